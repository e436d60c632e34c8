"""Tests of tvm_ext.passes.epilogue_before_channel_slice (int32 crossing after a conv's channel slice).

Three head forms: x86's ``strided_slice(layout_transform(y))``, and aarch64's slice of whole channel
blocks, ``layout_transform(strided_slice(y))`` or the slice alone (the region then reads the blocks).
"""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.passes import EpilogueBeforeChannelSlice
from tvm_ext.testing import assert_same_outputs, assert_unchanged, check, infer

from _helpers import assert_unchanged_with_reason, assert_untyped_module_raises

LOGGER = "tvm_ext.passes.EpilogueBeforeChannelSlice"
RNG = np.random.default_rng(5)
C = 12  # real channels; the blocked conv has 16
ZP = RNG.integers(-50, 50, (1, C, 1, 1)).astype("int32")
SCALE = RNG.uniform(0.001, 0.01, (1, C, 1, 1)).astype("float32")


def _y():
    return relay.var("y", shape=(1, 1, 5, 6, 16), dtype="int32")  # conv accumulators, NCHW16c


def _slice(x, c=C):
    lt = relay.layout_transform(x, "NCHW16c", "NCHW")
    return relay.strided_slice(lt, begin=[0, 0, 0, 0], end=[1, c, 5, 6])


def _requantize(v, zp, scale, tail=True):
    """subtract zp (per channel) -> cast f32 -> multiply scale (per channel) -> add 3.5 -> floor -> cast
    -> clip [0, 255] [-> cast u8]: the requantize QNN lowering leaves."""
    v = relay.multiply(relay.cast(relay.subtract(v, zp), "float32"), scale)
    v = relay.clip(relay.cast(relay.floor(relay.add(v, relay.const(3.5))), "int32"), 0, 255)
    return relay.cast(v, "uint8") if tail else v


def _blocked(a):
    a = np.pad(a, ((0, 0), (0, 16 - C), (0, 0), (0, 0)), mode="edge")
    return relay.const(np.ascontiguousarray(a.reshape(1, 1, 16, 1, 1).transpose(0, 1, 3, 4, 2)))


def before(tail=True):
    """y -> layout_transform(NCHW16c -> NCHW) -> strided_slice(12 of 16 channels) -> requantize [-> cast u8]
    -> max_pool2d (not elementwise: the region ends before it)"""
    r = _requantize(_slice(_y()), relay.const(ZP), relay.const(SCALE), tail)
    return infer(relay.nn.max_pool2d(r, pool_size=(2, 2)))


def expected(tail=True):
    r = _requantize(_y(), _blocked(ZP), _blocked(SCALE), tail)
    if tail:
        return infer(relay.nn.max_pool2d(_slice(r), pool_size=(2, 2)))
    s = relay.cast(_slice(relay.cast(r, "uint8")), "int32")  # the clip end: 8 bits across the slice
    return infer(relay.nn.max_pool2d(s, pool_size=(2, 2)))


@pytest.mark.parametrize("tail", [True, False], ids=["uint8_end", "clip_end"])
def test_structure(tail):
    check(EpilogueBeforeChannelSlice(), before(tail), expected(tail))


@pytest.mark.parametrize("tail", [True, False], ids=["uint8_end", "clip_end"])
def test_idempotent(tail):
    assert_unchanged(EpilogueBeforeChannelSlice(), expected(tail))


def test_numerics_bit_exact():
    mod = before()
    y = np.random.default_rng(0).integers(-60000, 60000, (1, 1, 5, 6, 16)).astype("int32")
    out_b, out_a = assert_same_outputs(mod, EpilogueBeforeChannelSlice()(mod), {"y": y})
    np.testing.assert_array_equal(out_b[0], out_a[0])


def qnn_conv_chain(per_channel=False):
    """uint8 x -> qconv (12 output channels: x86 pads them to 16) -> requantize -> qconv (12) -> requantize;
    ``per_channel``: the requantizes' input scales per output channel (fixed_point_multiply_per_axis)."""
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="uint8")
    v = x
    for cin in (16, 12):
        w = RNG.integers(-3, 4, (C, cin, 3, 3)).astype("int8")
        w_scale = RNG.uniform(0.01, 0.05, C).astype("float32")
        c = relay.qnn.op.conv2d(v, relay.const(w), relay.const(3), relay.const(0), relay.const(0.1),
                                relay.const(w_scale), kernel_size=(3, 3), channels=C, padding=(1, 1), out_dtype="int32")
        in_scale = relay.const(0.1 * w_scale) if per_channel else relay.const(0.002)
        v = relay.qnn.op.requantize(c, in_scale, relay.const(0), relay.const(0.1), relay.const(3), axis=1,
                                    out_dtype="uint8")
    return infer(v)


# -- aarch64: the slice takes whole channel blocks of y, before the layout change or without one ----------
K4 = 4  # NCHW4c: 16 channels in 4 blocks, 12 in 3


def _y4():
    return relay.var("y", shape=(1, 4, 5, 6, K4), dtype="int32")


def _block_slice(x, blocks=C // K4):
    return relay.strided_slice(x, begin=[0, 0, 0, 0], end=[1, blocks, 5, 6])


def _as_blocks(a, blocks):
    """(1, C, 1, 1) -> (1, C/4, 1, 1, 4), padded with the last channel's value to ``blocks`` blocks."""
    a = np.pad(a, ((0, 0), (0, blocks * K4 - a.shape[1]), (0, 0), (0, 0)), mode="edge")
    return np.ascontiguousarray(a.reshape(1, blocks, K4, 1, 1).transpose(0, 1, 3, 4, 2))


def before_aarch64(form):
    """y (NCHW4c, 16 channels) -> strided_slice(3 of 4 blocks) [-> layout_transform(NCHW4c -> NCHW)]
    -> requantize -> cast u8 -> max_pool2d"""
    if form == "layout_transform_of_slice":
        head = relay.layout_transform(_block_slice(_y4()), "NCHW4c", "NCHW")
        r = _requantize(head, relay.const(ZP), relay.const(SCALE))
        return infer(relay.nn.max_pool2d(r, pool_size=(2, 2)))
    r = _requantize(_block_slice(_y4()), relay.const(_as_blocks(ZP, 3)), relay.const(_as_blocks(SCALE, 3)))
    return infer(relay.nn.max_pool2d(r, pool_size=(2, 2), layout="NCHW4c"))


def expected_aarch64(form):
    if form == "layout_transform_of_slice":  # (1, C, 1, 1) constants padded per channel, then blocked
        r = _requantize(_y4(), relay.const(_as_blocks(ZP, 4)), relay.const(_as_blocks(SCALE, 4)))
        return infer(relay.nn.max_pool2d(relay.layout_transform(_block_slice(r), "NCHW4c", "NCHW"), pool_size=(2, 2)))
    def pad_block(a):  # (1, C/4, 1, 1, 4) constants: the last block repeated
        return relay.const(np.pad(_as_blocks(a, 3), ((0, 0), (0, 1), (0, 0), (0, 0), (0, 0)), mode="edge"))

    r = _requantize(_y4(), pad_block(ZP), pad_block(SCALE))
    return infer(relay.nn.max_pool2d(_block_slice(r), pool_size=(2, 2), layout="NCHW4c"))


AARCH64_FORMS = ["layout_transform_of_slice", "slice_of_blocks"]


@pytest.mark.parametrize("form", AARCH64_FORMS)
def test_structure_aarch64(form, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        check(EpilogueBeforeChannelSlice(), before_aarch64(form), expected_aarch64(form))
    assert f"EpilogueBeforeChannelSlice.{form}" in caplog.text


@pytest.mark.parametrize("form", AARCH64_FORMS)
def test_idempotent_aarch64(form):
    assert_unchanged(EpilogueBeforeChannelSlice(), expected_aarch64(form))


@pytest.mark.parametrize("form", AARCH64_FORMS)
def test_numerics_bit_exact_aarch64(form):
    mod = before_aarch64(form)
    y = np.random.default_rng(2).integers(-60000, 60000, (1, 4, 5, 6, K4)).astype("int32")
    out_b, out_a = assert_same_outputs(mod, EpilogueBeforeChannelSlice()(mod), {"y": y})
    np.testing.assert_array_equal(out_b[0], out_a[0])


@pytest.mark.parametrize("case,reason", [
    ("blocked_spatial_slice", "slices other axes than channels"),
    ("slice_read_outside", "the slice has other readers"),
    ("per_pixel_constant", "no 8-bit value ends a closed elementwise region"),
    ("other_layout_after_slice", "not NCHW<k>c -> NCHW"),
])
def test_unchanged_on_no_match_aarch64(case, reason, caplog):
    y = _y4()
    if case == "blocked_spatial_slice":
        sl = relay.strided_slice(y, begin=[0, 0, 0, 0], end=[1, 4, 4, 6])
        mod = infer(relay.cast(relay.clip(sl, 0, 255), "uint8"))
    elif case == "slice_read_outside":  # the int32 slice is also returned: it must stay
        sl = _block_slice(y)
        lt = relay.layout_transform(sl, "NCHW4c", "NCHW")
        mod = infer(relay.Tuple([relay.cast(relay.clip(lt, 0, 255), "uint8"), sl]))
    elif case == "per_pixel_constant":  # varies over H: not per channel
        c = relay.const(RNG.integers(0, 5, (1, 1, 5, 1, 1)).astype("int32"))
        mod = infer(relay.cast(relay.clip(relay.add(_block_slice(y), c), 0, 255), "uint8"))
    else:
        lt = relay.layout_transform(_block_slice(y), "NCHW4c", "NHWC")
        mod = infer(relay.cast(relay.clip(lt, 0, 255), "uint8"))
    assert_unchanged_with_reason(EpilogueBeforeChannelSlice(), mod, reason, LOGGER, caplog)


# the diagonal runs by default: each CPU once, each scale form once (the other two are slow)
@pytest.mark.parametrize("cpu, per_channel", [
    ("neoverse-n1", True), ("neoverse-v1", False),
    pytest.param("neoverse-n1", False, marks=pytest.mark.slow),
    pytest.param("neoverse-v1", True, marks=pytest.mark.slow)], ids=["n1-per_channel", "v1-per_tensor",
                                                                     "n1-per_tensor", "v1-per_channel"])
def test_aarch64_build_removes_int32_crossing(cpu, per_channel, caplog):
    """Compiled only: at Neoverse-N1 the 12-channel convs are NCHW4c and the slice takes 3 of 4 blocks;
    at Neoverse-V1 they are NCHW8c and x86's form appears (12 is no multiple of 8). Per channel, the
    requantizes are fixed_point_multiply_per_axis at aarch64 (x86's int64 requantize broadcasts instead)."""
    from tvm.target import codegen

    from tvm_ext.testing.aarch64 import TARGETS

    if "aarch64" not in list(codegen.llvm_get_targets()):
        pytest.skip("this TVM's LLVM has no AArch64 back end")
    mod = qnn_conv_chain(per_channel)
    base = tvm_ext.build(mod, target=TARGETS[cpu], kernels=True)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        new = tvm_ext.build(mod, target=TARGETS[cpu], kernels=True,
                            passes={"before_fuse": [EpilogueBeforeChannelSlice()]})
    assert caplog.text.count("elementwise ops moved in front of it") == 2
    rb, rn = base.kernel_report, new.kernel_report
    assert rb.crossing.nbytes.get("int32", 0) > 0 and rn.crossing.nbytes.get("int32", 0) == 0, (rb.table(), rn.table())
    assert rn.num_kernels == rb.num_kernels and rn.num_anchor_kernels == rb.num_anchor_kernels


def test_build_removes_int32_crossing_bit_exact(caplog):
    mod = qnn_conv_chain()
    x = np.random.default_rng(1).integers(0, 256, (1, 16, 8, 8)).astype("uint8")
    base = tvm_ext.build(mod)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        new = tvm_ext.build(mod, passes={"before_fuse": [EpilogueBeforeChannelSlice()]})
    assert caplog.text.count("elementwise ops moved in front of it") == 2
    rb, rn = base.kernel_report, new.kernel_report
    assert rb.crossing.nbytes.get("int32", 0) > 0 and rn.crossing.nbytes.get("int32", 0) == 0, (rb.table(), rn.table())
    assert rn.num_kernels == rb.num_kernels and rn.num_anchor_kernels == rb.num_anchor_kernels
    assert_same_outputs(base, new, {"x": x})


# -- per-axis requantize: fixed_point_multiply_per_axis indexes its constants by the data's axes ------------
M = RNG.integers(2**30, 2**31 - 1, C).astype("int32")  # Q31 multipliers, per channel
LSHIFT = RNG.integers(0, 3, C).astype("int32")
RSHIFT = RNG.integers(2, 10, C).astype("int32")


def _fpm_per_axis(v, consts, axes):
    """round(v * 2^l * m / 2^(31 + r)) (the per-channel requantize QNN lowering leaves), constants on ``axes``."""
    return relay.op._make.fixed_point_multiply_per_axis(v, *map(relay.const, consts), True, True, axes)


def _requantize_per_axis(v, zp, consts, axes):
    """subtract zp -> fixed_point_multiply_per_axis -> add 3 -> clip [0, 255] -> cast u8"""
    v = _fpm_per_axis(relay.subtract(v, relay.const(zp)), consts, axes)
    return relay.cast(relay.clip(relay.add(v, relay.const(3)), 0, 255), "uint8")


def _per_block(a, blocks, k):
    """(C,) -> (blocks, k): padded with the last channel's value."""
    return np.pad(a, (0, blocks * k - a.size), mode="edge").reshape(blocks, k)


PER_AXIS_FORMS = ["slice_of_layout_transform", "layout_transform_of_slice", "slice_of_blocks"]


def before_per_axis(form):
    """y -> [x86: NCHW16c -> NCHW, slice 12 of 16 | aarch64: slice 3 of 4 NCHW4c blocks [-> NCHW]]
    -> per-axis requantize -> cast u8 -> max_pool2d"""
    consts = (M, LSHIFT, RSHIFT)
    if form == "slice_of_blocks":  # the region is blocked: constants (3, 4) on axes (1, 4)
        r = _requantize_per_axis(_block_slice(_y4()), _as_blocks(ZP, 3), [_per_block(c, 3, K4) for c in consts],
                                 [1, 4])
        return infer(relay.nn.max_pool2d(r, pool_size=(2, 2), layout="NCHW4c"))
    head = _slice(_y()) if form == "slice_of_layout_transform" else \
        relay.layout_transform(_block_slice(_y4()), "NCHW4c", "NCHW")
    return infer(relay.nn.max_pool2d(_requantize_per_axis(head, ZP, consts, [1]), pool_size=(2, 2)))


def expected_per_axis(form):
    consts = (M, LSHIFT, RSHIFT)
    if form == "slice_of_layout_transform":
        y, zp, consts = _y(), _blocked(ZP), [_per_block(c, 1, 16) for c in consts]
    elif form == "layout_transform_of_slice":  # per channel: padded with the last channel, then blocked
        y, zp, consts = _y4(), relay.const(_as_blocks(ZP, 4)), [_per_block(c, 4, K4) for c in consts]
    else:  # per block: the last block repeated
        def last_block(a, axis):
            return np.concatenate([a, a.take([-1], axis=axis)], axis=axis)

        y, zp = _y4(), relay.const(last_block(_as_blocks(ZP, 3), 1))
        consts = [last_block(_per_block(c, 3, K4), 0) for c in consts]
    v = _fpm_per_axis(relay.subtract(y, zp), consts, [1, 4])
    r = relay.cast(relay.clip(relay.add(v, relay.const(3)), 0, 255), "uint8")
    if form == "slice_of_layout_transform":
        return infer(relay.nn.max_pool2d(_slice(r), pool_size=(2, 2)))
    if form == "layout_transform_of_slice":
        return infer(relay.nn.max_pool2d(relay.layout_transform(_block_slice(r), "NCHW4c", "NCHW"), pool_size=(2, 2)))
    return infer(relay.nn.max_pool2d(_block_slice(r), pool_size=(2, 2), layout="NCHW4c"))


@pytest.mark.parametrize("form", PER_AXIS_FORMS)
def test_structure_and_idempotence_per_axis(form):
    after = check(EpilogueBeforeChannelSlice(), before_per_axis(form), expected_per_axis(form))
    assert_unchanged(EpilogueBeforeChannelSlice(), after)


@pytest.mark.parametrize("form", PER_AXIS_FORMS)
def test_numerics_bit_exact_per_axis(form):
    """Exact against numpy's int64 requantize of the sliced channels, before and after the move."""
    mod = before_per_axis(form)
    shape = (1, 1, 5, 6, 16) if form == "slice_of_layout_transform" else (1, 4, 5, 6, K4)
    y = np.random.default_rng(3).integers(-3000, 3000, shape).astype("int32")
    # opt_level 2: no AlterOpLayout, whose layout inference of fixed_point_multiply_per_axis takes one axis
    # unless the layout changes (the blocked form on axes (1, 4) is what it leaves, not what it reads)
    out_b, out_a = assert_same_outputs(mod, EpilogueBeforeChannelSlice()(mod), {"y": y}, opt_level=2)
    np.testing.assert_array_equal(out_b[0], out_a[0])
    nchw = y.transpose(0, 1, 4, 2, 3).reshape(1, -1, 5, 6)[:, :C].astype("int64") - ZP
    m, lshift, rshift = (a.astype("int64")[:, None, None] for a in (M, LSHIFT, RSHIFT))
    v = ((nchw << lshift) * m + (1 << (30 + rshift))) >> (31 + rshift)  # Q31 product, right shift, half up
    want = np.clip(v + 3, 0, 255)
    want = np.lib.stride_tricks.sliding_window_view(want, (2, 2), axis=(2, 3)).max(axis=(-2, -1))
    got = out_a[0] if form != "slice_of_blocks" else \
        out_a[0].transpose(0, 1, 4, 2, 3).reshape(1, -1, 4, 5)[:, :C]
    np.testing.assert_array_equal(got, want.astype("uint8"))


def test_unchanged_on_no_match_per_axis_over_width(caplog):
    """Constants indexed by the width axis: not per channel."""
    v = _fpm_per_axis(_slice(_y()), [RNG.integers(2**30, 2**31 - 1, 6).astype("int32"),
                                     np.zeros(6, "int32"), np.full(6, -5, "int32")], [3])
    mod = infer(relay.cast(relay.clip(v, 0, 255), "uint8"))
    assert_unchanged_with_reason(EpilogueBeforeChannelSlice(), mod, "no 8-bit value ends a closed elementwise region",
                                 LOGGER, caplog)


# -- no match: unchanged, with the reason logged ----------------------------------------------
@pytest.mark.parametrize("case,reason", [
    ("no_narrow_end", "no 8-bit value ends a closed elementwise region"),
    ("spatial_slice", "slices other axes than channels"),
    ("other_layout", "not NCHW<k>c -> NCHW"),
    ("read_outside", "no 8-bit value ends a closed elementwise region"),
    ("per_pixel_constant", "no 8-bit value ends a closed elementwise region"),
])
def test_unchanged_on_no_match(case, reason, caplog):
    y = _y()
    if case == "no_narrow_end":  # float result, never narrowed
        mod = infer(relay.multiply(relay.cast(_slice(y), "float32"), relay.const(SCALE)))
    elif case == "spatial_slice":
        lt = relay.layout_transform(y, "NCHW16c", "NCHW")
        mod = infer(relay.cast(relay.strided_slice(lt, begin=[0, 0, 0, 0], end=[1, 16, 4, 6]), "uint8"))
    elif case == "other_layout":
        lt = relay.layout_transform(relay.var("z", shape=(1, 5, 6, 16), dtype="int32"), "NHWC", "NCHW")
        mod = infer(relay.cast(relay.strided_slice(lt, begin=[0, 0, 0, 0], end=[1, C, 5, 6]), "uint8"))
    elif case == "read_outside":  # the wide value is also returned: it must stay sliced
        s = relay.subtract(_slice(y), relay.const(ZP))
        mod = infer(relay.Tuple([relay.cast(relay.clip(s, 0, 255), "uint8"), s]))
    else:  # a constant varying over H: not per channel
        c = relay.const(RNG.integers(0, 5, (1, 1, 5, 1)).astype("int32"))
        mod = infer(relay.cast(relay.clip(relay.add(_slice(y), c), 0, 255), "uint8"))
    assert_unchanged_with_reason(EpilogueBeforeChannelSlice(), mod, reason, LOGGER, caplog)


def test_untyped_module_raises():
    mod = tvm.IRModule.from_expr(relay.cast(_slice(_y()), "uint8"))
    assert_untyped_module_raises(EpilogueBeforeChannelSlice(), mod, "EpilogueBeforeChannelSlice")


def test_in_int8_pipeline():
    names = tvm_ext.core.pipelines.int8().pass_names()["before_fuse"]
    assert names.index("EpilogueBeforeChannelSlice") == names.index("FoldZeroPointPadIntoConv") + 1
    assert names.index("EpilogueBeforeChannelSlice") < names.index("NarrowKernelBoundaries")
