"""Tests of tvm_ext.passes.pad_channels_at_producer."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.passes import PadChannelsAtProducer
from tvm_ext.testing import assert_same_outputs, assert_unchanged, check, infer, random_inputs

from _helpers import assert_unchanged_with_reason, assert_untyped_module_raises

LOGGER = "tvm_ext.passes.PadChannelsAtProducer"
RNG = np.random.default_rng(23)
IC, C, OC = 16, 6, 8  # float conv IC -> C (C % 4 != 0) -> int8 conv C -> OC
W_Q = RNG.integers(-127, 128, (C, IC, 1, 1)).astype("int8")
B_Q = RNG.integers(-2000, 2000, C).astype("int32")
V = RNG.integers(-127, 128, (OC, C, 3, 3)).astype("int8")
V2 = RNG.integers(-127, 128, (OC, C, 1, 1)).astype("int8")
ZP_X = 3
SCALE = RNG.uniform(0.5, 2.0, (1, C, 1, 1)).astype("float32")
SHIFT = RNG.uniform(-0.5, 0.5, (1, C, 1, 1)).astype("float32")


def _const(arr):
    return relay.const(np.asarray(arr))


def _pad(arr, axis, n, value=0):
    width = [(0, 0)] * arr.ndim
    width[axis] = (0, n - arr.shape[axis])
    return np.pad(arr, width, constant_values=value)


def producer(x, n=C, chain="bias_relu"):
    """QDQ's float conv kept in float: conv(x, dequantize(W)) + dequantize(b) -> chain -> quantize."""
    w = relay.qnn.op.dequantize(_const(_pad(W_Q, 0, n)), _const(np.float32(0.01)), _const(0), axis=0)
    y = relay.nn.conv2d(x, w, channels=n, kernel_size=(1, 1))
    b = relay.qnn.op.dequantize(_const(_pad(B_Q, 0, n)), _const(np.float32(0.001)), _const(0), axis=0)
    y = relay.nn.bias_add(y, b)
    if chain == "bias_relu":
        y = relay.nn.relu(y)
    elif chain == "per_channel":  # multiply / subtract by (1, C, 1, 1) constants, clip around 0
        y = relay.multiply(y, _const(_pad(SCALE, 1, n, 1.0)))
        y = relay.subtract(y, _const(_pad(SHIFT, 1, n, 0.0)))
        y = relay.clip(y, -3.0, 3.0)
    return relay.qnn.op.quantize(y, _const(np.float32(0.05)), _const(ZP_X), out_dtype="uint8")


def qconv(q, v, n=C, kernel_zp=0, padding=(1, 1)):
    k = v.shape[-1]
    return relay.qnn.op.conv2d(q, _const(_pad(v, 1, n)), _const(ZP_X), _const(kernel_zp), _const(np.float32(0.05)),
                               _const(np.float32(0.01)), kernel_size=(k, k), channels=OC, padding=padding,
                               out_dtype="int32")


def graph(n=C, chain="bias_relu", two_readers=False, kernel_zp=0, pointwise=False):
    x = relay.var("x", shape=(1, IC, 7, 7), dtype="float32")
    q = producer(x, n, chain)
    out = qconv(q, V2, n, kernel_zp, padding=(0, 0)) if pointwise else qconv(q, V, n, kernel_zp)
    if two_readers:
        out = relay.Tuple([out, qconv(q, V2, n, kernel_zp, padding=(0, 0))])
    return infer(relay.Function([x], out))


@pytest.mark.parametrize("chain", ["bias_relu", "per_channel"])
def test_structure(chain):
    """6 channels become 8: the float conv's weight/bias and the int8 conv's weight padded with 0."""
    check(PadChannelsAtProducer(), graph(chain=chain), graph(n=8, chain=chain))


def test_every_int8_reader_padded():
    check(PadChannelsAtProducer(), graph(two_readers=True), graph(n=8, two_readers=True))


def test_idempotent():
    once = PadChannelsAtProducer()(graph())
    assert_unchanged(PadChannelsAtProducer(), once)


@pytest.mark.parametrize("chain,kernel_zp,two", [("bias_relu", 0, False), ("per_channel", 0, True),
                                                 ("bias_relu", 5, False)])
def test_numerics_bit_exact(chain, kernel_zp, two):
    """Integer outputs equal bit for bit, also with a non-zero weight zero point (the new channels
    hold exactly the input zero point, so QNN's zero-point terms cancel)."""
    before = graph(chain=chain, two_readers=two, kernel_zp=kernel_zp)
    after = PadChannelsAtProducer()(before)
    assert "channels=8" in after.astext(show_meta_data=False)
    with tvm.transform.PassContext(opt_level=3):
        built = [relay.build(m, target="llvm") for m in (before, after)]
    for seed in (1, 2):
        assert_same_outputs(*built, random_inputs(before, seed=seed))


def test_build_one_kernel_fewer_bit_exact(caplog):
    """Built for this host: x86 legalization's nn.pad kernel is gone, outputs bit-identical (a 1x1
    consumer: a 3x3 one keeps its spatial zero-point pad until FoldZeroPointPadIntoConv)."""
    mod = graph(pointwise=True)
    x = np.random.default_rng(4).standard_normal((1, IC, 7, 7)).astype("float32")
    base = tvm_ext.build(mod)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        new = tvm_ext.build(mod, passes={"start": [PadChannelsAtProducer()]})
    if tvm_ext.x86.isa.isa_class(tvm_ext.x86.target.host_target()) == "other":
        pytest.skip("host is not x86: no input-channel padding to remove")
    assert "6 -> 8 channels" in caplog.text
    assert new.kernel_report.num_kernels == base.kernel_report.num_kernels - 1, (
        base.kernel_report.table(), new.kernel_report.table())
    assert_same_outputs(base, new, {"x": x})


# -- no match: unchanged, with the reason logged ----------------------------------------------
def _sigmoid_chain():
    x = relay.var("x", shape=(1, IC, 7, 7), dtype="float32")
    w = relay.const(RNG.standard_normal((C, IC, 1, 1)).astype("float32"))
    y = relay.sigmoid(relay.nn.conv2d(x, w, channels=C, kernel_size=(1, 1)))
    q = relay.qnn.op.quantize(y, _const(np.float32(0.05)), _const(ZP_X), out_dtype="uint8")
    return infer(relay.Function([x], qconv(q, V)))


def _other_reader():
    x = relay.var("x", shape=(1, IC, 7, 7), dtype="float32")
    q = producer(x)
    return infer(relay.Function([x], relay.Tuple([qconv(q, V), relay.cast(q, "int32")])))


def _constant_first_subtract():
    x = relay.var("x", shape=(1, IC, 7, 7), dtype="float32")
    w = relay.const(RNG.standard_normal((C, IC, 1, 1)).astype("float32"))
    y = relay.subtract(relay.const(1.0), relay.nn.conv2d(x, w, channels=C, kernel_size=(1, 1)))
    q = relay.qnn.op.quantize(y, _const(np.float32(0.05)), _const(ZP_X), out_dtype="uint8")
    return infer(relay.Function([x], qconv(q, V)))


def _quantized_input():
    x = relay.var("x", shape=(1, C, 7, 7), dtype="float32")
    q = relay.qnn.op.quantize(x, _const(np.float32(0.05)), _const(ZP_X), out_dtype="uint8")
    return infer(relay.Function([x], qconv(q, V)))


@pytest.mark.parametrize("make,reason", [
    (lambda: graph(n=8), "already a multiple of 4"),
    (_sigmoid_chain, "sigmoid in the chain is not in the chain table"),
    (_other_reader, "quantized value is read by cast"),
    (_constant_first_subtract, "does not keep 0"),
    (_quantized_input, "chain reaches a Var, not a conv"),
])
def test_unchanged_on_no_match(make, reason, caplog):
    assert_unchanged_with_reason(PadChannelsAtProducer(), make(), reason, LOGGER, caplog)


def test_dynamic_shapes_skipped(caplog):
    """A dynamic batch (a symbolic dimension, which int() cannot read): left alone."""
    x = relay.var("x", shape=(relay.Any(), IC, 7, 7), dtype="float32")
    assert_unchanged_with_reason(PadChannelsAtProducer(), infer(relay.Function([x], qconv(producer(x), V))),
                                 "dynamic shape", LOGGER, caplog)


def test_skipped_for_non_x86_target(caplog):
    """The padding is x86's: under another target (only named, nothing is compiled) no change."""
    with caplog.at_level(logging.DEBUG, logger=LOGGER), tvm.target.Target("cuda"):
        assert_unchanged(PadChannelsAtProducer(), graph())
    assert "is not x86" in caplog.text


def test_untyped_module_raises():
    x = relay.var("x", shape=(1, IC, 7, 7), dtype="float32")
    mod = tvm.IRModule.from_expr(relay.Function([x], qconv(producer(x), V)))
    assert_untyped_module_raises(PadChannelsAtProducer(), mod, "PadChannelsAtProducer")


def test_in_int8_pipeline():
    names = tvm_ext.core.pipelines.int8().pass_names()["start"]
    assert names.index("PadChannelsAtProducer") > names.index("QDQToInteger")


# -- int8 producers: requantize(bias_add(qnn.conv2d)) read by int8 convs (QOperator SE blocks) ----
SE_W1 = RNG.integers(-127, 128, (6, 16, 1, 1)).astype("int8")
SE_B1 = RNG.integers(-500, 500, 6).astype("int32")
SE_S1 = RNG.uniform(0.001, 0.01, 6).astype("float32")
SE_W2 = RNG.integers(-127, 128, (16, 6, 1, 1)).astype("int8")


def se_pair(n=6, out_zp=5, kernel_zp=0, spatial=1):
    """squeeze conv 16 -> 6 (per-channel scales) -> requantize -> excite conv 6 -> 16, as ORT's
    QLinearConv imports; n > 6: the padded form the pass writes."""
    x = relay.var("x", shape=(1, 16, spatial, spatial), dtype="uint8")
    a = relay.qnn.op.conv2d(x, _const(_pad(SE_W1, 0, n)), _const(3), _const(np.zeros(n, "int32")),
                            _const(np.float32(0.02)), _const(_pad(SE_S1, 0, n, 1.0)), kernel_size=(1, 1),
                            channels=n, out_dtype="int32")
    a = relay.nn.bias_add(a, _const(_pad(SE_B1, 0, n)))
    r = relay.qnn.op.requantize(a, _const(_pad(np.float32(0.02) * SE_S1, 0, n, 1.0)), _const(0),
                                _const(np.float32(0.05)), _const(out_zp), axis=1, out_dtype="uint8")
    y = relay.qnn.op.conv2d(r, _const(_pad(SE_W2, 1, n)), _const(out_zp), _const(kernel_zp),
                            _const(np.float32(0.05)), _const(np.float32(0.01)), kernel_size=(1, 1), channels=16,
                            out_dtype="int32")
    return infer(relay.Function([x], y))


def test_int8_producer_structure_and_idempotent():
    after = check(PadChannelsAtProducer(), se_pair(), se_pair(n=16))
    assert_unchanged(PadChannelsAtProducer(), after)


@pytest.mark.parametrize("kernel_zp", [0, 4])
def test_int8_producer_bit_exact(kernel_zp):
    """The new channels requantize to the output zero point (the readers' input zero point): exact
    also with a non-zero weight zero point."""
    before = se_pair(kernel_zp=kernel_zp, spatial=3)
    after = PadChannelsAtProducer()(before)
    assert "channels=16" in after.astext(show_meta_data=False).split("qnn.requantize")[0]
    with tvm.transform.PassContext(opt_level=3):
        built = [relay.build(m, target="llvm") for m in (before, after)]
    for seed in (1, 2):
        assert_same_outputs(*built, random_inputs(before, seed=seed))


def test_int8_producer_build_fewer_kernels():
    """x86 slices the 6-channel output back from 16 and pads it to 8 for the reader: that kernel goes."""
    if tvm_ext.x86.isa.isa_class(tvm_ext.x86.target.host_target()) == "other":
        pytest.skip("host is not x86: no channel padding to remove")
    mod = se_pair()
    x = np.random.default_rng(5).integers(0, 256, (1, 16, 1, 1)).astype("uint8")
    pipe = tvm_ext.core.pipelines.int8()  # UniformZeroPointsToScalar drops the zero per-channel zp terms
    base = tvm_ext.build(mod, passes=pipe, disabled_pass=["PadChannelsAtProducer"])
    new = tvm_ext.build(mod, passes=pipe)
    assert new.kernel_report.num_kernels < base.kernel_report.num_kernels, (
        base.kernel_report.table(), new.kernel_report.table())
    assert_same_outputs(base, new, {"x": x})


def test_int8_producer_left_alone_when_readers_would_work_more(caplog):
    """6 -> 16 channels in front of a 100x100 reader: 8 more input channels x 16 outputs x 10^4
    pixels = 1.28 M extra multiply-accumulates (limit 2^20), more than the kernel saved."""
    assert_unchanged_with_reason(PadChannelsAtProducer(), se_pair(spatial=100),
                                 "multiply-accumulates to the readers", LOGGER, caplog)


def test_per_channel_dequantized_weight_bit_exact():
    """The kept-float conv's weight dequantized per output channel (ORT per-channel QDQ): the new
    rows and scales dequantize to 0, the int8 reader's outputs are bit-identical."""
    x = relay.var("x", shape=(1, IC, 5, 5), dtype="float32")
    scales = RNG.uniform(0.005, 0.02, C).astype("float32")
    w = relay.qnn.op.dequantize(_const(W_Q), _const(scales), _const(np.zeros(C, "int32")), axis=0)
    y = relay.nn.relu(relay.nn.conv2d(x, w, channels=C, kernel_size=(1, 1)))
    q = relay.qnn.op.quantize(y, _const(np.float32(0.05)), _const(ZP_X), out_dtype="uint8")
    before = infer(relay.Function([x], qconv(q, V2, padding=(0, 0))))
    after = PadChannelsAtProducer()(before)
    assert "channels=8" in after.astext(show_meta_data=False)
    assert_same_outputs(before, after, random_inputs(before, seed=3))


# -- int8 producers whose channel count 4 divides but x86 pads all the same (PP-OCRv4 rec: 60) -----
def wide_pair(c=12, n=None, spatial=2, out_zp=7):
    """int8 conv 16 -> c (per-tensor) -> requantize -> int8 conv c -> 16; ``n``: the padded form."""
    n = n or c
    rng = np.random.default_rng(12)
    w1, w2 = rng.integers(-40, 40, (c, 16, 1, 1)).astype("int8"), rng.integers(-40, 40, (16, c, 3, 3)).astype("int8")
    b = rng.integers(-500, 500, c).astype("int32")
    x = relay.var("x", shape=(1, 16, spatial, spatial), dtype="uint8")
    a = relay.qnn.op.conv2d(x, _const(_pad(w1, 0, n)), _const(3), _const(0), _const(np.float32(0.02)),
                            _const(np.full(n, 0.01, "float32")) if n != c else _const(np.float32(0.01)),
                            kernel_size=(1, 1), channels=n, out_dtype="int32")
    a = relay.nn.bias_add(a, _const(_pad(b, 0, n)))
    r = relay.qnn.op.requantize(a, _const(np.full(n, 0.0002, "float32")) if n != c else _const(np.float32(0.0002)),
                                _const(0), _const(np.float32(0.05)), _const(out_zp), axis=1, out_dtype="uint8")
    y = relay.qnn.op.conv2d(r, _const(_pad(w2, 1, n)), _const(out_zp), _const(0), _const(np.float32(0.05)),
                            _const(np.float32(0.01)), kernel_size=(3, 3), padding=(1, 1), channels=16,
                            out_dtype="int32")
    return infer(relay.Function([x], y))


def test_x86_padded_multiple_of_4_structure_idempotent_bit_exact():
    """12 channels (4 divides them; no policy block does): written as 16 by the producer."""
    with tvm.target.Target("llvm -mcpu=x86-64-v3"):
        after = PadChannelsAtProducer()(wide_pair())
    assert "channels=16" in after.astext(show_meta_data=False).split("qnn.requantize")[0]
    with tvm.target.Target("llvm -mcpu=x86-64-v3"):
        assert_unchanged(PadChannelsAtProducer(), after)
    with tvm.transform.PassContext(opt_level=3):
        built = [relay.build(m, target="llvm") for m in (wide_pair(), after)]
    for seed in (1, 2):
        assert_same_outputs(*built, random_inputs(wide_pair(), seed=seed))


@pytest.mark.parametrize("target", ["llvm -mcpu=x86-64-v3", pytest.param("llvm -mcpu=znver4", marks=pytest.mark.slow),
                                    pytest.param("llvm -mcpu=skylake-avx512", marks=pytest.mark.slow)])
def test_x86_padded_multiple_of_4_one_kernel_fewer(target):
    """The slice kernel between the two convs goes (compiled for each CPU class, not run here)."""
    pipe = tvm_ext.core.pipelines.int8()
    base = tvm_ext.build(wide_pair(), target=target, passes=pipe, disabled_pass=["PadChannelsAtProducer"])
    new = tvm_ext.build(wide_pair(), target=target, passes=pipe)
    assert new.kernel_report.num_kernels == base.kernel_report.num_kernels - 1, (
        base.kernel_report.table(), new.kernel_report.table())


def test_channels_an_output_block_divides_unchanged(caplog):
    """24 channels: 8 divides them, the AVX2 policy's output block: x86 writes 24, nothing to pad.
    TVM's own rule (no target) pads 24 to 32, so there the rule applies."""
    with tvm.target.Target("llvm -mcpu=x86-64-v3"), caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert_unchanged(PadChannelsAtProducer(), wide_pair(c=24))
    assert "x86 writes them unpadded" in caplog.text
    assert "channels=32" in PadChannelsAtProducer()(wide_pair(c=24)).astext(show_meta_data=False)


# -- a conv that reads one padded producer and is one itself -------------------------------------
def conv_chain(c=12, spatial=2):
    """int8 conv 16 -> c -> requantize -> int8 conv c -> c -> requantize -> int8 conv c -> 16: the middle
    conv is the first producer's reader and the second producer."""
    rng = np.random.default_rng(21)
    x = relay.var("x", shape=(1, 16, spatial, spatial), dtype="uint8")
    y = x
    for i, (cin, cout) in enumerate([(16, c), (c, c), (c, 16)]):
        w = rng.integers(-40, 40, (cout, cin, 1, 1)).astype("int8")
        y = relay.qnn.op.conv2d(y, _const(w), _const(3 if i == 0 else 7), _const(0), _const(np.float32(0.05)),
                                _const(np.float32(0.01)), kernel_size=(1, 1), channels=cout, out_dtype="int32")
        if i < 2:
            y = relay.nn.bias_add(y, _const(rng.integers(-500, 500, cout).astype("int32")))
            y = relay.qnn.op.requantize(y, _const(np.full(cout, 0.0005, "float32")), _const(0),
                                        _const(np.float32(0.05)), _const(7), axis=1, out_dtype="uint8")
    return infer(relay.Function([x], y))


def test_conv_that_reads_and_writes_padded_channels_structure_idempotent_bit_exact():
    """Both producers write 16 channels; the middle conv gets 16 input and 16 output channels, one
    rewrite per round (each rule rebuilds the conv it rewrites)."""
    with tvm.target.Target("llvm -mcpu=x86-64-v3"):
        after = PadChannelsAtProducer()(conv_chain())
        assert_unchanged(PadChannelsAtProducer(), after)
    convs = [c for c in after.astext(show_meta_data=False).splitlines() if "qnn.conv2d(" in c]
    assert [c.count("channels=16") for c in convs] == [1, 1, 1], convs
    assert "Tensor[(16, 16, 1, 1), int8]" in convs[1], convs[1]
    with tvm.transform.PassContext(opt_level=3):
        built = [relay.build(m, target="llvm") for m in (conv_chain(), after)]
    for seed in (1, 2):
        assert_same_outputs(*built, random_inputs(conv_chain(), seed=seed))
