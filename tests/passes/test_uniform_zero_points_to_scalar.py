"""Tests of tvm_ext.passes.uniform_zero_points_to_scalar."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.passes import UniformZeroPointsToScalar
from tvm_ext.testing import assert_same_outputs, assert_unchanged, check, infer, random_inputs

from _helpers import assert_unchanged_with_reason, assert_untyped_module_raises

LOGGER = "tvm_ext.passes.UniformZeroPointsToScalar"
RNG = np.random.default_rng(71)
OC = 16
W = RNG.integers(-127, 128, (OC, 8, 3, 3)).astype("int8")
W_SCALES = RNG.uniform(0.001, 0.01, OC).astype("float32")
W_SCALE = relay.const(W_SCALES)
ACC_SCALE = relay.const((np.float32(0.02) * W_SCALES).astype("float32"))


def _zp(values):
    return relay.const(np.asarray(values, "int32"))


def qconv(x, kernel_zp, requant_zp=None):
    """Per-channel qnn.conv2d + per-channel requantize to uint8, as ORT's QLinearConv imports."""
    y = relay.qnn.op.conv2d(x, relay.const(W), _zp(3), kernel_zp, relay.const(np.float32(0.02)), W_SCALE,
                            kernel_size=(3, 3), channels=OC, padding=(1, 1), out_dtype="int32")
    return relay.qnn.op.requantize(y, ACC_SCALE, _zp(0) if requant_zp is None else requant_zp,
                                   relay.const(np.float32(0.05)), _zp(128), axis=1, out_dtype="uint8")


def graph(kernel_zp, requant_zp=None):
    x = relay.var("x", shape=(1, 8, 12, 12), dtype="uint8")
    return infer(relay.Function([x], qconv(x, kernel_zp, requant_zp)))


def test_rewrites_uniform_vectors_to_scalars():
    """conv's kernel zp [0]*16 -> 0 and requantize's input zp [0]*16 -> 0; scalars stay."""
    check(UniformZeroPointsToScalar(), graph(_zp(np.zeros(OC)), _zp(np.zeros(OC))), graph(_zp(0), _zp(0)))


def test_qdq_per_axis_dequantize_and_quantize():
    """qnn.dequantize / qnn.quantize per-axis zero points too; the non-uniform one is kept."""
    x = relay.var("x", shape=(1, OC, 4, 4), dtype="uint8")
    s = relay.const(np.full(OC, 0.1, "float32"))
    uneven = _zp(np.arange(OC))

    def body(zp_a, zp_b):
        a = relay.qnn.op.dequantize(x, s, zp_a, axis=1)
        b = relay.qnn.op.quantize(a, s, zp_b, axis=1, out_dtype="int8")
        c = relay.qnn.op.dequantize(x, s, uneven, axis=1)
        return relay.Tuple([b, c])

    before = infer(relay.Function([x], body(_zp([5] * OC), _zp([-7] * OC))))
    expected = infer(relay.Function([x], body(_zp(5), _zp(-7))))
    after = check(UniformZeroPointsToScalar(), before, expected)
    assert_same_outputs(before, after, random_inputs(before, seed=2))


def test_integer_outputs_bit_exact():
    before = graph(_zp(np.zeros(OC)))
    after = UniformZeroPointsToScalar()(before)
    assert_same_outputs(before, after, random_inputs(before, seed=3))
    assert_same_outputs(before, after, random_inputs(before, seed=4))


def test_nonzero_uniform_and_depthwise_bit_exact():
    """A uniform non-zero kernel zero point (asymmetric weights) on a depthwise conv: same bits."""
    x = relay.var("x", shape=(1, OC, 10, 10), dtype="uint8")
    wd = RNG.integers(0, 256, (OC, 1, 3, 3)).astype("uint8")
    y = relay.qnn.op.conv2d(x, relay.const(wd), _zp(100), _zp([131] * OC), relay.const(np.float32(0.02)), W_SCALE,
                            kernel_size=(3, 3), channels=OC, padding=(1, 1), groups=OC, out_dtype="int32")
    before = infer(relay.Function([x], y))
    after = UniformZeroPointsToScalar()(before)
    assert "131" in after.astext() and "[131" not in after.astext().replace(" ", "")
    assert_same_outputs(before, after, random_inputs(before, seed=5))


def test_fewer_kernels_and_no_int32_crossing_when_built():
    """What the pass is for: the zero-point term kernels of TVM's canonicalization disappear."""
    before = graph(_zp(np.zeros(OC)))
    stock = tvm_ext.build(before)
    ext = tvm_ext.build(before, passes=[UniformZeroPointsToScalar()], at="start")
    assert ext.kernel_report.num_kernels < stock.kernel_report.num_kernels
    assert "int32" in stock.kernel_report.crossing.nbytes
    assert "int32" not in ext.kernel_report.crossing.nbytes
    assert_same_outputs(stock, ext, random_inputs(before, seed=6))


def test_idempotent():
    once = UniformZeroPointsToScalar()(graph(_zp(np.zeros(OC))))
    assert_unchanged(UniformZeroPointsToScalar(), once)


@pytest.mark.parametrize("zp, reason", [
    (_zp(0), "already a scalar"),
    (_zp(np.arange(OC)), "zero points differ across the axis"),
])
def test_unchanged_on_no_match_says_why(zp, reason, caplog):
    mod = graph(zp)
    assert_unchanged_with_reason(UniformZeroPointsToScalar(), mod, reason, LOGGER, caplog)


def test_non_constant_zero_point_left_alone(caplog):
    x = relay.var("x", shape=(1, 8, 12, 12), dtype="uint8")
    zp = relay.var("zp", shape=(OC,), dtype="int32")
    mod = infer(relay.Function([x, zp], qconv(x, zp)))
    assert_unchanged_with_reason(UniformZeroPointsToScalar(), mod, "not a constant", LOGGER, caplog)


def test_untyped_module_raises():
    x = relay.var("x", shape=(1, 8, 12, 12), dtype="uint8")
    untyped = tvm.IRModule.from_expr(relay.Function([x], qconv(x, _zp(np.zeros(OC)))))
    assert_untyped_module_raises(UniformZeroPointsToScalar(), untyped, "UniformZeroPointsToScalar")


def test_caller_module_not_mutated_and_works_in_sequential():
    mod = graph(_zp(np.zeros(OC)))
    text = mod.astext()
    seq = tvm.transform.Sequential([UniformZeroPointsToScalar(), relay.transform.InferType()])
    with tvm.transform.PassContext(opt_level=3):
        out = seq(mod)
    assert mod.astext() == text
    assert not tvm.ir.structural_equal(out["main"], mod["main"])
    with tvm.transform.PassContext(opt_level=3, disabled_pass=["UniformZeroPointsToScalar"]):
        tvm.ir.assert_structural_equal(seq(mod)["main"], mod["main"])
