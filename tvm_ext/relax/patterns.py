"""tvm-ext pattern tables on Relax: each Relay ``Entry`` becomes a Relax ``FusionPattern``.

Design note
-----------
*Same tables, translated, not re-written.* :func:`translate_table` walks every entry's Relay
``tvm.relay.dataflow_pattern`` tree and builds the equivalent ``tvm.relax.dpl`` tree node by node
(memoised, so a Relay sub-pattern shared by two alternatives stays one Relax node and annotations
keep pointing at it). Any table built with ``make_table`` / ``make_entry`` or by hand translates
the same way; there is no parallel Relax table to keep in sync.

*Op map* (:data:`OP_MAP`): Relay op -> Relax call pattern, equations::

    nn.conv2d(x, w)            -> relax.nn.conv2d(x, w)
    nn.dense(x, w)             -> relax.matmul(x, permute_dims(w)) | relax.matmul(x, w')   # w' = folded transpose
    nn.batch_matmul(x, y)      -> relax.matmul(x, permute_dims(y)) | relax.matmul(x, y)
    nn.matmul(x, y)            -> relax.matmul(x, y)
    nn.bias_add(y, b)          -> relax.add(y, b)          # frontends emit add(y, reshape(b)); FoldConstant folds it
    clip(x)                    -> relax.clip(x, lo, hi)    # Relax passes the bounds as arguments
    qnn.quantize(x, s, z)      -> relax.quantize(x, s, z)  (same for dequantize)
    op(args)                   -> relax.op(args)           # any other Relay op whose name exists in Relax

*No counterpart* (:data:`NO_COUNTERPART`): Relay ops that exist only in Relay's lowering
(``nn.contrib_conv2d_NCHWc``, ``nn.contrib_dense_pack``: AlterOpLayout output on x86; Relax 0.19
keeps NCHW), the QNN dialect (``qnn.conv2d``, ``qnn.dense``, ``qnn.requantize``: Relax 0.19 has none
and its ONNX frontend imports neither QLinearConv nor QuantizeLinear), and ``TOpPattern`` attribute
patterns (Relax ops carry no ``TOpPattern``: fusion kinds come from the TIR after ``LegalizeOps``).
An ``|`` alternative that cannot be translated is dropped and its reason recorded; an entry whose
every alternative is dropped has no Relax pattern and says why (:attr:`RelaxEntry.reason`).

*Checks.* The Relay entry's own ``check`` runs on a :class:`RelaxMatchContext`, which offers what
Relay checks use (``get(annotation)``, ``calls``, ``root``) as *views* of the Relax expressions:
``.op.name`` is a **Relay** op name (the Relax op's namesake when Relay has one: a Relax ``add``
is ``add`` even where the ``nn.bias_add`` branch matched it, since Relay would only match ``add``
there; else the name of the Relay pattern node that matched, e.g. ``nn.dense`` for
``relax.matmul``), ``.checked_type`` has
``.shape`` (ints, from the struct info) and ``.dtype``, ``.args``, and the class name is
``Call`` / ``Constant`` / ``Var`` as in Relay. A check touching anything else (Relay attrs, types
of non-tensors) raises, which rejects with the error as the reason: such a check cannot be
reproduced on Relax, and the log says so. Every rejection is logged under the entry's name on the
``tvm_ext.relax.patterns`` logger, as :func:`tvm_ext.patterns.evaluate` does on Relay.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from tvm_ext.patterns import PatternTable
from tvm_ext.patterns._table import Entry

logger = logging.getLogger("tvm_ext.relax.patterns")

__all__ = [
    "OP_MAP",
    "NO_COUNTERPART",
    "NoRelaxCounterpart",
    "RelaxEntry",
    "RelaxTable",
    "RelaxMatchContext",
    "translate_table",
    "translate_pattern",
]


class NoRelaxCounterpart(ValueError):
    """A Relay (sub-)pattern that has no Relax equivalent; the message is the reason."""


def _rx(name, arity=None):
    """Builder for ``relax.<name>(args...)`` (``arity`` pads with wildcards)."""

    def build(args):
        from tvm.relax.dpl import is_op, wildcard

        args = list(args)
        if arity is not None:
            args += [wildcard() for _ in range(arity - len(args))]
        return is_op(name)(*args)

    return build


def _matmul_t(args):
    # nn.dense(x, w) = x @ w^T
    from tvm.relax.dpl import is_op

    x, w = args
    return is_op("relax.matmul")(x, is_op("relax.permute_dims")(w)) | is_op("relax.matmul")(x, w)


#: Relay op name -> builder of the Relax pattern from the translated arguments.
OP_MAP: dict = {
    "nn.conv2d": _rx("relax.nn.conv2d"),
    "nn.conv2d_transpose": _rx("relax.nn.conv2d_transpose"),
    "nn.dense": _matmul_t,
    "nn.batch_matmul": _matmul_t,
    "nn.matmul": _rx("relax.matmul"),
    "nn.bias_add": _rx("relax.add"),
    "nn.relu": _rx("relax.nn.relu"),
    "nn.max_pool2d": _rx("relax.nn.max_pool2d"),
    "nn.avg_pool2d": _rx("relax.nn.avg_pool2d"),
    "clip": _rx("relax.clip", arity=3),
    "cast": _rx("relax.astype"),
    "transpose": _rx("relax.permute_dims"),
    "qnn.quantize": _rx("relax.quantize"),
    "qnn.dequantize": _rx("relax.dequantize"),
}

_NO_LAYOUT = ("exists only after Relay's AlterOpLayout on x86 (relay.build prefix); Relax 0.19's "
              "pipeline keeps NCHW/plain matmul and has no such op")
_NO_QNN = ("Relax 0.19 has no QNN dialect (no qnn.conv2d/qnn.dense/qnn.requantize; its ONNX frontend "
           "imports neither QLinearConv/QGemm nor QuantizeLinear/DequantizeLinear)")

#: Relay op name -> why there is no Relax counterpart.
NO_COUNTERPART: dict = {
    "nn.contrib_conv2d_NCHWc": _NO_LAYOUT,
    "nn.contrib_dense_pack": _NO_LAYOUT,
    "qnn.conv2d": _NO_QNN,
    "qnn.dense": _NO_QNN,
    "qnn.requantize": _NO_QNN,
    "qnn.add": _NO_QNN,
}


def _op_builder(relay_op: str):
    if relay_op in OP_MAP:
        return OP_MAP[relay_op]
    if relay_op in NO_COUNTERPART:
        raise NoRelaxCounterpart(f"{relay_op}: {NO_COUNTERPART[relay_op]}")
    import tvm

    for cand in ("relax." + relay_op,):
        try:
            tvm.ir.Op.get(cand)
        except Exception:  # noqa: BLE001 - TVM raises TVMError for unknown ops
            continue
        return _rx(cand)
    raise NoRelaxCounterpart(f"{relay_op}: no Relax op named relax.{relay_op} and no entry in OP_MAP")


class _Translator:
    """Relay DFPattern -> Relax DFPattern, memoised per Relay node."""

    def __init__(self):
        self.memo: dict = {}
        self.dropped: list = []  # reasons of dropped '|' alternatives
        self.calls: list = []  # (relax CallPattern(s), relay op name) for every translated Relay call

    def __call__(self, pat):
        key = pat.handle.value
        if key not in self.memo:
            self.memo[key] = (pat, self._translate(pat))  # keep pat alive: the handle is the key
        return self.memo[key][1]

    def _translate(self, pat):
        import tvm
        from tvm.relax import dpl
        from tvm.relay import dataflow_pattern as rp

        if isinstance(pat, rp.WildcardPattern):
            return dpl.wildcard()
        if isinstance(pat, rp.ConstantPattern):
            return dpl.is_const()
        if isinstance(pat, rp.AltPattern):
            left = right = None
            errs = []
            try:
                left = self(pat.left)
            except NoRelaxCounterpart as e:
                errs.append(str(e))
            try:
                right = self(pat.right)
            except NoRelaxCounterpart as e:
                errs.append(str(e))
            if left is None and right is None:
                raise NoRelaxCounterpart("; ".join(dict.fromkeys(errs)))
            self.dropped.extend(errs)
            if left is None or right is None:
                return left if right is None else right
            return left | right
        if isinstance(pat, rp.CallPattern):
            op = pat.op
            if isinstance(op, rp.ExprPattern) and isinstance(op.expr, tvm.ir.Op):
                name = str(op.expr.name)
            elif _selects_by_attr(op, "TOpPattern"):
                raise NoRelaxCounterpart(
                    "call of any op selected by TOpPattern: Relax ops carry no TOpPattern "
                    "(fusion kinds come from the TIR after LegalizeOps)")
            else:
                raise NoRelaxCounterpart(f"call of a {type(op).__name__}: only calls of named ops translate")
            build = _op_builder(name)
            args = [self(a) for a in pat.args]
            out = build(args)
            self.calls.append((out, name))
            return out
        if isinstance(pat, rp.AttrPattern):
            raise NoRelaxCounterpart(f"attribute pattern {dict(pat.attrs)}: Relay attribute names differ from Relax's")
        if isinstance(pat, rp.DataTypePattern):
            return dpl.has_dtype(str(pat.dtype), self(pat.pattern))
        if isinstance(pat, rp.TuplePattern):
            return dpl.is_tuple([self(f) for f in pat.fields])
        if isinstance(pat, rp.TupleGetItemPattern):
            return dpl.is_tuple_get_item(self(pat.tuple), int(pat.index))
        raise NoRelaxCounterpart(f"{type(pat).__name__} has no translation")


def _selects_by_attr(op_pat, attr: str) -> bool:
    """Whether a Relay op pattern (an ``|`` of ``wildcard().has_attr(...)``) selects ops by ``attr``."""
    from tvm.relay import dataflow_pattern as rp

    if isinstance(op_pat, rp.AltPattern):
        return _selects_by_attr(op_pat.left, attr) or _selects_by_attr(op_pat.right, attr)
    return isinstance(op_pat, rp.AttrPattern) and attr in dict(op_pat.attrs)


def _relax_calls_of(rx_pat) -> list:
    """The Relax CallPatterns a translated Relay call produced (one, or the branches of an ``|``)."""
    from tvm.relax import dpl

    if isinstance(rx_pat, dpl.OrPattern):
        return _relax_calls_of(rx_pat.left) + _relax_calls_of(rx_pat.right)
    return [rx_pat] if isinstance(rx_pat, dpl.CallPattern) else []


def translate_pattern(pattern):
    """Relax DFPattern for a Relay DFPattern; raises :class:`NoRelaxCounterpart` with the reason."""
    return _Translator()(pattern)


@dataclass(frozen=True)
class RelaxEntry:
    """One table entry on Relax: the Relay ``entry``, its Relax ``pattern`` (or None and ``reason``)."""

    entry: Entry
    pattern: Any = None
    reason: str = ""
    dropped: tuple = ()  # reasons of Relay alternatives without a Relax counterpart
    annotations: dict = field(default_factory=dict)  # name -> relax pattern (Relay annotations + call keys)
    call_names: dict = field(default_factory=dict)  # call key -> Relay op name

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def translated(self) -> bool:
        return self.pattern is not None


def _translate_entry(entry: Entry) -> RelaxEntry:
    tr = _Translator()
    try:
        pat = tr(entry.pattern)
    except NoRelaxCounterpart as e:
        return RelaxEntry(entry, None, str(e))
    annotations, call_names = {}, {}
    for name, rpat in entry.annotations:
        key = rpat.handle.value
        if key in tr.memo:
            annotations[name] = tr.memo[key][1]
    i = 0
    for rx, relay_name in tr.calls:
        for c in _relax_calls_of(rx):
            key = f"__call{i}"
            annotations[key] = c
            call_names[key] = relay_name
            i += 1
    return RelaxEntry(entry, pat, "", tuple(dict.fromkeys(tr.dropped)), annotations, call_names)


# -- checks ------------------------------------------------------------------------------------
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


class RelaxTable:
    """A :class:`~tvm_ext.patterns.PatternTable` translated to Relax, in the same order."""

    def __init__(self, table: PatternTable, entries):
        self.table = table
        self.entries: tuple = tuple(entries)

    name = property(lambda self: self.table.name)

    def __iter__(self):
        return iter(self.entries)

    def __len__(self):
        return len(self.entries)

    def __getitem__(self, key) -> RelaxEntry:
        for e in self.entries:
            if e.name == key:
                return e
        raise KeyError(f"no entry {key!r} in pattern table {self.name!r}")

    @property
    def translated(self) -> list:
        return [e for e in self.entries if e.translated]

    @property
    def untranslated(self) -> list:
        return [e for e in self.entries if not e.translated]

    def fusion_patterns(self, extra_checks=(), on_reject: Optional[Callable] = None) -> list:
        """``[FusionPattern(name, pattern, annotations, check), ...]`` for ``FuseOpsByPattern``.

        ``on_reject(name, reason)`` is called for every rejected match (besides the log).
        """
        from tvm.relax.transform import FusionPattern

        out = []
        for e in self.translated:

            def check(relax_context, _e=e):
                ok, reason = evaluate_relax(_e, relax_context, extra_checks)
                if not ok and on_reject is not None:
                    on_reject(_e.name, reason)
                return ok

            out.append(FusionPattern(e.name, e.pattern, e.annotations, check))
        return out

    def listing(self) -> list:
        """One line per entry: name, then the Relay summary or ``no Relax counterpart: why``."""
        width = max(len(e.name) for e in self.entries)
        lines = []
        for e in self.entries:
            if e.translated:
                note = e.entry.summary
                if e.dropped:
                    note += f"  [dropped: {'; '.join(e.dropped)}]"
            else:
                note = f"no Relax counterpart: {e.reason}"
            lines.append(f"{e.name.ljust(width)}  {note}")
        return lines

    def __repr__(self) -> str:
        return f"RelaxTable({self.name!r}, {len(self.translated)}/{len(self.entries)} entries translated)"


def translate_table(table: PatternTable) -> RelaxTable:
    """Translate every entry of ``table`` (same names, same order, same checks) to Relax.

    Parameters
    ----------
    table : tvm_ext.patterns.PatternTable
        Any table: ``GENERIC``, ``QNN``, or one built with ``make_table``.

    Returns
    -------
    RelaxTable
        Entries with a Relax ``pattern`` or, where none exists, the ``reason``.
    """
    if not isinstance(table, PatternTable):
        raise ValueError(f"translate_table: expected a PatternTable, got {type(table).__name__}")
    return RelaxTable(table, [_translate_entry(e) for e in table])

