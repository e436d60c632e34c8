"""Tests of tvm_ext.passes.round_half_to_even (and pipelines.int8(numerics="onnxruntime"))."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relay

import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.passes import RoundHalfToEven
from tvm_ext.passes.round_half_to_even import round_half_to_even
from tvm_ext.testing import assert_unchanged, check, exact_ort_session, infer, run_module

from _helpers import (assert_not_mutated_and_disabled_by_name, assert_unchanged_with_reason,
                      assert_untyped_module_raises, onnxruntime_reference, real_model_vs_onnxruntime)

LOGGER = "tvm_ext.passes.RoundHalfToEven"
TIES = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -127.5, 3.0, -4.0, 0.49999997, -0.49999997,
                 2.5000002, -2.4999998, 1e9 + 0.0, -0.0], "float32")


def _round_graph(shape=(16,), dtype="float32"):
    x = relay.var("x", shape=shape, dtype=dtype)
    return infer(relay.Function([x], relay.multiply(relay.round(relay.multiply(x, relay.const(1.0, dtype))),
                                                    relay.const(2.0, dtype))))


def test_rewrites_round_to_floor_form():
    """round(v) -> f + where(d > 0.5, 1, where(d == 0.5, f - 2 floor(f/2), 0)), f = floor(v), d = v - f."""
    x = relay.var("x", shape=(16,), dtype="float32")
    v = relay.multiply(x, relay.const(1.0))
    expected = infer(relay.Function([x], relay.multiply(round_half_to_even(v), relay.const(2.0))))
    after = check(RoundHalfToEven(), _round_graph(), expected)
    assert "round(" not in after.astext()


def test_rounded_scalar_division_stays_a_division():
    """round(x / c) -> rne(x / const([c])): TIR would turn x / c into x * (1 / c)."""
    x = relay.var("x", shape=(16,), dtype="float32")
    c = np.float32(2 / 255)
    before = infer(relay.Function([x], relay.round(relay.divide(x, relay.const(c)))))
    expected = infer(relay.Function([x], round_half_to_even(relay.divide(x, relay.const(np.array([c]))))))
    after = check(RoundHalfToEven(), before, expected)
    xv = np.array([(p / 255 - 0.5) / 0.5 for p in (129, 126)] * 8, "float32")  # x / c == +-1.5, x * (1 / c) not
    assert (np.abs(xv / c) == np.float32(1.5)).all() and not (np.abs(xv * (np.float32(1) / c)) == np.float32(1.5)).any()
    np.testing.assert_array_equal(run_module(after, {"x": xv})[0], np.rint(xv / c))
    np.testing.assert_array_equal(run_module(before, {"x": xv})[0], np.round(xv * (np.float32(1) / c)))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ties_to_even_and_equal_elsewhere(dtype):
    """Differential: the rewritten graph equals numpy's rint (ties to even) bit for bit, and the
    original graph everywhere but on exact ties."""
    before = _round_graph(dtype=dtype)
    after = RoundHalfToEven()(before)
    rng = np.random.default_rng(5)
    xs = [TIES.astype(dtype), (rng.standard_normal(16) * 300).astype(dtype),
          np.array([np.inf, -np.inf, np.nan, 2.0**23 + 1, -(2.0**23) - 1, 2.0**30, 0.25, -0.75] * 2, dtype)]
    for x in xs:
        got = run_module(after, {"x": x})[0]
        ref = run_module(before, {"x": x})[0]
        np.testing.assert_array_equal(got, np.rint(x) * 2)
        with np.errstate(invalid="ignore"):
            tie = (x - np.floor(x)) == 0.5
        np.testing.assert_array_equal(got[~tie], ref[~tie])
    assert (run_module(before, {"x": TIES.astype(dtype)})[0] != np.rint(TIES) * 2).any()  # stock differs on ties


def _quantize_graph():
    x = relay.var("x", shape=(1, 4, 8, 8), dtype="float32")
    q = relay.qnn.op.quantize(x, relay.const(np.float32(2 / 255)), relay.const(127), out_dtype="uint8")
    return infer(relay.Function([x], q))


def _onnx_model(nodes, name, x, y, inits):
    """A checked opset-13 ONNX model of ``nodes``: input "x" as ``x = (elem_type, shape)``, one output as
    ``y = (elem_type, shape, name)``."""
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", x[0], list(x[1]))],
                              [helper.make_tensor_value_info(y[2], y[0], list(y[1]))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _ort_quantize(x):
    import onnxruntime as ort

    node = helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["y"])
    model = _onnx_model([node], "q", (TensorProto.FLOAT, x.shape), (TensorProto.UINT8, x.shape, "y"),
                        [helper.make_tensor("s", TensorProto.FLOAT, [], [np.float32(2 / 255)]),
                         helper.make_tensor("zp", TensorProto.UINT8, [], [127])])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _pixels(seed):
    """Images normalised as PP-OCR does: (p / 255 - 0.5) / 0.5 lands on x / (2/255) = p - 127.5 (ties)."""
    p = np.random.default_rng(seed).integers(0, 256, (1, 4, 8, 8)).astype("float64")
    p[0, 0, 0, :2] = [126, 129]  # x / scale is a tie, x * (1 / scale) is not (+-1.4999999)
    return ((p / 255 - 0.5) / 0.5).astype("float32")


def test_lowered_quantize_matches_onnxruntime_on_ties():
    """What the pass is for: qnn.quantize of normalised pixels, stock TVM vs ORT vs the rewrite."""
    mod = _quantize_graph()
    target = tvm_ext.host_target()
    stock = tvm_ext.build(mod, target)
    ext = tvm_ext.build(mod, target, passes=[RoundHalfToEven()])
    assert ext.kernel_report.num_kernels == stock.kernel_report.num_kernels
    x = _pixels(0)
    ort_y = _ort_quantize(x)
    stock_y, ext_y = run_module(stock, {"x": x})[0], run_module(ext, {"x": x})[0]
    assert (stock_y != ort_y).mean() > 0.2  # half are exact ties: stock is one level off on half of them
    np.testing.assert_array_equal(ext_y, ort_y)
    r = np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype("float32")  # no ties: all agree
    np.testing.assert_array_equal(run_module(ext, {"x": r})[0], run_module(stock, {"x": r})[0])


def test_idempotent():
    once = RoundHalfToEven()(_round_graph())
    assert_unchanged(RoundHalfToEven(), once)


def test_unchanged_on_no_match():
    x = relay.var("x", shape=(8,), dtype="float32")
    assert_unchanged(RoundHalfToEven(), infer(relay.Function([x], relay.floor(relay.sqrt(x)))))


def test_float16_round_left_alone_says_why(caplog):
    assert_unchanged_with_reason(RoundHalfToEven(), _round_graph(dtype="float16"), "round of float16", LOGGER, caplog)


def test_if_skipped(caplog):
    x = relay.var("x", shape=(4,), dtype="float32")
    c = relay.var("c", shape=(), dtype="bool")
    mod = infer(relay.Function([x, c], relay.If(c, relay.round(x), x)))
    assert_unchanged_with_reason(RoundHalfToEven(), mod, "If", LOGGER, caplog)


def test_untyped_module_raises():
    x = relay.var("x", shape=(4,), dtype="float32")
    untyped = tvm.IRModule.from_expr(relay.Function([x], relay.round(x)))
    assert_untyped_module_raises(RoundHalfToEven(), untyped, "RoundHalfToEven")


def test_not_mutated_and_disabled_by_name():
    assert_not_mutated_and_disabled_by_name(RoundHalfToEven(), _round_graph(), "RoundHalfToEven", "round(")


# --- pipelines.int8(numerics="onnxruntime") ------------------------------------------------------
def test_pipeline_numerics_option():
    """int8(numerics="onnxruntime") = int8() + AddAsOnnxRuntime + QuantizeWeightsAsOnnxRuntime + RoundHalfToEven
    (before TabulateEightBit, so tables round as ONNX does) + ORT requantize settings."""
    default, ort = pipelines.int8(), pipelines.int8(numerics="onnxruntime")
    assert "RoundHalfToEven" not in default.pass_names()["before_fuse"]
    fuse = default.pass_names()["before_fuse"]
    assert fuse[-4:] == ["TabulateEightBit", "AffineEightBitJoin", "AnchoredArgumentFirst", "DequantizeInConvTranspose"]
    assert ort.pass_names()["before_fuse"] == [*fuse[:-4], "RoundHalfToEven", *fuse[-4:]]
    start = default.pass_names()["start"]
    assert ort.pass_names()["start"] == [*start[:2], "AddAsOnnxRuntime", "QuantizeWeightsAsOnnxRuntime",
                                         *start[2:]]  # after QDQToInteger
    assert ort.name == "tvm_ext.int8_ort" and default.name == "tvm_ext.int8"
    assert default.requantize == () and dict(ort.requantize) == dict(pipelines.ORT_REQUANTIZE)
    with pytest.raises(ValueError, match="numerics='mlas'"):
        pipelines.int8(numerics="mlas")


def _qdq_conv_model():
    """Input QuantizeLinear of normalised pixels -> QDQ conv (16 channels) -> output; opset 13."""
    rng = np.random.default_rng(3)
    w = rng.integers(-127, 128, (16, 4, 3, 3)).astype("int8")
    inits = [helper.make_tensor("s_x", TensorProto.FLOAT, [], [np.float32(2 / 255)]),
             helper.make_tensor("z_x", TensorProto.UINT8, [], [127]),
             helper.make_tensor("w", TensorProto.INT8, list(w.shape), w.ravel().tolist()),
             helper.make_tensor("s_w", TensorProto.FLOAT, [], [0.004]),
             helper.make_tensor("z_w", TensorProto.INT8, [], [0]),
             helper.make_tensor("s_y", TensorProto.FLOAT, [], [0.05]),
             helper.make_tensor("z_y", TensorProto.UINT8, [], [128])]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s_x", "z_x"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s_x", "z_x"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "s_w", "z_w"], ["wd"]),
             helper.make_node("Conv", ["xd", "wd"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["y", "s_y", "z_y"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "s_y", "z_y"], ["out"])]
    return _onnx_model(nodes, "qdq", (TensorProto.FLOAT, [1, 4, 8, 8]), (TensorProto.FLOAT, [1, 16, 8, 8], "out"),
                       inits)


def test_pipeline_onnxruntime_numerics_on_a_qdq_conv():
    """The int8 pipeline with numerics="onnxruntime" agrees with ORT where the default does not,
    with the same kernels."""
    from tvm_ext.core.frontend import from_onnx

    model = _qdq_conv_model()
    mod, params = from_onnx(model)
    default = tvm_ext.build(mod, params=params, passes=pipelines.int8())
    ortnum = tvm_ext.build(mod, params=params, passes=pipelines.int8(numerics="onnxruntime"))
    assert ortnum.kernel_report.num_kernels == default.kernel_report.num_kernels
    sess = exact_ort_session(model.SerializeToString())  # as tvm-ext: no saturated pair sums without VNNI
    diffs_default, diffs_ort = [], []
    for seed in range(3):
        x = _pixels(10 + seed)
        ref = sess.run(None, {"x": x})[0]
        diffs_default.append(np.abs(run_module(default, {"x": x})[0] - ref).max() / 0.05)
        diffs_ort.append(np.abs(run_module(ortnum, {"x": x})[0] - ref).max() / 0.05)
    assert max(diffs_default) >= 1.0  # the input's ties move conv outputs by whole steps
    assert max(diffs_ort) == 0.0, diffs_ort


def test_zero_point_added_after_rounding():
    """round(v + 3.0) -> rne(v) + 3.0 (ONNX Runtime requantizes as rne(acc * m) + zp)."""
    x = relay.var("x", shape=(16,), dtype="float32")
    before = infer(relay.Function([x], relay.round(relay.add(relay.multiply(x, relay.const(np.float32(0.5))),
                                                             relay.const(np.float32(3.0))))))
    v = relay.multiply(x, relay.const(np.float32(0.5)))
    expected = infer(relay.Function([x], relay.add(round_half_to_even(v), relay.const(np.float32(3.0)))))
    after = check(RoundHalfToEven(), before, expected)
    xv = np.arange(-8, 8).astype("float32") * 2 + 1  # v = odd / 2: every element a tie
    np.testing.assert_array_equal(run_module(after, {"x": xv})[0], np.rint(xv * 0.5) + 3)
    assert (run_module(before, {"x": xv})[0] != np.rint(xv * 0.5) + 3).any()


def test_non_integer_offset_stays_inside():
    x = relay.var("x", shape=(4,), dtype="float32")
    v = relay.add(x, relay.const(np.float32(0.25)))
    before = infer(relay.Function([x], relay.round(v)))
    check(RoundHalfToEven(), before, infer(relay.Function([x], round_half_to_even(v))))


def _requantize_graph(zp_out):
    x = relay.var("x", shape=(1, 64), dtype="int32")
    y = relay.qnn.op.requantize(x, relay.const(np.float32(0.25)), relay.const(0), relay.const(np.float32(1.0)),
                                relay.const(zp_out), out_dtype="uint8")
    return infer(relay.Function([x], y))


def _mlas_requantize(acc, m, zp):
    """ONNX Runtime (MLAS): clamp(acc * m) in float, round half to even, then + zp."""
    v = np.clip(acc.astype(np.float32) * np.float32(m), 0 - zp, 255 - zp)
    return (np.rint(v) + zp).astype("uint8")


@pytest.mark.parametrize("zp_out", [0, 7])
def test_onnxruntime_numerics_pipeline_requantizes_as_mlas(zp_out):
    """pipelines.onnxruntime_numerics(): requantize_config(TONEAREST, float32) + RoundHalfToEven
    gives MLAS's requantize bit for bit (ties included); stock rounds ties up."""
    mod = _requantize_graph(zp_out)
    pipe = pipelines.onnxruntime_numerics()
    assert dict(pipe.requantize) == {"rounding": "TONEAREST", "compute_dtype": "float32"}
    stock = tvm_ext.build(mod)
    ext = tvm_ext.build(mod, passes=pipe)
    acc = np.arange(-28, 36).reshape(1, 64).astype("int32")  # acc * 0.25 = k + 0.5 for every acc = 2 mod 4
    want = _mlas_requantize(acc, 0.25, zp_out)
    np.testing.assert_array_equal(run_module(ext, {"x": acc})[0], want)
    assert (run_module(stock, {"x": acc})[0] != want).any()
    assert ext.kernel_report.num_kernels == stock.kernel_report.num_kernels


# --- real model (slow: a PP-OCR classifier build takes minutes; built in a child process) --------
def _saturating_conv_model(fmt):
    """A 1x1 uint8 x int8 conv (64 input channels) whose int16 pair sums saturate without VNNI: every
    weight of output channel 0 is 127 and the first rows of the image are 255. Scales 1, 1 and 2**-14:
    ONNX Runtime's requantize ``rne(acc * 2**-14) + 128`` is exact in float32. ``fmt``: ``"qoperator"``
    (QLinearConv) or ``"qdq"`` (DequantizeLinear -> Conv -> QuantizeLinear, which ONNX Runtime fuses
    into the same kernel)."""
    rng = np.random.default_rng(7)
    w = rng.integers(-128, 128, (8, 64, 1, 1)).astype("int8")
    w[0] = 127
    one, y_scale = np.float32(1.0), np.float32(2.0**14)
    inits = [helper.make_tensor("s_x", TensorProto.FLOAT, [], [one]),
             helper.make_tensor("z_x", TensorProto.UINT8, [], [0]),
             helper.make_tensor("w", TensorProto.INT8, list(w.shape), w.tobytes(), raw=True),
             helper.make_tensor("s_w", TensorProto.FLOAT, [], [one]),
             helper.make_tensor("z_w", TensorProto.INT8, [], [0]),
             helper.make_tensor("s_y", TensorProto.FLOAT, [], [y_scale]),
             helper.make_tensor("z_y", TensorProto.UINT8, [], [128])]
    if fmt == "qoperator":
        nodes = [helper.make_node("QLinearConv", ["x", "s_x", "z_x", "w", "s_w", "z_w", "s_y", "z_y"], ["y"])]
    else:
        nodes = [helper.make_node("DequantizeLinear", ["x", "s_x", "z_x"], ["xd"]),
                 helper.make_node("DequantizeLinear", ["w", "s_w", "z_w"], ["wd"]),
                 helper.make_node("Conv", ["xd", "wd"], ["yf"]),
                 helper.make_node("QuantizeLinear", ["yf", "s_y", "z_y"], ["y"])]
    return _onnx_model(nodes, "conv", (TensorProto.UINT8, [1, 64, 4, 4]), (TensorProto.UINT8, [1, 8, 4, 4], "y"),
                       inits), w


@pytest.mark.parametrize("fmt", ["qoperator", "qdq"])
def test_real_model_reference_is_exact_accumulation(fmt, tmp_path):
    """The ONNX Runtime outputs the real-model tests compare with are exact integer arithmetic (numpy),
    also where its default kernels saturate int16 pair sums (x86 with AVX2 and no VNNI: checked to differ)."""
    import onnxruntime as ort

    from tvm_ext.x86.isa import host_features

    model, w = _saturating_conv_model(fmt)
    path = tmp_path / "conv.onnx"
    onnx.save(model, str(path))
    xs = [np.random.default_rng(s).integers(0, 256, (1, 64, 4, 4)).astype("uint8") for s in range(2)]
    for x in xs:
        x[:, :, :2] = 255
    got = onnxruntime_reference(path, xs)
    acc = np.stack([np.einsum("oc,nchw->nohw", w[:, :, 0, 0].astype(np.int64), x.astype(np.int64)) for x in xs])
    want = np.clip(np.rint(acc * 2.0**-14) + 128, 0, 255).astype("uint8")
    np.testing.assert_array_equal(got, want)
    default = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    saturated = np.stack([default.run(None, {"x": x})[0] for x in xs])
    host = host_features()
    if "avx2" in host and not {"avx512vnni", "avxvnni"} & host:  # MLAS's vpmaddubsw kernels
        assert (saturated != want).any()  # what a default session would have compared with here


def test_exact_session_says_when_it_falls_back_to_the_default_one(tmp_path, caplog):
    """An int8 x int8 QLinearConv has no exact kernel in ONNX Runtime: the default session is used, and
    a warning says so (a silent fallback could make a saturating session the reference)."""
    import logging

    model, _ = _saturating_conv_model("qoperator")
    for t in model.graph.initializer:  # activations int8 instead of uint8
        if t.name in ("z_x", "z_y"):
            t.CopyFrom(helper.make_tensor(t.name, TensorProto.INT8, [], [0]))
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.INT8
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.INT8
    with caplog.at_level(logging.WARNING, logger="tvm_ext.testing"):
        sess = exact_ort_session(model.SerializeToString())
    assert "no exact int8 kernel" in caplog.text
    assert sess.run(None, {"x": np.zeros((1, 64, 4, 4), "int8")})[0].shape == (1, 8, 4, 4)


@pytest.mark.slow
@pytest.mark.parametrize("name, pipeline", [
    ("ppocr_cls_v2_int8_qoperator", "int8"),
    ("ppocr_cls_v2_int8_qdq", "onnxruntime_numerics"),
    # QDQToInteger(shared_dequantize=True) keeps the SE pools float (FQ2I would make them integer:
    # 14 steps, top-1 6/8; docs/numerics.md)
    ("ppocr_cls_v2_int8_qdq", "int8"),
])
def test_real_classifier_within_two_steps_of_onnxruntime(name, pipeline, tmp_path):
    """PP-OCR's text-direction classifier: with ONNX Runtime's numerics, TVM is within 2 output
    steps of ONNX Runtime's exact int8 path and agrees on top-1 for all 8 images (stock and the
    default pipeline are 13-32 steps away, top-1 6-8/8; ONNX Runtime's default kernels without VNNI,
    which saturate pair sums, are 29-30 steps from its exact path, top-1 7/8)."""
    got, ref, step = real_model_vs_onnxruntime(tmp_path, name, pipeline, timeout=1800)
    assert np.abs(got - ref).max() / step <= 2.0
    assert (got.reshape(8, -1).argmax(1) == ref.reshape(8, -1).argmax(1)).all()


def test_onnxruntime_numerics_per_channel_requantize():
    """Per-channel scales (ORT's per-channel weights): same MLAS rounding, per output channel."""
    x = relay.var("x", shape=(1, 4, 16), dtype="int32")
    scales = np.array([0.25, 0.5, 0.125, 0.75], "float32")
    y = relay.qnn.op.requantize(x, relay.const(scales), relay.const(0), relay.const(np.float32(1.0)),
                                relay.const(5), axis=1, out_dtype="uint8")
    mod = infer(relay.Function([x], y))
    ext = tvm_ext.build(mod, passes=pipelines.onnxruntime_numerics())
    acc = np.arange(-20, 44).reshape(1, 4, 16).astype("int32")
    want = np.stack([_mlas_requantize(acc[:, c], scales[c], 5) for c in range(4)], axis=1)
    np.testing.assert_array_equal(run_module(ext, {"x": acc})[0], want)


# --- the rounding op: one nearbyint per rounding (compile time), same values as the formula --------
def _formula_rne(v, dtype="float32"):
    """What RoundHalfToEven emitted before tvm_ext.round_half_to_even: a Relay formula reading v 7 times."""
    def c(x):
        return relay.const(x, dtype)

    f = relay.floor(v)
    d = relay.subtract(v, f)
    odd = relay.subtract(f, relay.multiply(c(2.0), relay.floor(relay.multiply(c(0.5), f))))
    tie = relay.where(relay.equal(d, c(0.5)), odd, c(0.0))
    return relay.add(f, relay.where(relay.greater(d, c(0.5)), c(1.0), tie))


def _nested_roundings(k, rne):
    """k roundings chained in one elementwise kernel, every level with exact ties ((v - 3) / 2, v odd)."""
    x = relay.var("x", shape=(1, 16, 4, 4), dtype="uint8")
    v = relay.cast(x, "float32")
    for i in range(k):
        v = relay.multiply(relay.subtract(v, relay.const(np.float32(3.0 + i))), relay.const(np.float32(0.5)))
        v = relay.clip(relay.add(rne(v), relay.const(np.float32(100.0))), 0.0, 255.0)
    return infer(relay.Function([x], relay.cast(v, "uint8")))


def test_nested_roundings_bit_exact_to_the_formula_and_linear_code():
    """Nested roundings: the op is one nearbyint per rounding, where the Relay formula makes 7**k
    copies of its operand in a fused kernel (3 nested: 71 s to compile, 4: > 5 min). Same values on
    every 8-bit input, ties at every level."""
    x = np.arange(256).astype("uint8").reshape(1, 16, 4, 4)
    want = run_module(_nested_roundings(2, _formula_rne), {"x": x})[0]
    fac = tvm_ext.build(_nested_roundings(2, round_half_to_even), "llvm")
    assert fac.kernel_report.num_kernels == 1
    np.testing.assert_array_equal(run_module(fac, {"x": x})[0], want)
    ties = (x.astype(np.float64) - 3) % 2 == 1
    assert ties.mean() == 0.5
    deep = tvm_ext.build(_nested_roundings(8, round_half_to_even), "llvm")  # formula: 7**8 copies (hours)
    ir = deep.get_lib().get_source("ll")
    calls = ir.count("call <16 x float> @llvm.nearbyint") + ir.count("call float @llvm.nearbyint")
    assert 8 <= ir.count("@llvm.nearbyint") and calls <= 8 * 4, calls


def test_op_takes_its_input_layout():
    """tvm_ext.round_half_to_even before AlterOpLayout (AddAsOnnxRuntime makes it at start): no
    layout_transform around it, the same kernels as relay's own round."""
    def graph(rne):
        x = relay.var("x", shape=(1, 16, 8, 8), dtype="float32")
        w = relay.const(np.random.default_rng(0).standard_normal((32, 16, 3, 3)).astype("float32"))
        y = relay.nn.conv2d(x, w, padding=(1, 1), channels=32, kernel_size=(3, 3))
        y = relay.nn.conv2d(relay.nn.relu(rne(y)), relay.const(np.ones((32, 32, 1, 1), "float32")), channels=32,
                            kernel_size=(1, 1))
        return infer(relay.Function([x], y))

    target = tvm_ext.host_target()
    ops_round = [k["ops"] for k in tvm_ext.build(graph(relay.round), target).kernel_report.to_dict()["kernels"]]
    ops_rne = [k["ops"] for k in tvm_ext.build(graph(round_half_to_even), target).kernel_report.to_dict()["kernels"]]
    assert [[o.replace("round", "tvm_ext.round_half_to_even") for o in k] for k in ops_round] == ops_rne


def test_op_rejects_integer_input():
    x = relay.var("x", shape=(4,), dtype="int32")
    with pytest.raises(tvm.error.TVMError):
        infer(relay.Function([x], round_half_to_even(x)))


def test_rounded_float64_division_keeps_its_dtype():
    """round(x / c) in float64: the one-element divisor stays float64 (relay.const alone makes it float32)."""
    x = relay.var("x", shape=(8,), dtype="float64")
    before = infer(relay.Function([x], relay.round(relay.divide(x, relay.const(0.25, "float64")))))
    after = RoundHalfToEven()(before)
    xv = np.array([0.125, 0.375, -0.125, 1.0, 2.0, -0.375, 0.6, 3.2])
    np.testing.assert_array_equal(run_module(after, {"x": xv})[0], np.rint(xv / 0.25))


def test_pipeline_onnxruntime_silu_feeding_a_quantized_add():
    """A SiLU output read by a quantized add (YOLOv8n QDQ). AddAsOnnxRuntime's float64 adds extend the
    SiLU chain, TabulateEightBit tabulates it with a float64 table (the chain's dtype). Bit-exact to
    the same pipeline without the tables, and no more kernels than int8()."""
    rng = np.random.default_rng(4)
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="uint8")
    w = relay.const(rng.integers(-20, 20, (16, 16, 3, 3)).astype("int8"))
    acc = relay.qnn.op.conv2d(x, w, relay.const(0), relay.const(0), relay.const(0.02), relay.const(0.01),
                              kernel_size=(3, 3), channels=16, padding=(1, 1), out_dtype="int32")
    r = relay.qnn.op.requantize(acc, relay.const(0.0002), relay.const(0), relay.const(0.05), relay.const(3),
                                out_dtype="uint8")
    d = relay.qnn.op.dequantize(r, relay.const(0.05), relay.const(3))
    silu = relay.qnn.op.quantize(relay.multiply(d, relay.sigmoid(d)), relay.const(0.04), relay.const(5),
                                 out_dtype="uint8")
    y = relay.qnn.op.add(silu, x, relay.const(0.04), relay.const(5), relay.const(0.02), relay.const(0),
                         relay.const(0.06), relay.const(2))
    mod = infer(relay.Function([x], y))
    ort_pipe = pipelines.int8(numerics="onnxruntime")
    names = ort_pipe.pass_names()["before_fuse"]
    assert "TabulateEightBit" in names
    no_tables = pipelines.Pipeline(
        name="no_tables", start=ort_pipe.start, requantize=ort_pipe.requantize,
        before_fuse=pipelines._sequential([getattr(tvm_ext.passes, n)() for n in names if n != "TabulateEightBit"],
                                          "no_tables.bf"))
    target = tvm_ext.host_target()
    fac = tvm_ext.build(mod, target, passes=ort_pipe)
    ref = tvm_ext.build(mod, target, passes=no_tables)
    assert "tvm_ext.table_lookup" in str(fac.kernel_report.to_dict())
    assert (fac.kernel_report.num_kernels
            <= tvm_ext.build(mod, target, passes=pipelines.int8()).kernel_report.num_kernels)
    for seed in range(2):
        xv = np.random.default_rng(seed).integers(0, 256, (1, 16, 8, 8)).astype("uint8")
        np.testing.assert_array_equal(run_module(fac, {"x": xv})[0], run_module(ref, {"x": xv})[0])


# --- rounds inside Primitive groups (FuseWideningIntoPool's pool groups) --------------------------
POOL_SCALE = np.float32(2.0)


def _pool_group(body_fn, consts=()):
    """x -> f(x) with f = fn(p) {body_fn(p)} Primitive=1 (the form FuseWideningIntoPool writes)."""
    x = relay.var("x", shape=(1, 4, 8, 8), dtype="float32")
    p = relay.var("p0", shape=(1, 4, 8, 8), dtype="float32")
    qs = [relay.var(f"p_const{i}", relay.TensorType(c.shape, str(c.dtype))) for i, c in enumerate(consts)]
    fn = relay.Function([p, *qs], body_fn(p, *qs)).with_attr("Primitive", tvm.tir.IntImm("int32", 1))
    return infer(relay.Function([x], relay.Call(fn, [x, *[relay.const(c) for c in consts]])))


def _pool_quantize(p):
    # clip(round(global_avg_pool2d(p) / s) + 3, 0, 255): a pool's requantize, as lowered QNN writes it
    pooled = relay.nn.global_avg_pool2d(p)
    return relay.clip(relay.add(relay.round(relay.divide(pooled, relay.const(POOL_SCALE))), relay.const(3.0)),
                      0.0, 255.0)


def test_round_inside_a_primitive_group():
    """f(x), f = fn(p) {..round(v / s) + 3..} Primitive=1 -> f'(x, [s]), f' = fn(p, q) {..rne(v / q) + 3..}:
    the one-element divisor is lifted to a parameter, as FuseOps lifts non-scalar constants."""
    expected = _pool_group(
        lambda p, q: relay.clip(relay.add(round_half_to_even(relay.divide(relay.nn.global_avg_pool2d(p), q)),
                                          relay.const(3.0)), 0.0, 255.0),
        consts=[np.array([POOL_SCALE])])
    after = check(RoundHalfToEven(), _pool_group(_pool_quantize), expected)
    assert "round(" not in after.astext()
    assert_unchanged(RoundHalfToEven(), after)  # idempotent: nothing left to round


def test_round_inside_a_primitive_group_built_ties_to_even():
    """Differential, built by TVM: a channel mean of v gives v / 2 = k + 0.5 for odd v, a tie. The
    rewritten group rounds it to even (numpy's rint); the original away from zero; equal elsewhere."""
    before = _pool_group(_pool_quantize)
    after = RoundHalfToEven()(before)
    target = tvm_ext.host_target()
    fb, fa = tvm_ext.build(before, target), tvm_ext.build(after, target)
    assert fa.kernel_report.num_kernels == fb.kernel_report.num_kernels == 1
    ties = np.broadcast_to(np.array([1.0, 3.0, 5.0, 7.0], "float32").reshape(1, 4, 1, 1), (1, 4, 8, 8)).copy()
    mean = ties.mean(axis=(2, 3), keepdims=True)
    np.testing.assert_array_equal(run_module(fa, {"x": ties})[0], np.clip(np.rint(mean / POOL_SCALE) + 3, 0, 255))
    np.testing.assert_array_equal(run_module(fb, {"x": ties})[0], np.clip(np.floor(mean / POOL_SCALE + 0.5) + 3,
                                                                           0, 255))
    r = (np.random.default_rng(3).standard_normal((1, 4, 8, 8)) * 50).astype("float32")  # no ties: equal
    np.testing.assert_array_equal(run_module(fa, {"x": r})[0], run_module(fb, {"x": r})[0])


def test_primitive_group_without_round_unchanged():
    assert_unchanged(RoundHalfToEven(), _pool_group(lambda p: relay.nn.relu(relay.nn.global_avg_pool2d(p))))


def test_pipeline_onnxruntime_numerics_rounds_inside_pool_groups():
    """pipelines.int8(numerics="onnxruntime") on a QDQ conv -> global average pool -> quantize graph:
    FuseWideningIntoPool groups the pool with its requantize, and no ``round`` is left anywhere."""
    x = relay.var("x", shape=(1, 8, 6, 6), dtype="uint8")
    w = relay.const(np.random.default_rng(2).integers(-3, 4, (8, 8, 1, 1)).astype("int8"))
    conv = relay.qnn.op.conv2d(x, w, relay.const(3), relay.const(0), relay.const(0.02), relay.const(0.05),
                               kernel_size=(1, 1), channels=8, out_dtype="int32")
    q = relay.qnn.op.requantize(conv, relay.const(0.001), relay.const(0), relay.const(0.1), relay.const(5),
                                out_dtype="uint8")
    pooled = relay.nn.global_avg_pool2d(relay.qnn.op.dequantize(q, relay.const(0.1), relay.const(5)))
    mod = infer(relay.Function([x], relay.qnn.op.quantize(pooled, relay.const(0.07), relay.const(9),
                                                          out_dtype="uint8")))
    pipeline = pipelines.int8(numerics="onnxruntime")
    target = tvm.target.Target(str(tvm_ext.host_target()))
    factory = tvm_ext.build(mod, target, passes=pipeline)
    handed = factory.tvm_ext_module  # what relay.build got after the before_fuse passes
    text = handed.astext()
    assert "Primitive=1" in text and "nn.global_avg_pool2d" in text, text
    assert " round(" not in text and "tvm_ext.round_half_to_even" in text, text
    xv = np.random.default_rng(4).integers(0, 256, (1, 8, 6, 6)).astype("uint8")
    stock = tvm_ext.build(mod, target)
    got, ref = run_module(factory, {"x": xv})[0], run_module(stock, {"x": xv})[0]
    assert np.abs(got.astype(int) - ref.astype(int)).max() <= 1  # differs from TVM's rounding on ties only
