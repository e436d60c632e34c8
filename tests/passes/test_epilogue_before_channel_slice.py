"""Tests of tvm_ext.passes.epilogue_before_channel_slice (int32 crossing after x86's channel slice)."""
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
