"""Tests of tvm_ext.passes.fold_zero_point_pad_into_conv (the zero-point pad kernels of QDQ models)."""
from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.passes import FoldPadIntoConv
from _helpers import assert_if_and_let_skipped, assert_not_mutated_and_disabled_by_name, assert_untyped_module_raises
from tvm_ext.passes.fold_zero_point_pad_into_conv import FoldZeroPointPadIntoConv, block, border_constant, unblock
from tvm_ext.testing import assert_same_outputs, assert_unchanged, check, infer, random_inputs

LOGGER = "tvm_ext.passes.FoldZeroPointPadIntoConv"
RNG = np.random.default_rng(7)
# small weights: no int16 pair sum saturates (vpmaddubsw on non-VNNI x86), so every ISA is exact
W = RNG.integers(-3, 4, (8, 4, 3, 3)).astype("int8")
HW1 = [[0, 0], [0, 0], [1, 1], [1, 1]]


def _x(shape=(1, 4, 6, 7), dtype="uint8"):
    return relay.var("x", shape=shape, dtype=dtype)


def _conv(data, w=W, padding=(0, 0, 0, 0), **kw):
    return relay.nn.conv2d(data, relay.const(w), kernel_size=w.shape[2:], channels=w.shape[0], padding=padding,
                           out_dtype="int32", **kw)


def reference_border(w, z, x_hw, pad, strides=(1, 1), dilation=(1, 1), groups=1, conv_padding=(0, 0, 0, 0)):
    """conv(pad(zeros, z), w) by direct loops (an oracle independent of the pass's einsum)."""
    (pt, pb), (pl, pr) = pad
    cin = w.shape[1] * groups
    zp = np.zeros((cin, x_hw[0] + pt + pb, x_hw[1] + pl + pr), np.int64)
    zp[:, :pt], zp[:, zp.shape[1] - pb:], zp[:, :, :pl], zp[:, :, zp.shape[2] - pr:] = z, z, z, z
    qt, ql, qb, qr = conv_padding
    zp = np.pad(zp, ((0, 0), (qt, qb), (ql, qr)))  # the conv's own padding is zeros
    o, _, kh, kw = w.shape
    oh = (zp.shape[1] - (kh - 1) * dilation[0] - 1) // strides[0] + 1
    ow = (zp.shape[2] - (kw - 1) * dilation[1] - 1) // strides[1] + 1
    out = np.zeros((o, oh, ow), np.int64)
    per = o // groups
    for oc in range(o):
        g = oc // per
        for y in range(oh):
            for x in range(ow):
                win = zp[g * w.shape[1]:(g + 1) * w.shape[1],
                         y * strides[0]:y * strides[0] + (kh - 1) * dilation[0] + 1:dilation[0],
                         x * strides[1]:x * strides[1] + (kw - 1) * dilation[1] + 1:dilation[1]]
                out[oc, y, x] = (win * w[oc].astype(np.int64)).sum()
    return out


# -- the constant and the layouts --------------------------------------------------------------
@pytest.mark.parametrize("strides,dilation,groups,pad,conv_padding", [
    ((1, 1), (1, 1), 1, ((1, 1), (1, 1)), (0, 0, 0, 0)),
    ((2, 2), (1, 1), 4, ((1, 1), (1, 1)), (0, 0, 0, 0)),          # depthwise, stride 2
    ((2, 1), (1, 1), 2, ((2, 0), (1, 3)), (1, 0, 0, 1)),          # grouped, asymmetric, plus conv padding
    ((1, 1), (2, 2), 1, ((2, 2), (2, 2)), (0, 0, 0, 0)),          # dilated
])
def test_border_constant_matches_direct_loops(strides, dilation, groups, pad, conv_padding):
    w = RNG.integers(-100, 100, (8, 4 // groups, 3, 3)).astype("int8")
    x_hw = (6, 7)
    ref = reference_border(w, 200, x_hw, pad, strides, dilation, groups, conv_padding)
    in_hw = (x_hw[0] + sum(pad[0]), x_hw[1] + sum(pad[1]))
    got = border_constant(w, 200, in_hw, pad, (conv_padding[0], conv_padding[1]), strides,
                          dilation, ref.shape[1:])
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("layout,primal,shape", [
    ("OIHW4i16o4i", "OIHW", (32, 32, 3, 3)),
    ("OIHW1i16o", "OIHW", (32, 1, 3, 3)),
    ("NCHW16c", "NCHW", (1, 32, 5, 6)),
    ("NHWC", "NCHW", (1, 8, 5, 6)),
])
def test_unblock_inverts_tvm_layout_transform(layout, primal, shape):
    arr = RNG.integers(-100, 100, shape).astype("int32")
    mod = tvm.IRModule.from_expr(relay.layout_transform(relay.const(arr), primal, layout))
    blocked = relay.transform.FoldConstant()(relay.transform.InferType()(mod))["main"].body.data.numpy()
    np.testing.assert_array_equal(unblock(blocked, layout, primal), arr)
    np.testing.assert_array_equal(block(arr, primal, layout), blocked)


# -- structure ---------------------------------------------------------------------------------
def _narrowest(c):
    for dtype in ("int8", "int16", "int32"):
        if np.iinfo(dtype).min <= c.min() and c.max() <= np.iinfo(dtype).max:
            return dtype
    raise AssertionError("constant exceeds int32")


def _expected_correction(w, z, x_hw, pad, dtype=None, **kw):
    """cast(C, int32) (or C when int32) for the border constant C, stored in ``dtype`` (default: the
    narrowest integer type holding it)."""
    c = reference_border(w, z, x_hw, pad, **kw)[None]
    dtype = dtype or _narrowest(c)
    const = relay.const(c.astype(dtype))
    return const if dtype == "int32" else relay.cast(const, "int32")


def test_fold_conv2d_nchw():
    """x -> pad(3) -> conv2d(padding 0)  =>  conv2d(x, padding 1) + cast(C int8, int32)"""
    before = infer(_conv(relay.nn.pad(_x(), HW1, 3)))
    expected = infer(relay.add(_conv(_x(), padding=(1, 1, 1, 1)),
                               _expected_correction(W, 3, (6, 7), ((1, 1), (1, 1)), "int8")))
    after = check(FoldZeroPointPadIntoConv(), before, expected)
    assert_unchanged(FoldZeroPointPadIntoConv(), after)  # idempotent: the conv reads x now


def test_nested_pads_fold_in_one_run():
    """x -> pad(3) -> pad(3) -> conv(padding 0)  =>  conv(x, padding 2) + C_inner + C_outer

    One pad per sweep, the sweeps in one run: the outer pad's constant is computed for the conv
    without padding, the inner one's for the conv padded by the outer pad (a second run changes
    nothing). Bit-exact against the unfolded graph."""
    before = infer(_conv(relay.nn.pad(relay.nn.pad(_x(), HW1, 3), HW1, 3)))
    inner = _expected_correction(W, 3, (6, 7), ((1, 1), (1, 1)), conv_padding=(1, 1, 1, 1))
    outer = _expected_correction(W, 3, (8, 9), ((1, 1), (1, 1)))
    expected = infer(relay.add(relay.add(_conv(_x(), padding=(2, 2, 2, 2)), inner), outer))
    after = check(FoldZeroPointPadIntoConv(), before, expected)
    assert_unchanged(FoldZeroPointPadIntoConv(), after)
    out_b, out_a = assert_same_outputs(before, after, random_inputs(before), opt_level=0)
    np.testing.assert_array_equal(out_b[0], out_a[0])


def test_fold_through_layout_transform_nchwc():
    """x NCHW -> pad(200) -> layout_transform NCHW4c -> conv NCHWc  =>  conv(layout_transform(x)) + C"""
    w = RNG.integers(-100, 100, (8, 4, 3, 3)).astype("int8")
    wb = block(w, "OIHW", "OIHW1i4o4i")

    def conv(data, padding):
        return relay.nn.contrib_conv2d_nchwc(data, relay.const(wb), padding=padding, channels=8, kernel_size=(3, 3),
                                             data_layout="NCHW4c", kernel_layout="OIHW1i4o4i", out_layout="NCHW4c",
                                             out_dtype="int32")

    before = infer(conv(relay.layout_transform(relay.nn.pad(_x(), HW1, 200), "NCHW", "NCHW4c"), (0, 0, 0, 0)))
    c = block(reference_border(w, 200, (6, 7), ((1, 1), (1, 1)))[None], "NCHW", "NCHW4c").astype("int32")
    expected = infer(relay.add(conv(relay.layout_transform(_x(), "NCHW", "NCHW4c"), (1, 1, 1, 1)), relay.const(c)))
    check(FoldZeroPointPadIntoConv(), before, expected)


# -- numerics: bit-exact through tvm_ext.build (AlterOpLayout -> NCHWc, the real form) ------------
def _qconv(x, cin, cout, zp, groups=1, stride=1, k=3, pad=1):
    w = RNG.integers(-3, 4, (cout, cin // groups, k, k)).astype("int8")
    c = relay.qnn.op.conv2d(x, relay.const(w), relay.const(zp), relay.const(0), relay.const(0.1), relay.const(0.05),
                            kernel_size=(k, k), channels=cout, padding=(pad, pad), strides=(stride, stride),
                            groups=groups, out_dtype="int32")
    c = relay.add(c, relay.const(RNG.integers(-100, 100, (cout, 1, 1)).astype("int32")))
    return relay.qnn.op.requantize(c, relay.const(0.05), relay.const(0), relay.const(0.1), relay.const(zp),
                                   out_dtype="uint8")


def qnn_chain():
    """conv 3x3 -> depthwise 3x3 stride 2 -> depthwise 5x5 -> conv 3x3 stride 2, input zero points != 0."""
    x = relay.var("x", shape=(1, 16, 12, 20), dtype="uint8")
    y = _qconv(x, 16, 32, zp=200)
    y = _qconv(y, 32, 32, zp=200, groups=32, stride=2)
    y = _qconv(y, 32, 32, zp=100, groups=32, k=5, pad=2)
    return infer(_qconv(y, 32, 16, zp=7, stride=2))


def _run(fac, x):
    from tvm.contrib import graph_executor

    gm = graph_executor.GraphModule(fac["default"](tvm.cpu()))
    gm.set_input("x", x)
    gm.run()
    return gm.get_output(0).numpy()


def test_build_removes_pad_kernels_bit_exact(caplog):
    mod = qnn_chain()
    x = np.random.default_rng(0).integers(0, 256, (1, 16, 12, 20)).astype("uint8")
    base = tvm_ext.build(mod, passes={"before_fuse": [FoldPadIntoConv()]})
    with caplog.at_level(logging.INFO, logger=LOGGER):
        new = tvm_ext.build(mod, passes={"before_fuse": [FoldPadIntoConv(), FoldZeroPointPadIntoConv()]})
    assert caplog.text.count("zero-point pad folded") == 4
    pads = lambda f: [k.func_name for k in f.kernel_report.kernels if "pad" in k.func_name]  # noqa: E731
    assert len(pads(base)) == 4 and pads(new) == []
    # a pad that shares its kernel with a layout_transform (the input's; on AVX2 also those between
    # the 16-channel convs and the 8-channel depthwise ones) leaves that kernel; each pad kernel of
    # its own goes away
    alone = [name for name in pads(base) if re.search(r"_nn_pad(_\d+)?$", name)]
    assert alone and new.kernel_report.num_kernels == base.kernel_report.num_kernels - len(alone)
    np.testing.assert_array_equal(_run(new, x), _run(base, x))


def test_numerics_nchw_conv2d_interpreter_reference():
    """Plain relay.build on NCHW (no AlterOpLayout): pad(z) + conv == conv(padding) + C, bit for bit."""
    w = RNG.integers(-3, 4, (6, 2, 3, 3)).astype("int8")
    before = infer(_conv(relay.nn.pad(_x(), [[0, 0], [0, 0], [2, 1], [0, 1]], 255), w=w, strides=(2, 1), groups=2))
    after = FoldZeroPointPadIntoConv()(before)
    assert "nn.pad" not in after.astext()
    out_b, out_a = assert_same_outputs(before, after, random_inputs(before), opt_level=0)
    np.testing.assert_array_equal(out_b[0], out_a[0])


# -- no match: unchanged, with the reason logged ----------------------------------------------
@pytest.mark.parametrize("case,reason", [
    ("zero", "pad value 0"),
    ("float", "not an integer conv"),
    ("channel_pad", "pads non-spatial axis 1"),
    ("other_reader", "readers other than convolutions"),
    ("edge_mode", "pad mode 'edge'"),
    ("nhwc", "only NCHW (blocked or not) is supported"),
])
def test_unchanged_on_no_match(case, reason, caplog):
    x = _x()
    if case == "zero":
        mod = infer(_conv(relay.nn.pad(x, HW1, 0)))
    elif case == "float":
        xf = _x(dtype="float32")
        mod = infer(relay.nn.conv2d(relay.nn.pad(xf, HW1, 3.0), relay.const(W.astype("float32")), kernel_size=(3, 3)))
    elif case == "channel_pad":
        w = RNG.integers(-3, 4, (8, 5, 3, 3)).astype("int8")
        mod = infer(_conv(relay.nn.pad(x, [[0, 0], [0, 1], [1, 1], [1, 1]], 3), w=w))
    elif case == "other_reader":
        p = relay.nn.pad(x, HW1, 3)
        mod = infer(relay.Tuple([_conv(p), relay.max(p)]))
    elif case == "nhwc":
        xh = _x((1, 6, 7, 4))
        wh = np.transpose(W, (2, 3, 1, 0)).copy()  # HWIO
        mod = infer(relay.nn.conv2d(relay.nn.pad(xh, [[0, 0], [1, 1], [1, 1], [0, 0]], 3), relay.const(wh),
                                    kernel_size=(3, 3), channels=8, data_layout="NHWC", kernel_layout="HWIO",
                                    out_dtype="int32"))
    else:
        mod = infer(_conv(relay.nn.pad(x, HW1, pad_mode="edge")))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert_unchanged(FoldZeroPointPadIntoConv(), mod)
    assert reason in caplog.text
    assert "FoldZeroPointPadIntoConv.pad: not rewritten" in caplog.text  # under the rule's name


def test_untyped_module_raises():
    mod = tvm.IRModule.from_expr(_conv(relay.nn.pad(_x(), HW1, 3)))
    assert_untyped_module_raises(FoldZeroPointPadIntoConv(), mod, "FoldZeroPointPadIntoConv")


def test_if_and_let_skipped(caplog):
    assert_if_and_let_skipped(FoldZeroPointPadIntoConv(), _conv(relay.nn.pad(_x(), HW1, 3)), LOGGER, caplog)


def test_not_mutated_and_disabled_by_name():
    before = infer(_conv(relay.nn.pad(_x(), HW1, 3)))
    assert_not_mutated_and_disabled_by_name(FoldZeroPointPadIntoConv(), before, "FoldZeroPointPadIntoConv", "nn.pad")


def test_in_int8_pipeline():
    names = tvm_ext.core.pipelines.int8().pass_names()["before_fuse"]
    assert names.index("FoldZeroPointPadIntoConv") == names.index("FoldPadIntoConv") + 1
