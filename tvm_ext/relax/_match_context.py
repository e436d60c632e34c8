"""Relay checks run on Relax matches: views of the Relax expressions that look like Relay's.

A Relay entry's ``check`` runs on a :class:`RelaxMatchContext`, which offers what Relay checks use
(``get(annotation)``, ``calls``, ``root``) as views of the Relax expressions: ``.op.name`` is a
Relay op name, ``.checked_type`` has ``.shape`` and ``.dtype``, ``.args``, and the class name is
``Call`` / ``Constant`` / ``Var`` as in Relay. A check touching anything else raises, which rejects
with the error as the reason (:func:`evaluate_relax`); every rejection is logged under the entry's
name on the ``tvm_ext.relax.patterns`` logger (docs/relax.md).
"""
from __future__ import annotations

import logging
from typing import Optional

from ._translate import RelaxEntry

logger = logging.getLogger("tvm_ext.relax.patterns")

__all__ = ["RelaxMatchContext", "evaluate_relax"]


class _Type:
    def __init__(self, sinfo):
        from tvm import relax

        if not isinstance(sinfo, relax.TensorStructInfo):
            raise TypeError(f"{type(sinfo).__name__} is not a tensor (cannot reproduce a Relay type)")
        self.dtype = str(sinfo.dtype)
        self._sinfo = sinfo

    @property
    def shape(self):
        from tvm import relax, tir

        shape = self._sinfo.shape
        if not isinstance(shape, relax.ShapeExpr) or not all(isinstance(d, tir.IntImm) for d in shape.values):
            raise ValueError(f"dynamic or unknown shape {shape}")
        return [int(d) for d in shape.values]


class _OpView:
    __slots__ = ("name", "relax_name")

    def __init__(self, name, relax_name):
        self.name, self.relax_name = name, relax_name


class _View:
    """A Relax expression seen through Relay's eyes (see the module note)."""

    def __init__(self, expr, ctx: "RelaxMatchContext"):
        self.relax_expr = expr
        self._ctx = ctx

    @property
    def checked_type(self):
        return _Type(self.relax_expr.struct_info)

    def same_as(self, other):
        return self.relax_expr.same_as(getattr(other, "relax_expr", other))


class Call(_View):
    @property
    def op(self):
        return _OpView(self._ctx.relay_op_name(self.relax_expr), str(self.relax_expr.op.name))

    @property
    def args(self):
        return [self._ctx.view(a) for a in self.relax_expr.args]


class Constant(_View):
    @property
    def data(self):
        return self.relax_expr.data


class Var(_View):
    pass


class Other(_View):
    pass


class RelaxMatchContext:
    """What a Relay entry's check sees on Relax (mirrors :class:`tvm_ext.patterns.MatchContext`).

    ``relax_context`` is TVM's ``PatternCheckContext``.
    """

    def __init__(self, rentry: RelaxEntry, relax_context):
        self.entry = rentry
        self.relax_context = relax_context
        self.annotations = dict(rentry.entry.annotations)
        self._bindings = {v: e for v, e in relax_context.matched_bindings.items()}
        self._by_key = {k: e for k, e in relax_context.annotated_expr.items()}

    def _resolve(self, expr):
        from tvm import relax

        seen = 0
        while isinstance(expr, relax.Var) and expr in self._bindings and seen < 100:
            expr, seen = self._bindings[expr], seen + 1
        return expr

    def view(self, expr):
        from tvm import relax

        expr = self._resolve(expr)
        if isinstance(expr, relax.Call):
            return Call(expr, self)
        if isinstance(expr, relax.Constant):
            return Constant(expr, self)
        if isinstance(expr, relax.Var):
            return Var(expr, self)
        return Other(expr, self)

    def relay_op_name(self, call) -> str:
        """The Relay op name of the pattern node that matched ``call``.

        Several Relay ops can translate to one Relax op (``add`` and ``nn.bias_add`` both to
        ``relax.add``): when a Relay op has the Relax op's own name (``add``), that is the name,
        since only it would match this call in Relay (a Relax ``add`` is no ``bias_add``, whatever
        branch of the pattern matched it); otherwise (``relax.matmul``) the matched node's.
        """
        import tvm

        plain = str(call.op.name).removeprefix("relax.")
        try:
            tvm.ir.Op.get(plain)
            return plain
        except Exception:  # noqa: BLE001 - no Relay op of that name
            pass
        names = [n for k, n in self.entry.call_names.items()
                 if self._by_key.get(k) is not None and self._by_key[k].same_as(call)]
        return names[0] if names else plain

    @property
    def root(self):
        return self.view(self.relax_context.matched_expr)

    def get(self, name: str):
        """The expression the Relay annotation ``name`` matched (a view), or None."""
        e = self._by_key.get(name)
        return None if e is None else self.view(e)

    @property
    def calls(self) -> list:
        """Matched calls of translated Relay op patterns, post-order, root last."""
        keyed = [self._resolve(self._by_key[k]) for k in self.entry.call_names if k in self._by_key]
        order, seen = [], set()

        def visit(e):
            e = self._resolve(e)
            if e in seen:
                return
            seen.add(e)
            for a in getattr(e, "args", ()):
                visit(a)
            if any(e.same_as(k) for k in keyed):
                order.append(e)

        visit(self.relax_context.matched_expr)
        return [Call(e, self) for e in order]


def _leaks(relax_context) -> Optional[str]:
    """Name of an intermediate of the match that is used outside it (FuseTIR would duplicate it)."""
    from tvm.relax import DataflowVar

    defined = set(relax_context.matched_bindings.keys())
    out = relax_context.value_to_bound_var[relax_context.matched_expr]
    for v in defined:
        if v.same_as(out):
            continue
        if not isinstance(v, DataflowVar):
            return f"{v.name_hint} (not a dataflow var: visible outside the block)"
        users = [u for u in relax_context.var_usages.get(v, []) if u not in defined]
        if users:
            return f"{v.name_hint} (read by {', '.join(u.name_hint for u in users)})"
    return None


def evaluate_relax(rentry: RelaxEntry, relax_context, extra_checks=()) -> tuple:
    """Run the Relay entry's check (then ``extra_checks``) on a Relax match: ``(ok, reason)``.

    Rejections (a falsy result, a :class:`Reject`, or an exception: a check that cannot be
    reproduced on Relax) are logged under the entry's name.
    """
    try:
        leak = _leaks(relax_context)
    except Exception as err:  # noqa: BLE001 - never let a check error escape into FuseOpsByPattern
        leak = f"(usage analysis failed: {type(err).__name__}: {err})"
    if leak:
        reason = f"intermediate {leak} is used outside the group"
        logger.debug("%s: rejected (%s)", rentry.name, reason)
        return False, reason
    checks = ([rentry.entry.check] if rentry.entry.check is not None else []) + list(extra_checks)
    if not checks:
        return True, ""
    ctx = RelaxMatchContext(rentry, relax_context)
    for chk in checks:
        try:
            res = chk(ctx)
        except Exception as err:  # noqa: BLE001 - a check that raises rejects, with the reason
            reason = f"check cannot be evaluated on Relax: {type(err).__name__}: {err}"
            logger.debug("%s: rejected (%s)", rentry.name, reason)
            return False, reason
        if not res:
            reason = getattr(res, "reason", None) or f"check {getattr(chk, '__name__', chk)!s} returned {res!r}"
            logger.debug("%s: rejected (%s)", rentry.name, reason)
            return False, reason
    return True, ""
