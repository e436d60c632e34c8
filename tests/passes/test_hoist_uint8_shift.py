"""Tests of tvm_ext.passes.hoist_uint8_shift (S8S8 models' lone +128 shift kernels)."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.passes import FoldPadIntoConv, FoldZeroPointPadIntoConv, HoistUint8Shift
from tvm_ext.testing import assert_same_outputs, assert_unchanged, check, infer

from _helpers import assert_unchanged_with_reason, assert_untyped_module_raises

LOGGER = "tvm_ext.passes.HoistUint8Shift"
RNG = np.random.default_rng(11)
W = RNG.integers(-3, 4, (4, 4, 3, 3)).astype("int8")


def _x():
    return relay.var("x", shape=(1, 4, 6, 6), dtype="int32")


def _conv(u8):
    return relay.nn.conv2d(u8, relay.const(W), kernel_size=(3, 3), channels=4, padding=(1, 1), out_dtype="int32")


def before(reader=lambda b: relay.subtract(b, relay.const(5, "int32")), clip=True):
    """The block input ``b`` of a residual after x86 legalization::

        x -> add 3 -> clip[-128, 127] = b -+-> add 128 -> cast u8 -> conv -+-> add
                                           +-> subtract 5 ------------------+
    """
    b = relay.add(_x(), relay.const(3, "int32"))
    if clip:
        b = relay.clip(b, -128, 127)
    s = relay.cast(relay.add(b, relay.const(128, "int32")), "uint8")
    return infer(relay.add(_conv(s), reader(b)))


def expected():
    b = relay.clip(relay.add(_x(), relay.const(3, "int32")), -128, 127)
    s = relay.cast(relay.add(b, relay.const(128, "int32")), "uint8")
    r = relay.subtract(relay.subtract(relay.cast(s, "int32"), relay.const(128, "int32")), relay.const(5, "int32"))
    return infer(relay.add(_conv(s), r))


def test_structure():
    check(HoistUint8Shift(), before(), expected())


def test_structure_int8_form():
    """x(i8) -+-> cast i32 -> add 128 -> cast u8 -> conv -+-> add      (qnn.add's lowering keeps y int8)
              +-> cast f32 -------------------------------+ """
    x = relay.var("x", shape=(1, 4, 6, 6), dtype="int8")
    y = relay.cast(relay.clip(relay.cast(x, "int32"), -100, 100), "int8")  # an op call producing int8

    def graph(other):
        s = relay.cast(relay.add(relay.cast(y, "int32"), relay.const(128, "int32")), "uint8")
        return infer(relay.add(relay.cast(_conv(s), "float32"), relay.cast(other(s), "float32")))

    unshift = lambda s: relay.cast(relay.subtract(relay.cast(s, "int32"), relay.const(128, "int32")), "int8")  # noqa: E731
    after = check(HoistUint8Shift(), graph(lambda s: y), graph(unshift))
    assert_unchanged(HoistUint8Shift(), after)


def test_structure_concatenate_reader():
    """YOLO's C2f: a branch read by the next conv (shifted) and by the block's concatenate (injective)."""
    def graph(other):
        b = relay.clip(relay.add(_x(), relay.const(3, "int32")), -128, 127)
        s = relay.cast(relay.add(b, relay.const(128, "int32")), "uint8")
        return infer(relay.concatenate([_conv(s), other(b, s)], axis=1))

    unshift = lambda b, s: relay.subtract(relay.cast(s, "int32"), relay.const(128, "int32"))  # noqa: E731
    before = graph(lambda b, s: b)
    after = check(HoistUint8Shift(), before, graph(unshift))
    assert_unchanged(HoistUint8Shift(), after)
    x = {"x": np.random.default_rng(2).integers(-400, 400, (1, 4, 6, 6)).astype("int32")}
    out_b, out_a = assert_same_outputs(before, after, x)
    np.testing.assert_array_equal(out_b[0], out_a[0])


def test_idempotent():
    assert_unchanged(HoistUint8Shift(), expected())


def test_numerics_bit_exact():
    mod = before()
    inputs = {"x": np.random.default_rng(0).integers(-400, 400, (1, 4, 6, 6)).astype("int32")}  # clip saturates too
    out_b, out_a = assert_same_outputs(mod, HoistUint8Shift()(mod), inputs)
    np.testing.assert_array_equal(out_b[0], out_a[0])


def _qconv(x, zp_in, w):
    c = relay.qnn.op.conv2d(x, relay.const(w), relay.const(zp_in), relay.const(0), relay.const(0.1), relay.const(0.05),
                            kernel_size=(3, 3), channels=w.shape[0], padding=(1, 1), out_dtype="int32")
    return relay.qnn.op.requantize(c, relay.const(0.005), relay.const(0), relay.const(0.1), relay.const(-3),
                                   out_dtype="int8")


def s8s8_residual(join):
    """S8S8 residual block in QNN::

        x(i8) -> qconv -> y(i8) -+-> qconv -> z -+-> join -> i8
                                 +---------------+

    ``join="onnx"``: dequantize, float add, quantize (TVM's import of ONNX Runtime's QLinearAdd;
    after lowering ``y`` is an int32 ``clip``); ``"qnn"``: ``qnn.add`` (``y`` stays an int8 cast).
    """
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="int8")
    w1, w2 = (RNG.integers(-3, 4, (16, 16, 3, 3)).astype("int8") for _ in range(2))
    y = _qconv(x, -3, w1)
    z = _qconv(y, -3, w2)
    s, zp, so, zo = relay.const(0.1), relay.const(-3), relay.const(0.2), relay.const(1)
    if join == "qnn":
        return infer(relay.qnn.op.add(y, z, s, zp, s, zp, so, zo))
    f = relay.add(relay.qnn.op.dequantize(y, s, zp), relay.qnn.op.dequantize(z, s, zp))
    return infer(relay.qnn.op.quantize(f, so, zo, out_dtype="int8"))


@pytest.mark.parametrize("join", ["onnx"])  # "qnn" (the int8 form) also works; its structure is tested above
def test_build_removes_shift_kernel_bit_exact(join, caplog):
    """x86 legalization shifts y for the second conv: a lone shift kernel (and, in the ONNX form, an
    int32 tensor crossing) that the hoist removes; zero-point pads folded in both builds."""
    mod = s8s8_residual(join)
    x = np.random.default_rng(1).integers(-128, 128, (1, 16, 8, 8)).astype("int8")
    pads = [FoldPadIntoConv(), FoldZeroPointPadIntoConv()]
    base = tvm_ext.build(mod, passes={"before_fuse": pads})
    with caplog.at_level(logging.INFO, logger=LOGGER):
        new = tvm_ext.build(mod, passes={"before_fuse": [HoistUint8Shift(), *pads]})
    assert caplog.text.count("shift hoisted into the producer") == 1
    rb, rn = base.kernel_report, new.kernel_report
    assert rn.num_kernels == rb.num_kernels - 1, (rb.table(), rn.table())
    assert rn.num_anchor_kernels == rb.num_anchor_kernels == 2
    assert rn.crossing.nbytes.get("int32", 0) == 0
    if join == "onnx":
        assert rb.crossing.nbytes.get("int32", 0) > 0
    assert_same_outputs(base, new, {"x": x})


def u8_residual(join):
    """The same block with uint8 activations (U8S8), as aarch64's dot-product convs read them: aarch64
    legalization shifts y (uint8) to int8 for the second conv (``cast(cast(y, int32) - 128, int8)``)."""
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="uint8")
    w1, w2 = (RNG.integers(-3, 4, (16, 16, 3, 3)).astype("int8") for _ in range(2))

    def qconv(v, w):
        c = relay.qnn.op.conv2d(v, relay.const(w), relay.const(125), relay.const(0), relay.const(0.1),
                                relay.const(0.05), kernel_size=(3, 3), channels=16, padding=(1, 1), out_dtype="int32")
        return relay.qnn.op.requantize(c, relay.const(0.005), relay.const(0), relay.const(0.1), relay.const(125),
                                       out_dtype="uint8")

    y = qconv(x, w1)
    z = qconv(y, w2)
    s, zp, so, zo = relay.const(0.1), relay.const(125), relay.const(0.2), relay.const(128)
    if join == "qnn":
        return infer(relay.qnn.op.add(y, z, s, zp, s, zp, so, zo))
    f = relay.add(relay.qnn.op.dequantize(y, s, zp), relay.qnn.op.dequantize(z, s, zp))
    return infer(relay.qnn.op.quantize(f, so, zo, out_dtype="uint8"))


def test_structure_aarch64_form():
    """y(u8) -+-> cast i32 -> add -128 -> cast i8 -> conv -+-> add
              +-> cast f32 --------------------------------+ """
    x = relay.var("x", shape=(1, 4, 6, 6), dtype="uint8")
    y = relay.cast(relay.clip(relay.cast(x, "int32"), 10, 250), "uint8")

    def graph(other):
        s = relay.cast(relay.add(relay.cast(y, "int32"), relay.const(-128, "int32")), "int8")
        return infer(relay.add(relay.cast(_conv(s), "float32"), relay.cast(other(s), "float32")))

    unshift = lambda s: relay.cast(relay.subtract(relay.cast(s, "int32"), relay.const(-128, "int32")), "uint8")  # noqa: E731
    before_mod = graph(lambda s: y)
    after = check(HoistUint8Shift(), before_mod, graph(unshift))
    assert_unchanged(HoistUint8Shift(), after)
    x_in = {"x": np.random.default_rng(4).integers(0, 256, (1, 4, 6, 6)).astype("uint8")}
    out_b, out_a = assert_same_outputs(before_mod, after, x_in)
    np.testing.assert_array_equal(out_b[0], out_a[0])


# the qnn form is the same hoist; its structure is tested above
@pytest.mark.parametrize("join", ["onnx", pytest.param("qnn", marks=pytest.mark.slow)])
def test_aarch64_build_removes_shift_kernel(join, caplog):
    """Compiled for Neoverse-N1 (+dotprod, int8 x int8 dot products; zero-point pads folded in both
    builds): the lone shift kernel is gone. Compile only; here the kernels and bytes are counted."""
    mod = u8_residual(join)
    target = "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1 -mattr=+neon,+dotprod"
    pads = [FoldPadIntoConv(), FoldZeroPointPadIntoConv()]
    base = tvm_ext.build(mod, target=target, kernels=True, passes={"before_fuse": pads})
    with caplog.at_level(logging.INFO, logger=LOGGER):
        new = tvm_ext.build(mod, target=target, kernels=True, passes={"before_fuse": [HoistUint8Shift(), *pads]})
    assert caplog.text.count("-128 int8 shift hoisted into the producer") == 1
    rb, rn = base.kernel_report, new.kernel_report
    assert rn.num_kernels == rb.num_kernels - 1, (rb.table(), rn.table())
    assert rn.crossing.total_bytes < rb.crossing.total_bytes


# -- no match: unchanged, with the reason logged ----------------------------------------------
@pytest.mark.parametrize("case,reason", [
    ("no_clip", "not proven inside [-128, 127]"),
    ("only_reader", "the shift is its only reader"),
    ("pool_reader", "reader nn.max_pool2d is not elementwise/broadcast/injective"),
])
def test_unchanged_on_no_match(case, reason, caplog):
    if case == "no_clip":
        mod = before(clip=False)
    elif case == "only_reader":
        mod = before(reader=lambda b: relay.const(0, "int32"))
    else:
        mod = before(reader=lambda b: relay.nn.max_pool2d(b, pool_size=(3, 3), padding=(1, 1)))
    assert_unchanged_with_reason(HoistUint8Shift(), mod, reason, LOGGER, caplog)


def test_untyped_module_raises():
    b = relay.clip(_x(), -128, 127)
    mod = tvm.IRModule.from_expr(relay.add(_conv(relay.cast(relay.add(b, relay.const(128)), "uint8")), b))
    assert_untyped_module_raises(HoistUint8Shift(), mod, "HoistUint8Shift")


def test_in_int8_pipeline():
    names = tvm_ext.core.pipelines.int8().pass_names()["before_fuse"]
    assert names.index("HoistUint8Shift") == names.index("CombineParallelCast") + 1
    assert names.index("HoistUint8Shift") < names.index("FoldPadIntoConv")

