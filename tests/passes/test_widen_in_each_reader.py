"""Tests of tvm_ext.passes.widen_in_each_reader (float32 SE-block inputs of QOperator models)."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.passes import FuseWideningIntoPool, WidenInEachReader
from tvm_ext.testing import assert_same_outputs, assert_unchanged, check, infer

from _helpers import assert_unchanged_with_reason, assert_untyped_module_raises

LOGGER = "tvm_ext.passes.WidenInEachReader"
RNG = np.random.default_rng(3)


def _x():
    return relay.var("x", shape=(1, 4, 6, 6), dtype="int32")


def _g():
    return relay.var("g", shape=(1, 4, 6, 6), dtype="float32")


def _widen(n):
    return relay.multiply(relay.cast(n, "float32"), relay.const(0.5))


def before(second=lambda v, g: relay.multiply(v, g)):
    """x -> clip[0, 255] = n -> cast f32 -> multiply 0.5 = v -+-> global_avg_pool2d -+-> multiply
                                                              +-> second(v, g) -------+
    """
    v = _widen(relay.clip(_x(), 0, 255))
    return infer(relay.multiply(second(v, _g()), relay.nn.global_avg_pool2d(v)))


def expected():
    c = relay.cast(relay.clip(_x(), 0, 255), "uint8")

    def copy():
        return _widen(relay.cast(c, "int32"))

    return infer(relay.multiply(relay.multiply(copy(), _g()), relay.nn.global_avg_pool2d(copy())))


def test_structure():
    check(WidenInEachReader(), before(), expected())


def test_idempotent():
    assert_unchanged(WidenInEachReader(), expected())


def test_numerics_bit_exact():
    mod = before()
    inputs = {"x": RNG.integers(-100, 400, (1, 4, 6, 6)).astype("int32"),
              "g": RNG.standard_normal((1, 4, 6, 6)).astype("float32")}
    out_b, out_a = assert_same_outputs(mod, WidenInEachReader()(mod), inputs, rtol=0, atol=0)
    np.testing.assert_array_equal(out_b[0], out_a[0])


def clip_read_twice():
    """x -> clip[0, 255] = n -+-> cast u8 -> global_avg_pool2d (int)   (n is the value itself: it
                              +-> multiply(n, g) -> ...                  would cross as int32)"""
    n = relay.clip(_x(), 0, 255)
    gate = relay.var("g", shape=(1, 4, 1, 1), dtype="int32")
    pooled = relay.nn.global_avg_pool2d(relay.cast(relay.cast(n, "uint8"), "float32"))
    return infer(relay.Tuple([pooled, relay.multiply(n, gate)]))


def test_structure_clip_read_twice():
    """The clip's own narrowing cast becomes the value that crosses; the other reader widens it."""
    c = relay.cast(relay.clip(_x(), 0, 255), "uint8")
    gate = relay.var("g", shape=(1, 4, 1, 1), dtype="int32")
    want = infer(relay.Tuple([relay.nn.global_avg_pool2d(relay.cast(c, "float32")),
                              relay.multiply(relay.cast(c, "int32"), gate)]))
    check(WidenInEachReader(), clip_read_twice(), want)
    assert_unchanged(WidenInEachReader(), want)


def test_build_clip_read_twice_crosses_as_uint8_bit_exact():
    mod = clip_read_twice()
    inputs = {"x": RNG.integers(-100, 400, (1, 4, 6, 6)).astype("int32"),
              "g": RNG.integers(-5, 5, (1, 4, 1, 1)).astype("int32")}
    base, new = tvm_ext.build(mod), tvm_ext.build(mod, passes={"before_fuse": [WidenInEachReader()]})
    assert new.kernel_report.num_kernels <= base.kernel_report.num_kernels
    assert "int32" in base.kernel_report.crossing.nbytes, base.kernel_report.table()
    assert "int32" not in new.kernel_report.crossing.nbytes, new.kernel_report.table()
    assert_same_outputs(base, new, inputs)


def layer_norm_of_dequantized():
    """A QDQ transformer's LayerNorm input: n (uint8, a conv's output) -> dequantize = v, read by
    mean(v) and v - mean(v) (ONNX LayerNormalization decomposed: ReduceMean, Sub, ...)."""
    x = relay.var("x", shape=(1, 8, 6, 6), dtype="float32")
    w = relay.const(RNG.standard_normal((16, 8, 1, 1)).astype("float32"))
    q = relay.cast(relay.clip(relay.round(relay.nn.conv2d(x, w, kernel_size=(1, 1), channels=16)), 0.0, 255.0),
                   "uint8")
    v = relay.multiply(relay.subtract(relay.cast(q, "float32"), relay.const(3.0)), relay.const(0.05))
    centred = relay.subtract(v, relay.mean(v, axis=[1], keepdims=True))
    return infer(relay.divide(centred, relay.sqrt(relay.add(relay.mean(relay.multiply(centred, centred), axis=[1],
                                                                       keepdims=True), relay.const(1e-5)))))


def test_reduction_reader_widens_in_its_kernel_bit_exact():
    """The conv kernel wrote v as float32 (its post-dominator lies past mean and subtract); each
    reader now widens n itself, mean included (an elementwise producer fuses into a reduction)."""
    mod = layer_norm_of_dequantized()
    base, new = tvm_ext.build(mod), tvm_ext.build(mod, passes={"before_fuse": [WidenInEachReader()]})
    rb, rn = base.kernel_report, new.kernel_report
    assert rn.num_kernels <= rb.num_kernels
    assert "float32" in rb.crossing.nbytes and rn.crossing.nbytes.get("float32", 0) < rb.crossing.nbytes["float32"]
    assert "uint8" in rn.crossing.nbytes, rn.table()
    inputs = {"x": RNG.standard_normal((1, 8, 6, 6)).astype("float32") * 40}
    # float: the widening recomputed inside the reduction's loop may be contracted into a fused
    # multiply-add by LLVM, so the last bit can differ (module note)
    assert_same_outputs(base, new, inputs, rtol=1e-6, atol=1e-6)
    after = WidenInEachReader()(mod)
    assert_unchanged(WidenInEachReader(), after)


def qnn_se_block():
    """QOperator-style squeeze-and-excitation after an integer conv::

        x(u8) -> qconv -> requantize u8 -> dequantize = v -+-> global_avg_pool2d -> sigmoid -+-> multiply -> quantize
                                                           +-----------------------------------+
    """
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="uint8")
    w = RNG.integers(-3, 4, (16, 16, 3, 3)).astype("int8")
    c = relay.qnn.op.conv2d(x, relay.const(w), relay.const(3), relay.const(0), relay.const(0.1), relay.const(0.05),
                            kernel_size=(3, 3), channels=16, padding=(1, 1), out_dtype="int32")
    y = relay.qnn.op.requantize(c, relay.const(0.005), relay.const(0), relay.const(0.1), relay.const(3),
                                out_dtype="uint8")
    v = relay.qnn.op.dequantize(y, relay.const(0.1), relay.const(3))
    m = relay.multiply(v, relay.sigmoid(relay.nn.global_avg_pool2d(v)))
    return infer(relay.qnn.op.quantize(m, relay.const(0.05), relay.const(0), out_dtype="uint8"))


def test_build_conv_writes_uint8_bit_exact(caplog):
    mod = qnn_se_block()
    x = np.random.default_rng(1).integers(0, 256, (1, 16, 8, 8)).astype("uint8")
    base = tvm_ext.build(mod, passes={"before_fuse": [FuseWideningIntoPool()]})
    with caplog.at_level(logging.INFO, logger=LOGGER):
        new = tvm_ext.build(mod, passes={"before_fuse": [WidenInEachReader(), FuseWideningIntoPool()]})
    assert "crosses as uint8; each of its 2 readers widens it" in caplog.text
    rb, rn = base.kernel_report, new.kernel_report
    assert rn.num_kernels == rb.num_kernels and rn.num_anchor_kernels == rb.num_anchor_kernels
    conv = lambda r: next(k for k in r.kernels if k.anchor == "nn.contrib_conv2d_NCHWc")  # noqa: E731
    assert conv(rb).outputs[0][1] == "float32" and conv(rn).outputs[0][1] == "uint8", (rb.table(), rn.table())
    assert rn.crossing.nbytes.get("float32", 0) < rb.crossing.nbytes["float32"] / 10
    assert_same_outputs(base, new, {"x": x})


# -- no match: unchanged, with the reason logged ----------------------------------------------
@pytest.mark.parametrize("case,reason", [
    ("conv_reader", "reader nn.conv2d is neither elementwise/broadcast, a reduction nor a pool"),
    ("no_narrow", "no 8-bit point on its private elementwise chain"),
    ("shared_middle", "an intermediate value of the chain has other readers"),
    ("one_reader_twice", "one reader, reading it more than once"),
])
def test_unchanged_on_no_match(case, reason, caplog):
    if case == "conv_reader":
        w = relay.const(RNG.standard_normal((4, 4, 1, 1)).astype("float32"))
        mod = before(second=lambda v, g: relay.nn.conv2d(v, w, kernel_size=(1, 1)))
    elif case == "no_narrow":
        v = _widen(relay.clip(_x(), 0, 1000))
        mod = infer(relay.multiply(relay.multiply(v, _g()), relay.nn.global_avg_pool2d(v)))
    elif case == "one_reader_twice":  # v * v: rewritten, its copy would again be read twice, every sweep
        v = _widen(relay.clip(_x(), 0, 255))
        mod = infer(relay.multiply(v, v))
    else:
        f = relay.cast(relay.clip(_x(), 0, 255), "float32")
        v = relay.multiply(f, relay.const(0.5))
        mod = infer(relay.Tuple([relay.multiply(v, _g()), relay.nn.global_avg_pool2d(v), f]))
    assert_unchanged_with_reason(WidenInEachReader(), mod, reason, LOGGER, caplog)


def test_untyped_module_raises():
    v = _widen(relay.clip(_x(), 0, 255))
    mod = tvm.IRModule.from_expr(relay.multiply(relay.multiply(v, _g()), relay.nn.global_avg_pool2d(v)))
    assert_untyped_module_raises(WidenInEachReader(), mod, "WidenInEachReader")


def test_in_int8_pipeline():
    names = tvm_ext.core.pipelines.int8().pass_names()["before_fuse"]
    assert names.index("WidenInEachReader") == names.index("FuseWideningIntoPool") - 1



def test_float_quantize_with_zero_point_is_the_8bit_point():
    """QOperator hard-swish: v = dequantize(clip(round(x) + 16, 0, 255)) / 6, read by the SE pool and the
    next quantize: the float clip of round + zero point is the 8-bit value that crosses."""
    xf = relay.var("xf", shape=(1, 4, 6, 6), dtype="float32")
    n = relay.clip(relay.add(relay.round(xf), relay.const(16.0)), 0.0, 255.0)

    def chain(p):  # dequantize (zero point 16, scale 0.14), then hard-swish's / 6
        d = relay.cast(relay.subtract(relay.cast(p, "int32"), relay.const(16)), "float32")
        return relay.divide(relay.multiply(d, relay.const(0.14)), relay.const(6.0))

    def graph(v1, v2):  # the next quantize's divide and the SE pool read it
        return infer(relay.Tuple([relay.round(relay.divide(v1, relay.const(0.02))), relay.nn.global_avg_pool2d(v2)]))

    v = chain(n)
    c = relay.cast(n, "uint8")
    after = check(WidenInEachReader(), graph(v, v),
                  graph(chain(relay.cast(c, "float32")), chain(relay.cast(c, "float32"))))
    assert_unchanged(WidenInEachReader(), after)


def nested():
    """PP-OCRv4 det QOperator's RSE block under ``int8()``: the dequantize's first step is shared::

        n(u8) -> cast i32 -> subtract 146 = s -+-> cast f32 -> multiply 0.74 = v -+-> global_avg_pool2d
                                               |                                 +-> add(v, g)
                                               +-> multiply(s, gi)  (qnn.mul's integer lowering)
    """
    n = relay.var("n", shape=(1, 4, 6, 6), dtype="uint8")
    gi = relay.var("gi", shape=(1, 4, 1, 1), dtype="int32")

    def s():
        return relay.subtract(relay.cast(n, "int32"), relay.const(146))

    def v(s_):
        return relay.multiply(relay.cast(s_, "float32"), relay.const(0.74))

    return n, gi, s, v


def test_structure_nested_widening_second_sweep():
    """Sweep 1 gives each reader of ``s`` its own copy, so ``v``'s chain is private; sweep 2 rewrites ``v``."""
    n, gi, s, v = nested()
    s0 = s()
    v0 = v(s0)
    before_ = infer(relay.Tuple([relay.nn.global_avg_pool2d(v0), relay.add(v0, _g()), relay.multiply(s0, gi)]))
    want = infer(relay.Tuple([relay.nn.global_avg_pool2d(v(s())), relay.add(v(s()), _g()),
                              relay.multiply(s(), gi)]))
    after = check(WidenInEachReader(), before_, want)
    assert_unchanged(WidenInEachReader(), after)
    inputs = {"n": RNG.integers(0, 256, (1, 4, 6, 6)).astype("uint8"),
              "g": RNG.standard_normal((1, 4, 6, 6)).astype("float32"),
              "gi": RNG.integers(-9, 9, (1, 4, 1, 1)).astype("int32")}
    out_b, out_a = assert_same_outputs(before_, after, inputs, rtol=0, atol=0)
    for b, a in zip(out_b, out_a):
        np.testing.assert_array_equal(b, a)
