"""tvm_ext.testing.fuzz.bounds: how far QDQToInteger's moved levels carry to each output, and the
oracle's tolerance built on it (``compare_outputs``)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.relay import qnn

from tvm_ext.testing import fuzz
from tvm_ext.testing.fuzz.bounds import output_bounds

STEPS = fuzz.QDQ_STEPS


def _module(*outputs, params):
    body = outputs[0] if len(outputs) == 1 else relay.Tuple(list(outputs))
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(params, body)))


def _level_then_conv():
    """x (float) -> quantize (scale 0.05) -> qnn.conv2d 1x1 3->2 -> int32, and -> requantize -> uint8;
    the kernel's per-output sums of |w| are 6 and 9."""
    x = relay.var("x", shape=(1, 3, 2, 2), dtype="float32")
    q = qnn.op.quantize(x, relay.const(0.05), relay.const(0, "int32"), out_dtype="uint8")
    w = np.array([[1, -2, 3], [-4, 0, 5]], "int8").reshape(2, 3, 1, 1)
    acc = qnn.op.conv2d(q, relay.const(w), relay.const(0, "int32"), relay.const(0, "int32"), relay.const(0.05),
                        relay.const(0.1), kernel_size=(1, 1), channels=2, out_dtype="int32")
    out8 = qnn.op.requantize(acc, relay.const(0.005), relay.const(0, "int32"), relay.const(0.02),
                             relay.const(0, "int32"), out_dtype="uint8")
    return _module(acc, out8, params=[x])


def test_a_moved_level_carries_through_a_conv_by_its_kernel_sums():
    """A conv's int32 output moves by the moved level times its kernel's largest sum of |w| (9); a
    requantize scales that by its scale ratio (0.005 / 0.02) and rounds once more."""
    acc, out8 = output_bounds(_level_then_conv(), STEPS)
    assert acc == pytest.approx(STEPS * 9)
    assert out8 == pytest.approx(STEPS * 9 * 0.25 + 1)


def test_the_tolerance_follows_the_bound():
    """The int32 output may differ by its bound (18), not more; the 8-bit output by 5.5 rounded up."""
    bounds = output_bounds(_level_then_conv(), STEPS)
    ref = [[np.array([100, -7], "int32"), np.array([10, 20], "uint8")]]

    def got(d_acc, d_out8):
        return [[ref[0][0] + np.int32(d_acc), (ref[0][1] + np.uint8(d_out8)).astype("uint8")]]

    assert fuzz.compare_outputs(ref, got(18, 6), False, STEPS, bounds) is None
    assert "more than 18" in fuzz.compare_outputs(ref, got(19, 0), False, STEPS, bounds)
    assert "more than 6" in fuzz.compare_outputs(ref, got(0, 7), False, STEPS, bounds)
    # without QDQToInteger (no steps) both are compared bit for bit
    assert "more than 0" in fuzz.compare_outputs(ref, got(1, 0), False, 0, bounds)


def test_outputs_no_quantize_reaches_stay_exact():
    """An integer output computed from the inputs alone does not move: exact even with the steps;
    a float output that dequantizes a moved level may move that many steps of its scale."""
    x = relay.var("x", shape=(4,), dtype="float32")
    y = relay.var("y", shape=(4,), dtype="int8")
    q = qnn.op.quantize(x, relay.const(0.05), relay.const(0, "int32"), out_dtype="uint8")
    deq = qnn.op.dequantize(q, relay.const(0.05), relay.const(128, "int32"))
    plain = relay.add(relay.cast(y, "int32"), relay.const(3))
    bounds = output_bounds(_module(deq, plain, x, params=[x, y]), STEPS)
    assert bounds == [pytest.approx(STEPS * 0.05), 0.0, 0.0]
    ref = [[np.array([6.4, 0.0, 1.0, 2.0], "float32"), np.array([1, 2, 3, 4], "int32"), np.ones(4, "float32")]]
    one = [[np.array([6.35, 0.0, 1.0, 2.0], "float32"), ref[0][1], ref[0][2]]]
    three = [[np.array([6.25, 0.0, 1.0, 2.0], "float32"), ref[0][1], ref[0][2]]]
    assert "float" in fuzz.compare_outputs(ref, one, True)  # float tolerance alone
    assert fuzz.compare_outputs(ref, one, True, STEPS, bounds) is None
    assert "float" in fuzz.compare_outputs(ref, three, True, STEPS, bounds)
    off_int = [[ref[0][0], ref[0][1] + np.int32(2), ref[0][2]]]
    assert "more than 1" in fuzz.compare_outputs(ref, off_int, True, STEPS, bounds)  # one step: float graph
    off_float = [[ref[0][0], ref[0][1], np.full(4, 1.01, "float32")]]
    assert "float" in fuzz.compare_outputs(ref, off_float, True, STEPS, bounds)


def test_an_op_without_a_rule_keeps_the_fixed_steps():
    """A product of two moved tensors has no bound: that output keeps QDQ_STEPS levels; the others
    their bounds (a concat of a moved level and a constant: the level's)."""
    x = relay.var("x", shape=(1, 4), dtype="float32")
    q = relay.cast(qnn.op.quantize(x, relay.const(0.05), relay.const(0, "int32"), out_dtype="uint8"), "int32")
    square = relay.multiply(q, q)
    joined = relay.concatenate([q, relay.const(np.zeros((1, 4), "int32"))], axis=1)
    assert output_bounds(_module(square, joined, params=[x]), STEPS) == [None, pytest.approx(STEPS)]
    ref = [[np.array([[4, 9, 16, 25]], "int32"), np.zeros((1, 8), "int32")]]
    got = [[ref[0][0] + np.int32(2), ref[0][1]]]
    assert fuzz.compare_outputs(ref, got, False, STEPS, [None, STEPS]) is None
    got3 = [[ref[0][0] + np.int32(3), ref[0][1]]]
    assert "more than 2" in fuzz.compare_outputs(ref, got3, False, STEPS, [None, STEPS])


def test_a_dense_carries_a_level_by_its_row_sums_less_the_zero_points():
    """qnn.dense: the largest sum over a row of |w - kernel zero point| (per-output zero points 1, -1:
    rows [1, 2] and [3, -4] give 0 + 1 and 4 + 3)."""
    x = relay.var("x", shape=(1, 2), dtype="float32")
    q = qnn.op.quantize(x, relay.const(0.05), relay.const(0, "int32"), out_dtype="uint8")
    w = relay.const(np.array([[1, 2], [3, -4]], "int8"))
    zp = relay.const(np.array([1, -1], "int32"))
    y = qnn.op.dense(q, w, relay.const(0, "int32"), zp, relay.const(0.05), relay.const(np.array([0.1, 0.1], "float32")),
                     units=2, out_dtype="int32")
    assert output_bounds(_module(y, params=[x]), STEPS) == [pytest.approx(STEPS * 7)]


def test_a_narrowing_cast_keeps_the_bound_only_after_a_clip_into_its_range():
    """int32 -> uint8 wraps around (a level 2 past 255 lands near 0): no bound, unless a clip into
    [0, 255] comes first; widening casts keep the bound."""
    x = relay.var("x", shape=(4,), dtype="float32")
    q = relay.cast(qnn.op.quantize(x, relay.const(0.05), relay.const(0, "int32"), out_dtype="uint8"), "int32")
    shifted = relay.add(q, relay.const(100))
    outs = [relay.cast(shifted, "uint8"), relay.cast(relay.clip(shifted, 0, 255), "uint8"),
            relay.cast(relay.clip(shifted, -1, 255), "uint8"), relay.cast(q, "int64"),
            relay.add(relay.cast(q, "uint8"), relay.const(100, "uint8")),  # uint8 arithmetic wraps as well
            relay.divide(shifted, relay.const(3))]  # integer division truncates: one more step
    assert output_bounds(_module(*outs, params=[x]), STEPS) == [None, STEPS, None, STEPS, None,
                                                                 pytest.approx(STEPS / 3 + 1)]
