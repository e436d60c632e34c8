"""Kernel reports: what a built Relay module runs, and what crosses between its kernels.

Design note
-----------
The truth is the graph executor's JSON: every ``tvm_op`` node is one kernel launch, so
``KernelReport.num_kernels`` equals the number of ``tvm_op`` nodes, always. Each node's
``func_name`` is looked up in the build's ``function_metadata``, whose ``relay_primfuncs`` hold
the fused Relay ``Primitive`` function that was lowered; its calls give the kernel's ops.

*Anchor*: the op of a kernel with the highest ``TOpPattern`` when that pattern is
``kCommReduce`` (3) or above (conv2d, dense, pooling, reductions, softmax, opaque ops).
FuseOps lets at most one such op into a kernel, so ``kernels - anchor kernels`` counts the
kernels a better fusion could remove.

*Crossing tensors*: a kernel output read by at least one other kernel, counted once whatever the
number of readers; bytes = elements x dtype width. The graph's inputs, weights and outputs are
reported apart (``inputs``, ``outputs``) and are not crossings.

*Why a float or int32 tensor crosses* (:meth:`KernelReport.float_crossings`,
:meth:`KernelReport.int_crossings`): each such crossing gets one reason from the closed set
:data:`CROSSING_REASONS`, computed from the fused Relay functions (what the producer's output
holds, what each reader does with it first; see :mod:`tvm_ext.core._crossings`) and marked *on
purpose* or *avoidable*, so that "float32 crosses only where the graph computes in float on
purpose" can be checked and the rest is a to-do list.
"""
from __future__ import annotations

import json
import math
from typing import Optional

from . import _crossings
from .._op_pattern import op_pattern
from ._kernel_records import (CROSSING_REASONS, PATTERN_NAMES, Crossing, Kernel, TensorTraffic,  # noqa: F401
                              _relay_ops, _traffic, anchor_of, dtype_bytes)

__all__ = ["Kernel", "TensorTraffic", "KernelReport", "Crossing", "CROSSING_REASONS", "dtype_bytes", "op_pattern",
           "anchor_of"]


def _funcs_from_metadata(function_metadata) -> dict:
    out = {}
    if not function_metadata:
        return out
    for name, info in function_metadata.items():
        prims = getattr(info, "relay_primfuncs", None)
        if not prims:
            continue
        for _target, func in prims.items():
            out[str(name)] = func
            break
    return out


class KernelReport:
    """What a built graph-executor module runs.

    Build it with :meth:`from_factory` (``relay.build``'s result) or :meth:`from_graph_json`.
    """

    def __init__(self, kernels, crossing: TensorTraffic, inputs: TensorTraffic, outputs: TensorTraffic,
                 crossings=None):
        self.kernels: list[Kernel] = list(kernels)
        self.crossing = crossing
        self.inputs = inputs
        self.outputs = outputs
        # None: not analysed (e.g. a Relax report); a list: every float / wide-integer crossing
        self._crossings: Optional[list] = None if crossings is None else list(crossings)

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_factory(cls, factory) -> "KernelReport":
        """Report of ``relay.build``'s (or ``tvm_ext.build``'s) result."""
        params = factory.get_params() if hasattr(factory, "get_params") else {}
        return cls.from_graph_json(
            factory.get_graph_json(), getattr(factory, "function_metadata", None), param_names=set(params)
        )

    @classmethod
    def from_graph_json(cls, graph_json, function_metadata=None, param_names=()) -> "KernelReport":
        """Report from a graph executor JSON (str or dict) and optional function metadata."""
        graph = json.loads(graph_json) if isinstance(graph_json, str) else graph_json
        nodes = graph["nodes"]
        row_ptr = graph.get("node_row_ptr") or _row_ptr(nodes)
        shapes = graph["attrs"]["shape"][1]
        dtypes = graph["attrs"]["dltype"][1]
        funcs = _funcs_from_metadata(function_metadata)
        ops_by_func = {name: _relay_ops(func) for name, func in funcs.items()}
        param_names = set(param_names)

        readers: dict = {}
        for nid, node in enumerate(nodes):
            if node["op"] != "tvm_op":
                continue
            for src, idx, *_ in node["inputs"]:
                readers.setdefault((src, idx), set()).add(nid)

        kernels, crossing, graph_inputs = [], [], []
        kernel_of: dict = {}
        for nid, node in enumerate(nodes):
            n_out = row_ptr[nid + 1] - row_ptr[nid]
            outs = tuple((tuple(shapes[row_ptr[nid] + i]), dtypes[row_ptr[nid] + i]) for i in range(n_out))
            if node["op"] == "null":
                if node["name"] not in param_names and (nid, 0) in readers:
                    graph_inputs.extend(outs)
                continue
            if node["op"] != "tvm_op":
                continue
            func_name = node.get("attrs", {}).get("func_name", node["name"])
            ops = tuple(ops_by_func.get(func_name, _ops_from_name(func_name)))
            ins = tuple((tuple(shapes[row_ptr[src] + idx]), dtypes[row_ptr[src] + idx])
                        for src, idx, *_ in node["inputs"])
            uses, kinds = (), ()
            if func_name in funcs:
                const_in = [j for j, (src, *_r) in enumerate(node["inputs"])
                            if nodes[src]["op"] == "null" and nodes[src]["name"] in param_names]
                try:
                    uses, kinds = _crossings.analyse(funcs[func_name], const_in)
                except Exception:  # the analysis is advisory: never fail a report on it
                    uses, kinds = (), ()
                if len(uses) != len(node["inputs"]) or len(kinds) != n_out:
                    uses, kinds = (), ()
            kernel_of[nid] = len(kernels)
            kernels.append(Kernel(len(kernels), node["name"], func_name, ops, anchor_of(ops), outs, ins,
                                  input_uses=uses, output_kinds=kinds))
            for i, out in enumerate(outs):
                if readers.get((nid, i)):
                    crossing.append(out)
        heads = [(tuple(shapes[row_ptr[h[0]] + h[1]]), dtypes[row_ptr[h[0]] + h[1]]) for h in graph["heads"]]
        reasons = _crossing_reasons(nodes, row_ptr, shapes, dtypes, readers, kernel_of, kernels,
                                    {(h[0], h[1]) for h in graph["heads"]})
        return cls(kernels, _traffic(crossing), _traffic(graph_inputs), _traffic(heads), reasons)

    def with_tuned(self, workloads) -> "KernelReport":
        """This report with ``Kernel.tuned`` set where a tuned AutoTVM workload was compiled.

        A kernel is tuned when its inputs include the data and weight tensors (shape and dtype)
        of one of ``workloads`` (as :func:`tvm_ext.x86.tuning.apply`'s ``hits`` lists them).
        """
        import dataclasses

        keys = []
        for wl in workloads:
            tensors = [(tuple(a[1]), a[2]) for a in wl[1:] if isinstance(a, tuple) and a and a[0] == "TENSOR"]
            if len(tensors) >= 2:
                keys.append(tensors[:2])
        kernels = [dataclasses.replace(k, tuned=any(d in k.inputs and w in k.inputs for d, w in keys))
                   for k in self.kernels]
        return KernelReport(kernels, self.crossing, self.inputs, self.outputs, self._crossings)

    @property
    def num_tuned_kernels(self) -> int:
        return sum(1 for k in self.kernels if k.tuned)

    # -- why tensors cross ----------------------------------------------------------------
    def float_crossings(self) -> list:
        """Every float (float32/float16/bfloat16) tensor crossing kernels, with its :class:`Crossing` reason.

        Empty for reports built without the analysis (Relax reports: ``to_dict()`` gives None there).
        """
        return [c for c in self._crossings or () if _crossings.is_float(c.dtype)]

    def int_crossings(self) -> list:
        """Every integer tensor wider than 8 bits (int32, int64) crossing kernels, with its reason."""
        return [c for c in self._crossings or () if not _crossings.is_float(c.dtype)]

    def avoidable_bytes(self) -> dict:
        """Bytes per dtype of the float/wide-integer crossings that are not on purpose."""
        out: dict = {}
        for c in self._crossings or ():
            if not c.on_purpose:
                out[c.dtype] = out.get(c.dtype, 0) + c.nbytes
        return out

    def crossing_reasons_table(self) -> str:
        """Text: float and wide-integer crossings grouped by reason (bytes, count, kernels)."""
        if self._crossings is None:
            return "why tensors cross: not analysed for this report"
        if not self._crossings:
            return "no float or wide-integer tensor crosses kernels"
        groups: dict = {}
        for c in self._crossings:
            groups.setdefault((c.dtype, c.reason), []).append(c)
        lines = ["float / wide-integer tensors crossing kernels, by reason:"]
        for (dtype, reason), cs in sorted(groups.items(), key=lambda kv: (-sum(c.nbytes for c in kv[1]), kv[0])):
            on = "on purpose" if CROSSING_REASONS[reason][0] else "AVOIDABLE"
            where = ", ".join(f"{c.producer}->{'/'.join(map(str, c.readers))}" for c in cs[:6])
            more = f", ... ({len(cs) - 6} more)" if len(cs) > 6 else ""
            lines.append(f"  {dtype:<8} {sum(c.nbytes for c in cs) / 1e6:7.3f} MB  {len(cs):3d}x  {reason:<21} "
                         f"[{on}] kernels {where}{more}")
        lines.append("  reasons: " + "; ".join(f"{r}: {CROSSING_REASONS[r][1]}" for r in
                                                 sorted({c.reason for c in self._crossings})))
        return "\n".join(lines)

    # -- summary ------------------------------------------------------------------------
    @property
    def num_kernels(self) -> int:
        return len(self.kernels)

    @property
    def num_launched_kernels(self) -> int:
        """Kernels the graph executor launches: all but the reshape-only ``__nop`` nodes, whose output
        aliases their input (``GraphExecutorCodegen``)."""
        return sum(1 for k in self.kernels if k.func_name != "__nop")

    @property
    def num_anchor_kernels(self) -> int:
        return sum(1 for k in self.kernels if k.anchor is not None)

    @property
    def num_non_anchor_kernels(self) -> int:
        return self.num_kernels - self.num_anchor_kernels

    def anchor_counts(self) -> dict:
        """Kernels per anchor op name (``None`` key: kernels without an anchor)."""
        out: dict = {}
        for k in self.kernels:
            out[k.anchor] = out.get(k.anchor, 0) + 1
        return out

    def to_dict(self) -> dict:
        """JSON-serialisable form."""
        return {
            "num_kernels": self.num_kernels,
            "num_launched_kernels": self.num_launched_kernels,
            "num_anchor_kernels": self.num_anchor_kernels,
            "num_non_anchor_kernels": self.num_non_anchor_kernels,
            "num_tuned_kernels": self.num_tuned_kernels,
            "anchors": {str(k): v for k, v in self.anchor_counts().items()},
            "crossing": self.crossing.to_dict(),
            "inputs": self.inputs.to_dict(),
            "outputs": self.outputs.to_dict(),
            "kernels": [k.to_dict() for k in self.kernels],
            "float_crossings": None if self._crossings is None else [c.to_dict() for c in self.float_crossings()],
            "int_crossings": None if self._crossings is None else [c.to_dict() for c in self.int_crossings()],
        }

    def summary(self) -> str:
        """One line: kernels, anchors and crossing bytes by dtype."""
        by = ", ".join(f"{d} {b / 1e6:.2f}" for d, b in sorted(self.crossing.nbytes.items()))
        nop = self.num_kernels - self.num_launched_kernels
        return (
            f"{self.num_kernels} kernels ({self.num_anchor_kernels} with an anchor"
            f"{f'; {self.num_launched_kernels} launched, {nop} reshape-only __nop' if nop else ''}), "
            f"{self.crossing.total_count} tensors / {self.crossing.total_bytes / 1e6:.2f} MB "
            f"crossing kernels ({by or 'none'})"
        )

    def table(self, max_kernels: Optional[int] = None) -> str:
        """A plain-text table: one row per kernel, then totals."""
        rows = [("#", "anchor", "ops", "output")]
        shown = self.kernels if max_kernels is None else self.kernels[:max_kernels]
        for k in shown:
            out = ", ".join(f"{t}{list(s)}" for s, t in k.outputs)
            anchor = (k.anchor or "-") + (" (tuned)" if k.tuned else "")
            rows.append((str(k.index), anchor, " ".join(k.ops) or k.func_name, out))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
        if max_kernels is not None and len(self.kernels) > max_kernels:
            lines.append(f"... {len(self.kernels) - max_kernels} more kernels")
        lines.append("")
        lines.append(self.summary())
        if self.num_tuned_kernels:
            lines.append(f"{self.num_tuned_kernels} kernels use tuned schedules (tvm_ext.x86.tuning)")
        if self._crossings is not None:
            lines.append(self.crossing_reasons_table())
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"KernelReport({self.summary()})"


def _row_ptr(nodes) -> list:
    ptr = [0]
    for node in nodes:
        n = int(node.get("attrs", {}).get("num_outputs", 1))
        ptr.append(ptr[-1] + n)
    return ptr


def _ops_from_name(func_name: str) -> list:
    """Fallback when no Relay function is known (external codegen): the name itself."""
    return [func_name]


def _crossing_reasons(nodes, row_ptr, shapes, dtypes, readers, kernel_of, kernels, heads) -> list:
    """A :class:`Crossing` for every float or >8-bit integer kernel output read by another kernel."""

    def kind(nid, idx, depth=0) -> str:  # what (nid, idx) holds, following pure data movement
        if nodes[nid]["op"] != "tvm_op":  # a graph input (weights are never moved by a kernel alone)
            return "input" if _crossings.is_float(dtypes[row_ptr[nid] + idx]) else "int"
        k = kernels[kernel_of[nid]]
        if not k.output_kinds:
            return "unknown"
        kd = k.output_kinds[idx]
        if kd.startswith("param:") and depth < 64:
            j = int(kd.split(":")[1])
            if 0 <= j < len(nodes[nid]["inputs"]):
                src, sidx, *_ = nodes[nid]["inputs"][j]
                return kind(src, sidx, depth + 1)
            return "unknown"
        return kd

    def uses(nid, idx, depth=0) -> set:  # what the readers of (nid, idx) do with it first
        out: set = set()
        for r in sorted(readers.get((nid, idx), ())):
            k = kernels[kernel_of[r]]
            for j, (src, sidx, *_) in enumerate(nodes[r]["inputs"]):
                if (src, sidx) != (nid, idx):
                    continue
                if not k.input_uses:
                    out.add("unknown")
                    continue
                for u in k.input_uses[j].split("|"):
                    if u.startswith("out:"):
                        o = int(u.split(":")[1])
                        if (r, o) in heads:
                            out.add("output")
                        if depth < 64:
                            out |= uses(r, o, depth + 1)
                    elif u != "unused":
                        out.add(u)
        return out

    result = []
    for nid, node in enumerate(nodes):
        if node["op"] != "tvm_op":
            continue
        n_out = row_ptr[nid + 1] - row_ptr[nid]
        for i in range(n_out):
            rs = readers.get((nid, i))
            dtype = dtypes[row_ptr[nid] + i]
            wide_int = _crossings.is_int(dtype) and _crossings._bits(dtype) > 8
            if not rs or not (_crossings.is_float(dtype) or wide_int):
                continue
            holds, used = kind(nid, i), uses(nid, i)
            if (nid, i) in heads or "output" in used:
                reason = "graph_output"
            elif "unknown" in used or holds == "unknown":
                reason = "unknown"
            elif _crossings.is_float(dtype):
                if used and used <= {"quantize"}:
                    reason = "dq_q_round_trip" if holds == "q8" else "quantize_late"
                elif holds == "input":
                    reason = "graph_input"
                else:
                    reason = "dequantize_early" if holds == "q8" else "float_compute"
            elif used and used <= {"narrow"}:
                reason = "requantize_not_fused"
            elif "dequantize" in used and used <= {"dequantize", "narrow"}:
                reason = "dequantize_not_fused"
            else:
                reason = "int_compute"
            shape = tuple(shapes[row_ptr[nid] + i])
            result.append(Crossing(kernel_of[nid], i, tuple(sorted(kernel_of[r] for r in rs)), shape, dtype,
                                   int(math.prod(shape) * dtype_bytes(dtype)), reason, holds,
                                   tuple(sorted(used - {"output"}))))
    return result
