"""Tests of tvm_ext.passes.dequantize_in_conv_transpose (PP-OCRv4 det QOperator's float DB head)."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.passes import DequantizeInConvTranspose
from tvm_ext.testing import assert_unchanged, check, infer, run_module

from _helpers import assert_unchanged_with_reason, assert_untyped_module_raises, child_json, require_real_model

LOGGER = "tvm_ext.passes.DequantizeInConvTranspose"
RNG = np.random.default_rng(11)
W1 = RNG.standard_normal((8, 8, 2, 2)).astype("float32")
W2 = RNG.standard_normal((8, 1, 2, 2)).astype("float32")
GAMMA = RNG.uniform(0.5, 1.5, (1, 8, 1, 1)).astype("float32")
BETA = RNG.standard_normal((1, 8, 1, 1)).astype("float32")


def _q(x, s, zp):
    """float quantize: clip(round(x / s) + zp, 0, 255)"""
    return relay.clip(relay.add(relay.round(relay.divide(x, relay.const(s))), relay.const(float(zp))), 0.0, 255.0)


def _dq(n, s, zp):
    return relay.multiply(relay.cast(relay.subtract(relay.cast(n, "int32"), relay.const(zp)), "float32"),
                          relay.const(s))


def _convt(x, w, stride=2):
    return relay.nn.conv2d_transpose(x, relay.const(w), channels=w.shape[1], kernel_size=(2, 2),
                                     strides=(stride, stride))


def _x():
    return relay.var("x", shape=(1, 8, 6, 6), dtype="uint8")


def _bn_relu(v):
    return relay.nn.relu(relay.add(relay.multiply(v, relay.const(GAMMA)), relay.const(BETA)))


def head():
    """The DB head as ONNX Runtime's QOperator graph leaves it::

        x(u8) -> dequantize -> conv2d_transpose -> quantize = y -> dequantize -> BN -> ReLU
              -> conv2d_transpose -> quantize -> cast u8 (result)
    """
    y1 = _q(_convt(_dq(_x(), 0.05, 128), W1), 0.1, 120)
    t2 = _convt(_bn_relu(_dq(relay.cast(y1, "int32"), 0.1, 120)), W2)
    return infer(relay.cast(_q(t2, 0.2, 100), "uint8"))


def _primitive(params, body):
    attrs = tvm.ir.make_node("DictAttrs", **{"Primitive": tvm.tir.IntImm("int32", 1),
                                             "tvm_ext.pattern": "DequantizeInConvTranspose"})
    return relay.Function(params, body, None, None, attrs)


def expected():
    """Two kernels: x -> [dequantize, conv_t, quantize, cast u8] = c -> [widen, BN, ReLU, conv_t, quantize]."""
    p0 = relay.var("p0", shape=(1, 8, 6, 6), dtype="uint8")
    pw1 = relay.var("pw1", shape=W1.shape, dtype="float32")
    f1 = _primitive([p0, pw1], relay.cast(
        _q(relay.nn.conv2d_transpose(_dq(p0, 0.05, 128), pw1, channels=8, kernel_size=(2, 2), strides=(2, 2)),
           0.1, 120), "uint8"))
    c = relay.Call(f1, [_x(), relay.const(W1)])
    q0 = relay.var("q0", shape=(1, 8, 12, 12), dtype="uint8")
    pg, pb = relay.var("pg", shape=GAMMA.shape), relay.var("pb", shape=BETA.shape)
    pw2 = relay.var("pw2", shape=W2.shape, dtype="float32")
    y = relay.cast(q0, "float32")  # the widening of the 8-bit value that crosses
    v = relay.nn.relu(relay.add(relay.multiply(_dq(relay.cast(y, "int32"), 0.1, 120), pg), pb))
    t2 = relay.nn.conv2d_transpose(v, pw2, channels=1, kernel_size=(2, 2), strides=(2, 2))
    f2 = _primitive([q0, pg, pb, pw2], relay.cast(_q(t2, 0.2, 100), "uint8"))
    return infer(relay.Call(f2, [c, relay.const(GAMMA), relay.const(BETA), relay.const(W2)]))


def avx2_head():
    """The head as built for AVX2: the dequantize is followed by a float layout_transform (NCHW8c ->
    NCHW) before the transposed conv."""
    x = relay.var("x", shape=(1, 1, 6, 6, 8), dtype="uint8")
    d = relay.layout_transform(_dq(x, 0.05, 128), "NCHW8c", "NCHW")
    return infer(relay.cast(_q(_convt(d, W1), 0.1, 120), "uint8"))


def test_float_layout_transform_in_chain_bit_exact():
    mod = avx2_head()
    after = DequantizeInConvTranspose()(mod)
    assert "Primitive" in after.astext(show_meta_data=False)
    x = RNG.integers(0, 256, (1, 1, 6, 6, 8)).astype("uint8")
    base = tvm_ext.build(mod)
    new = tvm_ext.build(mod, passes={"before_fuse": [DequantizeInConvTranspose()]})
    assert "float32" not in new.kernel_report.crossing.nbytes, new.kernel_report.table()
    np.testing.assert_array_equal(run_module(base, {"x": x})[0], run_module(new, {"x": x})[0])


def test_int32_clip_start_read_as_uint8_bit_exact(caplog):
    """No uint8 value in front (an AVX2 build dequantizes the requantize's int32 clip directly): the
    group reads cast(clip, uint8) and widens it; the clip's kernel writes uint8, not float32."""
    xi = relay.var("xi", shape=(1, 1, 6, 6, 8), dtype="int32")
    n = relay.clip(relay.add(xi, relay.const(7)), 0, 255)
    d = relay.layout_transform(relay.multiply(relay.cast(n, "float32"), relay.const(0.05)), "NCHW8c", "NCHW")
    mod = infer(relay.cast(_q(_convt(d, W1), 0.1, 120), "uint8"))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        after = DequantizeInConvTranspose()(mod)
    assert "uint8 (narrowed int32)" in caplog.text
    assert_unchanged(DequantizeInConvTranspose(), after)
    x = RNG.integers(-300, 300, (1, 1, 6, 6, 8)).astype("int32")
    base = tvm_ext.build(mod)
    new = tvm_ext.build(mod, passes={"before_fuse": [DequantizeInConvTranspose()]})
    rn = new.kernel_report
    assert set(rn.crossing.nbytes) == {"uint8"} and rn.num_kernels == base.kernel_report.num_kernels, rn.table()
    np.testing.assert_array_equal(run_module(base, {"xi": x})[0], run_module(new, {"xi": x})[0])


def test_integer_head_int16_bit_exact():
    """The QDQ form: QNN lowers a quantized ConvTranspose to int16 x int16 -> int32 with its input
    widened (``cast(clip, int16)``) and re-laid out in front: grouped from the uint8 point, no int16
    crosses kernels, the layout_transform kernel goes, outputs bit-identical."""
    xi = relay.var("xi", shape=(1, 1, 6, 6, 8), dtype="int32")
    n = relay.clip(relay.add(xi, relay.const(7)), 0, 255)
    d = relay.layout_transform(relay.cast(n, "int16"), "NCHW8c", "NCHW")
    w = relay.const(RNG.integers(-100, 100, (8, 8, 2, 2)).astype("int16"))
    t = relay.nn.conv2d_transpose(d, w, channels=8, kernel_size=(2, 2), strides=(2, 2), out_dtype="int32")
    r = relay.clip(relay.floor(relay.add(relay.multiply(relay.cast(t, "float32"), relay.const(0.003)),
                                         relay.const(100.5))), 0.0, 255.0)
    mod = infer(relay.multiply(relay.cast(relay.cast(r, "uint8"), "float32"), relay.const(0.5)))
    after = DequantizeInConvTranspose()(mod)
    assert "Primitive" in after.astext(show_meta_data=False)
    x = RNG.integers(-300, 300, (1, 1, 6, 6, 8)).astype("int32")
    base = tvm_ext.build(mod)
    new = tvm_ext.build(mod, passes={"before_fuse": [DequantizeInConvTranspose()]})
    rb, rn = base.kernel_report, new.kernel_report
    assert rb.crossing.nbytes.get("int16", 0) > 0 and "int16" not in rn.crossing.nbytes, (rb.table(), rn.table())
    assert rn.num_kernels <= rb.num_kernels, (rb.table(), rn.table())
    np.testing.assert_array_equal(run_module(base, {"xi": x})[0], run_module(new, {"xi": x})[0])


def test_structure():
    check(DequantizeInConvTranspose(), head(), expected())


def test_idempotent():
    assert_unchanged(DequantizeInConvTranspose(), DequantizeInConvTranspose()(head()))


def test_build_bit_exact_no_float_crossing():
    """Host build (tvm_ext.build installs the direct conv_transpose schedule): same bits, one kernel
    fewer, nothing float crosses kernels."""
    mod = head()
    x = RNG.integers(0, 256, (1, 8, 6, 6)).astype("uint8")
    base = tvm_ext.build(mod)
    new = tvm_ext.build(mod, passes={"before_fuse": [DequantizeInConvTranspose()]})
    rb, rn = base.kernel_report, new.kernel_report
    assert rb.crossing.nbytes.get("float32", 0) > 0, rb.table()
    assert "float32" not in rn.crossing.nbytes and rn.num_kernels == rb.num_kernels - 1, rn.table()
    np.testing.assert_array_equal(run_module(base, {"x": x})[0], run_module(new, {"x": x})[0])


def test_last_in_int8_pipelines():
    # its kernel computes the input chain once per output row (x86_conv_transpose): PP-OCRv4 det
    # QOperator at znver4 8.73 -> 8.41 ms with it (per read, as first written: 8.66 ms, slower)
    for numerics in tvm_ext.core.pipelines.NUMERICS:
        names = tvm_ext.core.pipelines.int8(numerics).pass_names()["before_fuse"]
        assert names[-1] == "DequantizeInConvTranspose", names
        if "RoundHalfToEven" in names:
            assert names.index("RoundHalfToEven") == names.index("TabulateEightBit") - 1, names


# -- no match: unchanged, with the reason logged ----------------------------------------------
@pytest.mark.parametrize("case,reason", [
    ("stride1", "stride differs from the kernel"),
    ("float_input", "no 8-bit value at the start of its private elementwise input chain"),
    ("shared_input", "a value of its input chain has other readers"),
    ("reads_8bit", "the conv reads an 8-bit value already"),
    ("float16", "transposed conv (float32, or integer into int32, are grouped)"),
])
def test_unchanged_on_no_match(case, reason, caplog):
    if case == "stride1":
        mod = infer(relay.cast(_q(_convt(_dq(_x(), 0.05, 128), W1, stride=1), 0.1, 0), "uint8"))
    elif case == "float_input":
        xf = relay.var("xf", shape=(1, 8, 6, 6))
        mod = infer(relay.cast(_q(_convt(relay.multiply(xf, relay.const(0.5)), W1), 0.1, 0), "uint8"))
    elif case == "shared_input":
        d = relay.cast(relay.subtract(relay.cast(_x(), "int32"), relay.const(128)), "float32")
        t = _convt(relay.multiply(d, relay.const(0.05)), W1)
        mod = infer(relay.Tuple([relay.cast(_q(t, 0.1, 0), "uint8"), d]))
    elif case == "float16":
        t = relay.nn.conv2d_transpose(relay.cast(_dq(_x(), 0.05, 128), "float16"), relay.const(W1.astype("float16")),
                                      channels=8, kernel_size=(2, 2), strides=(2, 2))
        mod = infer(relay.cast(relay.clip(relay.round(t), 0.0, 255.0), "uint8"))
    else:
        w = relay.const(RNG.integers(-3, 4, (8, 8, 2, 2)).astype("int8"))
        t = relay.nn.conv2d_transpose(relay.cast(_x(), "int8"), w, channels=8, kernel_size=(2, 2), strides=(2, 2),
                                      out_dtype="int32")
        mod = infer(t)
    assert_unchanged_with_reason(DequantizeInConvTranspose(), mod, reason, LOGGER, caplog)


def test_untyped_module_raises():
    mod = tvm.IRModule.from_expr(_convt(_dq(_x(), 0.05, 128), W1))
    assert_untyped_module_raises(DequantizeInConvTranspose(), mod, "DequantizeInConvTranspose")


# -- the real model (slow: two full builds of PP-OCRv4 det, in a child process) -----------------
_CHILD = """
import json, sys
import numpy as np
import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.tools import zoo
from tvm_ext.testing import run_module
name, numerics = sys.argv[1], sys.argv[2]
m = zoo.load(name)
x = {m.input_name: zoo.sample_input(name)}
p = pipelines.int8(numerics)  # DequantizeInConvTranspose is its last pass
new = tvm_ext.build(m.mod, params=m.params, passes=p)
old = tvm_ext.build(m.mod, params=m.params, passes=p, disabled_pass=["DequantizeInConvTranspose"])
rn, ro = new.kernel_report, old.kernel_report
print(json.dumps({"kernels": [rn.num_kernels, ro.num_kernels],
                  "f32": [rn.crossing.nbytes.get("float32", 0), ro.crossing.nbytes.get("float32", 0)],
                  "bytes": [rn.crossing.total_bytes, ro.crossing.total_bytes],
                  "equal": bool(np.array_equal(run_module(new, x)[0], run_module(old, x)[0]))}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("numerics", ["tvm", "onnxruntime"])
def test_ppocr_det_qoperator_head_bit_exact_no_float_crossing(numerics):
    """PP-OCRv4 det QOperator's DB head: with the pass, no float32 crosses kernels (both pipelines),
    one kernel fewer, outputs bit-identical to the pipeline without it."""
    name = "ppocr_det_v4_int8_qoperator"
    require_real_model(name)
    res = child_json(_CHILD, name, numerics)
    assert res["equal"], res
    assert res["kernels"][0] == res["kernels"][1] - 1, res
    assert res["f32"][0] == 0 < res["f32"][1], res
    assert res["bytes"][0] < res["bytes"][1] - 2_000_000, res


def test_target_without_inlining_schedule_unchanged(caplog):
    """tvm-ext's llvm and GPU schedules inline the grouped chain: under another target (C source) the
    pass skips; under a GPU target it rewrites as under llvm."""
    mod = head()
    with caplog.at_level(logging.INFO, logger="tvm_ext.passes.DequantizeInConvTranspose"):
        with tvm.target.Target("c"):
            assert_unchanged(DequantizeInConvTranspose(), mod)
    assert "neither llvm nor a GPU" in caplog.text
    with tvm.target.Target("opencl"):
        at_gpu = DequantizeInConvTranspose()(mod)
    tvm.ir.assert_structural_equal(at_gpu, DequantizeInConvTranspose()(mod))
    assert not tvm.ir.structural_equal(at_gpu, mod)
