"""OpenCL builds executed on an OpenCL device (PoCL, set up by ``make gpu-env``) through the graph
executor: integer graphs bit-exact against a plain ``llvm`` build (generic, no int8 SIMD), float graphs
within tolerance. Skips with the reason when the set-up is missing. PoCL checks correctness, not speed."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.gpu import opencl
from _opencl_cases import device_or_skip, run_graph


@pytest.fixture(scope="module")
def device():
    return device_or_skip()


def _int8_conv_requantize():
    rng = np.random.RandomState(0)
    x = relay.var("x", shape=(1, 8, 12, 12), dtype="uint8")
    w = relay.const(rng.randint(-128, 128, (16, 8, 3, 3)).astype("int8"))
    c = relay.qnn.op.conv2d(x, w, relay.const(3), relay.const(0), relay.const(0.05), relay.const(0.01),
                            kernel_size=(3, 3), channels=16, padding=(1, 1), out_dtype="int32")
    b = relay.nn.bias_add(c, relay.const(rng.randint(-2000, 2000, 16).astype("int32")))
    r = relay.qnn.op.requantize(b, relay.const(0.0005), relay.const(0), relay.const(0.07), relay.const(5),
                                out_dtype="uint8")
    mod = tvm.IRModule.from_expr(relay.Function([x], r))
    return mod, {"x": rng.randint(0, 256, (1, 8, 12, 12)).astype("uint8")}


def test_opencl_build_hands_back_a_runnable_module(device):
    mod, _ = _int8_conv_requantize()
    lib = tvm_ext.build(mod, target="opencl")
    kinds = {m.type_key: m.is_runnable for m in opencl._walk(lib.lib)}
    assert kinds.get("opencl") is True


@pytest.mark.parametrize("passes", [(), "int8"])
def test_int8_conv_requantize_bit_exact_against_llvm(device, passes):
    mod, inputs = _int8_conv_requantize()
    chosen = pipelines.int8() if passes == "int8" else ()
    ref = run_graph(tvm_ext.build(mod, target="llvm", passes=chosen), tvm.cpu(), inputs)[0]
    got = run_graph(tvm_ext.build(mod, target="opencl", passes=chosen), device, inputs)[0]
    assert got.dtype == np.uint8 and 0 < len(np.unique(ref)) and np.array_equal(got, ref)


def test_float_graph_within_tolerance(device):
    rng = np.random.RandomState(1)
    x = relay.var("x", shape=(1, 8, 16, 16), dtype="float32")
    w = relay.const(rng.randn(16, 8, 3, 3).astype("float32"))
    y = relay.nn.relu(relay.nn.conv2d(x, w, padding=(1, 1), channels=16, kernel_size=(3, 3)))
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.nn.global_avg_pool2d(y)))
    inputs = {"x": rng.randn(1, 8, 16, 16).astype("float32")}
    ref = run_graph(tvm_ext.build(mod, target="llvm"), tvm.cpu(), inputs)[0]
    got = run_graph(tvm_ext.build(mod, target="opencl"), device, inputs)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def _zoo_pair(name, passes):
    from tvm_ext.tools import zoo

    m = zoo.load(name, small=True)
    inputs = {m.input_name: zoo.sample_input(m, seed=0)}
    ref = run_graph(tvm_ext.build(m.mod, target="llvm", params=m.params, passes=passes), tvm.cpu(), inputs)
    got = run_graph(tvm_ext.build(m.mod, target="opencl", params=m.params, passes=passes), tvm.opencl(0), inputs)
    return ref, got


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50_int8_qdq", "resnet50_int8_qoperator", "resnet50_int8_relay"])
def test_small_zoo_int8_resnet_with_int8_pipeline_matches_llvm(device, name):
    ref, got = _zoo_pair(name, pipelines.int8())
    for r, g in zip(ref, got):
        if np.issubdtype(r.dtype, np.integer):
            assert np.array_equal(g, r)
        else:
            # float outputs of an integer graph: the dequantized logits, one multiply from 8-bit levels
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_small_zoo_float_resnet_within_tolerance(device):
    ref, got = _zoo_pair("resnet50_fp32", ())
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-3, atol=1e-3)


def test_qdq_to_integer_converts_every_conv_at_opencl(device):
    """opencl legalizes no int8 conv (no channel padding), so QDQToInteger converts a 6-channel conv
    there (at plain llvm it stays float: x86 would pad it to 16); the build equals a plain llvm build
    of TVM's own FakeQuantizationToInteger of the graph, bit for bit."""
    from tvm_ext.passes import QDQToInteger

    rng = np.random.default_rng(6)
    a = relay.var("a", shape=(1, 16, 4, 4), dtype="uint8")
    scale, zp = relay.const(0.05), relay.const(3, "int32")
    w = relay.qnn.op.dequantize(relay.const(rng.integers(-20, 20, (6, 16, 1, 1)).astype("int8")), relay.const(0.02),
                                relay.const(0, "int32"))
    conv = relay.nn.conv2d(relay.qnn.op.dequantize(a, scale, zp), w, channels=6, kernel_size=1)
    mod = tvm.IRModule.from_expr(relay.Function([a], relay.qnn.op.quantize(conv, scale, zp, out_dtype="uint8")))
    mod = relay.transform.InferType()(mod)
    built = tvm_ext.build(mod, target="opencl", passes={"start": [QDQToInteger()]})
    assert any("nn.conv2d" in k.ops and k.inputs[0][1] == "uint8" for k in built.kernel_report.kernels)
    integer = relay.transform.FakeQuantizationToInteger()(mod)
    inputs = {"a": rng.integers(0, 256, (1, 16, 4, 4)).astype("uint8")}
    ref = run_graph(tvm_ext.build(integer, target="llvm"), tvm.cpu(), inputs)[0]
    got = run_graph(built, device, inputs)[0]
    assert got.dtype == np.uint8 and np.array_equal(got, ref)
