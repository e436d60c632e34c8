"""Tests of tvm_ext.passes.qdq_to_integer (QDQ graphs to integer, residual adds at one rounding)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
import tvm_ext.zoo
from tvm_ext.passes._util import UntypedModuleError
from tvm_ext.passes.qdq_to_integer import QDQToInteger, is_qdq_graph
from tvm_ext.testing import assert_unchanged, check, infer, run_module

S, ZP = relay.const(0.05), relay.const(0, "int32")
W = np.random.default_rng(0).integers(-20, 20, (4, 4, 1, 1)).astype("int8")


def _dq(x, scale=S, zp=ZP):
    return relay.qnn.op.dequantize(x, scale, zp)


def _q(x, scale=S, zp=ZP):
    return relay.qnn.op.quantize(x, scale, zp, out_dtype="uint8")


def _xs():
    return relay.var("a", shape=(1, 4, 4, 4), dtype="uint8"), relay.var("b", shape=(1, 4, 4, 4), dtype="uint8")


def qdq_block():
    """a, b -> dq -> conv(dq(w)) -> q -> dq  \\
                                        add -> q          (the residual add of a QDQ ResNet)
       b  -> dq ----------------------------/
    """
    a, b = _xs()
    w = _dq(relay.const(W), relay.const(0.02), relay.const(0, "int32"))
    conv = _q(relay.nn.conv2d(_dq(a), w, channels=4, kernel_size=1))
    return infer(_q(relay.add(_dq(conv), _dq(b))))


def qdq_block_expected():
    """The conv region becomes what TVM's FQ2I makes of it alone; the add stays float."""
    a, b = _xs()
    w = _dq(relay.const(W), relay.const(0.02), relay.const(0, "int32"))
    conv_region = infer(relay.Function([a], _q(relay.nn.conv2d(_dq(a), w, channels=4, kernel_size=1))))
    conv_fn = relay.transform.FakeQuantizationToInteger()(conv_region)["main"]
    assert "qnn.conv2d" in conv_fn.astext()
    return infer(relay.Function([conv_fn.params[0], b], _q(relay.add(_dq(conv_fn.body), _dq(b)))))


def test_structure_conv_integer_add_float():
    check(QDQToInteger(), qdq_block(), qdq_block_expected())


def test_plain_fq2i_would_round_twice():
    mod = relay.transform.FakeQuantizationToInteger()(qdq_block())
    assert "qnn.add" in mod.astext() and "qnn.add" not in QDQToInteger()(qdq_block()).astext()


def test_numerics_against_the_float_qdq_graph():
    """Within one step of the float QDQ graph, and no further from it than TVM's plain FQ2I."""
    before = qdq_block()
    ours = QDQToInteger()(qdq_block())
    plain = relay.transform.FakeQuantizationToInteger()(qdq_block())
    rng = np.random.default_rng(3)
    err_ours = err_plain = 0
    for _ in range(4):
        inputs = {"a": rng.integers(0, 256, (1, 4, 4, 4)).astype("uint8"),
                  "b": rng.integers(0, 256, (1, 4, 4, 4)).astype("uint8")}
        ref = run_module(before, inputs)[0].astype(int)
        out = run_module(ours, inputs)[0]
        assert out.dtype == np.uint8
        assert np.abs(out.astype(int) - ref).max() <= 1
        err_ours += np.abs(out.astype(int) - ref).sum()
        err_plain += np.abs(run_module(plain, inputs)[0].astype(int) - ref).sum()
    assert err_ours <= err_plain


def test_numerics_bit_exact_with_expected():
    rng = np.random.default_rng(4)
    inputs = {"a": rng.integers(0, 256, (1, 4, 4, 4)).astype("uint8"),
              "b": rng.integers(0, 256, (1, 4, 4, 4)).astype("uint8")}
    np.testing.assert_array_equal(run_module(QDQToInteger()(qdq_block()), inputs)[0],
                                  run_module(qdq_block_expected(), inputs)[0])


def test_idempotent():
    once = QDQToInteger()(qdq_block())
    assert_unchanged(QDQToInteger(), once)


def test_unchanged_on_qoperator_and_float_graphs():
    x = relay.var("x", shape=(1, 4, 4, 4), dtype="uint8")
    qconv = relay.qnn.op.conv2d(x, relay.const(W), relay.const(0), relay.const(0), relay.const(0.1),
                                relay.const(0.02), kernel_size=(1, 1), channels=4)
    assert_unchanged(QDQToInteger(), infer(qconv))
    f = relay.var("f", shape=(1, 4, 4, 4))
    assert_unchanged(QDQToInteger(), infer(relay.nn.relu(f)))
    assert not is_qdq_graph(infer(relay.nn.relu(f))["main"])


def test_untyped_module_raises_naming_the_pass():
    a, b = _xs()
    mod = tvm.IRModule.from_expr(relay.Function([a, b], _q(relay.add(_dq(a), _dq(b)))))
    with pytest.raises((UntypedModuleError, tvm.TVMError), match="QDQToInteger"):
        QDQToInteger()(mod)


def test_if_is_skipped():
    a, b = _xs()
    c = relay.var("c", shape=(), dtype="bool")
    body = relay.If(c, _q(relay.add(_dq(a), _dq(b))), _q(_dq(a)))
    mod = infer(relay.Function([a, b, c], body))
    assert_unchanged(QDQToInteger(), mod)


def test_in_sequential_disabled_and_instrumented():
    names = []

    @tvm.instrument.pass_instrument
    class Rec:
        def run_after_pass(self, _mod, info):
            names.append(info.name)

    seq = tvm.transform.Sequential([QDQToInteger()])
    with tvm.transform.PassContext(opt_level=2, disabled_pass=["QDQToInteger"]):
        assert "qnn.conv2d" not in seq(qdq_block()).astext()
    with tvm.transform.PassContext(opt_level=2, instruments=[Rec()]):
        assert "qnn.conv2d" in seq(qdq_block()).astext()
    assert "QDQToInteger" in names


def test_small_zoo_qdq_integer_between_kernels_and_close_to_ort():
    """Small QDQ ResNet through the int8 pipeline: only uint8 crosses kernels; top-1 as ORT."""
    import onnxruntime as ort

    m = tvm_ext.zoo.load("resnet50_int8_qdq", small=True)
    fac = tvm_ext.build(m.mod, params=m.params, passes=tvm_ext.pipelines.int8())
    assert set(fac.kernel_report.crossing.nbytes) <= {"uint8", "int8"}, fac.kernel_report.crossing.nbytes
    sess = ort.InferenceSession(str(m.onnx_path), providers=["CPUExecutionProvider"])
    for s in range(4):
        x = np.random.default_rng(1000 + s).standard_normal(m.input_shape).astype("float32")
        ours, ref = run_module(fac, {m.input_name: x})[0], sess.run(None, {m.input_name: x})[0]
        assert ours.argmax() == ref.argmax()
        assert np.abs(ours - ref).max() < 0.2  # a few output quantization steps
