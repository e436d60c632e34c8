"""The remedy table (``_remedies``): each boundary names the pass that removes it, and
``check_remedies`` applies it and measures what went: pads folded into convs, sliced accumulators,
channel pads, a tvm-ext pass group, and the small zoo ResNets (slow)."""
import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.core.explain import explain

from _explain_graphs import by_kind, mod_of


def qconv(x, zp=0):
    w = relay.const(np.ones((16, 16, 3, 3), "int8"))
    y = relay.qnn.op.conv2d(x, w, relay.const(zp, "int32"), relay.const(0, "int32"), relay.const(0.5, "float32"),
                            relay.const(0.25, "float32"), padding=(1, 1), kernel_size=(3, 3), channels=16,
                            out_dtype="int32")
    return relay.qnn.op.requantize(y, relay.const(0.125, "float32"), relay.const(0, "int32"),
                                   relay.const(0.5, "float32"), relay.const(zp, "int32"), out_dtype="uint8")


def test_qnn_pad_and_fold_pad_into_conv():
    """Two qnn convs: QnnCanonicalize pads explicitly; the second pad is its own kernel between two anchors."""
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="uint8")
    ex = explain(mod_of(qconv(qconv(x))))
    assert ex.verified is True
    assert ex.inserted_by["nn.pad"] == {"QnnCanonicalize": 2}
    (pad,) = [b for b in ex.boundaries if b.op == "nn.pad"]
    assert pad.kind == "prologue_into_anchor" and pad.remedy == "FoldPadIntoConv" and pad.shape[2:4] == (10, 10)
    assert ("nn.pad", ("QnnCanonicalize",)) in pad.inserted_by
    before_pad = [b for b in ex.boundaries if pad.producer in b.consumers]
    assert before_pad[0].kind == "injective_after_anchor" and "nn.pad" in before_pad[0].blocker
    res = {r.remedy: r for r in ex.check_remedies()}
    fp = res["FoldPadIntoConv"]
    assert fp.remaining == 0 and fp.kernels_saved == 1 and fp.bytes_saved == pad.nbytes
    # the layout_transforms AlterOpLayout put around the convs: disabling it removes kernels
    alt = res["disabled_pass=AlterOpLayout"]
    assert alt.measured and alt.remaining == 0 and alt.kernels_saved >= 1


def test_nonzero_pad_value_is_not_folded():
    """A pad of the input zero point (3) in front of an NCHWc conv: outside FoldPadIntoConv's scope.

    The table names FoldZeroPointPadIntoConv instead, and applying FoldPadIntoConv anyway (the
    check) indeed leaves the pad, while FoldZeroPointPadIntoConv removes it and its kernel.
    """
    from tvm_ext.core.explain import _apply_remedy
    from tvm_ext.core.explain._remedies import _REMEDY_BY_NAME

    x = relay.var("x", shape=(1, 16, 8, 8), dtype="uint8")
    ex = explain(mod_of(qconv(qconv(x, zp=3), zp=3)))
    (pad,) = [b for b in ex.boundaries if b.op == "nn.pad"]
    assert pad.pad_value == 3.0 and pad.remedy != "FoldPadIntoConv"
    after = _apply_remedy(ex, _REMEDY_BY_NAME["FoldPadIntoConv"])
    assert [b.pad_value for b in after.boundaries if b.op == "nn.pad"] == [3.0]
    assert after.num_kernels == ex.num_kernels
    assert pad.remedy == "FoldZeroPointPadIntoConv"
    folded = _apply_remedy(ex, _REMEDY_BY_NAME["FoldZeroPointPadIntoConv"])
    assert [b for b in folded.boundaries if b.op == "nn.pad"] == []
    assert folded.num_kernels == ex.num_kernels - 1


def conv24_pair():
    """uint8 -> qnn.conv2d (24 output channels) -> requantize -> qnn.conv2d (16) -> requantize.
    At AVX-512 targets without VNNI x86 int8 legalization pads the first conv to 32 output channels
    and slices back: its int32 accumulators cross to the slice's kernel. (AVX2 and AVX-512 VNNI
    targets block 24 channels by 8: no padding, ``tvm_ext.x86.int8_conv``'s ``narrow_channel_blocks``.)"""
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="uint8")

    def qconv(d, ci, co, seed):
        w = relay.const(np.random.default_rng(seed).integers(-5, 5, (co, ci, 1, 1)).astype("int8"))
        c = relay.qnn.op.conv2d(d, w, relay.const(3), relay.const(0), relay.const(0.02), relay.const(0.01),
                                kernel_size=(1, 1), channels=co, out_dtype="int32")
        return relay.qnn.op.requantize(c, relay.const(0.0002), relay.const(0), relay.const(0.05), relay.const(3),
                                       out_dtype="uint8")

    return tvm.IRModule.from_expr(relay.Function([x], qconv(qconv(x, 16, 24, 0), 24, 16, 1)))


def test_sliced_conv_accumulators_name_epilogue_before_channel_slice():
    # explain compiles nothing: an AVX-512 target is only read here, on any host
    ex = explain(conv24_pair(), target="llvm -mcpu=skylake-avx512")
    (b,) = [b for b in ex.boundaries if b.dtype == "int32"]
    assert b.kind == "injective_after_anchor" and b.remedy == "EpilogueBeforeChannelSlice"
    (rr,) = [r for r in ex.check_remedies(["EpilogueBeforeChannelSlice"]) if r.remedy == "EpilogueBeforeChannelSlice"]
    assert rr.measured and rr.remaining == 0


def float_conv_into_int8_conv(channels=6):
    """A float conv writing 6 channels, quantized and read by an int8 1x1 conv (QDQ's kept-float conv)."""
    rng = np.random.default_rng(8)
    x = relay.var("x", shape=(1, 16, 7, 7), dtype="float32")
    y = relay.nn.conv2d(x, relay.const(rng.standard_normal((channels, 16, 1, 1)).astype("float32")),
                        channels=channels, kernel_size=(1, 1))
    q = relay.qnn.op.quantize(relay.nn.relu(y), relay.const(np.float32(0.05)), relay.const(3), out_dtype="uint8")
    w = relay.const(rng.integers(-127, 128, (8, channels, 1, 1)).astype("int8"))
    out = relay.qnn.op.conv2d(q, w, relay.const(3), relay.const(0), relay.const(np.float32(0.05)),
                              relay.const(np.float32(0.01)), kernel_size=(1, 1), channels=8, out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([x], out))


def test_channel_pad_names_pad_channels_at_producer():
    # explain compiles nothing: an x86-64-v3 target is only read here, on any host
    ex = explain(float_conv_into_int8_conv(), target="llvm -mcpu=x86-64-v3")
    (b,) = [b for b in ex.boundaries if b.pads_channels]
    assert b.kind == "prologue_into_anchor" and b.remedy == "PadChannelsAtProducer"
    (rr,) = [r for r in ex.check_remedies(["PadChannelsAtProducer"]) if r.remedy == "PadChannelsAtProducer"]
    assert rr.measured and rr.remaining == 0 and rr.kernels_saved == 1
    # 8 channels: x86 pads nothing, no such boundary
    assert not [b for b in explain(float_conv_into_int8_conv(8), target="llvm -mcpu=x86-64-v3").boundaries
                if b.pads_channels]


def test_dequantize_in_conv_transpose_group_is_named_as_a_pass_group():
    """The Primitive group DequantizeInConvTranspose makes is a function boundary of a tvm-ext pass,
    not a user's pattern-table entry to drop."""
    from tvm_ext.passes import DequantizeInConvTranspose

    rng = np.random.default_rng(9)
    x = relay.var("x", shape=(1, 8, 6, 6), dtype="uint8")
    d = relay.multiply(relay.cast(relay.subtract(relay.cast(x, "int32"), relay.const(128)), "float32"),
                       relay.const(0.05))
    t = relay.nn.conv2d_transpose(d, relay.const(rng.standard_normal((8, 8, 2, 2)).astype("float32")), channels=8,
                                  kernel_size=(2, 2), strides=(2, 2))
    q = relay.clip(relay.round(relay.divide(t, relay.const(0.1))), 0.0, 255.0)
    y = relay.multiply(relay.cast(relay.cast(q, "uint8"), "float32"), relay.const(0.1))
    z = relay.nn.conv2d(y, relay.const(rng.standard_normal((4, 8, 3, 3)).astype("float32")), channels=4,
                        kernel_size=(3, 3))  # another kernel reads the group's 8-bit output
    ex = explain(tvm.IRModule.from_expr(relay.Function([x], z)),
                 passes={"before_fuse": [DequantizeInConvTranspose()]})
    groups = [b for b in ex.boundaries if b.entry == "DequantizeInConvTranspose"]
    assert groups and all(b.remedy == "tvm-ext pass group" for b in groups)


@pytest.mark.slow  # the small relay.quantize ResNet built and replayed: a minute and a half on 2 cores
def test_zoo_relay_quantize_small():
    """relay.quantize ResNet (small): stop_fusion dominates; RemoveStopFusion removes most of it."""
    m = tvm_ext.tools.zoo.load("resnet50_int8_relay", small=True)
    ex = explain(m.mod, params=m.params)
    assert ex.verified is True
    stops = by_kind(ex, "stop_fusion")
    assert len(stops) >= 20
    res = {r.remedy: r for r in ex.check_remedies(["RemoveStopFusion", "FuseWideningIntoPool"])}
    rs = res["RemoveStopFusion"]
    # RemoveStopFusion removes barriers where fusing is exact, else moves them (README): most go away
    assert rs.measured and rs.kernels_saved > 0 and rs.remaining < len(stops) // 4
    assert res["FuseWideningIntoPool"].remaining == 0
    # x86 legalisation's +128 shift pads (value 128) in front of the int8 convs: not FoldPadIntoConv's
    # (a pad fused into a layout_transform, as on AVX2 where blocks differ, is that transform's boundary)
    pads = [b for b in ex.boundaries if b.op == "nn.pad"]
    assert pads and all(b.remedy == "NonNegativeConvInputToUint8" for b in pads)
    assert all(("nn.pad", ("Legalize",)) in b.inserted_by for b in pads)


@pytest.mark.slow
def test_zoo_relay_small_start_stage_remedy():
    m = tvm_ext.tools.zoo.load("resnet50_int8_relay", small=True)
    ex = explain(m.mod, params=m.params)
    (rr,) = [r for r in ex.check_remedies(["NonNegativeConvInputToUint8"]) if r.remedy == "NonNegativeConvInputToUint8"]
    assert rr.measured and rr.remaining == 0 and rr.kernels_saved > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50_int8_qoperator", "resnet50_int8_qdq"])
def test_zoo_onnx_small(name):
    m = tvm_ext.tools.zoo.load(name, small=True)
    ex = explain(m.mod, params=m.params)
    assert ex.verified is True
    checked = ex.check_remedies([r.remedy for r in ex.remedies if r.remedy != "disabled_pass=AlterOpLayout"])
    for r in checked:
        if r.measured and r.remedy in ("FoldPadIntoConv", "FuseWideningIntoPool"):
            assert r.remaining == 0, r
