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


def qnn_conv_chain():
    """uint8 x -> qconv (12 output channels: x86 pads them to 16) -> requantize -> qconv (12) -> requantize."""
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="uint8")
    v = x
    for cin in (16, 12):
        w = RNG.integers(-3, 4, (C, cin, 3, 3)).astype("int8")
        c = relay.qnn.op.conv2d(v, relay.const(w), relay.const(3), relay.const(0), relay.const(0.1),
                                relay.const(RNG.uniform(0.01, 0.05, C).astype("float32")), kernel_size=(3, 3),
                                channels=C, padding=(1, 1), out_dtype="int32")
        v = relay.qnn.op.requantize(c, relay.const(0.002), relay.const(0), relay.const(0.1), relay.const(3),
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


@pytest.mark.parametrize("cpu", ["neoverse-n1", "neoverse-v1"])
def test_aarch64_build_removes_int32_crossing(cpu, caplog):
    """Compiled only: at Neoverse-N1 the 12-channel convs are NCHW4c and the slice takes 3 of 4 blocks;
    at Neoverse-V1 they are NCHW8c and x86's form appears (12 is no multiple of 8)."""
    from tvm.target import codegen

    from tvm_ext.testing.aarch64 import TARGETS

    if "aarch64" not in list(codegen.llvm_get_targets()):
        pytest.skip("this TVM's LLVM has no AArch64 back end")
    mod = qnn_conv_chain()
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
