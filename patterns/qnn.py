"""``qnn``: int8 conv2d / dense groups, as frontends produce them and as relay.build lowers them.

Each entry's pattern is ``source | lowered``:

* *source*: what ``relay.frontend.from_onnx`` produces. QOperator models (QLinearConv, QGemm,
  QLinearAdd) give ``qnn.conv2d -> nn.bias_add -> qnn.requantize`` and, for QLinearAdd,
  ``qnn.quantize(add(qnn.dequantize(a), qnn.dequantize(b)))``. QDQ models give float ops between
  ``qnn.dequantize``'d weights and bias and a ``qnn.quantize`` output (the activation's
  ``qnn.dequantize`` stays outside: it is often shared by two convs).
* *lowered*: what the same group looks like after relay.build's prefix (``at="before_fuse"``):
  QnnCanonicalize/Legalize have turned qnn ops into ``nn.contrib_conv2d_NCHWc``/
  ``nn.contrib_dense_pack`` plus a chain of elementwise/broadcast ops with constant operands
  (``cast, multiply, add, floor|round, clip, cast`` for requantize; ``divide, round, clip`` for
  quantize; ``subtract, cast, multiply`` for dequantize). The chain is matched by length
  (``<= MAX_EPILOGUE`` ops); checks tell the forms apart: an int32 anchor is QOperator, a float
  anchor QDQ, and the epilogue must round (``round``, ``floor`` or ``right_shift``) and clip.

After lowering, requantize's own clip and a following ``clip`` are indistinguishable: the
``*_clip`` entries match the source form only; their lowered groups land in the entry without it.
"""
from __future__ import annotations

from tvm.relay.dataflow_pattern import is_constant, is_op, wildcard

from ._table import Entry, PatternTable, Reject, register_table
from .generic import ANCHORS, anchor

__all__ = ["MAX_EPILOGUE", "epilogue", "QNN"]

#: Longest lowered epilogue matched (ops after the anchor, on each side of a residual add).
MAX_EPILOGUE = 12
_ROUNDING = {"round", "floor", "right_shift"}


def _ew_op():
    return wildcard().has_attr({"TOpPattern": 0}) | wildcard().has_attr({"TOpPattern": 1})


def epilogue(y, max_len: int = MAX_EPILOGUE, min_len: int = 1):
    """``y`` followed by ``min_len..max_len`` elementwise/broadcast ops whose other operands are constants.

    Longest first; fresh op patterns per position (a pattern node matches one expression).
    """
    if not (0 <= min_len <= max_len):
        raise ValueError(f"epilogue: need 0 <= min_len <= max_len, got {min_len}, {max_len}")
    levels = [y]
    for _ in range(max_len):
        prev = levels[-1]
        levels.append(_ew_op()(prev) | _ew_op()(prev, is_constant()) | _ew_op()(is_constant(), prev))
    alts = levels[min_len:][::-1]
    out = alts[0]
    for a in alts[1:]:
        out = out | a
    return out


def _dq(x):
    return is_op("qnn.dequantize")(x, wildcard(), wildcard())


def _q(x):
    return is_op("qnn.quantize")(x, wildcard(), wildcard())


def _comm_add(a, b):
    return is_op("add")(a, b) | is_op("add")(b, a)


def _bias(y, b):
    return is_op("nn.bias_add")(y, b) | _comm_add(y, b)


def _qo_source(kind):
    op = {"conv2d": "qnn.conv2d", "dense": "qnn.dense"}[kind]
    y = is_op(op)(wildcard(), wildcard(), wildcard(), wildcard(), wildcard(), wildcard())
    return is_op("qnn.requantize")(_bias(y, wildcard()), wildcard(), wildcard(), wildcard(), wildcard())


def _qdq_source(kind):
    # The data operand is a plain input: its dequantize is often shared (a block input feeds
    # conv1 and the downsample conv), and a shared interior node cannot join either group.
    y = is_op({"conv2d": "nn.conv2d", "dense": "nn.dense"}[kind])(wildcard(), _dq(wildcard()))
    return _q(_bias(y, _dq(wildcard())))


def _lowered(kind):
    return epilogue(anchor(kind))


def _lowered_add(kind):
    r = wildcard()
    return epilogue(_comm_add(epilogue(anchor(kind), min_len=0), r), max_len=6, min_len=0), r


def _anchor_call(ctx):
    anchors = set(ANCHORS["conv2d"] + ANCHORS["dense"])
    for c in ctx.calls:
        if c.op.name in anchors:
            return c
    return None


def _lowered_check(int_anchor: bool):
    """Accept the source form; for the lowered form require the anchor dtype and a round + clip."""

    def check(ctx):
        calls = ctx.calls
        if any(c.op.name.startswith("qnn.") for c in calls):
            return True  # source form: the pattern fixed the structure
        a = _anchor_call(ctx)
        if a is None:
            return Reject("no anchor in the match")
        dtype = a.checked_type.dtype
        if int_anchor and dtype != "int32":
            return Reject(f"anchor computes {dtype}, not int32 (not a lowered qnn op)")
        if not int_anchor and not dtype.startswith("float"):
            return Reject(f"anchor computes {dtype}, not float (not a lowered QDQ group)")
        names = {c.op.name for c in calls}
        if not names & _ROUNDING or "clip" not in names:
            return Reject(f"epilogue {sorted(names - {a.op.name})} does not round and clip (no requantize)")
        return True

    check.__name__ = "lowered_qoperator" if int_anchor else "lowered_qdq"
    return check


def _residual_check(int_anchor: bool):
    base = _lowered_check(int_anchor)

    def check(ctx):
        r = ctx.get("residual_operand")
        if r is not None and r.__class__.__name__ == "Constant":
            return Reject("residual operand is a constant")
        return base(ctx)

    check.__name__ = base.__name__ + "_residual"
    return check


def _entries():
    out = []
    # QOperator QLinearConv + QLinearAdd:
    #   quantize(dequantize(requantize(bias_add(qnn.conv2d(x, w), b))) + dequantize(r)) -> one kernel
    src = _q(_comm_add(_dq(_qo_source("conv2d")), _dq(wildcard())))
    low, r = _lowered_add("conv2d")
    out.append(Entry("qnn.conv2d_bias_requantize_add", src | low, _residual_check(True),
                     "q(dq(requantize(qnn.conv2d(x, w) + b)) + dq(r)) -> one kernel",
                     "QLinearConv + QLinearAdd (residual), source or lowered", (("residual_operand", r),)))
    for kind in ("conv2d", "dense"):
        onnx_op = {"conv2d": "QLinearConv", "dense": "QGemm"}[kind]
        # clip(requantize(qnn.<kind>(x, w) + b)) -> one kernel
        out.append(Entry(f"qnn.{kind}_bias_requantize_clip", is_op("clip")(_qo_source(kind)), _lowered_check(True),
                         f"clip(requantize(qnn.{kind}(x, w) + b)) -> one kernel",
                         f"{onnx_op} + Clip/Relu (source form only)"))
        # requantize(qnn.<kind>(x, w) + b) -> one kernel
        out.append(Entry(f"qnn.{kind}_bias_requantize", _qo_source(kind) | _lowered(kind), _lowered_check(True),
                         f"requantize(qnn.{kind}(x, w) + b) -> one kernel",
                         f"{onnx_op} (QOperator), source or lowered"))
    # QDQ: quantize(dequantize(quantize(conv2d(x, dq(w)) + dq(b))) + dq(r)) -> one kernel
    qdq_add = _q(_comm_add(_dq(_qdq_source("conv2d")), _dq(wildcard())))
    low, r = _lowered_add("conv2d")
    out.append(Entry("qnn.dq_conv2d_bias_q_add", qdq_add | low, _residual_check(False),
                     "q(dq(q(conv2d(x, dq(w)) + dq(b))) + dq(r)) -> one kernel",
                     "QDQ Conv + residual Add, source or lowered", (("residual_operand", r),)))
    for kind in ("conv2d", "dense"):
        # quantize(<kind>(x, dq(w)) + dq(b)) -> one kernel
        out.append(Entry(f"qnn.dq_{kind}_bias_q", _qdq_source(kind) | _lowered(kind), _lowered_check(False),
                         f"q({kind}(x, dq(w)) + dq(b)) -> one kernel",
                         f"QDQ {kind} + bias, source or lowered"))
    return out


QNN = register_table(PatternTable("qnn", _entries(),
                                  "int8 conv2d/dense + bias + requantize (QOperator, QDQ; source or lowered)"))
