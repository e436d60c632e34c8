"""FuseByPattern: every match of a pattern table becomes one kernel; FuseOps fuses the rest.

As data: the pattern table it is given (``tvm.relay.dataflow_pattern``, :mod:`tvm_ext.patterns`).

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``FuseByPattern``.
"""
from __future__ import annotations

import logging

import tvm
from tvm import relay, tir

from .._op_pattern import K_BROADCAST, K_COMM_REDUCE, K_TUPLE, call_pattern
from ._registry import register_pass
from ._util import Reject, SIMPLE_CONST, is_unlowered_qnn, lift_constants

logger = logging.getLogger("tvm_ext.passes.fuse_by_pattern")

__all__ = ["FuseByPattern", "tvm_fusible", "fused_counts"]

_PREFIX = "__tvm_ext_fbp__:"


def _static(ty) -> bool:
    if isinstance(ty, relay.TensorType):
        return all(isinstance(d, tir.IntImm) for d in ty.shape)
    if isinstance(ty, relay.TupleType):
        return all(_static(f) for f in ty.fields)
    return False


def tvm_fusible(ctx):
    """Can TVM compile the matched group as one kernel? ``True`` or a :class:`Reject` saying why."""
    calls = ctx.calls
    if not calls:
        return Reject("no op in the match")
    kinds = []
    for c in calls:
        if not isinstance(c.op, tvm.ir.Op):
            return Reject("the match calls a function, not an op")
        if not _static(c.checked_type) or not all(_static(a.checked_type) for a in c.args):
            return Reject(f"{c.op.name} has a dynamic or non-tensor shape")
        if is_unlowered_qnn(c):  # lowered forms match at before_fuse
            return Reject(f"{c.op.name} is not lowered yet (QNN ops need constant scales at canonicalization): "
                          f"run FuseByPattern at stage before_fuse")
        if c.op.name in ("nn.conv2d", "nn.dense") and str(c.args[0].checked_type.dtype) == "int8" \
                and str(c.args[1].checked_type.dtype) == "int8":
            # x86 Legalize (relay.build's prefix) rewrites int8 x int8 into a +128 shift, the op and a
            # `sum` compensation: two anchors in one Primitive fn, which TVM cannot schedule
            return Reject(f"{c.op.name} with int8 data and int8 weight is legalized into two anchors on x86: "
                          f"run FuseByPattern at stage before_fuse")
        kinds.append((c.op.name, call_pattern(c)))
    if not isinstance(ctx.root.checked_type, relay.TensorType):
        return Reject("the group's output is not a single tensor")
    if len(calls) > 1:
        opaque = [n for n, k in kinds if k >= K_TUPLE]
        if opaque:
            return Reject(f"opaque op {opaque[0]} cannot share a kernel")
    anchors = [(n, k) for n, k in kinds if K_COMM_REDUCE <= k < K_TUPLE]
    if len(anchors) > 1:
        return Reject(f"two anchor ops in one kernel: {anchors[0][0]} and {anchors[1][0]}")
    if anchors:
        bad = [n for n, k in kinds if k < K_COMM_REDUCE and k > K_BROADCAST]
        if bad:
            return Reject(f"{bad[0]} (injective) cannot join the {anchors[0][0]} kernel: "
                          "only elementwise/broadcast ops fuse with an anchor")
    return True


MAX_ABSORBED = 8  # producer ops pulled into one group, at most


def _use_counts(expr) -> dict:
    uses: dict = {}

    def visit(node):
        if isinstance(node, relay.Call):
            for a in node.args:
                uses[a] = uses.get(a, 0) + 1
        elif isinstance(node, relay.Tuple):
            for a in node.fields:
                uses[a] = uses.get(a, 0) + 1
        elif isinstance(node, relay.TupleGetItem):
            uses[node.tuple_value] = uses.get(node.tuple_value, 0) + 1

    relay.analysis.post_order_visit(expr, visit)
    return uses


def _absorb_producers(fn, new_args, old_args, uses):
    """Pull private elementwise/broadcast producer chains of the group's epilogue inputs in.

    # group(.., e(x, y), ..) where e is elementwise/broadcast, used once, not an anchor input
    #   -> group'(.., x, y, ..) computing e inside
    This is what FuseOps does for the terminal elementwise op of an anchor group (its phase 1:
    a broadcast chain fuses into a sink already in an out-elemwise-fusable group), e.g. the
    dequantize of an identity shortcut feeding the residual add after a convolution. A Primitive
    group is opaque to FuseOps, so without this the chain would be a kernel of its own.
    """
    params, body = list(fn.params), fn.body
    new_args, old_args = list(new_args), list(old_args)
    absorbed = 0
    while absorbed < MAX_ABSORBED:
        anchor_inputs = set()

        def visit(node, anchor_inputs=anchor_inputs):  # called by post_order_visit below, in this iteration
            if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op) and call_pattern(node) >= K_COMM_REDUCE:
                anchor_inputs.update(a for a in node.args if isinstance(a, relay.Var))

        relay.analysis.post_order_visit(body, visit)
        for i, (p, a_new, a_old) in enumerate(zip(params, new_args, old_args)):
            if p in anchor_inputs or not isinstance(a_new, relay.Call) or not isinstance(a_new.op, tvm.ir.Op):
                continue
            if call_pattern(a_new) > K_BROADCAST or uses.get(a_old, 0) != 1:
                continue
            if not all(_static(a.checked_type) for a in a_old.args) or not _static(a_old.checked_type):
                continue
            inner_args, extra_params, extra_new, extra_old = [], [], [], []
            for a_n, a_o in zip(a_new.args, a_old.args):
                if isinstance(a_o, relay.Constant) and a_o.data.shape == () and a_o.data.dtype in SIMPLE_CONST:
                    inner_args.append(a_o)  # FuseOps inlines such scalars too
                    continue
                v = relay.var(f"p_in{len(params) + len(extra_params)}", a_o.checked_type)
                inner_args.append(v)
                extra_params.append(v)
                extra_new.append(a_n)
                extra_old.append(a_o)
            body = relay.bind(body, {p: relay.Call(a_new.op, inner_args, a_new.attrs, a_new.type_args)})
            params = params[:i] + extra_params + params[i + 1:]
            new_args = new_args[:i] + extra_new + new_args[i + 1:]
            old_args = old_args[:i] + extra_old + old_args[i + 1:]
            absorbed += 1
            break
        else:
            break
    if absorbed:
        fn = relay.Function(params, body, None, fn.type_params, fn.attrs)
    return fn, new_args, absorbed


def _to_primitive(mod, counts):
    class _Mut(relay.ExprMutator):
        def __init__(self, uses):
            super().__init__()
            self.uses = uses

        def visit_call(self, call):
            new = super().visit_call(call)
            fn = new.op
            if isinstance(fn, relay.Function) and fn.attrs and "Composite" in fn.attrs:
                name = str(fn.attrs["Composite"])
                if name.startswith(_PREFIX):
                    entry = name[len(_PREFIX):]
                    counts[entry] = counts.get(entry, 0) + 1
                    fn, args, n_abs = _absorb_producers(fn, new.args, call.args, self.uses)
                    if n_abs:
                        logger.debug("%s: absorbed %d elementwise producer op(s)", entry, n_abs)
                    new = relay.Call(new.op, args, span=new.span)
                    fn, consts = lift_constants(fn)
                    attrs = {k: fn.attrs[k] for k in fn.attrs.keys() if k != "Composite"}
                    attrs.update({"Primitive": tvm.tir.IntImm("int32", 1), "tvm_ext.pattern": entry})
                    fn = relay.Function(fn.params, fn.body, fn.ret_type, fn.type_params,
                                        tvm.ir.make_node("DictAttrs", **attrs))
                    return relay.Call(fn, list(new.args) + consts, span=new.span)
            return new

    out = tvm.IRModule({}, mod.type_definitions)
    for gv in mod.get_global_vars():
        f = mod[gv]
        if isinstance(f, relay.Function) and not (f.attrs and ("Primitive" in f.attrs or "Compiler" in f.attrs)):
            f = relay.Function(f.params, _Mut(_use_counts(f.body)).visit(f.body), f.ret_type, f.type_params, f.attrs)
        out[gv] = f
    return relay.transform.InferType()(out)


def fused_counts(mod) -> dict:
    """``{entry name: number of kernels}`` FuseByPattern made in ``mod`` (reads ``tvm_ext.pattern``)."""
    counts: dict = {}

    def visit(e):
        if isinstance(e, relay.Function) and e.attrs and "tvm_ext.pattern" in e.attrs:
            name = str(e.attrs["tvm_ext.pattern"])
            counts[name] = counts.get(name, 0) + 1

    for gv in mod.get_global_vars():
        relay.analysis.post_order_visit(mod[gv], visit)
    return dict(sorted(counts.items()))


@register_pass("FuseByPattern")
def FuseByPattern(table):
    """Make every match of ``table`` one kernel (a ``Primitive`` function); FuseOps fuses the rest.

    Parameters
    ----------
    table : tvm_ext.patterns.PatternTable or str
        Ordered table (or the name of a registered one: ``"generic"``, ``"qnn"``). Each match that
        passes its entry's check and :func:`tvm_fusible` becomes one kernel.

    Returns
    -------
    tvm.transform.Pass
        A module pass named ``"FuseByPattern"``. Run it with
        ``tvm_ext.build(mod, passes=[FuseByPattern(table)], at="before_fuse")``.

    Raises
    ------
    ValueError
        ``table`` is not a table (at construction); at run time, a module that does not type-check.
    """
    from ..patterns import PatternTable, get_table

    if isinstance(table, str):
        table = get_table(table)
    if not isinstance(table, PatternTable):
        raise ValueError(f"FuseByPattern: expected a PatternTable or a table name, got {type(table).__name__}")
    triples = table.triples(extra_checks=[tvm_fusible], prefix=_PREFIX)

    @tvm.transform.module_pass(opt_level=0, name="FuseByPattern")
    def _fuse_by_pattern(mod, _ctx):
        try:
            typed = relay.transform.InferType()(mod)
        except tvm.TVMError as err:
            raise ValueError(f"FuseByPattern: the module does not type-check: {str(err).splitlines()[-1]}") from err
        merged = relay.transform.MergeComposite(triples)(typed)
        counts: dict = {}
        out = _to_primitive(merged, counts)
        if counts:
            logger.debug("FuseByPattern[%s]: %s", table.name, counts)
        else:
            return typed
        return out

    return _fuse_by_pattern
