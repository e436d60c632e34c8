"""Tests of tvm_ext.passes.fold_pad_into_conv (the lone pad kernels of the QNN conv lowering)."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
import tvm_ext.tools.zoo
from _helpers import assert_if_and_let_skipped, assert_not_mutated_and_disabled_by_name, assert_untyped_module_raises
from tvm_ext.passes.fold_pad_into_conv import MAX_FOLDS, RULES, FoldPadIntoConv, spatial_axes
from tvm_ext.testing import assert_same_outputs, assert_unchanged, check, infer, random_inputs

LOGGER = "tvm_ext.passes.FoldPadIntoConv"
W = np.random.default_rng(1).integers(-3, 4, (8, 4, 3, 3)).astype("int8")
HW1 = [[0, 0], [0, 0], [1, 1], [1, 1]]


def _conv(data, padding=(0, 0), w=W, **kw):
    return relay.nn.conv2d(data, relay.const(w), kernel_size=(3, 3), channels=8, padding=padding,
                           out_dtype="int32", **kw)


def _x(shape=(1, 4, 8, 8), dtype="uint8"):
    return relay.var("x", shape=shape, dtype=dtype)


# -- structure ---------------------------------------------------------------------------------
def test_spatial_axes():
    assert spatial_axes("NCHW") == ((2, 3), 4)
    assert spatial_axes("NCHW16c") == ((2, 3), 5)
    assert spatial_axes("NHWC") == ((1, 2), 4)
    assert not spatial_axes("NCD")


def pad_conv_before():
    """x -> pad(0, H/W by 1) -> conv2d(padding 0)"""
    x = _x()
    return infer(_conv(relay.nn.pad(x, HW1, 0)))


def pad_conv_expected():
    """x -> conv2d(padding 1)"""
    return infer(_conv(_x(), padding=(1, 1)))


def test_fold_conv2d():
    check(FoldPadIntoConv(), pad_conv_before(), pad_conv_expected())


def test_fold_adds_to_existing_padding_asymmetric():
    x = _x()
    before = infer(_conv(relay.nn.pad(x, [[0, 0], [0, 0], [1, 0], [0, 2]], 0), padding=(1, 1)))
    expected = infer(_conv(_x(), padding=(2, 1, 1, 3)))  # (t, l, b, r)
    check(FoldPadIntoConv(), before, expected)


def nchwc_before(pad_value=0):
    """x NCHW4c -> pad(H/W) -> contrib_conv2d_NCHWc (the form after AlterOpLayout)."""
    x = _x((1, 1, 8, 8, 4), "float32")
    w = np.random.default_rng(2).standard_normal((2, 1, 3, 3, 4, 4)).astype("float32")
    p = relay.nn.pad(x, [[0, 0], [0, 0], [1, 1], [1, 1], [0, 0]], pad_value)
    return p, w


def _nchwc(data, w, padding):
    return relay.nn.contrib_conv2d_nchwc(data, relay.const(w), padding=padding, channels=8, kernel_size=(3, 3),
                                         data_layout="NCHW4c", kernel_layout="OIHW4i4o", out_layout="NCHW4c",
                                         out_dtype="float32")


def test_fold_conv2d_nchwc():
    p, w = nchwc_before()
    before = infer(_nchwc(p, w, (0, 0, 0, 0)))
    expected = infer(_nchwc(_x((1, 1, 8, 8, 4), "float32"), w, (1, 1, 1, 1)))
    after = check(FoldPadIntoConv(), before, expected)
    assert_unchanged(FoldPadIntoConv(), after)  # idempotent
    out_b, out_a = assert_same_outputs(before, after, random_inputs(before))
    np.testing.assert_array_equal(out_b[0], out_a[0])  # the same sums in the same order


def test_tvm_fold_explicit_padding_leaves_blocked_layout_alone():
    """Why this pass exists: TVM 0.19's FoldExplicitPadding keeps the pad in front of NCHWc."""
    p, w = nchwc_before()
    before = infer(_nchwc(p, w, (0, 0, 0, 0)))
    assert "nn.pad" in relay.transform.FoldExplicitPadding()(before).astext()
    assert "nn.pad" not in FoldPadIntoConv()(before).astext()


def _qconv(data, padding, zp=3):
    return relay.qnn.op.conv2d(data, relay.const(W), relay.const(zp), relay.const(0), relay.const(0.1),
                               relay.const(0.05), kernel_size=(3, 3), channels=8, padding=padding,
                               out_dtype="int32")


def test_fold_qnn_conv2d_when_pad_value_is_zero_point():
    before = infer(_qconv(relay.nn.pad(_x(), HW1, 3), (0, 0)))
    expected = infer(_qconv(_x(), (1, 1)))
    after = check(FoldPadIntoConv(), before, expected)
    inputs = random_inputs(before)
    assert_same_outputs(before, after, inputs)


def test_qnn_conv2d_other_pad_value_kept(caplog):
    before = infer(_qconv(relay.nn.pad(_x(), HW1, 0), (0, 0)))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert_unchanged(FoldPadIntoConv(), before)
    assert "FoldPadIntoConv.qnn_conv2d: not rewritten: pad value 0 but qnn.conv2d pads with 3" in caplog.text


def test_pad_with_other_consumers_stays_for_them():
    """pad feeds conv and max: conv reads x directly, the pad remains for max (TVM's ``rewrite``
    would not fold it: its grouper refuses a match whose pad has a reader outside the match)."""
    x = _x()
    p = relay.nn.pad(x, HW1, 0)
    before = infer(relay.Tuple([_conv(p), relay.max(p)]))
    x2 = _x()
    expected = infer(relay.Tuple([_conv(x2, padding=(1, 1)), relay.max(relay.nn.pad(x2, HW1, 0))]))
    after = check(FoldPadIntoConv(), before, expected)
    assert_same_outputs(before, after, random_inputs(before))


def test_two_convs_share_one_pad():
    x = _x()
    p = relay.nn.pad(x, HW1, 0)
    w2 = np.random.default_rng(5).integers(-3, 4, (8, 4, 3, 3)).astype("int8")
    before = infer(relay.add(_conv(p), _conv(p, w=w2)))
    x2 = _x()
    expected = infer(relay.add(_conv(x2, padding=(1, 1)), _conv(x2, padding=(1, 1), w=w2)))
    check(FoldPadIntoConv(), before, expected)


# -- no match / rejections ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda x: relay.nn.pad(x, HW1, 1), "pad value 1 but nn.conv2d pads with 0"),
        (lambda x: relay.nn.pad(x, [[0, 0], [0, 1], [1, 1], [1, 1]], 0), "pads non-spatial axis 1"),
        (lambda x: relay.nn.pad(x, HW1, 0, pad_mode="edge"), "pad mode 'edge'"),
        (lambda x: relay.nn.pad(x, HW1, relay.var("v", shape=(), dtype="uint8")), "not a constant scalar"),
    ],
)
def test_rejections_are_logged(make, reason, caplog):
    x = _x()
    data = make(x)
    w = W if reason != "pads non-spatial axis 1" else np.zeros((8, 5, 3, 3), "int8")
    before = infer(_conv(data, w=w))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert_unchanged(FoldPadIntoConv(), before)
    assert reason in caplog.text


def test_no_pad_unchanged():
    assert_unchanged(FoldPadIntoConv(), pad_conv_expected())


def test_untyped_module_raises():
    x = _x()
    mod = tvm.IRModule.from_expr(relay.Function([x], _conv(relay.nn.pad(x, HW1, 0))))
    assert_untyped_module_raises(FoldPadIntoConv(), mod, "FoldPadIntoConv")


def test_if_and_let_skipped(caplog):
    assert_if_and_let_skipped(FoldPadIntoConv(), _conv(relay.nn.pad(_x(), HW1, 0)), LOGGER, caplog)


def test_not_mutated_and_disabled_by_name():
    assert_not_mutated_and_disabled_by_name(FoldPadIntoConv(), pad_conv_before(), "FoldPadIntoConv", "nn.pad")


def test_dynamic_shapes_skipped(caplog):
    x = relay.var("x", shape=(relay.Any(), 4, 8, 8), dtype="uint8")
    mod = infer(relay.Function([x], _conv(relay.nn.pad(x, HW1, 0))))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert_unchanged(FoldPadIntoConv(), mod)
    assert "dynamic shape" in caplog.text


# -- the zoo model (small) ------------------------------------------------------------------------
@pytest.mark.slow  # a small zoo ResNet built; the nested-pad, qnn and no-match tests above cover the fold
def test_small_qoperator_resnet_no_lone_pad_kernels():
    m = tvm_ext.tools.zoo.load("resnet50_int8_qoperator", small=True)
    f = tvm_ext.build(m.mod, params=m.params, passes=[FoldPadIntoConv()])
    rep = f.kernel_report
    lone_pads = [k for k in rep.kernels if k.ops == ("nn.pad",)]
    assert not lone_pads
    assert rep.num_kernels == rep.num_anchor_kernels + 2  # stock: + 6 (4 lone pads)


@pytest.mark.parametrize("qnn", [False, True])
def test_nested_pads_fold_at_once(qnn):
    """A fold's result is matched again: both pads fold in one run, so a second run changes nothing.

    ::

        x -> pad(1) -> pad(1) -> conv(padding 0)   =>   x -> conv(padding 2)
    """
    zp = 3
    val = relay.const(zp if qnn else 0, "uint8")
    conv = (lambda d, p: _qconv(d, p, zp)) if qnn else _conv
    before = infer(conv(relay.nn.pad(relay.nn.pad(_x(), HW1, pad_value=val), HW1, pad_value=val), (0, 0)))
    after = check(FoldPadIntoConv(), before, infer(conv(_x(), (2, 2))))
    assert_unchanged(FoldPadIntoConv(), after)
    assert_same_outputs(before, after, random_inputs(before))


def _dw_nchwc(data, w, padding):
    return relay.nn.contrib_depthwise_conv2d_nchwc(data, relay.const(w), padding=padding, groups=8, channels=8,
                                                   kernel_size=(3, 3), data_layout="NCHW4c", kernel_layout="OIHW1i4o",
                                                   out_layout="NCHW4c", out_dtype="float32")


def test_fold_depthwise_conv2d_nchwc():
    """x NCHW4c -> pad(0) -> contrib_depthwise_conv2d_NCHWc (MobileNet after AlterOpLayout, ReLU input)."""
    x = _x((1, 2, 8, 8, 4), "float32")
    w = np.random.default_rng(3).standard_normal((2, 1, 3, 3, 1, 4)).astype("float32")
    before = infer(_dw_nchwc(relay.nn.pad(x, [[0, 0], [0, 0], [1, 1], [1, 1], [0, 0]], 0), w, (0, 0, 0, 0)))
    expected = infer(_dw_nchwc(_x((1, 2, 8, 8, 4), "float32"), w, (1, 1, 1, 1)))
    after = check(FoldPadIntoConv(), before, expected)
    assert_unchanged(FoldPadIntoConv(), after)
    out_b, out_a = assert_same_outputs(before, after, random_inputs(before))
    np.testing.assert_allclose(out_b[0], out_a[0], rtol=1e-6, atol=1e-6)


def test_chain_longer_than_the_cap_keeps_its_last_pad(caplog):
    """MAX_FOLDS pads fold into one conv; the pad below them stays, with a warning naming the cap."""
    data = _x()
    for _ in range(MAX_FOLDS + 1):
        data = relay.nn.pad(data, HW1, 0)
    before = infer(_conv(data))
    inner = relay.nn.pad(_x(), HW1, 0)
    expected = infer(_conv(inner, padding=(MAX_FOLDS, MAX_FOLDS)))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        after = check(FoldPadIntoConv(), before, expected)
    assert f"{MAX_FOLDS} pads folded into one nn.conv2d" in caplog.text
    assert_same_outputs(before, after, random_inputs(before))


def test_rule_table():
    """One rule per convolution op, named after the pass, of the shared shape; each is rooted at its op."""
    from tvm_ext._rules import Rule, root_ops

    assert all(isinstance(r, Rule) for r in RULES)
    assert [r.name for r in RULES] == [f"FoldPadIntoConv.{n}" for n in
                                       ("conv2d", "conv2d_NCHWc", "depthwise_conv2d_NCHWc", "qnn_conv2d")]
    ops = [sorted(root_ops(r)) for r in RULES]
    assert ops == [["nn.conv2d"], ["nn.contrib_conv2d_NCHWc"], ["nn.contrib_depthwise_conv2d_NCHWc"], ["qnn.conv2d"]]
