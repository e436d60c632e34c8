"""AddAsOnnxRuntime: a quantized add computed the way ONNX Runtime's MLAS kernel computes it.

Rewrites::

    # quantize(add(dequantize(a, sa, za), dequantize(b, sb, zb)), sc, zc)    (QLinearAdd import)
    # quantize(clip(add(...), lo, hi), sc, zc)     (QDQ Add -> Clip -> Q; when the clip is implied
    #                                               by the 8-bit range, as ORT's ClipQuantFusion drops it)
    # qnn.add(a, b, sa, za, sb, zb, sc, zc)                                  (QDQToInteger / FQ2I)
    #   -> clip(rne(fma(a, rA, fma(b, rB, k))), qmin, qmax)
    #      with rA = f32(sa / sc), rB = f32(sb / sc), k = f32(zc - f32(f32(rA * za) + f32(rB * zb)))

As data: :data:`RULES` (``tvm.relay.dataflow_pattern``); the rewrite also reads the operands' other readers.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``AddAsOnnxRuntime``.
"""
from __future__ import annotations

import numpy as np

from tvm import relay
from tvm.relay import dataflow_pattern as dfp

from tvm_ext.ops import round_half_to_even
from tvm_ext._rules import Rule, rewrites
from ._registry import register_pass

from ._doc import factory_sections
from ._util import ANCHOR_OPS, Check, Reject, op_name, pass_logger, substitution_pass

__all__ = ["AddAsOnnxRuntime", "RULES"]

PASS_NAME = "AddAsOnnxRuntime"
_log = pass_logger(PASS_NAME)
_EIGHT_BIT = {"uint8": (0, 255), "int8": (-128, 127)}


def _scalar(expr, dtype_kind: str):
    """The Python value of a scalar (or one-element) constant of kind 'f'/'i', else None."""
    if not isinstance(expr, relay.Constant):
        return None
    v = expr.data.numpy()
    if v.size != 1 or v.dtype.kind != dtype_kind:
        return None
    return v.reshape(()).item()


def _dtype(expr) -> str:
    return str(getattr(expr.checked_type, "dtype", ""))


def _check(a, b, consts, out_dtype) -> Check:
    for name, x in (("lhs", a), ("rhs", b)):
        if _dtype(x) not in _EIGHT_BIT:
            return Reject(f"{name} is {_dtype(x)}, not 8-bit")
    if out_dtype not in _EIGHT_BIT:
        return Reject(f"output is {out_dtype}, not 8-bit")
    names = ("lhs scale", "lhs zero point", "rhs scale", "rhs zero point", "output scale", "output zero point")
    for name, v in zip(names, consts):
        if v is None:
            return Reject(f"{name} is not a scalar constant (per-tensor quantization only)")
    if consts[4] == 0:
        return Reject("output scale is 0")
    return True


def _one_element_value(x):
    """The 8-bit value of a one-element constant operand (MLAS's scalar path), else None."""
    if isinstance(x, relay.Constant) and x.data.numpy().size == 1:
        return int(x.data.numpy().reshape(()))
    return None


def mlas_add(a, b, sa, za, sb, zb, sc, zc, out_dtype):
    """Relay expression of MLAS's quantized add (docs/passes.md); ``a``, ``b`` 8-bit."""
    f32 = np.float32
    ra, rb = f32(f32(sa) / f32(sc)), f32(f32(sb) / f32(sc))
    k = f32(f32(zc) - f32(f32(ra * f32(za)) + f32(rb * f32(zb))))
    lo, hi = _EIGHT_BIT[out_dtype]

    def fma(x, r, c):  # f32(x * r + c) with one rounding of the product (exact in float64)
        prod = relay.multiply(relay.cast(x, "float64"), relay.const(float(r), "float64"))
        return relay.cast(relay.add(prod, relay.cast(c, "float64") if not isinstance(c, float) else
                                    relay.const(c, "float64")), "float32")

    a_val, b_val = _one_element_value(a), _one_element_value(b)
    if b_val is not None:  # scalar B: k += b * rB (no fma), then fma(a, rA, k)
        v = fma(a, ra, float(f32(k + f32(f32(b_val) * rb))))
    elif a_val is not None:
        v = fma(b, rb, float(f32(k + f32(f32(a_val) * ra))))
    else:
        v = fma(a, ra, fma(b, rb, float(k)))
    q = relay.clip(round_half_to_even(v), lo, hi)
    return relay.cast(q, out_dtype)


def _read_by_an_anchor(deq, users) -> bool:
    """``deq`` (a dequantize) is also read by a conv/dense: that anchor keeps reading it in float."""
    return deq is not None and any(op_name(u) in ANCHOR_OPS for u, _ in users.get(deq, []))


def _recovered(deq, scale: float, zero_point: int):
    """The 8-bit value ``a`` of ``deq = f32(f32(a - z) * s)`` (TVM's dequantize), exactly, as float64:
    ``rne(f64(deq) / s) + z``. ``|a - z| <= 255`` and one float32 rounding put ``f64(deq) / s``
    within ``255 * 2**-24`` of the integer ``a - z``: rounding it to the nearest integer is exact."""
    q = relay.divide(relay.cast(deq, "float64"), relay.const(float(np.float32(scale)), "float64"))
    return relay.add(round_half_to_even(q), relay.const(float(zero_point), "float64"))


def _qnn_add(node):
    """(a, b, consts, out_dtype, dequantizes) of ``qnn.add(a, b, sa, za, sb, zb, sc, zc)``."""
    a, b = node.args[0], node.args[1]
    consts = (_scalar(node.args[2], "f"), _scalar(node.args[3], "i"), _scalar(node.args[4], "f"),
              _scalar(node.args[5], "i"), _scalar(node.args[6], "f"), _scalar(node.args[7], "i"))
    return a, b, consts, _dtype(node), (None, None)


def _quantized_add(node):
    """(a, b, consts, out_dtype, dequantizes) of ``quantize([clip](add(dequantize(a), dequantize(b))))``,
    or a Reject (a clip that computes)."""
    add = node.args[0]
    clip = None
    if op_name(add) == "clip":
        clip, add = add, add.args[0]
    deq = add.args
    (a, sa, za), (b, sb, zb) = deq[0].args[:3], deq[1].args[:3]
    consts = (_scalar(sa, "f"), _scalar(za, "i"), _scalar(sb, "f"), _scalar(zb, "i"),
              _scalar(node.args[1], "f"), _scalar(node.args[2], "i"))
    if clip is not None:
        ok = _clip_implied(clip, consts[4], consts[5], _dtype(node))
        if not ok:
            return ok
    return a, b, consts, _dtype(node), tuple(deq)


def _float_add(node):
    return Reject("add of a value that is not dequantized (float compute)")


def _dequantized_add(dfp_add):
    deq = dfp.is_op("qnn.dequantize")
    return dfp_add(deq(dfp.wildcard(), dfp.wildcard(), dfp.wildcard()), deq(dfp.wildcard(), dfp.wildcard(),
                                                                             dfp.wildcard()))


def _quantize(body):
    return dfp.is_op("qnn.quantize")(body, dfp.wildcard(), dfp.wildcard())


def _checked(operands):
    """The rules' check: ``operands(node)`` (a, b, consts, out_dtype, dequantizes) or its Reject, then
    the conditions of :func:`_check` on them."""
    def check(node, users):
        found = operands(node)
        if isinstance(found, Reject):
            return found
        ok = _check(*found[:4])
        return found if ok else ok

    return check


def _as_mlas(node, found, users):
    """The rules' rewrite: MLAS's computation of the add (:func:`mlas_add`).

    An operand whose dequantize a float conv/dense also reads is recovered from that dequantize:
    the 8-bit tensor then has one reader, the dequantize fuses into its producer's kernel, and no
    kernel of its own dequantizes it for the anchor."""
    a, b, consts, out_dtype, (deq_a, deq_b) = found
    if _read_by_an_anchor(deq_a, users) and _one_element_value(a) is None:
        a = _recovered(deq_a, consts[0], consts[1])
    if _read_by_an_anchor(deq_b, users) and _one_element_value(b) is None:
        b = _recovered(deq_b, consts[2], consts[3])
    return mlas_add(a, b, *consts, out_dtype)


#: The forms of one quantized add, in priority order; each rule's check reads the operands, their
#: scales and zero points (or says why not), its rewrite is MLAS's arithmetic (:func:`mlas_add`).
RULES = (
    # qnn.add(a, b, sa, za, sb, zb, sc, zc)                                  -> mlas_add(a, b, ...)
    Rule(f"{PASS_NAME}.qnn.add", lambda: dfp.is_op("qnn.add")(*(dfp.wildcard() for _ in range(8))),
         _checked(_qnn_add), _as_mlas),
    # quantize(add(dequantize(a, sa, za), dequantize(b, sb, zb)), sc, zc)    -> mlas_add(a, b, ...)
    Rule(f"{PASS_NAME}.qnn.quantize", lambda: _quantize(_dequantized_add(dfp.is_op("add"))),
         _checked(_quantized_add), _as_mlas, depth=3),
    # quantize(clip(add(dequantize(a), dequantize(b)), lo, hi), sc, zc)      -> mlas_add(a, b, ...)
    #     (the clip implied by the 8-bit range of the output)
    Rule(f"{PASS_NAME}.qnn.quantize", lambda: _quantize(dfp.is_op("clip")(_dequantized_add(dfp.is_op("add")))),
         _checked(_quantized_add), _as_mlas, depth=4),
    # quantize([clip](add(x, y)), sc, zc), x or y computed in float           -> unchanged (said why)
    Rule(f"{PASS_NAME}.qnn.quantize", lambda: _quantize(dfp.is_op("add")(dfp.wildcard(), dfp.wildcard())
                                                        | dfp.is_op("clip")(dfp.is_op("add")(dfp.wildcard(),
                                                                                             dfp.wildcard()))),
         _checked(_float_add), _as_mlas, depth=3),
)


def _clip_implied(clip, sc, zc, out_dtype) -> Check:
    """``quantize(clip(v, lo, hi))`` == ``quantize(v)`` when lo and hi quantize to (or past) the 8-bit ends."""
    if sc is None or zc is None or out_dtype not in _EIGHT_BIT or sc == 0:
        return Reject("clip before a quantize without scalar constant scale / zero point")
    qmin, qmax = _EIGHT_BIT[out_dtype]
    lo, hi = float(clip.attrs.a_min), float(clip.attrs.a_max)
    f32 = np.float32
    if np.rint(f32(lo) / f32(sc)) + zc > qmin or np.rint(f32(hi) / f32(sc)) + zc < qmax:
        return Reject(f"clip [{lo}, {hi}] is narrower than the 8-bit range of the output (it computes)")
    return True


def _collect(nodes, users, body) -> dict:
    """Each quantized add, replaced by MLAS's computation of it."""
    subst = rewrites(nodes, RULES, _log, users)
    if subst:
        _log.info("%s: %d quantized add(s) now computed as ONNX Runtime's MLAS does", PASS_NAME, len(subst))
    return subst


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def AddAsOnnxRuntime():  # pylint: disable=invalid-name
    """Compute quantized adds as ONNX Runtime's MLAS ``QLinearAdd`` kernel does (x86 AVX2+).

    ``quantize(add(dequantize(a), dequantize(b)))`` (TVM's import of ``QLinearAdd``) and
    ``qnn.add`` (FakeQuantizationToInteger's form of a QDQ add) with scalar constant scales and
    zero points become ``clip(rne(fma(a, rA, fma(b, rB, k))))``, MLAS's arithmetic (docs/passes.md):
    bit-exact to ONNX Runtime's QLinearAdd on the tested models, where TVM's forms differ on up to
    47 % of the levels of an add. Changes outputs: part of
    ``tvm_ext.core.pipelines.int8(numerics="onnxruntime")``, not of the default pipeline.

    Run it before relay.build's prefix (stage ``"start"``), after ``QDQToInteger``.

    Notes
    -----
    Adds with non-8-bit operands or output, non-scalar or non-constant scales or zero points, a
    float (not dequantized) operand, and functions with ``If``/``Let``/``Match``/references/closures
    are left unchanged; each reason is logged at DEBUG on ``tvm_ext.passes.AddAsOnnxRuntime``.
    """
    return substitution_pass(PASS_NAME, _collect)
