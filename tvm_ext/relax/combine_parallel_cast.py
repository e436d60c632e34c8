"""CombineParallelCast on Relax: parallel narrowing ``R.astype`` of one value become one.

Design note
-----------
The rule and its reasons are the Relay pass's (:mod:`tvm_ext.passes.combine_parallel_cast`)::

    # astype(x, t), ..., astype(x, t)   -> c = astype(x, t); c, ..., c
    # needs: >= min_num_branches casts, narrowing (is_narrowing_cast), x produced by a fusable op
    # call, the casts are x's only users, x is not the function's result

The producer's fusion kind is the ``TOpPattern`` of its Relay namesake for a high-level op, or its
PrimFunc's ``op_pattern`` for an ``R.call_tir``. The pass works on the ``VarBinding``s of every
Relax function; the merged casts' variables are remapped to the first cast's variable and their
bindings dropped. Not implemented on Relax: the downstream propagation of merges and the
after-FuseOps rule. Merges are logged at INFO and rejections at DEBUG on
``tvm_ext.relax.CombineParallelCast``; the caller's module is never modified. Why, and the
differences from the Relay pass: docs/relax.md, section "CombineParallelCast on Relax".
"""
from __future__ import annotations

import logging

from tvm_ext.passes.combine_parallel_cast import is_narrowing_cast
from tvm_ext.patterns import Reject

__all__ = ["CombineParallelCast"]

PASS_NAME = "CombineParallelCast"
_log = logging.getLogger(f"tvm_ext.relax.{PASS_NAME}")
_K_INJECTIVE, _K_OUT_EWISE_FUSABLE = 2, 4
#: Relax op (without "relax.") -> Relay namesake, where the names differ.
_RELAY_NAME = {"matmul": "nn.matmul", "astype": "cast", "permute_dims": "transpose"}


def _astype_dtype(expr):
    import tvm
    from tvm import relax

    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.astype":
        return str(expr.attrs.dtype)
    return None


def _producer_kind(mod, value):
    """(name, fusion kind) of the op call ``value``, or a Reject."""
    import tvm
    from tvm import relax, tir

    from tvm_ext.core.report import op_pattern

    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        name = str(value.op.name)
        if name in ("relax.call_tir", "relax.call_tir_inplace"):
            gv = value.args[0]
            func = mod[gv] if mod is not None else None
            if isinstance(func, tir.PrimFunc) and func.attrs is not None and "op_pattern" in func.attrs:
                return gv.name_hint, int(func.attrs["op_pattern"])
            return gv.name_hint, 8
        short = name.removeprefix("relax.")
        return name, op_pattern(_RELAY_NAME.get(short, short))
    if isinstance(value, relax.Call):
        return "a function call", 8
    return type(value).__name__, None


def _check(mod, x, value, casts, users, returned):
    from tvm import relax

    src = x.struct_info.dtype if isinstance(x.struct_info, relax.TensorStructInfo) else None
    if src is None:
        return Reject("cast input is not a tensor")
    ok = is_narrowing_cast(str(src), _astype_dtype(casts[0][1]))
    if not ok:
        return ok
    if x in returned:
        return Reject("the producer is also the function's result")
    if value is None:
        return Reject(f"producer is parameter {x.name_hint}: the merged cast would be a kernel of its own")
    if isinstance(value, relax.Constant):
        return Reject("producer is a constant (FoldConstant's job)")
    name, kind = _producer_kind(mod, value)
    if kind is None:
        return Reject(f"producer is a {name}, not an op call FuseOps fuses a cast into")
    if not (kind <= _K_INJECTIVE or kind == _K_OUT_EWISE_FUSABLE):
        return Reject(f"producer {name} has fusion kind {kind}: FuseOps fuses no consumer into it")
    cast_vars = {v for v, _ in casts}
    others = [u for u in users if u not in cast_vars]
    if others:
        return Reject(f"producer {name} has other users ({', '.join(sorted(u.name_hint for u in others))}): "
                      "the merged cast would not fuse")
    return True


def _plan(mod, func, min_num_branches):
    """``{dropped cast var: kept cast var}`` for one function."""
    from tvm import relax

    values, users, order = {}, {}, []
    returned = set()

    def uses(expr):
        found = []
        relax.analysis.post_order_visit(expr, lambda e: found.append(e) if isinstance(e, relax.Var) else None)
        return found

    for block in func.body.blocks:
        for b in block.bindings:
            if isinstance(b, relax.VarBinding):
                values[b.var] = b.value
                order.append(b.var)
                for u in uses(b.value):
                    users.setdefault(u, []).append(b.var)
            else:
                for u in uses(b.value):
                    users.setdefault(u, []).append(b.var)
    for u in uses(func.body.body):
        returned.add(u)
    plan = {}
    for x in list(func.params) + order:
        groups: dict = {}
        for u in dict.fromkeys(users.get(x, [])):
            v = values.get(u)
            dt = _astype_dtype(v)
            if dt is not None and v.args[0].same_as(x):
                groups.setdefault(dt, []).append((u, v))
        for dt, casts in groups.items():
            if len(casts) < min_num_branches:
                continue
            ok = _check(mod, x, values.get(x), casts, list(dict.fromkeys(users.get(x, []))), returned)
            if not ok:
                _log.debug("%s: %d casts to %s of %s not merged: %s", PASS_NAME, len(casts), dt, x.name_hint, ok.reason)
                continue
            _log.info("%s: merged %d casts to %s of %s into one", PASS_NAME, len(casts), dt, x.name_hint)
            for v, _ in casts[1:]:
                plan[v] = casts[0][0]
    return plan


def _apply(func, plan):
    from tvm import relax

    @relax.expr_functor.mutator
    class _Merge(relax.PyExprMutator):
        def visit_var_binding_(self, binding):
            if binding.var in plan:
                self.set_var_remap(binding.var.vid, self.visit_expr(plan[binding.var]))
                return
            super().visit_var_binding_(binding)

    return _Merge().visit_expr(func)


def CombineParallelCast(min_num_branches: int = 2):
    """Merge ``min_num_branches`` or more identical narrowing ``R.astype`` of one value into one.

    Parameters
    ----------
    min_num_branches : int
        Smallest number of parallel casts merged (>= 2).

    Returns
    -------
    tvm.transform.Pass
        A Relax function pass named ``CombineParallelCast``.

    Raises
    ------
    ValueError
        If ``min_num_branches`` is not an int >= 2.
    """
    import tvm
    from tvm import relax

    if not isinstance(min_num_branches, int) or isinstance(min_num_branches, bool) or min_num_branches < 2:
        raise ValueError(f"{PASS_NAME}: min_num_branches must be an int >= 2, got {min_num_branches!r}")

    @relax.transform.function_pass(opt_level=0, name=PASS_NAME)
    def _pass(func, mod, _ctx):
        if func.attrs is not None and ("Primitive" in func.attrs or "Composite" in func.attrs):
            return func
        if not isinstance(func.body, relax.SeqExpr):
            _log.debug("%s: skipped a function whose body is not normalized (no SeqExpr)", PASS_NAME)
            return func
        plan = _plan(mod, func, min_num_branches)
        if not plan:
            return func
        try:
            return _apply(func, plan)
        except tvm.TVMError as err:
            raise RuntimeError(f"{PASS_NAME}: rewriting failed: {str(err).splitlines()[-1]}") from err

    return _pass
