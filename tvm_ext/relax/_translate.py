"""Relay ``tvm.relay.dataflow_pattern`` trees translated to ``tvm.relax.dpl`` trees, node by node.

The translation is memoised, so a Relay sub-pattern shared by two alternatives stays one Relax node
and annotations keep pointing at it. :data:`OP_MAP` maps Relay ops to Relax call patterns (its
equations: docs/relax.md); :data:`NO_COUNTERPART` names the Relay ops Relax 0.19 lacks, with the
reason. An ``|`` alternative that cannot be translated is dropped and its reason recorded; an entry
whose every alternative is dropped has no Relax pattern and says why (:attr:`RelaxEntry.reason`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tvm_ext.patterns._table import Entry

__all__ = ["OP_MAP", "NO_COUNTERPART", "NoRelaxCounterpart", "RelaxEntry", "translate_pattern", "translate_entry"]


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


def translate_entry(entry: Entry) -> RelaxEntry:
    """The Relax form of one Relay table entry (its pattern, annotations and calls), or why there is none."""
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
