"""Quantized adds over every pair of uint8 inputs, and their float arithmetic in numpy.

A uint8 + uint8 -> uint8 add with a float requantize (dequantize both, add, quantize) in the three
forms tvm-ext meets it: a QDQ graph (:func:`qdq_add`), ONNX's ``QLinearAdd`` as TVM imports it
(:func:`qlinear_add_onnx`) and a QDQ conv whose residual add is fused into its epilogue
(:func:`conv_residual_add`). :func:`pairs` gives the 65,536 input pairs; :func:`reference` computes
the output in TVM's float order (each product rounded to float32, then the sum; docs/numerics.md),
and :func:`fused_reference` with one product fused into the sum (a fused multiply-add).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["AddScales", "SHAPE", "pairs", "reference", "fused_reference", "qdq_add", "qlinear_add_onnx",
           "conv_residual_add"]

#: 1 x 16 x 64 x 64 = 65,536 elements: one per (a, b) pair.
SHAPE = (1, 16, 64, 64)


@dataclass(frozen=True)
class AddScales:
    """Scales and zero points of ``q(dq(a, sa, za) + dq(b, sb, zb), sc, zc)``."""

    sa: float
    za: int
    sb: float
    zb: int
    sc: float
    zc: int


def pairs() -> tuple:
    """``(a, b)``, uint8 arrays of :data:`SHAPE` holding every pair of values once."""
    a = np.repeat(np.arange(256), 256).astype("uint8").reshape(SHAPE)
    b = np.tile(np.arange(256), 256).astype("uint8").reshape(SHAPE)
    return a, b


def _quantize(s, p: AddScales, divide: bool):
    """``clip(round(s / sc) + zc)``: TVM's round (half away from zero); ``divide=False`` multiplies by
    float32(1 / sc), as TIR rewrites a division by a constant."""
    f32 = np.float32
    y = s / f32(p.sc) if divide else s * f32(1.0 / np.float64(f32(p.sc)))
    y = y.astype(np.float64)  # exact: the rounding below in float64 has no error of its own
    r = np.sign(y) * np.floor(np.abs(y) + 0.5)
    return np.clip(r + p.zc, 0, 255).astype("uint8")


def _terms(a, b, p: AddScales):
    f32 = np.float32
    return (a.astype(np.int32) - p.za).astype(f32), f32(p.sa), (b.astype(np.int32) - p.zb).astype(f32), f32(p.sb)


def reference(a, b, p: AddScales, divide: bool = False):
    """The add in TVM's float order: ``(a - za) * sa`` and ``(b - zb) * sb`` each rounded to float32,
    then their float32 sum, then the quantize."""
    x, sa, y, sb = _terms(a, b, p)
    return _quantize(x * sa + y * sb, p, divide)


def fused_reference(a, b, p: AddScales, fused: str, divide: bool = False):
    """As :func:`reference`, with the product of operand ``fused`` (``"a"`` or ``"b"``) added to the
    other, rounded, product with one rounding (a fused multiply-add). In float64 the product is exact
    (an 9-bit integer times a 24-bit significand) and so is the sum (checked): one rounding to float32."""
    x, sa, y, sb = _terms(a, b, p)
    exact, other = (x.astype(np.float64) * np.float64(sa), y * sb) if fused == "a" else (
        y.astype(np.float64) * np.float64(sb), x * sa)
    s = exact + other.astype(np.float64)
    if not (np.array_equal(s - exact, other) and np.array_equal(s - other, exact)):
        raise ValueError("fused_reference: the float64 sum is not exact for these scales")
    return _quantize(s.astype(np.float32), p, divide)


def _dq(relay, x, scale, zp):
    return relay.qnn.op.dequantize(x, relay.const(np.float32(scale)), relay.const(zp, "int32"))


def _q(relay, x, scale, zp):
    return relay.qnn.op.quantize(x, relay.const(np.float32(scale)), relay.const(zp, "int32"), out_dtype="uint8")


def qdq_add(p: AddScales):
    """``q(dq(a) + dq(b))`` with inputs ``a`` and ``b`` (QDQ form)."""
    import tvm
    from tvm import relay

    a, b = (relay.var(n, shape=SHAPE, dtype="uint8") for n in "ab")
    out = _q(relay, relay.add(_dq(relay, a, p.sa, p.za), _dq(relay, b, p.sb, p.zb)), p.sc, p.zc)
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([a, b], out)))


def qlinear_add_onnx(p: AddScales):
    """ONNX Runtime's ``QLinearAdd`` (QOperator form), as an ONNX model."""
    from onnx import TensorProto, helper, numpy_helper

    consts = {"sa": np.array(p.sa, np.float32), "za": np.array(p.za, np.uint8),
              "sb": np.array(p.sb, np.float32), "zb": np.array(p.zb, np.uint8),
              "sc": np.array(p.sc, np.float32), "zc": np.array(p.zc, np.uint8)}
    node = helper.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["c"],
                            domain="com.microsoft")
    graph = helper.make_graph([node], "qlinear_add",
                              [helper.make_tensor_value_info(n, TensorProto.UINT8, list(SHAPE)) for n in "ab"],
                              [helper.make_tensor_value_info("c", TensorProto.UINT8, list(SHAPE))],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                   helper.make_opsetid("com.microsoft", 1)])


def conv_residual_add(p: AddScales):
    """A QDQ 1x1 conv whose output equals its input ``a`` (identity weights of scale 1, the output
    quantized with ``a``'s scale and zero point), then the residual add of ``b``: what
    ``pipelines.int8()`` builds as one kernel, an integer conv with the add in its epilogue."""
    import tvm
    from tvm import relay

    a, b = (relay.var(n, shape=SHAPE, dtype="uint8") for n in "ab")
    c = SHAPE[1]
    w = _dq(relay, relay.const(np.eye(c, dtype="int8").reshape(c, c, 1, 1)), 1.0, 0)
    conv = _q(relay, relay.nn.conv2d(_dq(relay, a, p.sa, p.za), w, channels=c, kernel_size=1), p.sa, p.za)
    out = _q(relay, relay.add(_dq(relay, conv, p.sa, p.za), _dq(relay, b, p.sb, p.zb)), p.sc, p.zc)
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([a, b], out)))
