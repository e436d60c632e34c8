"""Tests of tvm_ext.passes.qdq_to_integer on shapes its rules must read with care: a dynamic batch
(``relay.Any()``), and a per-channel weight scale whose output channels are not on axis 1 (NHWC)."""
from __future__ import annotations

import contextlib
import logging

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from _helpers import assert_not_mutated_and_disabled_by_name
from _qdq_graphs import dq as _dq, llvm as _llvm, q as _q
from tvm_ext.passes.qdq_to_integer import QDQToInteger
from tvm_ext.testing import assert_unchanged, check, infer, run_module

LOGGER = "tvm_ext.passes.QDQToInteger"


# -- a dynamic batch (relay.Any()): the padding rule judges the conv at batch 1 ---------------------
def nhwc_conv(batch, oc=8):
    """a (batch x 5 x 5 x 16, NHWC) -> dq -> conv3x3(dq(w), HWIO, oc channels) -> q: a small conv
    that x86's int8 legalization pads when ``oc`` is no multiple of 16."""
    a = relay.var("a", shape=(batch, 5, 5, 16), dtype="uint8")
    w = _dq(relay.const(np.random.default_rng(oc).integers(-20, 20, (3, 3, 16, oc)).astype("int8")),
            relay.const(0.02), relay.const(0, "int32"))
    return infer(relay.Function([a], _q(relay.nn.conv2d(_dq(a), w, channels=oc, kernel_size=3, padding=1,
                                                        data_layout="NHWC", kernel_layout="HWIO"))))


def _with_batch(mod, batch):
    """``mod`` with its inputs' first dimension set to ``batch`` (re-typed)."""
    main = mod["main"]
    params = [relay.var(p.name_hint, shape=(batch, *p.type_annotation.shape[1:]), dtype=p.type_annotation.dtype)
              for p in main.params]
    return infer(relay.Function(params, relay.bind(main.body, dict(zip(main.params, params)))))


@pytest.mark.parametrize("target, oc, converts", [
    (None, 8, False),                      # small and padded: stays float, as with batch 1
    (None, 16, True),                      # not padded: converts
    ("llvm -mcpu=x86-64-v3", 8, True),     # 8-channel int8 blocks: every conv converts
])
def test_dynamic_batch_conv_rewritten_as_at_batch_one(target, oc, converts):
    """A dynamic batch does not stop the rewrite: the result is FQ2I's on the dynamic graph, and with
    the batch set to 1 it is the pass's result on the static graph (same decision, same ops)."""
    dyn = nhwc_conv(relay.Any(), oc)
    with tvm.target.Target(target) if target else contextlib.nullcontext():
        static_out = QDQToInteger()(nhwc_conv(1, oc))
        expected = relay.transform.FakeQuantizationToInteger()(dyn) if converts else dyn
        out = check(QDQToInteger(), dyn, expected)
    assert ("qnn.conv2d" in out.astext()) == converts
    tvm.ir.assert_structural_equal(_with_batch(out, 1)["main"], static_out["main"], map_free_vars=True)
    assert_unchanged(QDQToInteger(), out)


def test_dynamic_batch_conv_numerics_with_a_static_batch():
    """The dynamic rewrite with batch 3 substituted computes what the static graph's rewrite does, bit
    for bit, and is within one output step of the float region it replaces (TVM's FQ2I rounding)."""
    with tvm.target.Target("llvm -mcpu=x86-64-v3"):
        out = QDQToInteger()(nhwc_conv(relay.Any()))
        static_out = QDQToInteger()(nhwc_conv(3))
    assert "qnn.conv2d" in out.astext()
    x = {"a": np.random.default_rng(4).integers(0, 256, (3, 5, 5, 16)).astype("uint8")}
    got = run_module(_with_batch(out, 3), x)[0]
    np.testing.assert_array_equal(got, run_module(static_out, x)[0])
    diff = got.astype(np.int64) - run_module(nhwc_conv(3), x)[0].astype(np.int64)
    assert np.abs(diff).max() <= 1


@pytest.mark.parametrize("oc", [8, 16])
def test_dynamic_batch_conv_not_mutated(oc):
    with tvm.target.Target("llvm -mcpu=x86-64-v3"):
        assert_not_mutated_and_disabled_by_name(QDQToInteger(), nhwc_conv(relay.Any(), oc), "QDQToInteger",
                                                " nn.conv2d(")


def test_dynamic_output_channels_left_to_fq2i_with_reason(caplog):
    """Output channels unknown (a weight of dynamic shape): whether x86 pads them is unknown, so the
    padding rule rejects the conv with that reason and FQ2I converts it, as it does any conv."""
    a = relay.var("a", shape=(relay.Any(), 5, 5, 16), dtype="uint8")
    w = relay.var("w", shape=(1, 1, 16, relay.Any()), dtype="int8")
    mod = infer(relay.Function([a, w], _q(relay.nn.conv2d(_dq(a), _dq(w, relay.const(0.02)), kernel_size=1,
                                                           data_layout="NHWC", kernel_layout="HWIO"))))
    with caplog.at_level("DEBUG", logger=LOGGER):
        out = check(QDQToInteger(), mod, relay.transform.FakeQuantizationToInteger()(mod))
    assert "qnn.conv2d" in out.astext()
    assert "small_padded_conv: left to FQ2I: output channels" in caplog.text and "padding unknown" in caplog.text


def test_dynamic_batch_conv_large_at_batch_one_converts_with_reason(caplog):
    """Counted at batch 1, a padded conv over 64 x 64 x 16 runs 4.7M MACs, 144 products per output:
    int8 pays for the slice at any batch, so it converts and the reason says the count is a least one."""
    a = relay.var("a", shape=(relay.Any(), 64, 64, 16), dtype="uint8")
    w = _dq(relay.const(np.random.default_rng(1).integers(-20, 20, (3, 3, 16, 8)).astype("int8")),
            relay.const(0.02), relay.const(0, "int32"))
    mod = infer(relay.Function([a], _q(relay.nn.conv2d(_dq(a), w, channels=8, kernel_size=3, padding=1,
                                                        data_layout="NHWC", kernel_layout="HWIO"))))
    with caplog.at_level("DEBUG", logger=LOGGER):
        check(QDQToInteger(), mod, relay.transform.FakeQuantizationToInteger()(mod))
    assert "144 products per output, 4718592 MACs (at least: output shape" in caplog.text


# -- a per-channel weight scale with the output channels not on axis 1 (NHWC): FQ2I misreads the axis --
PC_IN, PC_OUT = (relay.const(0.05), relay.const(0, "int32")), (relay.const(0.1), relay.const(3, "int32"))
PC_TAIL = (relay.const(0.07), relay.const(0, "int32"))


def per_channel_conv(layout="NHWC", kernel_layout="HWIO", bias=False, tail=False, oc=16):
    """a -> dq -> conv3x3(dq(w, s[oc], axis=O)) [-> bias_add] -> q [-> dq -> relu -> q]: a conv with a
    per-channel weight scale, as ONNX Runtime's quantizer writes one (``tail``: a region after it)."""
    cin = 16
    a = relay.var("a", shape=(1, 5, 5, cin) if layout == "NHWC" else (1, cin, 5, 5), dtype="uint8")
    kshape = {"HWIO": (3, 3, cin, oc), "OHWI": (oc, 3, 3, cin), "OIHW": (oc, cin, 3, 3)}[kernel_layout]
    w = relay.qnn.op.dequantize(relay.const(np.random.default_rng(7).integers(-20, 20, kshape).astype("int8")),
                                relay.const(np.linspace(0.005, 0.03, oc).astype("float32")),
                                relay.const(0, "int32"), axis=kernel_layout.index("O"))
    y = relay.nn.conv2d(_dq(a, *PC_IN), w, channels=oc, kernel_size=3, padding=1, data_layout=layout,
                        kernel_layout=kernel_layout)
    if bias:
        y = relay.nn.bias_add(y, relay.const(np.linspace(-1, 1, oc).astype("float32")), axis=layout.index("C"))
    y = relay.qnn.op.quantize(y, *PC_OUT, out_dtype="uint8")
    if tail:
        y = _tail(y)
    return infer(relay.Function([a], y))


def _tail(y):
    return relay.qnn.op.quantize(relay.nn.relu(relay.qnn.op.dequantize(y, *PC_OUT)), *PC_TAIL, out_dtype="uint8")


def per_channel_conv_expected(**kw):
    """The conv region unchanged (float); the region after it as FQ2I makes it alone."""
    before = per_channel_conv(**kw, tail=False)["main"]
    y = relay.var("y", shape=[int(d) for d in before.ret_type.shape], dtype="uint8")
    tail = relay.transform.FakeQuantizationToInteger()(infer(relay.Function([y], _tail(y))))["main"]
    assert "qnn.requantize" in tail.astext() and "qnn.dequantize" not in tail.astext()
    return infer(relay.Function(before.params, relay.bind(tail.body, {tail.params[0]: before.body})))


def test_plain_fq2i_fails_on_a_per_channel_nhwc_conv():
    """The TVM 0.19 bug routed around: FQ2I's conv2d rule gives the output's per-channel scale axis 2
    (W) in NHWC, and its qnn.requantize fails type inference (8 scales on an axis of 5)."""
    with pytest.raises(tvm.error.DiagnosticError):
        relay.transform.FakeQuantizationToInteger()(per_channel_conv(oc=8))


@pytest.mark.parametrize("kernel_layout", ["HWIO", "OHWI"])
@pytest.mark.parametrize("bias", [False, True])
def test_per_channel_nhwc_conv_stays_float_with_reason(kernel_layout, bias, caplog):
    """The conv region is left as it is (float), with the reason logged; the region after it converts."""
    kw = {"kernel_layout": kernel_layout, "bias": bias}
    with caplog.at_level(logging.INFO, logger=LOGGER):
        check(QDQToInteger(), per_channel_conv(**kw, tail=True), per_channel_conv_expected(**kw))
        assert_unchanged(QDQToInteger(), per_channel_conv(**kw))
    assert ("QDQToInteger.per_channel_conv_not_channel_first: kept in float: per-channel weight scale and output "
            "layout NHWC: the channel axis is 3, TVM 0.19's FQ2I would requantize along axis 2") in caplog.text


def test_per_channel_nhwc_conv_numerics():
    """Built and run on this host: the float conv computes what the float QDQ graph does, bit for bit;
    the integer region after it is within one output step."""
    x = {"a": np.random.default_rng(8).integers(0, 256, (1, 5, 5, 16)).astype("uint8")}
    for tail in (False, True):
        mod = per_channel_conv(bias=True, tail=tail)
        got = run_module(_llvm(QDQToInteger()(mod)), x)[0].astype(np.int64)
        want = run_module(_llvm(mod), x)[0].astype(np.int64)
        assert np.abs(got - want).max() <= (1 if tail else 0)


def test_per_channel_nhwc_conv_not_mutated_and_idempotent():
    mod = per_channel_conv(bias=True, tail=True)
    assert_not_mutated_and_disabled_by_name(QDQToInteger(), mod, "QDQToInteger", " nn.relu(")
    once = QDQToInteger()(mod)
    assert "stop_fusion" not in once.astext()
    assert_unchanged(QDQToInteger(), once)


def test_per_channel_nhwc_conv_through_the_int8_pipeline():
    """``pipelines.int8()``'s start stage and ``tvm_ext.build`` take the graph (no TVM type error)."""
    from tvm_ext import families
    from tvm_ext.core.pipelines import int8

    mod = per_channel_conv(bias=True, tail=True)
    text = mod.astext()
    pipeline = int8().for_family(families.family(tvm.target.Target("llvm")))
    fac = tvm_ext.build(mod, passes=pipeline, target="llvm")
    assert mod.astext() == text
    x = {"a": np.random.default_rng(9).integers(0, 256, (1, 5, 5, 16)).astype("uint8")}
    diff = run_module(fac, x)[0].astype(np.int64) - run_module(_llvm(mod), x)[0].astype(np.int64)
    assert np.abs(diff).max() <= 1


@pytest.mark.parametrize("bias", [False, True])
def test_per_channel_nchw_conv_still_converts(bias, caplog):
    """Near miss: with the channels on axis 1 (NCHW/OIHW) FQ2I's axis is right, so the conv converts
    (FQ2I's result, per-channel requantize on axis 1); the conv region is within one output step of
    the float one."""
    mod = per_channel_conv("NCHW", "OIHW", bias=bias, tail=True)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        out = check(QDQToInteger(), mod, relay.transform.FakeQuantizationToInteger()(mod))
    assert "qnn.conv2d" in out.astext()
    assert "per_channel_conv_not_channel_first: left to FQ2I: layout NCHW" in caplog.text
    assert_unchanged(QDQToInteger(), out)
    conv = per_channel_conv("NCHW", "OIHW", bias=bias)  # the conv region alone: one rounding
    x = {"a": np.random.default_rng(10).integers(0, 256, (1, 16, 5, 5)).astype("uint8")}
    got, want = (run_module(_llvm(m), x)[0].astype(np.int64) for m in (QDQToInteger()(conv), conv))
    assert "qnn.conv2d" in QDQToInteger()(conv).astext() and np.abs(got - want).max() <= 1


def test_per_tensor_nhwc_conv_still_converts():
    """Near miss: a per-tensor weight scale has no axis to misread; the NHWC conv converts."""
    with tvm.target.Target("llvm -mcpu=x86-64-v3"):
        check(QDQToInteger(), nhwc_conv(1), relay.transform.FakeQuantizationToInteger()(nhwc_conv(1)))
        assert "qnn.conv2d" in QDQToInteger()(nhwc_conv(1)).astext()
