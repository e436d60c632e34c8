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
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Optional

__all__ = ["Kernel", "TensorTraffic", "KernelReport", "dtype_bytes", "op_pattern", "anchor_of"]

#: TOpPattern values (include/tvm/relay/op_attr_types.h).
PATTERN_NAMES = {
    0: "elemwise",
    1: "broadcast",
    2: "injective",
    3: "comm_reduce",
    4: "out_elemwise_fusable",
    7: "tuple",
    8: "opaque",
}
K_COMM_REDUCE = 3


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a TVM dtype string, as TVM's runtime allocates them.

    ``(bits * lanes + 7) // 8`` (``runtime::GetDataSize``): ``bool`` and ``int4`` take one byte.
    """
    import tvm

    t = tvm.DataType(dtype)
    return (t.bits * t.lanes + 7) // 8


def op_pattern(op_name: str) -> int:
    """TOpPattern of a Relay op (8, opaque, when unknown)."""
    import tvm

    try:
        pat = tvm.ir.Op.get(op_name).get_attr("TOpPattern")
    except Exception:  # unknown op
        return 8
    return 8 if pat is None else int(pat)


def anchor_of(ops) -> Optional[str]:
    """The anchor op among ``ops`` (names), or None for a kernel of only elementwise/injective ops."""
    best, best_pat = None, -1
    for name in ops:
        pat = op_pattern(name)
        if pat >= K_COMM_REDUCE and pat != 7 and pat > best_pat:
            best, best_pat = name, pat
    return best


@dataclass(frozen=True)
class TensorTraffic:
    """Count and bytes of tensors, per dtype."""

    count: dict = field(default_factory=dict)
    nbytes: dict = field(default_factory=dict)

    @property
    def total_count(self) -> int:
        return sum(self.count.values())

    @property
    def total_bytes(self) -> int:
        return int(sum(self.nbytes.values()))

    def to_dict(self) -> dict:
        return {
            "count": dict(sorted(self.count.items())),
            "bytes": {k: int(v) for k, v in sorted(self.nbytes.items())},
            "total_count": self.total_count,
            "total_bytes": self.total_bytes,
        }


def _traffic(entries) -> TensorTraffic:
    count: dict = {}
    nbytes: dict = {}
    for shape, dtype in entries:
        count[dtype] = count.get(dtype, 0) + 1
        nbytes[dtype] = nbytes.get(dtype, 0) + int(math.prod(shape) * dtype_bytes(dtype))
    return TensorTraffic(count, nbytes)


@dataclass(frozen=True)
class Kernel:
    """One kernel launch of the graph executor."""

    index: int
    name: str
    func_name: str
    ops: tuple
    anchor: Optional[str]
    outputs: tuple  # ((shape, dtype), ...)
    inputs: tuple = ()  # ((shape, dtype), ...), weights included
    tuned: bool = False  # compiled with a tuning record (tvm_ext.tuning), not TVM's rule

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ops"] = list(self.ops)
        d["outputs"] = [{"shape": list(s), "dtype": t} for s, t in self.outputs]
        d["inputs"] = [{"shape": list(s), "dtype": t} for s, t in self.inputs]
        return d


def _relay_ops(func) -> list:
    """Op names called in a Relay function, in post-order."""
    from tvm import relay

    ops = []

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.op, __import__("tvm").ir.Op):
            ops.append(node.op.name)

    relay.analysis.post_order_visit(func, visit)
    return ops


def _ops_from_metadata(function_metadata) -> dict:
    out = {}
    if not function_metadata:
        return out
    for name, info in function_metadata.items():
        prims = getattr(info, "relay_primfuncs", None)
        if not prims:
            continue
        for _target, func in prims.items():
            out[str(name)] = _relay_ops(func)
            break
    return out


class KernelReport:
    """What a built graph-executor module runs.

    Build it with :meth:`from_factory` (``relay.build``'s result) or :meth:`from_graph_json`.
    """

    def __init__(self, kernels, crossing: TensorTraffic, inputs: TensorTraffic, outputs: TensorTraffic):
        self.kernels: list[Kernel] = list(kernels)
        self.crossing = crossing
        self.inputs = inputs
        self.outputs = outputs

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
        ops_by_func = _ops_from_metadata(function_metadata)
        param_names = set(param_names)

        readers: dict = {}
        for nid, node in enumerate(nodes):
            if node["op"] != "tvm_op":
                continue
            for src, idx, *_ in node["inputs"]:
                readers.setdefault((src, idx), set()).add(nid)

        kernels, crossing, graph_inputs = [], [], []
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
            ins = tuple((tuple(shapes[row_ptr[src] + idx]), dtypes[row_ptr[src] + idx]) for src, idx, *_ in node["inputs"])
            kernels.append(Kernel(len(kernels), node["name"], func_name, ops, anchor_of(ops), outs, ins))
            for i, out in enumerate(outs):
                if readers.get((nid, i)):
                    crossing.append(out)
        heads = [(tuple(shapes[row_ptr[h[0]] + h[1]]), dtypes[row_ptr[h[0]] + h[1]]) for h in graph["heads"]]
        return cls(kernels, _traffic(crossing), _traffic(graph_inputs), _traffic(heads))

    def with_tuned(self, workloads) -> "KernelReport":
        """This report with ``Kernel.tuned`` set where a tuned AutoTVM workload was compiled.

        A kernel is tuned when its inputs include the data and weight tensors (shape and dtype)
        of one of ``workloads`` (as :func:`tvm_ext.tuning.apply`'s ``hits`` lists them).
        """
        import dataclasses

        keys = []
        for wl in workloads:
            tensors = [(tuple(a[1]), a[2]) for a in wl[1:] if isinstance(a, tuple) and a and a[0] == "TENSOR"]
            if len(tensors) >= 2:
                keys.append(tensors[:2])
        kernels = [dataclasses.replace(k, tuned=any(d in k.inputs and w in k.inputs for d, w in keys))
                   for k in self.kernels]
        return KernelReport(kernels, self.crossing, self.inputs, self.outputs)

    @property
    def num_tuned_kernels(self) -> int:
        return sum(1 for k in self.kernels if k.tuned)

    # -- summary ------------------------------------------------------------------------
    @property
    def num_kernels(self) -> int:
        return len(self.kernels)

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
            "num_anchor_kernels": self.num_anchor_kernels,
            "num_non_anchor_kernels": self.num_non_anchor_kernels,
            "num_tuned_kernels": self.num_tuned_kernels,
            "anchors": {str(k): v for k, v in self.anchor_counts().items()},
            "crossing": self.crossing.to_dict(),
            "inputs": self.inputs.to_dict(),
            "outputs": self.outputs.to_dict(),
            "kernels": [k.to_dict() for k in self.kernels],
        }

    def summary(self) -> str:
        """One line: kernels, anchors and crossing bytes by dtype."""
        by = ", ".join(f"{d} {b / 1e6:.2f}" for d, b in sorted(self.crossing.nbytes.items()))
        return (
            f"{self.num_kernels} kernels ({self.num_anchor_kernels} with an anchor), "
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
            lines.append(f"{self.num_tuned_kernels} kernels use tuned schedules (tvm_ext.tuning)")
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
