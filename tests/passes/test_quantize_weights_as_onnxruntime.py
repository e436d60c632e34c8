"""Tests of tvm_ext.passes.quantize_weights_as_onnxruntime: float conv weights quantized as ONNX Runtime does."""
from __future__ import annotations

import logging

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm import relay

import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.core.frontend import from_onnx
from tvm_ext.passes import QuantizeWeightsAsOnnxRuntime
from tvm_ext.passes.quantize_weights_as_onnxruntime import ort_int8_weight_parameters
from tvm_ext.testing import assert_unchanged, check, infer, run_module

from _helpers import assert_unchanged_with_reason, assert_untyped_module_raises, real_model_vs_onnxruntime

ort = pytest.importorskip("onnxruntime")
LOGGER = "tvm_ext.passes.QuantizeWeightsAsOnnxRuntime"
C, OC, HW = 8, 6, 12
# PP-OCRv4 det's head: activation scale / zero point in, ConvTranspose output scale / zero point out
SX, ZX, SY, ZY = 0.013869917, 3, 0.017635483, 118


def _c(v, dtype):
    return relay.const(np.array(v, dtype))


def _weights(seed=0, shape=(C, OC, 2, 2)):
    # an asymmetric range: ORT's zero point is not 0 (det's first ConvTranspose: -1)
    return np.random.default_rng(seed).uniform(-0.4, 0.9, shape).astype("float32")


def _bias(seed=1):
    return np.random.default_rng(seed).uniform(-1.0, 1.0, OC).astype("float32")


def _graph(weight, bias=None, op="conv2d_transpose", relu=False, extra_reader=False):
    """x (u8) -> dequantize -> op(., weight) [-> bias_add] [-> relu] -> quantize (u8)."""
    x = relay.var("x", shape=(1, C, HW, HW), dtype="uint8")
    d = relay.qnn.op.dequantize(x, _c(SX, "float32"), _c(ZX, "int32"))
    if op == "conv2d_transpose":
        y = relay.nn.conv2d_transpose(d, weight, channels=OC, kernel_size=(2, 2), strides=(2, 2))
    else:
        y = relay.nn.conv2d(d, weight, channels=OC, kernel_size=(3, 3), padding=(1, 1))
    anchor = y
    if bias is not None:
        y = relay.nn.bias_add(y, bias)
    if relu:
        y = relay.nn.relu(y)
    q = relay.qnn.op.quantize(y, _c(SY, "float32"), _c(ZY, "int32"), out_dtype="uint8")
    out = relay.Tuple([q, relay.nn.relu(anchor)]) if extra_reader else q
    return infer(relay.Function([x], out)), x, d


def _quantized_weight(w):
    q, s, zp = ort_int8_weight_parameters(w)
    return relay.qnn.op.dequantize(relay.const(q, "int8"), _c(s, "float32"), _c(zp, "int32"))


def test_transposed_conv_weight_becomes_dequantized_int8():
    w = _weights()
    before, x, d = _graph(relay.const(w))
    y = relay.nn.conv2d_transpose(d, _quantized_weight(w), channels=OC, kernel_size=(2, 2), strides=(2, 2))
    expected = infer(relay.Function([x], relay.qnn.op.quantize(y, _c(SY, "float32"), _c(ZY, "int32"),
                                                                out_dtype="uint8")))
    check(QuantizeWeightsAsOnnxRuntime(), before, expected)


def test_conv_bias_and_relu():
    """Conv -> bias -> Relu -> Q: the bias is rounded to int32 at input scale * weight scale."""
    w, b = _weights(2, (OC, C, 3, 3)), _bias()
    before, x, d = _graph(relay.const(w), relay.const(b), op="conv2d", relu=True)
    q, s, zp = ort_int8_weight_parameters(w)
    bs = np.float32(np.float32(SX) * np.float32(s))
    b2 = (np.rint(b / bs).astype("int32").astype("float32") * bs).astype("float32")
    y = relay.nn.conv2d(d, _quantized_weight(w), channels=OC, kernel_size=(3, 3), padding=(1, 1))
    y = relay.nn.relu(relay.nn.bias_add(y, relay.const(b2)))
    expected = infer(relay.Function([x], relay.qnn.op.quantize(y, _c(SY, "float32"), _c(ZY, "int32"),
                                                                out_dtype="uint8")))
    check(QuantizeWeightsAsOnnxRuntime(), before, expected)
    assert not np.array_equal(b2, b)


# --- against ONNX Runtime --------------------------------------------------------------------------
def _onnx_model(w, b=None):
    """DequantizeLinear -> ConvTranspose (float initializer weight [, bias]) -> QuantizeLinear."""
    inits = [numpy_helper.from_array(w, "W"), helper.make_tensor("sx", TensorProto.FLOAT, [], [SX]),
             helper.make_tensor("zx", TensorProto.UINT8, [], [ZX]),
             helper.make_tensor("sy", TensorProto.FLOAT, [], [SY]),
             helper.make_tensor("zy", TensorProto.UINT8, [], [ZY])]
    ins = ["xf", "W"]
    if b is not None:
        inits.append(numpy_helper.from_array(b, "B"))
        ins.append("B")
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             helper.make_node("ConvTranspose", ins, ["yf"], strides=[2, 2], kernel_shape=[2, 2]),
             helper.make_node("QuantizeLinear", ["yf", "sy", "zy"], ["y"])]
    graph = helper.make_graph(nodes, "dq_convtranspose_q",
                              [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, C, HW, HW])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model


def _ort_session(model, level="ORT_ENABLE_ALL", optimized=None):
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    so.intra_op_num_threads = 1
    if optimized:
        so.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def test_parameters_equal_onnxruntime_optimizer(tmp_path):
    """The int8 weight, scale and zero point ORT's basic optimizer writes into the graph."""
    import onnx

    w = _weights(3)
    _ort_session(_onnx_model(w), "ORT_ENABLE_BASIC", tmp_path / "opt.onnx")
    opt = onnx.load(str(tmp_path / "opt.onnx"))
    inits = {i.name: numpy_helper.to_array(i) for i in opt.graph.initializer}
    (qname,) = [k for k, v in inits.items() if v.dtype == np.int8 and v.shape == w.shape]
    q, s, zp = ort_int8_weight_parameters(w)
    np.testing.assert_array_equal(q, inits[qname])
    assert np.float32(s) in [v for v in inits.values() if v.dtype == np.float32 and v.size == 1]
    assert zp != 0 and zp in [int(v) for v in inits.values() if v.dtype == np.int8 and v.size == 1]


@pytest.mark.parametrize("with_bias", [False, True])
def test_bit_exact_to_onnxruntime(with_bias):
    """int8(numerics="onnxruntime") equals ORT on every level; without the pass it does not."""
    w, b = _weights(4), (_bias(5) if with_bias else None)
    model = _onnx_model(w, b)
    xs = np.random.default_rng(6).integers(0, 256, (1, C, HW, HW)).astype("uint8")
    want = _ort_session(model).run(None, {"x": xs})[0]
    mod, params = from_onnx(model, shape={"x": [1, C, HW, HW]})
    pipe = pipelines.int8(numerics="onnxruntime")
    got = run_module(tvm_ext.build(mod, params=params, passes=pipe), {"x": xs})[0]
    np.testing.assert_array_equal(got, want)
    without = tvm_ext.build(mod, params=params, passes=pipe, disabled_pass=["QuantizeWeightsAsOnnxRuntime"])
    assert (run_module(without, {"x": xs})[0] != want).mean() > 0.01


def test_idempotent():
    once = QuantizeWeightsAsOnnxRuntime()(_graph(relay.const(_weights()), relay.const(_bias()))[0])
    assert_unchanged(QuantizeWeightsAsOnnxRuntime(), once)


def test_unchanged_on_branch_and_says_why(caplog):
    """The conv's output also read by a relu that is not on the way to the quantize: ORT skips it."""
    before = _graph(relay.const(_weights()), extra_reader=True)[0]
    assert_unchanged_with_reason(QuantizeWeightsAsOnnxRuntime(), before, "2 readers", LOGGER, caplog)


def test_unchanged_on_float_input_and_quantized_weight(caplog):
    x = relay.var("x", shape=(1, C, HW, HW), dtype="float32")
    w = relay.const(_weights())
    y = relay.qnn.op.quantize(relay.nn.conv2d_transpose(x, w, channels=OC, kernel_size=(2, 2), strides=(2, 2)),
                              _c(SY, "float32"), _c(ZY, "int32"), out_dtype="uint8")
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert_unchanged(QuantizeWeightsAsOnnxRuntime(), infer(relay.Function([x], y)))
        assert_unchanged(QuantizeWeightsAsOnnxRuntime(), _graph(_quantized_weight(_weights()))[0])
    assert "not a qnn.dequantize" in caplog.text and "not a float32 constant" in caplog.text


def test_default_pipeline_does_not_run_it():
    assert "QuantizeWeightsAsOnnxRuntime" not in pipelines.int8().pass_names()["start"]
    assert "QuantizeWeightsAsOnnxRuntime" in pipelines.int8(numerics="onnxruntime").pass_names()["start"]
    assert "QuantizeWeightsAsOnnxRuntime" in pipelines.onnxruntime_numerics().pass_names()["start"]


def test_untyped_module_raises():
    import tvm

    x = relay.var("x", shape=(1, C, HW, HW), dtype="uint8")
    d = relay.qnn.op.dequantize(x, _c(SX, "float32"), _c(ZX, "int32"))
    y = relay.nn.conv2d_transpose(d, relay.const(_weights()), channels=OC, kernel_size=(2, 2), strides=(2, 2))
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.qnn.op.quantize(y, _c(SY, "float32"), _c(ZY, "int32"),
                                                                          out_dtype="uint8")))
    assert_untyped_module_raises(QuantizeWeightsAsOnnxRuntime(), mod, "QuantizeWeightsAsOnnxRuntime")


@pytest.mark.slow
def test_real_detector_qoperator_within_two_steps_of_onnxruntime(tmp_path):
    """PP-OCRv4 det QOperator: its head ConvTranspose has a float weight between a DequantizeLinear and
    a QuantizeLinear, which ORT quantizes; without the pass 60 output steps from ORT, with it 0 (8 images).
    Built in a child process (minutes)."""
    got, ref, step = real_model_vs_onnxruntime(tmp_path, "ppocr_det_v4_int8_qoperator")
    assert np.abs(got - ref).max() / step <= 2.0
