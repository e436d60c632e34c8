"""FuseOps, replayed in Python with a decision log (used by :mod:`tvm_ext.explain`).

Design note
-----------
This module re-implements, step for step, what TVM 0.19's ``FuseOps`` decides
(``src/relay/transforms/fuse_ops.cc``: ``IndexedForwardGraphCreator``;
``src/relay/analysis/graph_partitioner.cc``: ``DominatorTree::PostDom``,
``GraphPartitioner::RunFuse``), on the same post-DFS order, with the same op patterns, edge
patterns, post-dominator tree, three phases, ``CheckPath`` conditions,
``relay.FuseOps.max_depth``, the target's ``max_function_args`` (GPU targets: a fusion whose kernel
would take too many arguments is refused or postponed until its readers are grouped) and union-find
merging. Each refusal is recorded per node and phase,
with the node where ``CheckPath`` failed, so the explainer can say *which rule* kept a value out
of its reader's kernel. It never decides anything by kernel name.

It is checked, not trusted: :func:`tvm_ext.core.explain.explain` runs TVM's real ``FuseOps`` on the
same module and compares the kernels op for op (``Explanation.verified``). The graph's nodes and
labels are :mod:`._fusion_nodes`. How control flow and closures are replayed, and what is not
replayed: docs/explain.md, section "The FuseOps replay".
"""
from __future__ import annotations

from typing import Optional

from ..._op_pattern import K_BROADCAST, K_COMM_REDUCE, K_ELEMWISE, K_INJECTIVE, K_OPAQUE, K_OUT_EWISE_FUSABLE, K_TUPLE
from ._fusion_nodes import (Decision, DomNode, Node, _children, _is_dynamic, _op_attr, _shape_key, function_label,
                            is_primitive_function)

PATTERN_NAMES = {0: "kElemWise", 1: "kBroadcast", 2: "kInjective", 3: "kCommReduce", 4: "kOutEWiseFusable",
                 7: "kTuple", 8: "kOpaque"}
_SIMPLE_CONST = {"int32", "int64", "float32", "float64", "bool"}
MAX_FUSED_OPS = 256  # kMaxFusedOps, the default of relay.FuseOps.max_depth


class FusionGraph:
    """FuseOps' graph of one Relay function, its post-dominator tree and the fusion outcome."""

    def __init__(self, func, opt_level: int = 3, max_depth: int = MAX_FUSED_OPS, max_function_args: int = 0):
        self.func = func
        self.opt_level = int(opt_level)
        self.max_depth = int(max_depth)
        self.max_function_args = int(max_function_args)  # the target's attribute; 0: no limit (CPU targets)
        self.nodes: list[Node] = []
        self.index_of: dict = {}
        self.decisions: dict[int, list[Decision]] = {}
        self._build_graph()
        self._post_dom()
        self._partition()

    # -- IndexedForwardGraphCreator ---------------------------------------------------------
    def _build_graph(self):
        import tvm
        from tvm import relay

        order = []
        nested = []

        def visit(e):
            if isinstance(e, relay.Function):
                if not e.same_as(self.func):
                    nested.append(e)
                return
            if isinstance(e, (tvm.ir.Op, relay.GlobalVar)) or type(e).__name__ == "Constructor":
                return
            order.append(e)

        relay.analysis.post_order_visit(self.func, visit)
        # Functions handled by external codegen are skipped by TVM's creator.
        skipped = set()
        for fn in nested:
            if fn.attrs is not None and "Compiler" in fn.attrs:
                relay.analysis.post_order_visit(fn, lambda e: skipped.add(e))
        order = [e for e in order if e not in skipped]
        for i, e in enumerate(order):
            self.index_of[e] = i
            self.nodes.append(Node(i, e, *self._kind_op(e)))
        # FuseMutator returns Primitive functions unchanged: their groups are no kernels of this function
        inner = set()
        for fn in nested:
            if is_primitive_function(fn):
                relay.analysis.post_order_visit(fn, lambda e: inner.add(e))
        for n in self.nodes:
            n.outer = n.expr not in inner

        def update(child, parent: Optional[Node], pattern: int):
            idx = self.index_of.get(child)
            if idx is None:  # an Op, a function, a skipped external function
                return
            if parent is None:
                self.nodes[idx].extern = True
            else:
                self.nodes[idx].outputs.append((parent.index, pattern))

        funcs = [self.func] + [fn for fn in nested if not (fn.attrs is not None and "Compiler" in fn.attrs)]
        for fn in funcs:
            for p in fn.params:
                update(p, None, K_OPAQUE)
            update(fn.body, None, K_OPAQUE)
        for n in self.nodes:
            e = n.expr
            if isinstance(e, relay.Constant):
                scalar = len(e.data.shape) == 0 and e.data.dtype in _SIMPLE_CONST
                n.pattern = K_ELEMWISE if scalar else K_OPAQUE
            elif isinstance(e, relay.Call):
                pat = K_OPAQUE
                if not isinstance(e.op, tvm.ir.Op):  # the callee is an operand of the call, and external
                    update(e.op, n, K_OPAQUE)
                    update(e.op, None, K_OPAQUE)
                if isinstance(e.op, tvm.ir.Op):
                    dep = _op_attr(e.op, "TShapeDataDependent")
                    data_dep = bool(dep) and any(bool(x) for x in dep)
                    if _is_dynamic(e.checked_type) and (data_dep or e.op.name.startswith("dyn.")):
                        pat = K_OPAQUE
                    else:
                        p = _op_attr(e.op, "TOpPattern")
                        pat = K_OPAQUE if p is None else int(p)
                n.pattern = pat
                rtype = e.checked_type
                for a in e.args:
                    ep = pat
                    if ep == K_BROADCAST and isinstance(rtype, relay.TensorType):
                        at = a.checked_type
                        if isinstance(at, relay.TensorType) and _shape_key(at) == _shape_key(rtype):
                            ep = K_ELEMWISE
                    update(a, n, ep)
            elif isinstance(e, relay.Tuple):
                n.pattern = K_TUPLE
                for f in e.fields:
                    if isinstance(f.checked_type, relay.TensorType):
                        update(f, n, K_INJECTIVE)
                    else:
                        update(f, None, K_OPAQUE)
            elif isinstance(e, relay.TupleGetItem):
                tt = e.tuple_value.checked_type
                if all(isinstance(t, relay.TensorType) for t in tt.fields):
                    n.pattern = K_INJECTIVE
                    update(e.tuple_value, n, K_INJECTIVE)
                else:
                    update(e.tuple_value, None, K_OPAQUE)
            elif isinstance(e, relay.Var):
                pass
            else:  # Let, If, RefCreate/Read/Write, Match: TVM fuses nothing through them
                for child in _children(e):
                    update(child, None, K_OPAQUE)

    def _kind_op(self, e):
        import tvm
        from tvm import relay

        if isinstance(e, relay.Call):
            if isinstance(e.op, tvm.ir.Op):
                return "call", e.op.name
            if is_primitive_function(e.op):  # a group made before FuseOps: one kernel, opaque to it
                return "call", "fn:" + function_label(e.op)
            return "closure_call", None  # FuseMutator leaves the call as it is: no kernel
        if isinstance(e, relay.Var):
            return "var", None
        if isinstance(e, relay.Constant):
            return "const", None
        if isinstance(e, relay.Tuple):
            return "tuple", None
        if isinstance(e, relay.TupleGetItem):
            return "getitem", None
        return "other", None

    # -- DominatorTree::PostDom --------------------------------------------------------------
    def _post_dom(self):
        n = len(self.nodes)
        self.dom: list[Optional[DomNode]] = [None] * n
        for idx in range(n - 1, -1, -1):
            g = self.nodes[idx]
            if g.extern:
                self.dom[idx] = DomNode(None, 1, K_OPAQUE)
                continue
            pattern = K_ELEMWISE
            parent = None
            if g.outputs:
                first, epat = g.outputs[0]
                parent = first
                pattern = max(pattern, epat)
                for onode, epat in g.outputs[1:]:
                    parent, pattern = self._lca(parent, onode, pattern)
                    pattern = max(pattern, epat)
            # parent indexes are tree nodes: the dom node of graph node `parent`
            depth = self.dom[parent].depth + 1 if parent is not None else 1
            self.dom[idx] = DomNode(parent, depth, pattern)

    def _lca(self, lhs, rhs, pattern):
        while lhs != rhs:
            if lhs is None or rhs is None:
                return None, pattern
            dl, dr = self.dom[lhs], self.dom[rhs]
            if dl.depth < dr.depth:
                pattern = max(pattern, dr.pattern)
                rhs = dr.parent
            elif dr.depth < dl.depth:
                pattern = max(pattern, dl.pattern)
                lhs = dl.parent
            else:
                pattern = max(pattern, dl.pattern, dr.pattern)
                lhs, rhs = dl.parent, dr.parent
        return lhs, pattern

    # -- GraphPartitioner ----------------------------------------------------------------------
    def find_root(self, i: int) -> int:
        parent = self.g_parent
        root = i
        while parent[root] is not None:
            root = parent[root]
        while parent[i] is not None and parent[i] != root:
            parent[i], i = root, parent[i]
        return root

    def _merge(self, child: int, parent: int):
        child, parent = self.find_root(child), self.find_root(parent)
        if child == parent:
            return
        self.g_num[parent] += self.g_num[child]
        self.g_args[parent] += self.g_args[child]
        self.g_parent[child] = parent
        if self.g_anchor[child] is not None:
            self.g_anchor[parent] = self.g_anchor[child]
            self.g_pattern[parent] = max(self.g_pattern[child], self.g_pattern[parent])

    def _check_path(self, src: int, sink: int, fcond):
        """(ok, node where the condition failed)."""
        visited = set()
        stack = [o for o, _ in self.nodes[src].outputs]
        while stack:
            i = stack.pop()
            if i in visited:
                continue
            visited.add(i)
            if not fcond(self.g_pattern[self.find_root(i)], i == sink):
                return False, i
            if i == sink:
                continue
            stack.extend(o for o, _ in self.nodes[i].outputs)
        return True, None

    # -- GraphPartitioner's argument counts (max_function_args) ----------------------------------
    @staticmethod
    def _extra_args(ty, with_strides: bool = True) -> int:
        """CountAdditionalArgs_: a dynamic dimension is passed as an argument (and then the strides)."""
        from tvm import relay, tir

        if not isinstance(ty, relay.TensorType):
            return 0
        anys = sum(1 for d in ty.shape if isinstance(d, tir.Any))
        return anys + (len(ty.shape) if with_strides and anys else 0)

    def _init_args(self, e) -> int:
        """InitGroups' args_counter: the vars and tuple items a node reads (a var: itself)."""
        from tvm import relay

        def one(x):
            return 1 + self._extra_args(x.checked_type) if isinstance(x, (relay.Var, relay.TupleGetItem)) else 0

        if isinstance(e, relay.Call):
            return sum(one(a) for a in e.args)
        if isinstance(e, relay.Tuple):
            return sum(one(f) for f in e.fields)
        if isinstance(e, relay.Var):
            return 1 + self._extra_args(e.checked_type)
        return 0

    def _count_args(self, src: int, update_postpone: bool = True) -> int:
        """CountArgs_: the arguments of ``src``'s group and of the groups it reads, once each; a read
        group not counted yet marks ``src`` for postponed fusing (``update_postpone``)."""
        from tvm import relay

        total = self.g_args[src]
        seen = {self.find_root(src)}
        e = self.nodes[src].expr
        operands = e.args if isinstance(e, relay.Call) else e.fields if isinstance(e, relay.Tuple) else ()
        for a in operands:
            if isinstance(a, relay.Var) or a not in self.index_of:
                continue
            node = self.index_of[a]
            prev = self.find_root(node)
            if prev in seen:
                continue
            seen.add(prev)
            if self.g_args[prev] > 0:
                total += self.g_args[prev]
            elif update_postpone:
                self.postpone_node = src
            else:
                total += self._count_args(node, update_postpone)
        return total

    def _args_limit(self, child: int) -> int:
        """CountArgsLimit_: max_function_args less one argument per output of ``child``."""
        from tvm import relay

        outs = 0
        for o, _ in self.nodes[child].outputs:
            outs += 1
            e = self.nodes[o].expr
            if isinstance(e, relay.Call):
                outs += self._extra_args(e.checked_type, False)
        return self.max_function_args - outs if self.max_function_args > outs else 0

    def _too_many_args(self, nid: int) -> bool:
        if self.max_function_args <= 0:
            return False
        limit = self._args_limit(nid)
        if limit <= 0:
            return False
        return max((self._count_args(o) for o, _ in self.nodes[nid].outputs), default=0) > limit

    def _run_postponed(self, nid: int, phase: int):
        """RunFuse's start of a node: the fusions postponed until ``nid`` was reached, latest first (TVM keeps
        them in a ``std::unordered_multimap``, whose ``equal_range`` gives equal keys newest first). One whose
        post-dominator's group holds an anchor by then is dropped (logged as ``postponed_dropped``)."""
        for src in reversed(self.postponed.pop(nid, [])):
            if self._count_args(nid, False) <= self._args_limit(nid):
                snode = self.dom[src].parent
                if self.g_anchor[snode] is not None:
                    self._log(src, phase, "postponed_dropped", dom=snode)
                    continue
                self._commit(src, snode)

    def _commit(self, src: int, sink: int):
        if self.postpone_node is not None:  # CommitFuse_: the argument count needs readers not grouped yet
            self.postponed.setdefault(self.postpone_node, []).append(src)
            return
        target = sink
        visited = set()
        stack = [src]
        while stack:
            i = stack.pop()
            if i == sink or i in visited:
                continue
            visited.add(i)
            self._merge(i, target)
            stack.extend(o for o, _ in self.nodes[i].outputs)

    def _count_with_child(self, child: int, dom_parent: int) -> int:
        visited = set()
        total = self.g_num[self.find_root(dom_parent)]
        stack = [child]
        while stack:
            i = stack.pop()
            if i == dom_parent or i in visited:
                continue
            visited.add(i)
            total += self.g_num[i]
            stack.extend(o for o, _ in self.nodes[i].outputs)
        return total

    def _log(self, nid, phase, code, **kw):
        self.decisions.setdefault(nid, []).append(Decision(phase, code, self.g_pattern[nid], **kw))

    def _partition(self):
        n = len(self.nodes)
        self.g_parent: list = [None] * n
        self.g_pattern = [nd.pattern for nd in self.nodes]
        self.g_anchor = [i if nd.pattern == K_OUT_EWISE_FUSABLE else None for i, nd in enumerate(self.nodes)]
        self.g_num = [1] * n
        self.g_args = [self._init_args(nd.expr) for nd in self.nodes]
        self.postponed: dict[int, list] = {}
        self.postpone_node = None
        if self.opt_level == 0:
            for i in range(n):
                self._log(i, 0, "opt_level_0")
            return
        for phase in range(3):
            self._run_fuse(phase)

    def _run_fuse(self, phase: int):
        for nid in range(len(self.nodes)):
            self.postpone_node = None
            if nid in self.postponed:
                self._run_postponed(nid, phase)
            dom = self.dom[nid]
            gpat = self.g_pattern[nid]
            if gpat == K_OPAQUE:
                self._log(nid, phase, "opaque")
                continue
            if dom.parent is None:
                self._log(nid, phase, "no_dom")
                continue
            dp = dom.parent
            cnt = self._count_with_child(nid, dp)
            if cnt > self.max_depth:
                # FuseOps stops here; say whether the pattern rules would have fused it at all
                would = self._step(nid, phase, commit=False)
                if would is None:
                    continue
                if would[0] == "fused":
                    self._log(nid, phase, "max_depth", dom=dp, dom_pattern=dom.pattern, count=cnt)
                else:
                    code, kw = would
                    self._log(nid, phase, code, **kw, count=cnt)
                continue
            if self._too_many_args(nid):
                self._log(nid, phase, "max_function_args", dom=dp, dom_pattern=dom.pattern)
                continue
            res = self._step(nid, phase, commit=True)
            if res is not None:
                code, kw = res
                self._log(nid, phase, code, **kw)

    def _step(self, nid: int, phase: int, commit: bool):
        """RunFuse's branch logic for one node: (code, details), or None when the phase skips it."""
        dom = self.dom[nid]
        gpat = self.g_pattern[nid]
        dp = dom.parent

        def attempt(fcond):
            ok, bad = self._check_path(nid, dp, fcond)
            if ok:
                if commit:
                    self._commit(nid, dp)
                return "fused", {"dom": dp}
            return "path", {"dom": dp, "dom_pattern": dom.pattern, "failed_at": bad}

        if phase == 2:
            if gpat > K_INJECTIVE:
                return None
            dom_root = self.find_root(dp)
            if self.g_pattern[dom_root] == K_TUPLE:
                return "p2_tuple_root", {"dom": dp}
            if self.g_pattern[dp] == K_TUPLE and self.g_pattern[dom_root] <= K_INJECTIVE:
                return attempt(lambda k, s: k <= K_INJECTIVE)
            return None
        if self.find_root(nid) == self.find_root(dp):
            return "same_group", {"dom": dp}
        if self.g_pattern[dp] == K_TUPLE:
            return "dom_tuple", {"dom": dp, "dom_pattern": dom.pattern}
        if gpat == K_OUT_EWISE_FUSABLE:
            if phase != 0:
                return None
            if dom.pattern == K_ELEMWISE:
                return attempt(lambda k, s: k <= K_BROADCAST)
            return "dom_pattern", {"dom": dp, "dom_pattern": dom.pattern}
        if gpat <= K_BROADCAST:
            if dom.pattern <= K_INJECTIVE or dom.pattern == K_COMM_REDUCE:
                def fcond(k, is_sink):
                    if not is_sink:
                        return k <= K_INJECTIVE
                    return k <= K_BROADCAST or k in (K_COMM_REDUCE, K_INJECTIVE, K_OUT_EWISE_FUSABLE)

                return attempt(fcond)
            return "dom_pattern", {"dom": dp, "dom_pattern": dom.pattern}
        if gpat in (K_INJECTIVE, K_TUPLE):
            if phase != 1:
                return None
            return attempt(lambda k, s: k <= K_INJECTIVE)
        return "reduce", {"dom": dp, "dom_pattern": dom.pattern}

    # -- results -------------------------------------------------------------------------------
    def final_decision(self, nid: int) -> Optional[Decision]:
        """The refusal that decided ``nid``'s fate (the last informative one)."""
        ds = [d for d in self.decisions.get(nid, []) if d.code not in ("same_group",)]
        if not ds:
            return None
        # phase 2 only concerns tuples; prefer phases 0/1 unless phase 2 is about a tuple
        main = [d for d in ds if d.phase < 2]
        p2 = [d for d in ds if d.phase == 2]
        if p2 and p2[-1].code in ("p2_tuple_root",) and (not main or main[-1].code == "dom_tuple"):
            return p2[-1]
        return (main or ds)[-1]
