"""Tests of tvm_ext.passes.fold_channel_repad_into_conv (a conv reading a channel slice padded back reads
the tensor below the slice).

Forms: aarch64's NCHWc convs, the slice taking whole blocks (``lt(pad(lt(strided_slice(x))))``, N1's
``OIHW1i4o4i`` weights) or channels (``lt(pad(strided_slice(lt(x))))``, V1's ``OIHW8o8i``), and the NCHW
``nn.conv2d(pad(strided_slice(x)))``. The numerics run at plain ``llvm`` (whose x86 NCHWc conv takes
``OIHW<k>i<k>o`` weights) against numpy's exact integers; aarch64 builds are compiled here and run under
qemu in tests/arm.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.passes import FoldChannelRepadIntoConv
from tvm_ext.testing import assert_unchanged, check, infer, run_module

from _helpers import assert_not_mutated_and_disabled_by_name, assert_unchanged_with_reason, \
    assert_untyped_module_raises

LOGGER = "tvm_ext.passes.FoldChannelRepadIntoConv"
RNG = np.random.default_rng(7)
H, W = 3, 5
OUT = 8  # output channels of the conv under test


def weights(c_read, kept, kh=1, seed=0):
    """OIHW int8 weights on ``c_read`` input channels, zero from channel ``kept`` on (legalization's padding)."""
    w = np.random.default_rng(seed).integers(-127, 128, (OUT, c_read, kh, kh)).astype("int8")
    w[:, kept:] = 0
    return w


def blocked(w, layout):
    """OIHW -> ``layout`` in numpy (TVM's convention ``X = (X_o * f1 + x1) * f2 + x2``)."""
    o, i, kh, kw = w.shape
    if layout == "OIHW1i4o4i":  # (O/4, I/4, H, W, 1i, 4o, 4i)
        return np.ascontiguousarray(w.reshape(o // 4, 4, i // 4, 1, 4, kh, kw).transpose(0, 2, 5, 6, 3, 1, 4))
    if layout == "OIHW8o8i":  # (O/8, I/8, H, W, 8o, 8i)
        return np.ascontiguousarray(w.reshape(o // 8, 8, i // 8, 8, kh, kw).transpose(0, 2, 4, 5, 1, 3))
    k = int(layout[4:-2].split("i")[0])  # OIHW<k>i<k>o: (O/k, I/k, H, W, ki, ko)
    return np.ascontiguousarray(w.reshape(o // k, k, i // k, k, kh, kw).transpose(0, 2, 4, 5, 3, 1))


def conv_nchwc(data, w, k, layout):
    return relay.nn.contrib_conv2d_nchwc(data, relay.const(blocked(w, layout)), channels=OUT, kernel_size=(1, 1),
                                         data_layout=f"NCHW{k}c", kernel_layout=layout, out_layout=f"NCHW{k}c",
                                         out_dtype="int32")


# form -> (block k, x's channels, channels kept, channels the conv reads)
FORMS = {
    "blocked_slice": (4, 16, 12, 16),     # N1: 12 of 16 channels are 3 of 4 blocks
    "channel_slice": (8, 16, 10, 16),     # V1: 10 channels of two 8-blocks
    "widened": (4, 8, 2, 4),              # 2 channels padded to 4 (<= 4 input channels) from x's 8
}


def x_var(form):
    k, c_x, _, _ = FORMS[form]
    return relay.var("x", shape=(1, c_x // k, H, W, k), dtype="int8")


def repad(form, x):
    """The slice and pad in front of the conv: ``lt(pad(lt(ss(x))))`` or ``lt(pad(ss(lt(x))))``."""
    k, c_x, kept, c_read = FORMS[form]
    if form == "blocked_slice":
        d = relay.layout_transform(relay.strided_slice(x, [0, 0, 0, 0], [1, kept // k, H, W]), f"NCHW{k}c", "NCHW")
    else:
        d = relay.strided_slice(relay.layout_transform(x, f"NCHW{k}c", "NCHW"), [0, 0, 0, 0], [1, kept, H, W])
    d = relay.nn.pad(d, ((0, 0), (0, c_read - kept), (0, 0), (0, 0)), 0)
    return relay.layout_transform(d, "NCHW", f"NCHW{k}c")


def layout_of(form, runnable):
    """The aarch64 kernel layout of the form, or x86's ``OIHW<k>i<k>o`` (which plain ``llvm`` runs)."""
    k = FORMS[form][0]
    if runnable:
        return f"OIHW{k}i{k}o"
    return "OIHW8o8i" if k == 8 else "OIHW1i4o4i"


def before(form, runnable=False):
    """x (NCHWkc) -> [lt ->] strided_slice -> [lt ->] nn.pad -> lt -> conv_NCHWc (w zero on the padded channels)"""
    _, _, kept, c_read = FORMS[form]
    x = x_var(form)
    return infer(relay.Function([x], conv_nchwc(repad(form, x), weights(c_read, kept), FORMS[form][0],
                                                layout_of(form, runnable))))


def expected(form, runnable=False):
    """x (NCHWkc) -> conv_NCHWc (w widened with zero input channels to x's when x holds more)"""
    k, c_x, kept, c_read = FORMS[form]
    w = np.pad(weights(c_read, kept), ((0, 0), (0, c_x - c_read), (0, 0), (0, 0)))
    x = x_var(form)
    return infer(relay.Function([x], conv_nchwc(x, w, k, layout_of(form, runnable))))


def before_nchw():
    """x (NCHW, 16) -> strided_slice(12) -> nn.pad(16) -> conv2d 3x3 (w zero on input channels 12..15)"""
    x = relay.var("x", shape=(1, 16, H, W), dtype="int8")
    d = relay.nn.pad(relay.strided_slice(x, [0, 0, 0, 0], [1, 12, H, W]), ((0, 0), (0, 4), (0, 0), (0, 0)), 0)
    y = relay.nn.conv2d(d, relay.const(weights(16, 12, kh=3)), channels=OUT, kernel_size=(3, 3), padding=(1, 1),
                        out_dtype="int32")
    return infer(relay.Function([x], y))


def expected_nchw():
    x = relay.var("x", shape=(1, 16, H, W), dtype="int8")
    y = relay.nn.conv2d(x, relay.const(weights(16, 12, kh=3)), channels=OUT, kernel_size=(3, 3), padding=(1, 1),
                        out_dtype="int32")
    return infer(relay.Function([x], y))


def rule_of(form):
    return "nchw" if form == "nchw" else ("blocked_slice" if form == "blocked_slice" else "channel_slice")


# -- structure ------------------------------------------------------------------------------------
@pytest.mark.parametrize("form", [*FORMS, "nchw"])
def test_structure(form, caplog):
    pair = (before_nchw(), expected_nchw()) if form == "nchw" else (before(form), expected(form))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        check(FoldChannelRepadIntoConv(), *pair)
    assert f"FoldChannelRepadIntoConv.{rule_of(form)}" in caplog.text


@pytest.mark.parametrize("form", [*FORMS, "nchw"])
def test_idempotent(form):
    mod = before_nchw() if form == "nchw" else before(form)
    once = FoldChannelRepadIntoConv()(mod)
    assert_unchanged(FoldChannelRepadIntoConv(), once)


# -- numerics: plain llvm against numpy's exact integers ----------------------------------------------
def numpy_conv(x_nchw, w, pad):
    """Exact int64 conv2d (stride 1) of ``x_nchw`` with OIHW ``w``, ``pad`` zeros on each side."""
    xp = np.pad(x_nchw.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    kh = w.shape[2]
    out = np.zeros((1, w.shape[0], H, W), np.int64)
    for dy in range(kh):
        for dx in range(kh):
            out += np.einsum("nchw,oc->nohw", xp[:, :, dy:dy + H, dx:dx + W], w[:, :, dy, dx].astype(np.int64))
    return out


def unblock(a):
    n, cb, h, w, k = a.shape
    return a.transpose(0, 1, 4, 2, 3).reshape(n, cb * k, h, w)


@pytest.mark.parametrize("form", [*FORMS, "nchw"])
def test_numerics_bit_exact(form):
    """Before and after at plain ``llvm`` equal numpy's exact conv of the kept channels (x's other channels
    hold values the conv must not read)."""
    if form == "nchw":
        mod = before_nchw()
        x = RNG.integers(-128, 128, (1, 16, H, W)).astype("int8")
        ref = numpy_conv(x[:, :12], weights(16, 12, kh=3)[:, :12], 1)
        outs = [run_module(m, {"x": x})[0] for m in (mod, FoldChannelRepadIntoConv()(mod))]
    else:
        k, c_x, kept, c_read = FORMS[form]
        mod = before(form, runnable=True)
        x = RNG.integers(-128, 128, (1, c_x // k, H, W, k)).astype("int8")
        ref = numpy_conv(unblock(x)[:, :kept], weights(c_read, kept)[:, :kept], 0)
        outs = [unblock(run_module(m, {"x": x})[0]) for m in (mod, FoldChannelRepadIntoConv()(mod))]
    assert "strided_slice" not in FoldChannelRepadIntoConv()(mod).astext()
    for out in outs:
        np.testing.assert_array_equal(out, ref)


# -- no match: unchanged, with the reason logged ----------------------------------------------------
def _variant(case):
    k, c_x, kept, c_read = FORMS["channel_slice"]
    x = x_var("channel_slice")
    layout = layout_of("channel_slice", False)
    w = weights(c_read, kept)
    if case == "weight_not_zero":
        w[:, kept + 1] = 3
        return relay.Function([x], conv_nchwc(repad("channel_slice", x), w, k, layout))
    if case == "weight_not_constant":
        wv = relay.var("w", shape=blocked(w, layout).shape, dtype="int8")
        y = relay.nn.contrib_conv2d_nchwc(repad("channel_slice", x), wv, channels=OUT, kernel_size=(1, 1),
                                          data_layout=f"NCHW{k}c", kernel_layout=layout, out_layout=f"NCHW{k}c",
                                          out_dtype="int32")
        return relay.Function([x, wv], y)
    d = relay.layout_transform(x, f"NCHW{k}c", "NCHW")
    if case == "slice_not_from_zero":
        d = relay.strided_slice(d, [0, 2, 0, 0], [1, kept + 2, H, W])
    elif case == "slice_spatial":
        d = relay.strided_slice(d, [0, 0, 0, 0], [1, kept, H, W - 1])
        d = relay.nn.pad(d, ((0, 0), (0, 0), (0, 0), (0, 1)), 0)
        d = relay.strided_slice(d, [0, 0, 0, 0], [1, kept, H, W])  # keep the shape the conv reads
    else:
        d = relay.strided_slice(d, [0, 0, 0, 0], [1, kept, H, W])
    if case == "pad_in_front":
        d = relay.nn.pad(d, ((0, 0), (c_read - kept, 0), (0, 0), (0, 0)), 0)
    elif case == "pad_spatial":  # the NCHW rule: a pad of channels and of W, in front of a conv without padding
        xn = relay.var("x", shape=(1, 16, H, W), dtype="int8")
        d = relay.nn.pad(relay.strided_slice(xn, [0, 0, 0, 0], [1, 12, H, W]), ((0, 0), (0, 4), (0, 0), (1, 1)), 0)
        return relay.Function([xn], relay.nn.conv2d(d, relay.const(weights(16, 12, kh=3)), channels=OUT,
                                                    kernel_size=(3, 3), out_dtype="int32"))
    elif case != "slice_spatial":
        d = relay.nn.pad(d, ((0, 0), (0, c_read - kept), (0, 0), (0, 0)), 0)
    if case == "other_block":  # the conv reads NCHW4c, x is NCHW8c
        w4 = blocked(weights(c_read, kept), "OIHW1i4o4i")
        y = relay.nn.contrib_conv2d_nchwc(relay.layout_transform(d, "NCHW", "NCHW4c"), relay.const(w4), channels=OUT,
                                          kernel_size=(1, 1), data_layout="NCHW4c", kernel_layout="OIHW1i4o4i",
                                          out_layout="NCHW4c", out_dtype="int32")
        return relay.Function([x], y)
    return relay.Function([x], conv_nchwc(relay.layout_transform(d, "NCHW", f"NCHW{k}c"), w, k, layout))


@pytest.mark.parametrize("case,reason", [
    ("weight_not_zero", "the weight is not zero on padded input channel 11"),
    ("weight_not_constant", "the weight is a Var, not a constant"),
    ("slice_not_from_zero", "the slice does not start at 0"),
    ("pad_in_front", "pad more than the channels' end"),
    ("pad_spatial", "pad more than the channels' end"),
    ("other_block", "x is NCHW8c, the conv reads NCHW4c"),
])
def test_unchanged_on_no_match(case, reason, caplog):
    assert_unchanged_with_reason(FoldChannelRepadIntoConv(), infer(_variant(case)), reason, LOGGER, caplog)


def test_unchanged_when_x_holds_too_many_channels(caplog):
    """x holds 32 channels (4 blocks of 8), the conv reads 8: widening the weights fourfold is not done."""
    x = relay.var("x", shape=(1, 8, H, W, 4), dtype="int8")
    d = relay.strided_slice(relay.layout_transform(x, "NCHW4c", "NCHW"), [0, 0, 0, 0], [1, 6, H, W])
    d = relay.layout_transform(relay.nn.pad(d, ((0, 0), (0, 2), (0, 0), (0, 0)), 0), "NCHW", "NCHW4c")
    mod = infer(relay.Function([x], conv_nchwc(d, weights(8, 6), 4, "OIHW1i4o4i")))
    assert_unchanged_with_reason(FoldChannelRepadIntoConv(), mod, "x holds 32", LOGGER, caplog)


def test_other_readers_keep_the_chain():
    """The padded tensor is also returned: the conv reads x, the slice/pad chain stays for the other reader."""
    x = x_var("blocked_slice")
    d = repad("blocked_slice", x)
    y = conv_nchwc(d, weights(16, 12), 4, "OIHW1i4o4i")
    out = FoldChannelRepadIntoConv()(infer(relay.Function([x], relay.Tuple([y, d]))))
    body = out["main"].body
    assert isinstance(body.fields[0].args[0], relay.Var) and "strided_slice" in out.astext()


# -- bad input ------------------------------------------------------------------------------------
def test_untyped_module_raises():
    x = x_var("blocked_slice")
    mod = tvm.IRModule.from_expr(relay.Function([x], conv_nchwc(repad("blocked_slice", x), weights(16, 12), 4,
                                                                "OIHW1i4o4i")))
    assert_untyped_module_raises(FoldChannelRepadIntoConv(), mod, "FoldChannelRepadIntoConv")


def test_dynamic_shapes_skipped(caplog):
    x = relay.var("x", shape=(relay.Any(), 16, H, W), dtype="int8")
    d = relay.nn.pad(relay.strided_slice(x, [0, 0, 0, 0], [1, 12, H, W]), ((0, 0), (0, 4), (0, 0), (0, 0)), 0)
    mod = infer(relay.Function([x], relay.nn.conv2d(d, relay.const(weights(16, 12)), channels=OUT, kernel_size=(1, 1),
                                                    out_dtype="int32")))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert_unchanged(FoldChannelRepadIntoConv(), mod)
    assert "dynamic shape" in caplog.text


def test_not_mutated_and_disabled_by_name():
    assert_not_mutated_and_disabled_by_name(FoldChannelRepadIntoConv(), before("blocked_slice"),
                                            "FoldChannelRepadIntoConv", "strided_slice")


# -- in the int8 pipeline at aarch64 (compiled only; run under qemu in tests/arm) --------------------
def se_block(mid=12, seed=0):
    """uint8 x -> qnn.conv2d 1x1 16 -> ``mid`` -> 16 (each requantized to uint8): a squeeze-excite's pair of
    1x1 convs, the first with output channels the aarch64 block does not divide."""
    rng = np.random.default_rng(seed)
    x = relay.var("x", shape=(1, 16, 4, 4), dtype="uint8")

    def qconv(d, co, ci):
        w = relay.const(rng.integers(-127, 128, (co, ci, 1, 1)).astype("int8"))
        y = relay.qnn.op.conv2d(d, w, relay.const(3), relay.const(0), relay.const(0.02), relay.const(0.01),
                                kernel_size=(1, 1), channels=co, out_dtype="int32")
        return relay.qnn.op.requantize(y, relay.const(0.0002), relay.const(0), relay.const(0.05), relay.const(3),
                                       out_dtype="uint8")

    return infer(relay.Function([x], qconv(qconv(x, mid, 16), 16, mid)))


@pytest.mark.parametrize("cpu,mid", [("neoverse-n1", 12),
                                     pytest.param("neoverse-v1", 12, marks=pytest.mark.slow),
                                     pytest.param("cortex-a72", 10, marks=pytest.mark.slow)])
def test_aarch64_int8_pipeline_drops_the_repad_kernel(cpu, mid, caplog):
    """At each aarch64 class the slice/re-pad kernel between the two convs goes, and no other kernel comes
    (explain's FuseOps replay, no code generation; N1 takes the blocked-slice rule, V1 and A72 the channel
    slice)."""
    from tvm_ext.core import pipelines
    from tvm_ext.testing.aarch64 import TARGETS

    mod = se_block(mid)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        new = tvm_ext.explain(mod, TARGETS[cpu], None, passes=pipelines.int8())
    old = tvm_ext.explain(mod, TARGETS[cpu], None, passes=pipelines.int8(), disabled_pass=["FoldChannelRepadIntoConv"])
    assert "reads the 16-channel tensor below the slice" in caplog.text
    assert new.num_kernels == old.num_kernels - 1
    assert not [k for k in new.kernels if "strided_slice" in k.ops or "nn.pad" in k.ops]
