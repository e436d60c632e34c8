"""Tests of tvm_ext.passes.add_as_onnxruntime: quantized adds as ONNX Runtime's MLAS computes them."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relay

import tvm_ext
from tvm_ext.passes import AddAsOnnxRuntime, RoundHalfToEven
from tvm_ext.passes.add_as_onnxruntime import mlas_add
from tvm_ext.testing import assert_unchanged, check, infer, run_module

from _helpers import assert_not_mutated_and_disabled_by_name, assert_unchanged_with_reason, assert_untyped_module_raises

ort = pytest.importorskip("onnxruntime")
LOGGER = "tvm_ext.passes.AddAsOnnxRuntime"
SHAPE = (1, 8, 16, 16)
# PP-OCR cls hard-swish "x + 3" (Add@9) and a residual add (elementwise_add_3), scales as quantized
X3 = dict(sa=0.06693647, za=117, sb=0.011764706, zb=0, sc=0.023529412, zc=0)
RES = dict(sa=0.08210577, za=110, sb=0.035563823, zb=130, sc=0.09235757, zc=107)


def _c(v, dtype):
    return relay.const(np.array(v, dtype))


def _imported(q, b_const=None):
    """TVM's import of QLinearAdd: quantize(add(dequantize(a), dequantize(b)))."""
    a = relay.var("a", shape=SHAPE, dtype="uint8")
    b = relay.const(np.array([b_const], "uint8")) if b_const is not None else relay.var("b", shape=SHAPE, dtype="uint8")
    da = relay.qnn.op.dequantize(a, _c(q["sa"], "float32"), _c(q["za"], "int32"))
    db = relay.qnn.op.dequantize(b, _c(q["sb"], "float32"), _c(q["zb"], "int32"))
    y = relay.qnn.op.quantize(relay.add(da, db), _c(q["sc"], "float32"), _c(q["zc"], "int32"), out_dtype="uint8")
    params = [a] if b_const is not None else [a, b]
    return infer(relay.Function(params, y)), a, b


def _qnn_add(q):
    a = relay.var("a", shape=SHAPE, dtype="uint8")
    b = relay.var("b", shape=SHAPE, dtype="uint8")
    y = relay.qnn.op.add(a, b, _c(q["sa"], "float32"), _c(q["za"], "int32"), _c(q["sb"], "float32"),
                         _c(q["zb"], "int32"), _c(q["sc"], "float32"), _c(q["zc"], "int32"))
    return infer(relay.Function([a, b], y)), a, b


def _ort_qlinear_add(q, a, b):
    node = helper.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["y"], domain="com.microsoft")
    inits = [helper.make_tensor("sa", TensorProto.FLOAT, [], [q["sa"]]),
             helper.make_tensor("za", TensorProto.UINT8, [], [q["za"]]),
             helper.make_tensor("sb", TensorProto.FLOAT, [], [q["sb"]]),
             helper.make_tensor("zb", TensorProto.UINT8, [], [q["zb"]]),
             helper.make_tensor("sc", TensorProto.FLOAT, [], [q["sc"]]),
             helper.make_tensor("zc", TensorProto.UINT8, [], [q["zc"]])]
    if b.size == 1:
        inits.append(helper.make_tensor("b", TensorProto.UINT8, list(b.shape), b.ravel().tolist()))
        inputs = [helper.make_tensor_value_info("a", TensorProto.UINT8, list(a.shape))]
        feed = {"a": a}
    else:
        inputs = [helper.make_tensor_value_info(n, TensorProto.UINT8, list(a.shape)) for n in ("a", "b")]
        feed = {"a": a, "b": b}
    graph = helper.make_graph([node], "qladd", inputs, [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)[0]


def _mlas_host():
    """MLAS's x86 AVX2 kernel is what the pass reproduces (module note)."""
    if "avx2" not in tvm_ext.x86.isa.host_features():
        pytest.skip("ONNX Runtime uses another QLinearAdd kernel without AVX2")


def test_rewrites_imported_qlinear_add():
    before, a, b = _imported(RES)
    expected = infer(relay.Function([a, b], mlas_add(a, b, *RES.values(), "uint8")))
    after = check(AddAsOnnxRuntime(), before, expected)
    assert "qnn." not in after.astext()


def test_rewrites_qnn_add():
    before, a, b = _qnn_add(RES)
    check(AddAsOnnxRuntime(), before, infer(relay.Function([a, b], mlas_add(a, b, *RES.values(), "uint8"))))


def _all_levels():
    a = np.arange(256, dtype="uint8")
    return np.resize(a, int(np.prod(SHAPE))).reshape(SHAPE)


def test_scalar_operand_bit_exact_to_onnxruntime():
    """hard-swish's x + 3: at a == za the sum is 127.5 levels in exact arithmetic; MLAS's float
    evaluation gives 127, TVM (even with ties to even) 128."""
    _mlas_host()
    before, _, _ = _imported(X3, b_const=255)
    a = _all_levels()
    want = _ort_qlinear_add(X3, a, np.array([255], "uint8"))
    ext = tvm_ext.build(before, passes={"start": [AddAsOnnxRuntime()], "before_fuse": [RoundHalfToEven()]})
    stock = tvm_ext.build(before)
    np.testing.assert_array_equal(run_module(ext, {"a": a})[0], want)
    assert (run_module(stock, {"a": a})[0] != want).any()


@pytest.mark.parametrize("form", ["imported", "qnn.add"])
def test_tensor_operands_bit_exact_to_onnxruntime(form):
    """Differential against ONNX Runtime's QLinearAdd on random levels; TVM's qnn.add (two roundings)
    differs from it."""
    _mlas_host()
    before = _imported(RES)[0] if form == "imported" else _qnn_add(RES)[0]
    after = AddAsOnnxRuntime()(before)
    rng = np.random.default_rng(7)
    a, b = (rng.integers(0, 256, SHAPE).astype("uint8") for _ in range(2))
    want = _ort_qlinear_add(RES, a, b)
    np.testing.assert_array_equal(run_module(after, {"a": a, "b": b})[0], want)
    if form == "qnn.add":
        assert (run_module(before, {"a": a, "b": b})[0] != want).mean() > 0.01


def _residual_block(q):
    """QDQ residual block whose input's dequantize is also read by a float conv::

        p = conv_a(x) (u8) -> dq_p -+-> conv2d (float, kept by QDQToInteger) -> q -> dq ----+-> add -> q
                                    +----------------------------------------------------+
    """
    x = relay.var("x", shape=SHAPE, dtype="float32")
    w = relay.const(np.random.default_rng(5).uniform(-0.5, 0.5, (8, 8, 1, 1)).astype("float32"))
    p = relay.qnn.op.quantize(relay.nn.conv2d(x, w, kernel_size=(1, 1)), _c(q["sa"], "float32"),
                              _c(q["za"], "int32"), out_dtype="uint8")
    dq_p = relay.qnn.op.dequantize(p, _c(q["sa"], "float32"), _c(q["za"], "int32"))
    b = relay.qnn.op.quantize(relay.nn.conv2d(dq_p, w, kernel_size=(1, 1)), _c(q["sb"], "float32"),
                              _c(q["zb"], "int32"), out_dtype="uint8")
    db = relay.qnn.op.dequantize(b, _c(q["sb"], "float32"), _c(q["zb"], "int32"))
    y = relay.qnn.op.quantize(relay.add(dq_p, db), _c(q["sc"], "float32"), _c(q["zc"], "int32"), out_dtype="uint8")
    return infer(relay.Function([x], y)), (x, p, b)


def test_operand_whose_dequantize_a_conv_reads_is_recovered_from_it():
    """The add reads rne(dq_p / s) + z (exact) instead of p: p keeps one reader, its dequantize
    fuses into p's kernel; no kernel of its own dequantizes p for the conv. Same outputs."""
    before, (x, p, b) = _residual_block(RES)
    after = AddAsOnnxRuntime()(before)
    text = after.astext()
    assert "tvm_ext.round_half_to_even" in text and "qnn.quantize(%" in text
    # p (the first quantize) is read once: by its dequantize
    from tvm_ext.passes._util import consumers, dataflow_nodes
    nodes = dataflow_nodes(after["main"], "test")
    users = consumers(nodes)
    p_after = [n for n in nodes if getattr(n, "op", None) is not None and getattr(n.op, "name", "") == "qnn.quantize"
               and str(n.checked_type.dtype) == "uint8" and len(users.get(n, [])) and
               all(getattr(u.op, "name", "") == "qnn.dequantize" for u, _ in users[n])]
    assert len(p_after) == 1, text  # p, read by its dequantize only (b's only reader is the add)
    direct = infer(relay.Function([x], mlas_add(p, b, *RES.values(), "uint8")))
    xs = np.random.default_rng(2).uniform(-40, 40, SHAPE).astype("float32")
    np.testing.assert_array_equal(run_module(after, {"x": xs})[0], run_module(direct, {"x": xs})[0])
    built = [tvm_ext.build(m) for m in (direct, after)]
    assert built[1].kernel_report.num_kernels == built[0].kernel_report.num_kernels - 1, \
        [r.kernel_report.table() for r in built]
    np.testing.assert_array_equal(run_module(built[1], {"x": xs})[0], run_module(built[0], {"x": xs})[0])
    assert_unchanged(AddAsOnnxRuntime(), after)


def test_implied_clip_is_looked_through_and_narrow_clip_is_kept(caplog):
    """QDQ Add -> Clip(0, 6) -> Q with output scale 6/255: the clip is implied by the 8-bit range."""
    a = relay.var("a", shape=SHAPE, dtype="uint8")
    da = relay.qnn.op.dequantize(a, _c(X3["sa"], "float32"), _c(X3["za"], "int32"))
    db = relay.qnn.op.dequantize(relay.const(np.array([255], "uint8")), _c(X3["sb"], "float32"), _c(0, "int32"))

    def graph(hi):
        y = relay.qnn.op.quantize(relay.clip(relay.add(da, db), 0.0, hi), _c(X3["sc"], "float32"), _c(0, "int32"),
                                  out_dtype="uint8")
        return infer(relay.Function([a], y))

    after = AddAsOnnxRuntime()(graph(6.0))
    assert "clip(%" in after.astext() and "qnn.quantize" not in after.astext()  # only the output clip remains
    assert_unchanged_with_reason(AddAsOnnxRuntime(), graph(3.0), "narrower than the 8-bit range", LOGGER, caplog)


def test_idempotent():
    once = AddAsOnnxRuntime()(_imported(RES)[0])
    assert_unchanged(AddAsOnnxRuntime(), once)


def test_unchanged_on_float_add():
    x = relay.var("x", shape=SHAPE, dtype="float32")
    y = relay.qnn.op.quantize(relay.add(x, x), _c(0.1, "float32"), _c(3, "int32"), out_dtype="uint8")
    assert_unchanged(AddAsOnnxRuntime(), infer(relay.Function([x], y)))


def test_per_channel_scale_left_alone_says_why(caplog):
    a = relay.var("a", shape=SHAPE, dtype="uint8")
    da = relay.qnn.op.dequantize(a, relay.const(np.full(8, 0.1, "float32")), _c(0, "int32"), axis=1)
    db = relay.qnn.op.dequantize(a, _c(0.2, "float32"), _c(0, "int32"))
    y = relay.qnn.op.quantize(relay.add(da, db), _c(0.3, "float32"), _c(0, "int32"), out_dtype="uint8")
    assert_unchanged_with_reason(AddAsOnnxRuntime(), infer(relay.Function([a], y)),
                                 "lhs scale is not a scalar constant", LOGGER, caplog)


def test_untyped_module_raises():
    a = relay.var("a", shape=SHAPE, dtype="uint8")
    y = relay.qnn.op.add(a, a, _c(0.1, "float32"), _c(0, "int32"), _c(0.1, "float32"), _c(0, "int32"),
                         _c(0.2, "float32"), _c(0, "int32"))
    assert_untyped_module_raises(AddAsOnnxRuntime(), tvm.IRModule.from_expr(relay.Function([a], y)), "AddAsOnnxRuntime")


def test_not_mutated_and_disabled_by_name():
    assert_not_mutated_and_disabled_by_name(AddAsOnnxRuntime(), _qnn_add(RES)[0], "AddAsOnnxRuntime", "qnn.add")
