"""Tests of tvm_ext.passes.narrow_before_max_pool (the float32 tensor in front of max_pool)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.passes.narrow_before_max_pool import NarrowBeforeMaxPool
from tvm_ext.testing import assert_same_outputs, assert_unchanged, check, infer

from _helpers import assert_unchanged_with_reason, assert_untyped_module_raises

LOGGER = "tvm_ext.passes.NarrowBeforeMaxPool"
rng = np.random.default_rng(2)
W = rng.standard_normal((8, 3, 3, 3)).astype("float32")
SCALE = np.abs(rng.standard_normal((8, 1, 1))).astype("float32") + 0.1  # bn scale, >= 0
SHIFT = rng.standard_normal((8, 1, 1)).astype("float32")


def _quantize(v, scale=8.0):
    # relay.quantize's realize: multiply, round, clip, cast
    return relay.cast(relay.clip(relay.round(relay.multiply(v, relay.const(scale))), -127.0, 127.0), "int8")


def _bn_relu(v, scale=SCALE):
    return relay.nn.relu(relay.add(relay.multiply(v, relay.const(scale)), relay.const(SHIFT)))


def _stem(x):
    return relay.nn.relu(relay.nn.conv2d(x, relay.const(W), padding=(1, 1), channels=8, kernel_size=(3, 3)))


def _pool(v):
    return relay.nn.max_pool2d(v, pool_size=(3, 3), strides=(2, 2), padding=(1, 1))


def _x():
    return relay.var("x", shape=(1, 3, 16, 16), dtype="float32")


def before():
    """conv -> relu -> max_pool -> [bn -> relu -> quantize] -> int8 consumer (a cast to int32)."""
    return infer(relay.cast(_quantize(_bn_relu(_pool(_stem(_x())))), "int32"))


def expected():
    """The pool reads the int8 value: conv -> relu -> bn -> relu -> quantize -> max_pool."""
    return infer(relay.cast(_pool(_quantize(_bn_relu(_stem(_x())))), "int32"))


def test_structure_and_idempotence():
    after = check(NarrowBeforeMaxPool(), before(), expected())
    assert_unchanged(NarrowBeforeMaxPool(), after)


def test_chain_moves_in_front_of_nested_pools_at_once():
    """f(pool(pool(x))) -> pool(pool(f(x))) in one run (the sweeps repeat until nothing moves)."""
    def graph(moved):
        s = _stem(_x())
        if moved:
            return infer(relay.cast(_pool(_pool(_quantize(_bn_relu(s)))), "int32"))
        return infer(relay.cast(_quantize(_bn_relu(_pool(_pool(s)))), "int32"))

    after = check(NarrowBeforeMaxPool(), graph(False), graph(True))
    assert_unchanged(NarrowBeforeMaxPool(), after)


def test_kernels_crossing_and_outputs():
    """Same kernels; the conv kernel writes int8 (16x16x8 B) instead of float32 (16x16x8x4 B)."""
    fb = tvm_ext.build(before())
    fa = tvm_ext.build(before(), passes=[NarrowBeforeMaxPool()])
    rb, ra = fb.kernel_report, fa.kernel_report
    assert ra.num_kernels == rb.num_kernels
    assert ra.crossing.nbytes.get("float32", 0) == rb.crossing.nbytes["float32"] - 4 * 8 * 16 * 16
    assert ra.crossing.nbytes["int8"] == rb.crossing.nbytes.get("int8", 0) + 8 * 16 * 16
    x = {"x": np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")}
    out_b, _ = assert_same_outputs(fb, fa, x, rtol=0, atol=0)  # exact, float monotonicity included
    assert len(np.unique(out_b[0])) > 10


@pytest.mark.parametrize("layout", ["NCHW16c", "NHWC"])
def test_other_layouts(layout):
    """Pooled axes come from the layout string; per-channel constants broadcast along C only."""
    if layout == "NHWC":
        x = relay.var("x", shape=(1, 9, 9, 16), dtype="float32")
        scale = np.abs(rng.standard_normal((16,))).astype("float32")
    else:
        x = relay.var("x", shape=(1, 1, 9, 9, 16), dtype="float32")
        scale = np.abs(rng.standard_normal((1, 1, 1, 1, 16))).astype("float32")
    pool = relay.nn.max_pool2d(x, pool_size=(3, 3), strides=(2, 2), padding=(1, 1), layout=layout)
    mod = infer(_quantize(relay.multiply(pool, relay.const(scale))))
    after = NarrowBeforeMaxPool()(mod)
    assert after["main"].body.op.name == "nn.max_pool2d"
    assert str(after["main"].body.checked_type.dtype) == "int8"
    xs = {"x": np.random.default_rng(1).standard_normal([int(d) for d in x.type_annotation.shape]).astype("float32")}
    assert_same_outputs(mod, after, xs, rtol=0, atol=0)


@pytest.mark.parametrize("graphs", ["quantizing", "widening"])
def test_runs_in_sequential(graphs):
    build, want = (before, expected) if graphs == "quantizing" else (before_widening, expected_widening)
    seq = tvm.transform.Sequential([NarrowBeforeMaxPool(), relay.transform.InferType()])
    with tvm.transform.PassContext(opt_level=3):
        after = seq(build())
    tvm.ir.assert_structural_equal(after, want())


def test_caller_module_not_mutated():
    mod = before()
    snapshot = mod.astext()
    NarrowBeforeMaxPool()(mod)
    assert mod.astext() == snapshot


# -- rule 2: a widening chain in front of the pool moves behind it ----------------------------------
ZP = 21


def _q8(v):
    # quantize to uint8 levels, in float (ONNX QuantizeLinear as Relay lowers it): clip(round(v*s) + zp)
    return relay.clip(relay.add(relay.round(relay.multiply(v, relay.const(8.0))), relay.const(float(ZP))), 0.0, 255.0)


def _dequantize(v):
    # DequantizeLinear: (cast(v, i32) - zp) * s; the int32 subtract is proven not to wrap ([0, 255] - 21)
    return relay.multiply(relay.cast(relay.subtract(relay.cast(v, "int32"), relay.const(ZP)), "float32"),
                          relay.const(0.125))


def before_widening():
    """conv -> q8 -> dequantize -> max_pool -> global_avg_pool (PP-OCR cls's head, QOperator)."""
    return infer(relay.nn.global_avg_pool2d(_pool(_dequantize(_q8(_stem(_x()))))))


def expected_widening():
    """The pool reads the uint8 levels; the dequantize runs on the pooled tensor."""
    return infer(relay.nn.global_avg_pool2d(_dequantize(_pool(relay.cast(_q8(_stem(_x())), "uint8")))))


def test_widening_structure_and_idempotence():
    after = check(NarrowBeforeMaxPool(), before_widening(), expected_widening())
    assert_unchanged(NarrowBeforeMaxPool(), after)


def test_widening_kernels_crossing_and_outputs():
    """Same kernels; the conv kernel writes uint8 instead of float32, and with FuseWideningIntoPool
    the pool's kernel writes uint8 too: no avoidable float32 crossing is left."""
    from tvm_ext.passes.fuse_widening_into_pool import FuseWideningIntoPool

    fb = tvm_ext.build(before_widening())
    fa = tvm_ext.build(before_widening(), passes=[NarrowBeforeMaxPool()])
    fw = tvm_ext.build(before_widening(), passes=[NarrowBeforeMaxPool(), FuseWideningIntoPool()])
    rb, ra, rw = fb.kernel_report, fa.kernel_report, fw.kernel_report
    assert ra.num_kernels == rb.num_kernels == rw.num_kernels
    assert ra.crossing.nbytes.get("float32", 0) == rb.crossing.nbytes["float32"] - 4 * 8 * 16 * 16
    assert ra.crossing.nbytes["uint8"] == rb.crossing.nbytes.get("uint8", 0) + 8 * 16 * 16
    assert rw.crossing.nbytes["uint8"] == ra.crossing.nbytes["uint8"] + 8 * 8 * 8  # the pooled levels
    assert [c.reason for c in rw.float_crossings() if not c.on_purpose] == []
    assert [c.reason for c in ra.float_crossings() if not c.on_purpose] == ["dequantize_early"]
    x = {"x": np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")}
    out_b, _ = assert_same_outputs(fb, fa, x, rtol=0, atol=0)  # exact: g(max) == max(g) for monotone g
    assert_same_outputs(fb, fw, x, rtol=0, atol=0)
    assert np.abs(out_b[0]).max() > 0


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_widening_of_typed_value(dtype):
    """A typed 8-bit tensor (here a graph input) read through cast -> multiply: the pool reads it
    and the dequantize becomes the pool's epilogue (one kernel instead of two). int8 pads with -128,
    which never wins a window that holds data."""
    x = relay.var("x", shape=(1, 8, 9, 9), dtype=dtype)
    mod = infer(_pool(relay.multiply(relay.cast(x, "float32"), relay.const(SCALE))))
    expected = infer(relay.multiply(relay.cast(_pool(x), "float32"), relay.const(SCALE)))
    after = check(NarrowBeforeMaxPool(), mod, expected)
    fb, fa = tvm_ext.build(mod), tvm_ext.build(after)
    assert fa.kernel_report.num_kernels == fb.kernel_report.num_kernels - 1
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    data = {"x": np.random.default_rng(4).integers(lo, hi, (1, 8, 9, 9)).astype(dtype)}
    assert_same_outputs(fb, fa, data, rtol=0, atol=0)


def test_widening_link_with_other_users_unchanged(caplog):
    d = _dequantize(_q8(_stem(_x())))
    scaled = relay.multiply(d, relay.const(2.0))
    mod = infer(relay.Tuple([_pool(relay.add(scaled, relay.const(1.0))), scaled]))
    _assert_rejected(mod, "multiply in front of it has other users", caplog)


def test_widening_clip_with_other_users_unchanged(caplog):
    q = _q8(_stem(_x()))
    mod = infer(relay.Tuple([_pool(_dequantize(q)), q]))
    _assert_rejected(mod, "8-bit clip in front of it has 2 users", caplog)


def test_widening_decreasing_link_unchanged(caplog):
    mod = infer(_pool(relay.multiply(_dequantize(_q8(_stem(_x()))), relay.const(-1.0))))
    _assert_rejected(mod, "negative constant", caplog)


def test_widening_integer_add_that_may_wrap_unchanged(caplog):
    x = relay.var("x", shape=(1, 8, 8, 8), dtype="uint8")
    mod = infer(_pool(relay.add(relay.cast(x, "int32"), relay.const(2**31 - 100))))
    _assert_rejected(mod, "integer add can wrap around (no proven range)", caplog)


def test_widening_without_8bit_value_unchanged(caplog):
    mod = infer(_pool(relay.multiply(_stem(_x()), relay.const(2.0))))
    _assert_rejected(mod, "no 8-bit value in front of it", caplog)


# -- no match --------------------------------------------------------------------------------------
def _assert_rejected(mod, reason, caplog):
    assert_unchanged_with_reason(NarrowBeforeMaxPool(), mod, reason, LOGGER, caplog)


def test_negative_scale_unchanged(caplog):
    """A negative bn scale makes the chain decreasing: max would have to become min."""
    neg = SCALE.copy()
    neg[3] = -0.5
    mod = infer(_quantize(_bn_relu(_pool(_stem(_x())), scale=neg)))
    _assert_rejected(mod, "negative constant", caplog)


def test_spatially_varying_constant_unchanged(caplog):
    v = _pool(_stem(_x()))  # 1x8x8x8
    mod = infer(_quantize(relay.add(v, relay.const(rng.standard_normal((1, 1, 8, 8)).astype("float32")))))
    _assert_rejected(mod, "varies along pooled axis", caplog)


def test_pool_input_with_other_users_unchanged(caplog):
    s = _stem(_x())
    mod = infer(s, _quantize(_pool(s)))
    _assert_rejected(mod, "input has other users", caplog)


def test_no_8bit_point_unchanged(caplog):
    mod = infer(relay.exp(relay.multiply(_pool(_stem(_x())), relay.const(2.0))))
    _assert_rejected(mod, "exp is not in the monotone table", caplog)


def test_wrapping_integer_add_unchanged(caplog):
    x = relay.var("x", shape=(1, 8, 8, 8), dtype="int32")
    mod = infer(relay.cast(relay.clip(relay.add(_pool(x), relay.const(5)), -128.0, 127.0), "int8"))
    _assert_rejected(mod, "integer add can wrap", caplog)


def test_unclipped_narrowing_cast_unchanged(caplog):
    mod = infer(relay.cast(relay.round(_pool(_stem(_x()))), "int8"))
    _assert_rejected(mod, "narrowing cast float32->int8 not right after a clip", caplog)


def test_window_entirely_in_padding_unchanged(caplog):
    x = relay.var("x", shape=(1, 8, 4, 4), dtype="float32")
    pool = relay.nn.max_pool2d(x, pool_size=(2, 2), strides=(2, 2), padding=(0, 0, 2, 2))
    _assert_rejected(infer(_quantize(pool)), "entirely in the padding", caplog)


def test_untyped_module_raises():
    x = _x()
    mod = tvm.IRModule.from_expr(relay.Function([x], _quantize(_pool(x))))
    assert_untyped_module_raises(NarrowBeforeMaxPool(), mod, "NarrowBeforeMaxPool")


def test_if_skipped(caplog):
    mod = before()
    c = relay.var("c", shape=(), dtype="bool")
    body = mod["main"].body
    f = infer(relay.Function(list(mod["main"].params) + [c], relay.If(c, body, body)))
    _assert_rejected(f, "If", caplog)


def test_dynamic_shapes_skipped():
    x = relay.var("x", shape=(relay.Any(), 8, 8, 8), dtype="float32")
    mod = infer(relay.Function([x], _quantize(_pool(x))))
    assert_unchanged(NarrowBeforeMaxPool(), mod)
