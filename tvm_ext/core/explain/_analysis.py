"""Kernels, the tensors crossing them and the reason of each, read off the FuseOps replay.

The records it makes (``REASONS``, :class:`Kernel`, :class:`Boundary`) are :mod:`._result`; the
readers of ops and types it shares with the naming are :mod:`._ops`.

A kernel is a group of the replay (:mod:`._fusion_sim`) whose root is an op call, as FuseMutator
makes Primitive functions; a boundary is a kernel's output read by another kernel. Its reason
(``REASONS``, ordered data) is the rule that refused to fuse the producing group's root into its
post-dominator, with the node where the rule failed (the join, the anchor, the barrier).
"""
from __future__ import annotations

from typing import Optional

from ._fusion_sim import (
    K_COMM_REDUCE,
    K_INJECTIVE,
    K_OPAQUE,
    K_OUT_EWISE_FUSABLE,
    K_TUPLE,
    PATTERN_NAMES,
    FusionGraph,
)
from ._fusion_nodes import node_label
from ._ops import _bool_attr, _bool_attr_name, _fn_ops, _is_dynamic_type, _operands, _outputs, _pattern_of
from ._result import Kernel


class _Analysis:
    def __init__(self, fg: FusionGraph, inserted_by: dict):
        import tvm

        self.fg = fg
        self.inserted = inserted_by
        nodes = fg.nodes
        self.root = [fg.find_root(i) for i in range(len(nodes))]
        members: dict = {}
        for i, _n in enumerate(nodes):
            members.setdefault(self.root[i], []).append(i)
        self.members = members
        # a kernel: a group of the function itself whose root is an op call (not a non-computational
        # op) or a TupleGetItem of a tuple in the same group, as FuseMutator makes Primitive functions
        self.kernel_of_group: dict = {}
        kernels = []
        for r in sorted(members):
            n = nodes[r]
            if not n.outer:
                continue
            if n.kind == "call":
                if n.op and not n.op.startswith("fn:"):
                    op = tvm.ir.Op.get(n.op)
                    if n.op == "annotation.stop_fusion" or (_bool_attr(op, "TNonComputational")
                                                            and not _bool_attr(op, "FTVMQnnCanonicalize")):
                        n.noncomputational = True
                        continue
            elif n.kind == "getitem":
                src = self.fg.index_of.get(n.expr.tuple_value)
                if src is None or self.root[src] != r:
                    continue
            else:
                continue
            self.kernel_of_group[r] = len(kernels)
            kernels.append(r)
        self.kernel_roots = kernels
        from tvm import relay

        self.let_values = {}
        for n in nodes:
            if isinstance(n.expr, relay.Let) and n.expr.value in fg.index_of:
                self.let_values[n.expr.var] = n.expr.value

    def kernel_list(self) -> list:
        out = []
        for ki, r in enumerate(self.kernel_roots):
            ops = []
            for i in sorted(self.members[r]):
                n = self.fg.nodes[i]
                if n.kind == "call" and n.op:
                    ops += _fn_ops(n.expr.op) if n.op.startswith("fn:") else [n.op]
            best, best_pat = None, -1
            for o in ops:
                pat = _pattern_of(o)
                if K_COMM_REDUCE <= pat < K_TUPLE and pat > best_pat:
                    best, best_pat = o, pat
            ty = self.fg.nodes[r].expr.checked_type
            outs = _outputs(ty)
            reshape_only = all(_bool_attr_name(o, "TReshapeOp") for o in ops) and bool(ops)
            pat = max(self.fg.g_pattern[r], max((self.fg.nodes[i].pattern for i in self.members[r]
                                                  if self.fg.nodes[i].kind == "call"), default=0))
            out.append(Kernel(ki, None, tuple(ops), best, PATTERN_NAMES.get(pat, str(pat)), outs,
                              reshape_only))
        return out

    def resolve(self, idx: Optional[int]) -> list:
        """[(kernel index, output field or None)] that value ``idx`` comes from.

        Followed: Let-bound variables to their values, a Let to its body, tuples to their fields,
        non-computational ops to their input. Not followed (``[]``): parameters (of the function
        or of a closure), constants, and what a closure call or an ``If``/``Match`` returns.
        """
        from tvm import relay

        if idx is None:  # not a node of the graph (a function literal, a global)
            return []
        n = self.fg.nodes[idx]
        r = self.root[idx]
        if r in self.kernel_of_group:
            return [(self.kernel_of_group[r], None)]
        index_of = self.fg.index_of
        if n.kind == "var" and n.expr in self.let_values:  # a Let-bound value: its producer
            return self.resolve(index_of.get(self.let_values[n.expr]))
        if n.kind in ("var", "const", "closure_call"):
            return []
        if n.kind == "tuple":
            out = []
            for f in n.expr.fields:
                out += self.resolve(index_of.get(f))
            return out
        if n.kind == "getitem":
            tup = n.expr.tuple_value
            while isinstance(tup, relay.Var) and tup in self.let_values:  # a Let-bound tuple
                tup = self.let_values[tup]
            if isinstance(tup, relay.Tuple):  # the field itself
                fields = list(tup.fields)
                return self.resolve(index_of.get(fields[n.expr.index])) if n.expr.index < len(fields) else []
            src = self.resolve(index_of.get(tup))
            return [(k, n.expr.index) for k, _ in src[:1]] if len(src) == 1 else src
        if n.kind == "call" and n.noncomputational and len(n.expr.args) >= 1:
            return self.resolve(index_of.get(n.expr.args[0]))
        if isinstance(n.expr, relay.Let):  # its value is its body's (the innermost body of a chain)
            body = n.expr.body
            while isinstance(body, relay.Let):
                body = body.body
            return self.resolve(index_of.get(body))
        return []

    def boundaries(self) -> list:
        """Crossing values -> {consumer kernels}, and the producing root node."""
        edges: dict = {}
        for ki, r in enumerate(self.kernel_roots):
            for i in self.members[r]:
                n = self.fg.nodes[i]
                for child in _operands(n.expr):
                    ci = self.fg.index_of.get(child)
                    if ci is None or self.root[ci] == r:
                        continue
                    for src in self.resolve(ci):
                        if src[0] == ki:
                            continue
                        ty = self.fg.nodes[self.kernel_roots[src[0]]].expr.checked_type
                        if src[1] is None and hasattr(ty, "fields"):  # a tuple read whole: every field crosses
                            for f in range(len(ty.fields)):
                                edges.setdefault((src[0], f), set()).add(ki)
                        else:
                            edges.setdefault(src, set()).add(ki)
        return edges

    # -- reasons ---------------------------------------------------------------------------
    def reason(self, r: int) -> dict:
        out = self._reason(r)
        d = self.fg.final_decision(r)
        if d is not None and d.count is not None and d.code != "max_depth":
            out["detail"] += (f" (the fused group would also exceed relay.FuseOps.max_depth={self.fg.max_depth}: "
                              f"{d.count} ops)")
        return out

    def _reason(self, r: int) -> dict:
        fg = self.fg
        n = fg.nodes[r]
        d = fg.final_decision(r)
        out = {"rule": "", "join": None, "blocker": None, "entry": None}
        readers = self.direct_readers(r)
        out["readers"] = tuple(fg.nodes[x].op or fg.nodes[x].kind for x in readers)
        closure_readers = [x for x in readers if fg.nodes[x].kind == "closure_call"]
        gp = PATTERN_NAMES.get(fg.g_pattern[r], "?")
        anchor = self.group_anchor(r)
        what = f"{n.op}" + (f" (kernel anchor {anchor})" if anchor and anchor != n.op else "")
        if d is None:
            out.update(kind="other", detail=f"{what}: no FuseOps decision recorded", rule="-")
            return out
        phase = f"phase {d.phase}"
        dom = d.dom
        if dom is not None:
            out["join"] = self.describe(dom)
        if d.code == "opt_level_0":
            out.update(kind="fusion_disabled", detail="FuseOps ran at opt_level 0: every op is its own kernel",
                       rule="GraphPartitioner::Partition: opt_level 0")
            return out
        if d.code == "opaque":
            if n.op and n.op.startswith("fn:"):
                out.update(kind="function_boundary", entry=n.op[3:],
                           detail=f"the value is produced by the function '{n.op[3:]}' (a Primitive/Composite "
                                  "group FuseOps does not enter)", rule=f"{phase}: group pattern kOpaque")
            elif n.pattern == K_OPAQUE and n.kind == "call" and _is_dynamic_type(n.expr.checked_type):
                out.update(kind="dynamic_shape", detail=f"{n.op} has a dynamic output shape and is data dependent",
                           rule=f"{phase}: kOpaque (IsDynamic && IsDataDependent)")
            else:
                out.update(kind="opaque_op", detail=f"{n.op} has TOpPattern kOpaque",
                           rule=f"{phase}: group pattern kOpaque")
            return out
        if closure_readers:  # a closure call reads it: kOpaque, the value cannot fuse onward
            c = fg.nodes[closure_readers[0]]
            out.update(kind="closure_call", blocker=self.describe(closure_readers[0]),
                       detail=f"{what} is passed to the {node_label(c)} (not an op): FuseOps makes the call "
                              "kOpaque and no kernel",
                       rule=f"{phase}: a reader is a call of a non-op (kOpaque)")
            return out
        if d.code == "no_dom":
            if n.extern:
                detail = (f"{what} is a graph output (or a Let/If/Match operand: FuseOps does not fuse through "
                          "them), so it has no post-dominator")
            else:
                detail = f"{what} has {len(readers)} readers whose paths never join again"
            out.update(kind="no_post_dominator", detail=detail, rule=f"{phase}: post-dominator is null")
            return out
        if d.code == "max_depth":
            out.update(kind="max_depth", detail=f"fusing {what} into {self.describe(dom)} would make a group of "
                                                f"{d.count} ops > relay.FuseOps.max_depth={fg.max_depth}",
                       rule=f"{phase}: CountFusedNodesWithNewChild > max_fuse_depth")
            return out
        if d.code == "max_function_args":
            out.update(kind="max_function_args", detail=f"fusing {what} into {self.describe(dom)} would give the "
                                                        f"kernel more than the target's max_function_args="
                                                        f"{fg.max_function_args} arguments",
                       rule=f"{phase}: CountFusedArgs > CountArgsLimit_")
            return out
        if d.code == "postponed_dropped":
            held = self.group_anchor(dom)
            out.update(kind="postponed_dropped",
                       detail=f"FuseOps postponed fusing {what} into {self.describe(dom)} (the target's "
                              f"max_function_args={fg.max_function_args}: the join's other input was not grouped yet) "
                              f"and dropped it at the join, whose kernel already held "
                              f"{held or 'an anchor'}: postponed fusions are retried latest first, and this one "
                              "comes from the join's earlier argument",
                       rule=f"{phase}: postponed fusion dropped (anchor_ref of the post-dominator's group)")
            return out
        if d.code == "dom_tuple" and len(readers) > 1:
            blocker = self.max_edge(r, dom)
            out.update(kind="multiple_readers", blocker=self.describe(blocker),
                       detail=f"{what} has {len(readers)} readers ({', '.join(sorted(set(out['readers'])))}); their "
                              f"paths join only at the tuple feeding {self.tuple_reader(dom)}, and FuseOps does not "
                              f"fuse into a tuple (the paths also pass {self.describe(blocker)})",
                       rule=f"{phase}: post-dominator is a tuple")
            return out
        if d.code in ("dom_tuple", "p2_tuple_root"):
            out.update(kind="tuple", detail=f"{what} goes into the tuple of {self.tuple_reader(dom)}; "
                                            "FuseOps does not fuse into a tuple unless the producer is injective "
                                            "and the tuple joins an injective group", rule=f"{phase}: {d.code}")
            return out
        if d.code == "reduce":
            out.update(kind="after_reduction", detail=f"{what} is a kCommReduce group; FuseOps fuses producers into a "
                                                      f"reduction, never a reduction into {self.describe(dom)}",
                       rule=f"{phase}: group pattern kCommReduce: no action")
            return out
        # dom_pattern / path: find what broke the rule on the way to the post-dominator
        blocker = d.failed_at if d.code == "path" else self.max_edge(r, dom)
        bdesc = self.describe(blocker) if blocker is not None else None
        out["blocker"] = bdesc
        bnode = fg.nodes[blocker] if blocker is not None else None
        rule = (f"{phase}: {gp} group, post-dominator {self.describe(dom)}, "
                + (f"dom pattern {PATTERN_NAMES.get(d.dom_pattern)}" if d.code == "dom_pattern"
                   else f"CheckPath failed at {bdesc}"))
        out["rule"] = rule
        # barriers on a direct reader take precedence
        if bnode is not None and blocker in readers:
            if bnode.op == "annotation.stop_fusion":
                by = self.inserted.get("annotation.stop_fusion")
                note = f"; placed by {', '.join(by)}" if by else ""
                out.update(kind="stop_fusion",
                           detail=f"{what} is read by annotation.stop_fusion (a fusion barrier){note}")
                return out
            if bnode.op and bnode.op.startswith("fn:"):
                out.update(kind="function_boundary", entry=bnode.op[3:],
                           detail=f"{what} is read by the function '{bnode.op[3:]}' (a Primitive/Composite group "
                                  "FuseOps does not enter)")
                return out
            if bnode.pattern == K_OPAQUE and bnode.kind == "call":
                kind = "dynamic_shape" if _is_dynamic_type(bnode.expr.checked_type) else "opaque_op"
                out.update(kind=kind, detail=f"{what} is read by {bnode.op} (kOpaque)")
                return out
        if len(readers) > 1:
            if blocker == dom:
                why = (f"the join itself is in the kernel of {self.group_anchor(dom)}" if self.group_anchor(dom)
                       else f"the join breaks the {PATTERN_NAMES.get(fg.g_pattern[r])} rule")
            else:
                why = f"the path passes {bdesc}"
            out.update(kind="multiple_readers",
                       detail=f"{what} has {len(readers)} readers ({', '.join(sorted(set(out['readers'])))}); its "
                              f"post-dominator is the join {self.describe(dom)} and {why}")
            return out
        if bnode is not None and bnode.op == "annotation.stop_fusion":
            out.update(kind="stop_fusion", detail=f"{what} reaches annotation.stop_fusion")
            return out
        g_has_anchor = fg.g_pattern[r] in (K_COMM_REDUCE, K_OUT_EWISE_FUSABLE) or anchor is not None
        bpat = fg.g_pattern[fg.find_root(blocker)] if blocker is not None else None
        reader_anchor = self.group_anchor(blocker) if blocker is not None else None
        if g_has_anchor and bnode is not None and (bnode.pattern in (K_COMM_REDUCE, K_OUT_EWISE_FUSABLE)
                                                   or reader_anchor is not None):
            out.update(kind="two_anchors", detail=f"{what} meets {bdesc}"
                                                  + (f" (kernel anchor {reader_anchor})"
                                                     if reader_anchor and reader_anchor != bnode.op else "")
                                                  + f": two anchors ({gp} and "
                                                  f"{PATTERN_NAMES.get(max(bnode.pattern, bpat or 0))})")
            return out
        if g_has_anchor:
            out.update(kind="injective_after_anchor",
                       detail=f"{bdesc} ({PATTERN_NAMES.get(bnode.pattern) if bnode else '?'}) reads the "
                              f"{anchor or n.op} kernel; only kElemWise epilogues fuse into kOutEWiseFusable")
            return out
        if bnode is not None and (bnode.pattern in (K_COMM_REDUCE, K_OUT_EWISE_FUSABLE) or reader_anchor is not None):
            holder = f" (in the kernel of {reader_anchor})" if reader_anchor and reader_anchor != bnode.op else ""
            out.update(kind="prologue_into_anchor",
                       detail=f"{what} ({PATTERN_NAMES.get(n.pattern)}) feeds {bdesc}{holder}; "
                              + ("injective ops fuse only into injective groups" if n.pattern == K_INJECTIVE
                                 else "FuseOps does not fuse a prologue into an anchor"))
            return out
        out.update(kind="other", detail=f"{what}: {d.code} toward {self.describe(dom)} (blocker {bdesc})")
        return out

    def tuple_reader(self, t: int) -> str:
        outs = [o for o, _ in self.fg.nodes[t].outputs]
        if outs:
            return self.describe(outs[0])
        return "the graph output" if self.fg.nodes[t].expr.same_as(self.fg.func.body) else "a Let/If/Match operand"

    def reader_casts(self, r: int) -> tuple:
        out = []
        for x in self.direct_readers(r):
            n = self.fg.nodes[x]
            if n.op == "cast":
                out.append(str(n.expr.attrs.dtype))
        return tuple(out)

    def pad_value(self, r: int):
        from tvm import relay

        n = self.fg.nodes[r]
        if n.op != "nn.pad" or len(n.expr.args) < 2 or not isinstance(n.expr.args[1], relay.Constant):
            return None
        return float(n.expr.args[1].data.numpy())

    def pads_channels(self, r: int) -> bool:
        """Does the kernel rooted at ``r`` pad the channel axis (axis 1 of a 4-d ``nn.pad``) of a tensor
        that a convolution's kernel wrote (what ``PadChannelsAtProducer`` removes)?"""
        from tvm import relay

        from ..._attrs import int_list

        for m in self.members[r]:
            n = self.fg.nodes[m]
            if n.op != "nn.pad":
                continue
            width = [int_list(w) for w in n.expr.attrs.pad_width]
            if len(width) != 4 or width[1] in (None, [0, 0]):
                continue
            src = n.expr.args[0]  # walk up inside this kernel to the tensor it reads
            while isinstance(src, relay.Call) and src in self.fg.index_of and self.root[self.fg.index_of[src]] == r:
                src = src.args[0]
            i = self.fg.index_of.get(src)
            if i is not None and any("conv2d" in (self.fg.nodes[k].op or "") for k in self.members[self.root[i]]):
                return True
        return False

    def direct_readers(self, r: int) -> list:
        """Distinct graph nodes reading ``r`` (through tuples/no-op nodes they are themselves)."""
        return sorted({o for o, _ in self.fg.nodes[r].outputs})

    def group_anchor(self, i: Optional[int]):
        if i is None:
            return None
        root = self.root[i]
        best, best_pat = None, -1
        for m in self.members[root]:
            n = self.fg.nodes[m]
            if n.kind == "call" and n.pattern in (K_COMM_REDUCE, K_OUT_EWISE_FUSABLE) and n.pattern > best_pat:
                best, best_pat = node_label(n), n.pattern
        return best

    def max_edge(self, r: int, dom: int) -> Optional[int]:
        """The node on the paths r -> dom entered by the highest-pattern edge (the rule breaker)."""
        best, best_pat = None, -1
        seen = set()
        stack = [r]
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            for o, ep in self.fg.nodes[i].outputs:
                if o > dom:
                    continue
                pat = max(ep, self.fg.g_pattern[self.root[o]] if o != dom else ep)
                if pat > best_pat:
                    best, best_pat = o, pat
                if o != dom:
                    stack.append(o)
        return best

    def describe(self, i: Optional[int]) -> str:
        if i is None:
            return "(none)"
        n = self.fg.nodes[i]
        label = node_label(n)
        r = self.root[i]
        if r in self.kernel_of_group:
            return f"{label} in kernel #{self.kernel_of_group[r]}"
        return label
