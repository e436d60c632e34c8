"""Tests of tvm_ext.passes.nonnegative_conv_input_to_uint8 and the interval analysis it uses."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
import tvm_ext.tools.zoo
from tvm_ext.passes._intervals import value_ranges
from tvm_ext.passes._util import post_order
from tvm_ext.passes.nonnegative_conv_input_to_uint8 import NonNegativeConvInputToUint8
from tvm_ext.testing import assert_same_outputs, assert_unchanged, check, infer, run_module

from _helpers import assert_if_and_let_skipped, assert_unchanged_with_reason, assert_untyped_module_raises

LOGGER = "tvm_ext.passes.NonNegativeConvInputToUint8"
RNG = np.random.default_rng(60)
W_SMALL = RNG.integers(-3, 4, (16, 16, 3, 3)).astype("int8")
W_FULL = RNG.integers(-128, 128, (16, 16, 3, 3)).astype("int8")
SCALE = RNG.integers(1, 9, (16, 1, 1)).astype("int32")
BIAS = RNG.integers(-500, 500, (16, 1, 1)).astype("int32")
stop = relay.annotation.stop_fusion



def _conv(x, w=W_SMALL, **kw):
    kw.setdefault("padding", (1, 1))
    return relay.nn.conv2d(x, relay.const(w), channels=16, kernel_size=(3, 3), out_dtype="int32", **kw)


def _bn_relu_requant(x8, relu=True):
    """relay.quantize's BN + ReLU + requantize of an int8 value (v in [0, 127] with the relu)."""
    y = relay.add(relay.multiply(relay.cast(x8, "int32"), relay.const(SCALE)), relay.const(BIAS))
    y = relay.nn.relu(y) if relu else y
    return relay.clip(relay.right_shift(relay.add(y, relay.const(64)), relay.const(7)), -127, 127)


def graph(dtype="int8", barrier=True, relu=True, w=W_SMALL):
    """x:i8 -> BN -> relu -> requant -> cast(dtype) -> [stop] -> conv(w)

    ::

        x -> cast i32 -> multiply -> add -> relu -> add 64 -> >> 7 -> clip -> cast dtype -> [stop] -> conv
    """
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="int8")
    d = relay.cast(_bn_relu_requant(x, relu), dtype)
    return infer(_conv(stop(d) if barrier else d, w))


def _x():
    return {"x": RNG.integers(-128, 128, (1, 16, 8, 8)).astype("int8")}


def test_retyped_with_barrier_kept():
    check(NonNegativeConvInputToUint8(), graph(), graph("uint8"))


def test_no_shift_no_pad_kernel_bit_exact():
    stock = tvm_ext.build(graph())
    ours = tvm_ext.build(graph(), passes={"start": [NonNegativeConvInputToUint8()]})
    ops = [op for k in ours.kernel_report.kernels for op in k.ops]
    assert "nn.pad" not in ops and "subtract" not in ops
    assert_same_outputs(stock, ours, _x())  # small weights: no int16 saturation in stock either


def test_exact_where_the_shifted_stock_conv_saturates():
    """Full-range weights: the shifted data (up to 255) can saturate x86's u8*s8 int16 pair sums
    (AVX-512 without VNNI); data in [0, 127] cannot. Reference: generic llvm (no legalization)."""
    x = _x()
    exact = run_module(tvm_ext.build(graph(w=W_FULL), target="llvm"), x)[0]
    ours = run_module(tvm_ext.build(graph(w=W_FULL), passes={"start": [NonNegativeConvInputToUint8()]}), x)[0]
    np.testing.assert_array_equal(ours, exact)


def test_possibly_negative_data_unchanged(caplog):
    assert_unchanged_with_reason(NonNegativeConvInputToUint8(), graph(relu=False), "cannot prove", LOGGER, caplog)


def test_aarch64_target_unchanged(caplog):
    """aarch64's dot products take int8 x int8: a uint8 input would be shifted back by its legalization."""
    with tvm.target.Target("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1 -mattr=+neon,+dotprod"):
        assert_unchanged_with_reason(NonNegativeConvInputToUint8(), graph(), "is not x86", LOGGER, caplog)
    with tvm.target.Target("llvm -mcpu=x86-64-v3"):
        assert not tvm.ir.structural_equal(NonNegativeConvInputToUint8()(graph()), graph())


def test_overflowing_arithmetic_gives_no_bound(caplog):
    """relu(x:i32) + 64 may wrap to negative: no bound, no rewrite."""
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="int32")
    v = relay.clip(relay.right_shift(relay.add(relay.nn.relu(x), relay.const(64)), relay.const(7)), -127, 127)
    assert_unchanged_with_reason(NonNegativeConvInputToUint8(), infer(_conv(relay.cast(v, "int8"))),
                                 "cannot prove", LOGGER, caplog)


def test_other_users_keep_the_int8_cast():
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="int8")
    v = _bn_relu_requant(x)
    before = infer(_conv(relay.cast(v, "int8")), relay.abs(relay.cast(v, "int8")))
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="int8")
    v = _bn_relu_requant(x)
    expected = infer(_conv(relay.cast(v, "uint8")), relay.abs(relay.cast(v, "int8")))
    check(NonNegativeConvInputToUint8(), before, expected)


@pytest.mark.parametrize("kw, reason", [
    (dict(groups=16, padding=(1, 1)), "groups"),
    (dict(dilation=(2, 2), padding=(2, 2)), "dilation"),
])
def test_convs_the_legalization_ignores_unchanged(kw, reason, caplog):
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="int8")
    w = W_SMALL[:, :1] if "groups" in kw else W_SMALL
    d = relay.cast(_bn_relu_requant(x), "int8")
    conv = relay.nn.conv2d(d, relay.const(w), channels=16, kernel_size=(3, 3), out_dtype="int32", **kw)
    assert_unchanged_with_reason(NonNegativeConvInputToUint8(), infer(conv), reason, LOGGER, caplog)


def test_intervals():
    x = relay.var("x", shape=(4,), dtype="int8")
    y = relay.multiply(relay.cast(x, "int32"), relay.const(np.array([2, -3, 1, 0], "int32")))
    r = relay.right_shift(relay.add(relay.nn.relu(y), relay.const(64)), relay.const(7))
    f = relay.cast(relay.clip(relay.round(relay.multiply(relay.cast(x, "float32"), relay.const(16.0))), -127, 127),
                   "int8")
    mod = infer(r, f)
    ranges = value_ranges(post_order(mod["main"].body))
    body = mod["main"].body
    assert ranges[body.fields[0]] == (0, (384 + 64) >> 7)  # relu(y) in [0, 3 * 128]
    assert ranges[body.fields[1]] == (-127, 127)


# -- the zoo model ---------------------------------------------------------------------------------
# the small zoo's relay.quantize ResNet made and calibrated (about 35 s); the structure, numerics, idempotence
# and no-match tests above check the pass in the default tier
@pytest.mark.slow
def test_zoo_small_every_int8_conv_reads_uint8():
    z = tvm_ext.tools.zoo.load("resnet50_int8_relay", small=True)
    out = NonNegativeConvInputToUint8()(z.mod)
    dtypes = []
    relay.analysis.post_order_visit(out["main"], lambda n: dtypes.append(str(n.args[0].checked_type.dtype))
                                    if isinstance(n, relay.Call) and getattr(n.op, "name", "") == "nn.conv2d"
                                    else None)
    assert dtypes.count("float32") == 1 and dtypes.count("uint8") == len(dtypes) - 1


# -- properties ------------------------------------------------------------------------------------
def test_idempotent():
    assert_unchanged(NonNegativeConvInputToUint8(), NonNegativeConvInputToUint8()(graph()))


def test_unchanged_when_nothing_matches():
    assert_unchanged(NonNegativeConvInputToUint8(), graph("uint8"))


def test_untyped_module_raises():
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="int8")
    mod = tvm.IRModule.from_expr(relay.Function([x], _conv(relay.cast(relay.abs(x), "int8"))))
    assert_untyped_module_raises(NonNegativeConvInputToUint8(), mod, "NonNegativeConvInputToUint8")


def test_dynamic_shapes_skipped(caplog):
    x = relay.var("x", shape=(relay.Any(), 16, 8, 8), dtype="int8")
    d = relay.cast(_bn_relu_requant(x), "int8")
    assert_unchanged_with_reason(NonNegativeConvInputToUint8(), infer(_conv(d)), "dynamic shape", LOGGER, caplog)


def test_if_and_let_skipped(caplog):
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="int8")
    body = _conv(relay.cast(_bn_relu_requant(x), "int8"))
    assert_if_and_let_skipped(NonNegativeConvInputToUint8(), body, LOGGER, caplog)


def test_registered_and_named():
    from tvm_ext.core.registry import get_pass

    assert get_pass("NonNegativeConvInputToUint8").factory is NonNegativeConvInputToUint8
    assert NonNegativeConvInputToUint8().info.name == "NonNegativeConvInputToUint8"
