"""Tests of tvm_ext.passes.qdq_to_integer (QDQ graphs to integer, residual adds at one rounding)."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from _helpers import (
    assert_if_and_let_skipped,
    assert_not_mutated_and_disabled_by_name,
    assert_untyped_module_raises,
    pass_names_seen,
)
from tvm_ext.passes.qdq_to_integer import KEEP_FLOAT, QDQToInteger, is_qdq_graph
from tvm_ext.testing import assert_unchanged, check, infer, run_module
from tvm_ext.testing.aarch64 import TARGETS as AARCH64_TARGETS
from _qdq_graphs import S, dq as _dq, llvm as _llvm, q as _q

LOGGER = "tvm_ext.passes.QDQToInteger"
W = np.random.default_rng(0).integers(-20, 20, (16, 16, 1, 1)).astype("int8")


def _xs():
    return relay.var("a", shape=(1, 16, 4, 4), dtype="uint8"), relay.var("b", shape=(1, 16, 4, 4), dtype="uint8")


def qdq_block():
    """a, b -> dq -> conv(dq(w)) -> q -> dq  \\
                                        add -> q          (the residual add of a QDQ ResNet)
       b  -> dq ----------------------------/
    """
    a, b = _xs()
    w = _dq(relay.const(W), relay.const(0.02), relay.const(0, "int32"))
    conv = _q(relay.nn.conv2d(_dq(a), w, channels=16, kernel_size=1))
    return infer(_q(relay.add(_dq(conv), _dq(b))))


def qdq_block_expected():
    """The conv region becomes what TVM's FQ2I makes of it alone; the add stays float."""
    a, b = _xs()
    w = _dq(relay.const(W), relay.const(0.02), relay.const(0, "int32"))
    conv_region = infer(relay.Function([a], _q(relay.nn.conv2d(_dq(a), w, channels=16, kernel_size=1))))
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
    before, ours, plain = (_llvm(m) for m in (
        qdq_block(), QDQToInteger()(qdq_block()), relay.transform.FakeQuantizationToInteger()(qdq_block())))
    rng = np.random.default_rng(3)
    err_ours = err_plain = 0
    for _ in range(4):
        inputs = {"a": rng.integers(0, 256, (1, 16, 4, 4)).astype("uint8"),
                  "b": rng.integers(0, 256, (1, 16, 4, 4)).astype("uint8")}
        ref = run_module(before, inputs)[0].astype(int)
        out = run_module(ours, inputs)[0]
        assert out.dtype == np.uint8
        assert np.abs(out.astype(int) - ref).max() <= 1
        err_ours += np.abs(out.astype(int) - ref).sum()
        err_plain += np.abs(run_module(plain, inputs)[0].astype(int) - ref).sum()
    assert err_ours <= err_plain


def test_numerics_bit_exact_with_expected():
    rng = np.random.default_rng(4)
    inputs = {"a": rng.integers(0, 256, (1, 16, 4, 4)).astype("uint8"),
              "b": rng.integers(0, 256, (1, 16, 4, 4)).astype("uint8")}
    np.testing.assert_array_equal(run_module(QDQToInteger()(qdq_block()), inputs)[0],
                                  run_module(qdq_block_expected(), inputs)[0])


def test_idempotent():
    once = QDQToInteger()(qdq_block())
    assert_unchanged(QDQToInteger(), once)


def test_unchanged_on_qoperator_and_float_graphs():
    x = relay.var("x", shape=(1, 16, 4, 4), dtype="uint8")
    qconv = relay.qnn.op.conv2d(x, relay.const(W), relay.const(0), relay.const(0), relay.const(0.1),
                                relay.const(0.02), kernel_size=(1, 1), channels=16)
    assert_unchanged(QDQToInteger(), infer(qconv))
    f = relay.var("f", shape=(1, 16, 4, 4))
    assert_unchanged(QDQToInteger(), infer(relay.nn.relu(f)))
    assert not is_qdq_graph(infer(relay.nn.relu(f))["main"])


def test_untyped_module_raises():
    a, b = _xs()
    mod = tvm.IRModule.from_expr(relay.Function([a, b], _q(relay.add(_dq(a), _dq(b)))))
    assert_untyped_module_raises(QDQToInteger(), mod, "QDQToInteger")


def test_if_and_let_skipped(caplog):
    assert_if_and_let_skipped(QDQToInteger(), qdq_block()["main"].body, LOGGER, caplog)


def test_not_mutated_and_disabled_by_name():
    """In a Sequential the float conv becomes qnn.conv2d, the input is not mutated, disabled_pass
    turns the pass off by its name, and instruments see that name."""
    assert_not_mutated_and_disabled_by_name(QDQToInteger(), qdq_block(), "QDQToInteger", " nn.conv2d(")
    assert "QDQToInteger" in pass_names_seen(lambda: QDQToInteger()(qdq_block()))


@pytest.mark.xdist_group("small_zoo:resnet50_int8_qdq")
def test_small_zoo_qdq_integer_between_kernels_and_close_to_ort(small_zoo_build):
    """Small QDQ ResNet through the int8 pipeline: only uint8 crosses kernels; top-1 as ORT."""
    import onnxruntime as ort

    m, fac = small_zoo_build("resnet50_int8_qdq", "int8")
    assert set(fac.kernel_report.crossing.nbytes) <= {"uint8", "int8"}, fac.kernel_report.crossing.nbytes
    sess = ort.InferenceSession(str(m.onnx_path), providers=["CPUExecutionProvider"])
    for s in range(4):
        x = np.random.default_rng(1000 + s).standard_normal(m.input_shape).astype("float32")
        ours, ref = run_module(fac, {m.input_name: x})[0], sess.run(None, {m.input_name: x})[0]
        assert ours.argmax() == ref.argmax()
        assert np.abs(ours - ref).max() < 0.2  # a few output quantization steps


# -- float constant operands (hard-sigmoid, hard-swish): FQ2I quantizes the constant with the
#    other operand's scale / zero point, which saturates (PP-OCR mobile cls: 0.2 became 0.0) ------
HS_IN = (relay.const(0.0121487), relay.const(255, "int32"))    # the cls model's SE logits
HS_OUT = (relay.const(0.00063703), relay.const(0, "int32"))


def _conv_region(a):
    w = _dq(relay.const(W), relay.const(0.02), relay.const(0, "int32"))
    return _q(relay.nn.conv2d(_dq(a), w, channels=16, kernel_size=1), *HS_IN)


def _hard_sigmoid(v):
    return relay.clip(relay.add(relay.multiply(v, relay.const(0.2)), relay.const(0.5)), 0.0, 1.0)


def hard_sigmoid_block():
    """a -> dq -> conv(dq(w)) -> q -> dq -> x*0.2 + 0.5 -> clip(0, 1) -> q   (ONNX HardSigmoid, QDQ)"""
    a = relay.var("a", shape=(1, 16, 4, 4), dtype="uint8")
    return infer(_q(_hard_sigmoid(_dq(_conv_region(a), *HS_IN)), *HS_OUT))


def hard_sigmoid_expected():
    """The conv region as FQ2I makes it; the hard-sigmoid region stays float."""
    a = relay.var("a", shape=(1, 16, 4, 4), dtype="uint8")
    conv_fn = relay.transform.FakeQuantizationToInteger()(infer(relay.Function([a], _conv_region(a))))["main"]
    assert "qnn.conv2d" in conv_fn.astext()
    return infer(relay.Function(conv_fn.params, _q(_hard_sigmoid(_dq(conv_fn.body, *HS_IN)), *HS_OUT)))


def test_structure_float_constant_region_stays_float():
    check(QDQToInteger(), hard_sigmoid_block(), hard_sigmoid_expected())


def test_plain_fq2i_saturates_the_constant():
    """The bug being routed around: plain FQ2I quantizes 0.2 at scale 0.0121, zero point 255."""
    plain = relay.transform.FakeQuantizationToInteger()(hard_sigmoid_block()).astext()
    assert "qnn.mul" in plain and "qnn.mul" not in QDQToInteger()(hard_sigmoid_block()).astext()


def test_float_constant_region_numerics():
    """Bit-exact with the float QDQ graph on all uint8 inputs; plain FQ2I is many steps off."""
    before, ours, plain = (_llvm(m) for m in (
        hard_sigmoid_block(), QDQToInteger()(hard_sigmoid_block()),
        relay.transform.FakeQuantizationToInteger()(hard_sigmoid_block())))
    for seed in range(3):
        inputs = {"a": np.random.default_rng(seed).integers(0, 256, (1, 16, 4, 4)).astype("uint8")}
        ref = run_module(before, inputs)[0].astype(int)
        np.testing.assert_array_equal(run_module(ours, inputs)[0].astype(int), ref)
        assert np.abs(run_module(plain, inputs)[0].astype(int) - ref).max() > 10


def test_bias_constant_still_converted():
    """conv -> add(c) -> q: the constant is a bias at the accumulator's scale; FQ2I keeps it integer."""
    a = relay.var("a", shape=(1, 16, 4, 4), dtype="uint8")
    w = _dq(relay.const(W), relay.const(0.02), relay.const(0, "int32"))
    bias = relay.const(np.full((1, 16, 1, 1), 0.3, "float32"))
    mod = infer(_q(relay.add(relay.nn.conv2d(_dq(a), w, channels=16, kernel_size=1), bias)))
    out = QDQToInteger()(mod).astext()
    assert "qnn.conv2d" in out and "stop_fusion" not in out


def test_rows_log_rejections_and_counts(caplog):
    """A row whose check rejects leaves the op to FQ2I, logged under the row's name with the reason;
    the INFO summary counts the regions kept per row."""
    a, b = _xs()
    w = _dq(relay.const(W), relay.const(0.02), relay.const(0, "int32"))
    bias = relay.const(np.full((1, 16, 1, 1), 0.3, "float32"))
    conv = _q(relay.add(relay.nn.conv2d(_dq(a), w, channels=16, kernel_size=1), bias))
    mod = infer(relay.Function([a, b], _q(relay.add(_dq(conv), _dq(b)))))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        out = QDQToInteger()(mod)
    assert "qnn.conv2d" in out.astext() and "qnn.add" not in out.astext()
    assert "QDQToInteger.float_constant_operand: left to FQ2I: a bias of nn.conv2d" in caplog.text
    assert "QDQToInteger.small_padded_conv: left to FQ2I: 16 output channels" in caplog.text
    assert "kept in float: residual_add 1" in caplog.text


def test_keep_float_table():
    """Rows named after the pass, each once; the rows under a quantize come last (marked second)."""
    names = [r.name for r in KEEP_FLOAT]
    assert len(set(names)) == len(names) and all(n.startswith("QDQToInteger.") for n in names)
    flags = [r.in_quantize for r in KEEP_FLOAT]
    assert flags == sorted(flags) and any(flags) and not all(flags)


def test_float_constant_idempotent_and_no_marker_left():
    once = QDQToInteger()(hard_sigmoid_block())
    assert "stop_fusion" not in once.astext()
    assert_unchanged(QDQToInteger(), once)


def test_existing_stop_fusion_is_skipped_with_reason(caplog):
    a = relay.var("a", shape=(1, 16, 4, 4), dtype="uint8")
    mod = infer(relay.annotation.stop_fusion(_q(_hard_sigmoid(_dq(_conv_region(a), *HS_IN)), *HS_OUT)))
    with caplog.at_level("INFO", logger=LOGGER):
        assert_unchanged(QDQToInteger(), mod)
    assert "stop_fusion" in caplog.text


def silu_block():
    """a -> dq -> conv(dq(w)) -> q -> dq -> sigmoid -> q -> dq \\
                                  \\-> dq ------------------- multiply -> q     (YOLO's SiLU, QDQ)"""
    a = relay.var("a", shape=(1, 16, 4, 4), dtype="uint8")
    c = _conv_region(a)
    sig = _q(relay.sigmoid(_dq(c, *HS_IN)), relay.const(1 / 255.0), relay.const(0, "int32"))
    return infer(_q(relay.multiply(_dq(c, *HS_IN), _dq(sig, relay.const(1 / 255.0), relay.const(0, "int32"))),
                    relay.const(0.01), relay.const(0, "int32")))


def test_sigmoid_region_stays_float_and_fuses_into_the_conv():
    """Plain FQ2I makes qnn.sigmoid (a table lookup ``take``); ours keeps stock's float sigmoid."""
    plain = relay.transform.FakeQuantizationToInteger()(silu_block())
    ours = QDQToInteger()(silu_block())
    assert "qnn.sigmoid" in plain.astext()
    assert "qnn.sigmoid" not in ours.astext() and "sigmoid(" in ours.astext() and "qnn.conv2d" in ours.astext()
    n_stock = tvm_ext.build(silu_block()).kernel_report.num_kernels
    assert tvm_ext.build(ours).kernel_report.num_kernels <= n_stock
    x = {"a": np.arange(256).astype("uint8").reshape(1, 16, 4, 4)}
    np.testing.assert_array_equal(run_module(ours, x)[0], run_module(silu_block(), x)[0])


def test_conv_padded_by_x86_int8_legalization_stays_float():
    """8 output channels: x86 int8 legalization would pad to 16 and slice (a kernel and an int32
    crossing more); the region stays float, as stock TVM has it. 16 channels convert."""
    def block(oc):
        a = relay.var("a", shape=(1, 16, 4, 4), dtype="uint8")
        w = _dq(relay.const(np.ones((oc, 16, 1, 1), "int8")), relay.const(0.02), relay.const(0, "int32"))
        return infer(_q(relay.nn.conv2d(_dq(a), w, channels=oc, kernel_size=1)))

    assert_unchanged(QDQToInteger(), block(8))
    assert "qnn.conv2d" in QDQToInteger()(block(16)).astext()
    x = {"a": np.arange(256).astype("uint8").reshape(1, 16, 4, 4)}
    np.testing.assert_array_equal(run_module(QDQToInteger()(block(8)), x)[0], run_module(block(8), x)[0])


def test_large_padded_conv_becomes_integer():
    """From PADDED_INT8_MIN_MACS on, a conv with channels % 16 != 0 converts (int8 wins over the
    slice kernel) whatever its reduction; one MAC-row less and a short-reduction conv (16
    products per output) stays float. Outputs: the integer conv is the QLinearConv ONNX Runtime
    runs, within one output step of the float region."""
    from tvm_ext.passes.qdq_to_integer import PADDED_INT8_LONG_REDUCTION, PADDED_INT8_MIN_MACS

    cin = 16
    assert cin < PADDED_INT8_LONG_REDUCTION

    def block(hw):
        a = relay.var("a", shape=(1, cin, hw, hw), dtype="uint8")
        w = _dq(relay.const(np.random.default_rng(0).integers(-5, 5, (24, cin, 1, 1)).astype("int8")),
                relay.const(0.02), relay.const(0, "int32"))
        return infer(_q(relay.nn.conv2d(_dq(a), w, channels=24, kernel_size=1)))

    macs = lambda hw: hw * hw * 24 * cin  # noqa: E731
    big = next(hw for hw in range(8, 400) if macs(hw) >= PADDED_INT8_MIN_MACS)
    assert "qnn.conv2d" in QDQToInteger()(block(big)).astext()
    assert_unchanged(QDQToInteger(), block(big - 1))
    x = {"a": np.random.default_rng(1).integers(0, 256, (1, cin, big, big)).astype("uint8")}
    got, want = (run_module(m, x)[0].astype(np.int64) for m in (QDQToInteger()(block(big)), block(big)))
    assert np.abs(got - want).max() <= 1


def test_padded_conv_with_a_long_reduction_becomes_integer():
    """PADDED_INT8_LONG_REDUCTION: under PADDED_INT8_MIN_MACS, a padded conv converts when each
    output sums >= 48 products and it has >= PADDED_INT8_LONG_MIN_MACS (PP-OCRv4 det's 96 -> 18,
    48 -> 12 convs); one input channel less, or a squeeze-and-excitation conv on a pooled vector
    (long reduction, few MACs), stays float."""
    from tvm_ext.passes.qdq_to_integer import (PADDED_INT8_LONG_MIN_MACS, PADDED_INT8_LONG_REDUCTION,
                                               PADDED_INT8_MIN_MACS)

    def block(cin, hw, oc=12):
        a = relay.var("a", shape=(1, cin, hw, hw), dtype="uint8")
        w = _dq(relay.const(np.random.default_rng(cin).integers(-5, 5, (oc, cin, 1, 1)).astype("int8")),
                relay.const(0.02), relay.const(0, "int32"))
        return infer(_q(relay.nn.conv2d(_dq(a), w, channels=oc, kernel_size=1)))

    cin, hw = PADDED_INT8_LONG_REDUCTION, 48
    assert PADDED_INT8_LONG_MIN_MACS <= hw * hw * 12 * cin < PADDED_INT8_MIN_MACS
    once = QDQToInteger()(block(cin, hw))
    assert "qnn.conv2d" in once.astext()
    check(QDQToInteger(), block(cin, hw), relay.transform.FakeQuantizationToInteger()(block(cin, hw)))
    tvm.ir.assert_structural_equal(QDQToInteger()(once), once)
    assert_unchanged(QDQToInteger(), block(cin - 1, hw))     # 47 products per output
    assert_unchanged(QDQToInteger(), block(96, 1, oc=24))     # SE: 96 products, 2304 MACs
    x = {"a": np.random.default_rng(3).integers(0, 256, (1, cin, hw, hw)).astype("uint8")}
    diff = run_module(once, x)[0].astype(np.int64) - run_module(block(cin, hw), x)[0].astype(np.int64)
    assert np.abs(diff).max() <= 1


def test_small_padded_conv_converts_for_avx2_and_vnni_targets():
    """PADDED_INT8_MIN_MACS_BY_ISA: compiling for AVX2 (-mcpu=x86-64-v3) or AVX-512 VNNI (znver4),
    the small 8- and 6-channel convs convert too (8-channel int8 blocks there: no padding); for
    AVX-512 without VNNI and without a target they stay float. The pass only reads the target:
    the graphs are the same QNN graphs whatever it is, and run on any host."""
    x = {"a": np.random.default_rng(2).integers(0, 256, (1, 16, 4, 4)).astype("uint8")}
    for oc in (8, 6):
        for target in ("llvm -mcpu=x86-64-v3", "llvm -mcpu=znver4"):
            with tvm.target.Target(target):
                got = QDQToInteger()(_small_conv(oc))
                check(QDQToInteger(), _small_conv(oc), relay.transform.FakeQuantizationToInteger()(_small_conv(oc)))
            assert "qnn.conv2d" in got.astext(), (oc, target)
        with tvm.target.Target("llvm -mcpu=znver4 -mattr=-avx512vnni,-avxvnni"):
            assert_unchanged(QDQToInteger(), _small_conv(oc))
        assert_unchanged(QDQToInteger(), _small_conv(oc))
        # the integer conv against the float region it replaces: within one output step
        diff = run_module(got, x)[0].astype(np.int64) - run_module(_small_conv(oc), x)[0].astype(np.int64)
        assert np.abs(diff).max() <= 1
    with tvm.target.Target("llvm -mcpu=znver4"):
        once = QDQToInteger()(_small_conv(8))
        tvm.ir.assert_structural_equal(QDQToInteger()(once), once)


def _small_conv(oc):
    a = relay.var("a", shape=(1, 16, 4, 4), dtype="uint8")
    w = _dq(relay.const(np.random.default_rng(oc).integers(-20, 20, (oc, 16, 1, 1)).astype("int8")),
            relay.const(0.02), relay.const(0, "int32"))
    return infer(_q(relay.nn.conv2d(_dq(a), w, channels=oc, kernel_size=1)))


@pytest.mark.parametrize("cpu", list(AARCH64_TARGETS))
def test_every_conv_converts_at_aarch64(cpu):
    """PADDED_INT8_MIN_MACS_BY_ISA: at aarch64 a small conv converts whether int8 legalization pads its
    output channels (6 -> 8) or not (8): FoldChannelRepadIntoConv lets the next conv read the padded
    channels, so the padding costs no kernel; without a target the 6-channel conv stays float."""
    with tvm.target.Target(AARCH64_TARGETS[cpu]):
        for oc in (8, 6):
            check(QDQToInteger(), _small_conv(oc), relay.transform.FakeQuantizationToInteger()(_small_conv(oc)))
            assert "qnn.conv2d" in QDQToInteger()(_small_conv(oc)).astext(), oc
    assert_unchanged(QDQToInteger(), _small_conv(6))


# --- shared_dequantize: an add / pool whose dequantize has other readers (SE blocks, residuals) -------
def se_block(shared=True):
    """conv -> q -> dq = y; gate = q(global_avg_pool(y)); q(y * dq(gate)) (MobileNetV3's SE, simplified).
    ``shared``: one dequantize of y read by the pool and the multiply (as ONNX Runtime's quantizer
    writes it); else each reader has its own copy."""
    a, _ = _xs()
    w = _dq(relay.const(W), relay.const(0.02), relay.const(0, "int32"))
    conv = _q(relay.nn.conv2d(_dq(a), w, channels=16, kernel_size=1))
    y1 = _dq(conv)
    y2 = y1 if shared else _dq(conv)
    gate = _q(relay.nn.global_avg_pool2d(y1), relay.const(0.03), relay.const(0, "int32"))
    return infer(relay.Function([a], _q(relay.multiply(y2, _dq(gate, relay.const(0.03))))))


def _pool_input_dtypes(mod):
    from tvm_ext.passes._util import op_name, post_order

    return [str(n.checked_type.dtype) for n in post_order(mod["main"].body)
            if isinstance(n, relay.Call) and op_name(n) == "nn.global_avg_pool2d"]


def test_shared_dequantize_structure():
    """Default: the pool whose dequantize the multiply also reads is not marked (TVM's pattern grouper)
    and FQ2I makes it an int32 pool; shared_dequantize=True keeps it in float, exactly as the default
    does when the pool has a dequantize of its own."""
    assert _pool_input_dtypes(QDQToInteger()(se_block())) == ["int32"]  # the default, as measured
    assert _pool_input_dtypes(QDQToInteger()(se_block(shared=False))) == ["float32"]
    expected = QDQToInteger()(se_block(shared=False))
    after = check(QDQToInteger(shared_dequantize=True), se_block(), expected)
    assert _pool_input_dtypes(after) == ["float32"] and "qnn.conv2d" in after.astext()


def test_shared_dequantize_numerics_bit_exact():
    """Differential: the shared graph with shared_dequantize=True computes what the unshared graph does
    with the default pass (float pool), bit for bit; the default's integer pool differs."""
    x = {"a": np.random.default_rng(2).integers(0, 256, (1, 16, 4, 4)).astype("uint8")}
    want = run_module(QDQToInteger()(se_block(shared=False)), x)[0]
    np.testing.assert_array_equal(run_module(QDQToInteger(shared_dequantize=True)(se_block()), x)[0], want)


def test_shared_dequantize_residual_add_stays_float():
    """A residual add whose dequantized input is also read past the add (YOLOv8n's C2f: the bottleneck
    input goes to the add and to a concatenate): float add (one rounding) with shared_dequantize=True;
    the default makes it qnn.add (the grouper wants the add to post-dominate the dequantize)."""
    a, _ = _xs()
    w = _dq(relay.const(W), relay.const(0.02), relay.const(0, "int32"))
    da = _dq(a)
    conv = _q(relay.nn.conv2d(da, w, channels=16, kernel_size=1))
    mod = infer(relay.Function([a], _q(relay.concatenate([_dq(_q(relay.add(_dq(conv), da))), da], axis=1))))
    assert "qnn.add" in QDQToInteger()(mod).astext()
    text = QDQToInteger(shared_dequantize=True)(mod).astext()
    assert "qnn.add" not in text and "qnn.conv2d" in text


def test_shared_dequantize_idempotent_and_no_match():
    once = QDQToInteger(shared_dequantize=True)(se_block())
    assert_unchanged(QDQToInteger(shared_dequantize=True), once)
    assert "stop_fusion" not in once.astext()
    x = relay.var("x", shape=(1, 16, 4, 4), dtype="uint8")
    qconv = relay.qnn.op.conv2d(x, relay.const(W), relay.const(0), relay.const(0), relay.const(0.1),
                                relay.const(0.02), kernel_size=(1, 1), channels=16)
    assert_unchanged(QDQToInteger(shared_dequantize=True), infer(qconv))


# -- products of two computed tensors (attention) stay float ---------------------------------------
def attention_block(weight_const=False):
    """q, k (uint8, zero point 128) -> dq -> batch_matmul(q, k^T) -> q: an attention score as in
    PP-OCRv4 rec (SVTR). With ``weight_const`` the right operand is a dequantized constant instead."""
    zp = relay.const(128, "int32")
    q = relay.var("q", shape=(2, 8, 16), dtype="uint8")
    if weight_const:
        k = relay.const(np.random.default_rng(1).integers(-20, 20, (2, 8, 16)).astype("int8"))
        kd = _dq(k, relay.const(0.02), relay.const(0, "int32"))
        params = [q]
    else:
        k = relay.var("k", shape=(2, 8, 16), dtype="uint8")
        kd = _dq(k, S, zp)
        params = [q, k]
    if not weight_const:  # as the ONNX importer writes q @ k^T: the heads reshaped, k transposed
        kd = relay.transpose(relay.reshape(kd, (2, 16, 8)), (0, 2, 1))
    out = _q(relay.nn.batch_matmul(_dq(q, S, zp), kd), relay.const(0.1), zp)
    return infer(relay.Function(params, out))


def test_product_of_two_activations_stays_float():
    """Plain FQ2I makes qnn.batch_matmul, whose zero points cost two `sum` kernels and int32
    crossings; ours leaves the region as stock TVM has it (unchanged) and builds no more kernels."""
    mod = attention_block()
    plain = relay.transform.FakeQuantizationToInteger()(mod)
    assert "qnn.batch_matmul" in plain.astext()
    # a QDQ graph needs a float conv/dense reading a dequantize to be converted at all: add one
    before = _with_qdq_conv(mod)
    out = QDQToInteger()(before)
    assert "qnn.conv2d" in out.astext()  # the conv converted, the product did not:
    tvm.ir.assert_structural_equal(out["main"].body.fields[0], before["main"].body.fields[0], map_free_vars=True)
    n_stock = tvm_ext.build(mod).kernel_report
    n_plain = tvm_ext.build(plain).kernel_report
    assert "sum" in n_plain.anchor_counts() and n_plain.num_kernels > n_stock.num_kernels
    assert tvm_ext.build(out).kernel_report.num_kernels <= tvm_ext.build(before).kernel_report.num_kernels


def test_product_with_a_constant_operand_still_converts():
    out = QDQToInteger()(_with_qdq_conv(attention_block(weight_const=True)))
    assert "qnn.batch_matmul" in out.astext()


def test_attention_numerics_bit_exact_and_idempotent():
    mod = _with_qdq_conv(attention_block())
    out = QDQToInteger()(mod)
    rng = np.random.default_rng(5)
    x = {v.name_hint: rng.integers(0, 256, [int(d) for d in v.type_annotation.shape]).astype("uint8")
         for v in mod["main"].params}
    for got, want in zip(run_module(out, x), run_module(mod, x)):
        np.testing.assert_array_equal(got, want)
    assert_unchanged(QDQToInteger(), out)


def _with_qdq_conv(mod):
    """``mod``'s outputs plus a QDQ conv of a new input (so ``is_qdq_graph`` holds)."""
    main = mod["main"]
    a = relay.var("a", shape=(1, 16, 4, 4), dtype="uint8")
    w = _dq(relay.const(W), relay.const(0.02), relay.const(0, "int32"))
    conv = _q(relay.nn.conv2d(_dq(a), w, channels=16, kernel_size=1))
    return infer(relay.Function([*main.params, a], relay.Tuple([main.body, conv])))
