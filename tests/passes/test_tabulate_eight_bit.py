"""Tests of tvm_ext.passes.tabulate_eight_bit (TabulateEightBit and the tvm_ext.table_lookup op)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relay

import tvm_ext
from tvm_ext import KernelReport
from tvm_ext.core import pipelines
from tvm_ext.passes import TabulateEightBit
from tvm_ext.ops import table_lookup
from tvm_ext.testing import assert_unchanged, check, infer, run_module

from _helpers import assert_untyped_module_raises

SHAPE = (1, 16, 4, 4)  # 256 elements: one of each 8-bit value fits


def _dequantize(x, zp, scale):
    return relay.multiply(relay.cast(relay.subtract(relay.cast(x, "int32"), relay.const(zp)), "float32"),
                          relay.const(scale))


def _quantize(v, scale, zp, dtype):
    lo, hi = (0, 255) if dtype == "uint8" else (-128, 127)
    q = relay.add(relay.round(relay.divide(v, relay.const(scale))), relay.const(float(zp)))
    return relay.cast(relay.clip(q, lo, hi), dtype)


def _silu(x, dtype="uint8", zp=3):
    """Lowered QDQ SiLU: q(dq(x) * dq(q(sigmoid(dq(x)))))."""
    d = _dequantize(x, zp, 0.05)
    s = _quantize(relay.sigmoid(d), 1 / 256, 0 if dtype == "uint8" else -128, dtype)
    return _quantize(relay.multiply(d, _dequantize(s, 0 if dtype == "uint8" else -128, 1 / 256)), 0.04, zp, dtype)


def _all_values(dtype):
    info = np.iinfo(dtype)
    return np.arange(info.min, info.max + 1).astype(dtype).reshape(SHAPE)


def _fn(body_of, dtype="uint8", shape=SHAPE):
    x = relay.var("x", shape=shape, dtype=dtype)
    return infer(relay.Function([x], body_of(x)))


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_silu_becomes_one_lookup_of_what_tvm_computes(dtype):
    """q(dq(x) * dq(q(sigmoid(dq(x))))) -> table_lookup(x, T), T = the chain on every 8-bit value."""
    before = _fn(lambda x: _silu(x, dtype), dtype)
    table = run_module(before, {"x": _all_values(dtype)})[0].reshape(-1)  # entry i: value i (- 128 for int8)
    expected = _fn(lambda x: table_lookup(x, relay.const(table)), dtype)
    after = check(TabulateEightBit(), before, expected)
    assert "sigmoid" not in after.astext()
    # sanity of T against the formula in float64 (it is TVM's float32 result: within one level)
    v = _all_values(dtype).reshape(-1).astype(np.int64)
    d = (v - 3) * 0.05
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    szp = 0 if dtype == "uint8" else -128
    sig = np.clip(np.round(1 / (1 + np.exp(-d)) * 256) + szp, lo, hi)
    ref = np.clip(np.round(d * ((sig - szp) / 256) / 0.04) + 3, lo, hi)
    assert np.abs(table.astype(np.int64) - ref).max() <= 1


def test_lookup_of_a_wide_integer_source_with_a_proven_range():
    """TVM's simplifier drops a requantize's narrowing cast: clip(int32, -10, 200) is the source;
    the lookup indexes x - (-10) into a 211-entry table."""
    def body(x):
        src = relay.clip(relay.cast(x, "int32"), -10, 200)
        return _quantize(relay.sigmoid(relay.multiply(relay.cast(src, "float32"), relay.const(0.1))), 1 / 256, 0,
                         "uint8")

    before = _fn(body, "int16")
    xs = np.arange(-20, 236).astype("int16").reshape(SHAPE)  # the whole domain and beyond
    want = run_module(before, {"x": xs})[0]
    after = TabulateEightBit()(before)
    text = after.astext()
    assert "tvm_ext.table_lookup" in text and "sigmoid" not in text and "Tensor[(211), uint8]" in text
    np.testing.assert_array_equal(run_module(after, {"x": xs})[0], want)


@pytest.mark.parametrize("lo, hi, narrow", [(0, 255, "uint8"), (-128, 127, "int8"), (3, 200, "uint8")])
def test_wide_source_inside_eight_bits_is_read_as_eight_bits(lo, hi, narrow):
    """clip(int32, lo, hi) inside an 8-bit range, read by two sigmoid chains: both lookups read one
    cast(clip, 8 bits) through 256-entry tables, so the clip's kernel writes 8 bits, not int32."""
    def chain(src, k):
        return _quantize(relay.sigmoid(relay.multiply(relay.cast(src, "float32"), relay.const(k))), 1 / 256, 0,
                         "uint8")

    def body(x):
        src = relay.clip(relay.add(relay.cast(x, "int32"), relay.const(7)), lo, hi)
        return relay.Tuple([chain(src, 0.1), relay.nn.max_pool2d(chain(src, -0.03), (2, 2))])

    before = _fn(body, "int16")
    after = TabulateEightBit()(before)
    text = after.astext()
    assert "sigmoid" not in text
    assert text.count(f'dtype="{narrow}"') == 1 and text.count("Tensor[(256), uint8]") == 2, text
    assert_unchanged(TabulateEightBit(), after)  # idempotent on the narrowed form
    xs = np.arange(-300, 300, 600 / 256).astype("int16").reshape(SHAPE)  # the whole domain and beyond
    for want, got in zip(run_module(before, {"x": xs}), run_module(after, {"x": xs})):
        np.testing.assert_array_equal(got, want)
    built = tvm_ext.build(before, passes=[TabulateEightBit()])
    crossing = KernelReport.from_factory(built).crossing.nbytes
    assert "int32" not in crossing and narrow in crossing, crossing


def test_lookup_reads_the_narrowing_cast_the_source_has():
    """clip(int32, 0, 255) narrowed by cast(., uint8) for a max pool and read by a sigmoid chain: the
    lookup indexes that cast, not a second cast of the clip, so the clip keeps one narrowing reader
    and its kernel writes uint8 (two casts of it would each leave it, as int32, to a kernel of its own)."""
    def body(x):
        src = relay.clip(relay.add(relay.cast(x, "int32"), relay.const(7)), 0, 255)
        pooled = relay.nn.max_pool2d(relay.cast(src, "uint8"), (2, 2))
        sig = _quantize(relay.sigmoid(relay.multiply(relay.cast(src, "float32"), relay.const(0.1))), 1 / 256, 0,
                        "uint8")
        return relay.Tuple([pooled, sig])

    before = _fn(body, "int16")
    after = TabulateEightBit()(before)
    text = after.astext()
    assert "sigmoid" not in text and text.count('dtype="uint8"') == 1, text
    assert_unchanged(TabulateEightBit(), after)
    xs = np.arange(-300, 300, 600 / 256).astype("int16").reshape(SHAPE)
    for want, got in zip(run_module(before, {"x": xs}), run_module(after, {"x": xs})):
        np.testing.assert_array_equal(got, want)
    built = tvm_ext.build(before, passes=[TabulateEightBit()])
    crossing = KernelReport.from_factory(built).crossing.nbytes
    assert "int32" not in crossing, crossing


def _assert_lookup_in_conv_kernel_bit_exact(mod, inputs, gone: str):
    """``mod`` built with TVM (host target) without and with the pass: as many kernels, a lookup inside
    a convolution's kernel, no kernel computing ``gone``, outputs bit-exact on each of ``inputs``."""
    plain, tab = (tvm_ext.build(mod, passes=p) for p in ([], [TabulateEightBit()]))
    kernels = [KernelReport.from_factory(f).kernels for f in (plain, tab)]
    assert len(kernels[0]) == len(kernels[1]), ([k.ops for k in kernels[0]], [k.ops for k in kernels[1]])
    assert any("nn.contrib_conv2d_NCHWc" in k.ops and "tvm_ext.table_lookup" in k.ops for k in kernels[1]), \
        [k.ops for k in kernels[1]]
    assert not any(gone in k.ops for k in kernels[1])
    for xv in inputs:
        np.testing.assert_array_equal(run_module(tab, {"x": xv})[0], run_module(plain, {"x": xv})[0])


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_differential_conv_silu_bit_exact_and_fused(dtype):
    """Built with TVM (host target, the pass at before_fuse): same kernels, the lookup inside the
    convolution's kernel, outputs bit-exact on every input value."""
    zp = 3 if dtype == "uint8" else -3
    x = relay.var("x", shape=(1, 16, 8, 8), dtype=dtype)
    rng = np.random.default_rng(0)
    w = relay.const(rng.integers(-100, 100, (16, 16, 3, 3)).astype("int8"))
    c = relay.qnn.op.conv2d(x, w, relay.const(zp), relay.const(0), relay.const(0.1), relay.const(0.02),
                            kernel_size=(3, 3), channels=16, padding=(1, 1))
    r = relay.qnn.op.requantize(c, relay.const(0.002), relay.const(0), relay.const(0.05), relay.const(zp),
                                out_dtype=dtype)
    d = relay.qnn.op.dequantize(r, relay.const(0.05), relay.const(zp))
    szp = 0 if dtype == "uint8" else -128
    s = relay.qnn.op.quantize(relay.sigmoid(d), relay.const(1 / 256), relay.const(szp), out_dtype=dtype)
    m = relay.multiply(d, relay.qnn.op.dequantize(s, relay.const(1 / 256), relay.const(szp)))
    q = relay.qnn.op.quantize(m, relay.const(0.04), relay.const(zp), out_dtype=dtype)
    w2 = relay.const(rng.integers(-100, 100, (16, 16, 1, 1)).astype("int8"))
    out = relay.qnn.op.conv2d(q, w2, relay.const(zp), relay.const(0), relay.const(0.04), relay.const(0.02),
                              kernel_size=(1, 1), channels=16)
    mod = infer(relay.Function([x], out))
    xs = [_all_values(dtype).reshape(1, 16, 4, 4).repeat(2, 2).repeat(2, 3),
          rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, (1, 16, 8, 8)).astype(dtype)]
    _assert_lookup_in_conv_kernel_bit_exact(mod, xs, gone="sigmoid")



def test_a_dequantized_reader_reads_the_one_lookup():
    """r1 = q(silu(x)) is read as 8 bits (an output) and as dq(r1) by a float add with y: one table
    for r1; the add's dequantize stays arithmetic on the lookup (before: a second, float32 table of
    x, so x had two lookups as readers)."""
    y = relay.var("y", shape=SHAPE, dtype="uint8")

    def body(x, r1):
        return relay.Tuple([r1, relay.add(_dequantize(r1, 3, 0.04), _dequantize(y, 5, 0.03))])

    x = relay.var("x", shape=SHAPE, dtype="uint8")
    before = infer(relay.Function([x, y], body(x, _silu(x))))
    table = run_module(_fn(_silu), {"x": _all_values("uint8")})[0].reshape(-1)
    x = relay.var("x", shape=SHAPE, dtype="uint8")
    expected = infer(relay.Function([x, y], body(x, table_lookup(x, relay.const(table)))))
    after = check(TabulateEightBit(), before, expected)
    assert after.astext().count("tvm_ext.table_lookup") == 1
    check(TabulateEightBit(), after, after)  # idempotent: the dequantize on the lookup is no new chain
    rng = np.random.default_rng(4)
    feed = {"x": _all_values("uint8"), "y": rng.integers(0, 256, SHAPE).astype("uint8")}
    for got, want in zip(run_module(after, feed), run_module(before, feed)):
        np.testing.assert_array_equal(got, want)


def test_a_dequantized_reader_of_an_8_bit_step_too_cheap_for_a_table_keeps_its_own_table():
    """r1 = q(dq(x) * 0.5) (10 ops, under ``long_chain`` = 12) is read as 8 bits by a max pool, and as
    dq(r1) by a float add with y (14 ops from x): dq(r1) is tabulated from x, while r1 keeps its ops.
    x then has two readers (r1's chain and the lookup), one more kernel than reading r1, and still the
    faster build where the step is long: the step computed in the producer's epilogue costs more than
    a kernel of its own (docs/passes.md, TabulateEightBit, one table per value)."""
    y = relay.var("y", shape=SHAPE, dtype="uint8")

    def step(x):
        return _quantize(relay.multiply(_dequantize(x, 3, 0.05), relay.const(0.5)), 0.04, 3, "uint8")

    x = relay.var("x", shape=SHAPE, dtype="uint8")
    r1 = step(x)
    tail = relay.add(_dequantize(r1, 3, 0.04), _dequantize(y, 5, 0.03))
    before = infer(relay.Function([x, y], relay.Tuple([relay.nn.max_pool2d(r1, (2, 2)), tail])))
    after = TabulateEightBit(long_chain=12)(before)
    text = after.astext()
    assert text.count("tvm_ext.table_lookup") == 1 and "nn.max_pool2d" in text
    assert_unchanged(TabulateEightBit(long_chain=12), after)
    feed = {"x": _all_values("uint8"), "y": np.random.default_rng(7).integers(0, 256, SHAPE).astype("uint8")}
    for got, want in zip(run_module(after, feed), run_module(before, feed)):
        np.testing.assert_array_equal(got, want)


def test_a_reader_with_its_own_transcendental_keeps_its_table():
    """dq(r1) followed by another sigmoid is not cheap: it keeps a table of its own (of x)."""
    x = relay.var("x", shape=SHAPE, dtype="uint8")
    r1 = _silu(x)
    before = infer(relay.Function([x], relay.Tuple([r1, relay.sigmoid(_dequantize(r1, 3, 0.04))])))
    after = TabulateEightBit()(before)
    assert after.astext().count("tvm_ext.table_lookup") == 2 and "sigmoid" not in after.astext()


def test_differential_csp_bottleneck_one_lookup_fused_into_the_conv():
    """A YOLOX/CSP bottleneck: s = SiLU(conv1(x)) is read by conv2 (as 8 bits) and by the float
    residual add (dequantized). Built with TVM: the SiLU lookup fuses into conv1's kernel (no
    lookup-only kernel), as many kernels as without the pass, outputs bit-exact."""
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="uint8")
    rng = np.random.default_rng(5)

    def conv_silu(data, zp_in, scale_in, k):
        w = relay.const(rng.integers(-100, 100, (16, 16, k, k)).astype("int8"))
        c = relay.qnn.op.conv2d(data, w, relay.const(zp_in), relay.const(0), relay.const(scale_in),
                                relay.const(0.02), kernel_size=(k, k), channels=16, padding=(k // 2, k // 2))
        r = relay.qnn.op.requantize(c, relay.const(scale_in * 0.02), relay.const(0), relay.const(0.05),
                                    relay.const(3), out_dtype="uint8")
        d = relay.qnn.op.dequantize(r, relay.const(0.05), relay.const(3))
        sg = relay.qnn.op.quantize(relay.sigmoid(d), relay.const(1 / 256), relay.const(0), out_dtype="uint8")
        m = relay.multiply(d, relay.qnn.op.dequantize(sg, relay.const(1 / 256), relay.const(0)))
        return relay.qnn.op.quantize(m, relay.const(0.04), relay.const(3), out_dtype="uint8")

    s1 = conv_silu(x, 3, 0.1, 1)
    s2 = conv_silu(s1, 3, 0.04, 3)
    add = relay.add(relay.qnn.op.dequantize(s1, relay.const(0.04), relay.const(3)),
                    relay.qnn.op.dequantize(s2, relay.const(0.04), relay.const(3)))
    out = relay.qnn.op.quantize(add, relay.const(0.07), relay.const(2), out_dtype="uint8")
    mod = infer(relay.Function([x], out))
    plain, tab = (tvm_ext.build(mod, passes=p) for p in ([], [TabulateEightBit()]))
    kernels = [KernelReport.from_factory(f).kernels for f in (plain, tab)]
    assert len(kernels[1]) <= len(kernels[0]), ([k.ops for k in kernels[0]], [k.ops for k in kernels[1]])
    assert not any(k.ops == ("tvm_ext.table_lookup",) or list(k.ops) == ["tvm_ext.table_lookup"]
                   for k in kernels[1]), [k.ops for k in kernels[1]]
    assert sum(k.ops.count("tvm_ext.table_lookup") for k in kernels[1]) == 2, [k.ops for k in kernels[1]]
    for xv in (_all_values("uint8").reshape(1, 16, 4, 4).repeat(2, 2).repeat(2, 3),
               rng.integers(0, 256, (1, 16, 8, 8)).astype("uint8")):
        np.testing.assert_array_equal(run_module(tab, {"x": xv})[0], run_module(plain, {"x": xv})[0])

def _stepwise_hard_swish(x):
    """A quantized hard-swish as some exporters write it (PaddlePaddle's PP-OCR): each step of
    v * clip(v + 3, 0, 6) / 6, v = x * 0.5, quantized on its own. No transcendental op, 50 ops."""
    v = _quantize(relay.multiply(_dequantize(x, 3, 0.05), relay.const(0.5)), 0.04, 3, "uint8")
    d = _dequantize(v, 3, 0.04)
    a = _quantize(relay.add(d, relay.const(3.0)), 0.08, 0, "uint8")
    c = _quantize(relay.clip(_dequantize(a, 0, 0.08), 0, 6), 0.03, 0, "uint8")
    m = _quantize(relay.multiply(d, _dequantize(c, 0, 0.03)), 0.1, 10, "uint8")
    return _quantize(relay.divide(_dequantize(m, 10, 0.1), relay.const(6.0)), 0.02, 5, "uint8")


#: Ops of :func:`_stepwise_hard_swish`: five dequantizes (4 ops each; ``v``'s is read twice), five
#: quantizes (5 each), the scaling, the add, the clip, the product and the division.
STEPWISE_OPS = 5 * 4 + 5 * 5 + 5


def test_a_long_chain_of_cheap_ops_becomes_one_lookup():
    """A stepwise quantized hard-swish (50 ops, no transcendental op) -> table_lookup(x, T)."""
    before = _fn(_stepwise_hard_swish)
    table = run_module(before, {"x": _all_values("uint8")})[0].reshape(-1)
    expected = _fn(lambda x: table_lookup(x, relay.const(table)))
    after = check(TabulateEightBit(), before, expected)
    assert "divide" not in after.astext()
    check(TabulateEightBit(), after, after)  # idempotent


def test_long_chain_counts_every_op(caplog):
    """The chain is tabulated at ``long_chain`` = its op count and left alone, saying why, at one more."""
    before = _fn(_stepwise_hard_swish)
    assert "tvm_ext.table_lookup" in TabulateEightBit(long_chain=STEPWISE_OPS)(before).astext()
    with caplog.at_level("DEBUG", logger="tvm_ext.passes.TabulateEightBit"):
        assert_unchanged(TabulateEightBit(long_chain=STEPWISE_OPS + 1), before)
    assert f"{STEPWISE_OPS} ops, fewer than {STEPWISE_OPS + 1}" in caplog.text


def test_differential_conv_stepwise_hard_swish_bit_exact_and_fused():
    """A conv whose requantized output goes through the stepwise hard-swish into a second conv:
    built with TVM (host target), the lookup in the first conv's kernel, as many kernels, outputs
    bit-exact on every input value."""
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="uint8")
    rng = np.random.default_rng(6)
    w = relay.const(rng.integers(-100, 100, (16, 16, 1, 1)).astype("int8"))
    c = relay.qnn.op.conv2d(x, w, relay.const(3), relay.const(0), relay.const(0.1), relay.const(0.02),
                            kernel_size=(1, 1), channels=16)
    r = relay.qnn.op.requantize(c, relay.const(0.002), relay.const(0), relay.const(0.05), relay.const(3),
                                out_dtype="uint8")
    w2 = relay.const(rng.integers(-100, 100, (16, 16, 3, 3)).astype("int8"))
    out = relay.qnn.op.conv2d(_stepwise_hard_swish(r), w2, relay.const(5), relay.const(0), relay.const(0.02),
                              relay.const(0.02), kernel_size=(3, 3), channels=16, padding=(1, 1))
    mod = infer(relay.Function([x], out))
    _assert_lookup_in_conv_kernel_bit_exact(mod, [_all_values("uint8").reshape(1, 16, 4, 4).repeat(2, 2).repeat(2, 3),
                                                  rng.integers(0, 256, (1, 16, 8, 8)).astype("uint8")], gone="divide")


def test_idempotent():
    before = _fn(lambda x: relay.nn.max_pool2d(_silu(x), (2, 2)))
    once = TabulateEightBit()(before)
    assert "tvm_ext.table_lookup" in once.astext()
    check(TabulateEightBit(), once, once)


def test_two_tensors_only_the_single_source_part_is_tabulated():
    """q(dq(x) * sigmoid(dq(y))): the product depends on two tensors (no table); sigmoid(dq(y)) is a
    float function of y alone and becomes a float32 table."""
    x, y = (relay.var(n, shape=SHAPE, dtype="uint8") for n in "xy")
    before = infer(relay.Function([x, y], _quantize(relay.multiply(_dequantize(x, 3, 0.05),
                                                                   relay.sigmoid(_dequantize(y, 3, 0.05))),
                                                    0.04, 3, "uint8")))
    table = run_module(infer(relay.Function([y], relay.sigmoid(_dequantize(y, 3, 0.05)))),
                       {"y": _all_values("uint8")})[0].reshape(-1)
    expected = infer(relay.Function([x, y], _quantize(relay.multiply(_dequantize(x, 3, 0.05),
                                                                     table_lookup(y, relay.const(table))),
                                                      0.04, 3, "uint8")))
    after = check(TabulateEightBit(), before, expected)
    rng = np.random.default_rng(2)
    feed = {n: rng.integers(0, 256, SHAPE).astype("uint8") for n in "xy"}
    np.testing.assert_array_equal(run_module(after, feed)[0], run_module(before, feed)[0])


@pytest.mark.parametrize("case", ["hard_swish", "per_channel_constant", "float_input", "integer_division"])
def test_unchanged_on_no_match(case, caplog):
    """No transcendental op; a per-channel scale; a float source; an integer division (its table
    would divide by zero at x == 0, a value the model may never see): left alone."""
    def hard_swish(x):  # 13 ops as written here, fewer than LONG_CHAIN: cheap arithmetic
        d = _dequantize(x, 3, 0.05)
        return _quantize(relay.divide(relay.multiply(d, relay.clip(relay.add(d, relay.const(3.0)), 0, 6)),
                                      relay.const(6.0)), 0.04, 3, "uint8")

    if case == "hard_swish":
        mod = _fn(hard_swish)
    elif case == "per_channel_constant":
        scale = np.linspace(0.01, 0.1, 16).astype("float32").reshape(1, 16, 1, 1)
        mod = _fn(lambda x: _quantize(relay.sigmoid(relay.multiply(relay.cast(x, "float32"), relay.const(scale))),
                                      1 / 256, 0, "uint8"))
    elif case == "integer_division":
        mod = _fn(lambda x: _quantize(relay.sigmoid(relay.cast(
            relay.floor_divide(relay.const(1000), relay.cast(x, "int32")), "float32")), 1 / 256, 0, "uint8"))
    else:
        mod = _fn(lambda x: _quantize(relay.sigmoid(x), 1 / 256, 0, "uint8"), "float32")
    with caplog.at_level("DEBUG", logger="tvm_ext.passes.TabulateEightBit"):
        assert_unchanged(TabulateEightBit(), mod)
    if case == "hard_swish":
        assert "no op of" in caplog.text
    if case == "integer_division":
        assert "integer division" in caplog.text


def test_untyped_module_raises():
    x = relay.var("x", shape=SHAPE, dtype="uint8")
    mod = tvm.IRModule.from_expr(relay.Function([x], _silu(x)))
    assert_untyped_module_raises(TabulateEightBit(), mod, "TabulateEightBit")


def test_if_and_dynamic_shapes_skipped():
    x = relay.var("x", shape=SHAPE, dtype="uint8")
    c = relay.var("c", shape=(), dtype="bool")
    with_if = infer(relay.Function([x, c], relay.If(c, _silu(x), x)))
    assert_unchanged(TabulateEightBit(), with_if)
    dyn = relay.var("x", shape=(relay.Any(), 16), dtype="uint8")
    assert_unchanged(TabulateEightBit(), infer(relay.Function([dyn], _silu(dyn))))


def test_bad_ops_argument():
    with pytest.raises(TypeError, match="TabulateEightBit"):
        TabulateEightBit(ops="sigmoid")


@pytest.mark.parametrize("long_chain", [0, -3, 2.5, True, "32"])
def test_bad_long_chain_argument(long_chain):
    with pytest.raises(ValueError, match="TabulateEightBit: long_chain must be a positive integer"):
        TabulateEightBit(long_chain=long_chain)


def test_lookup_op_clamps_and_types():
    """Out-of-table indices read the table's ends; float indices are a type error."""
    table = np.arange(10, 20).astype("float32")
    mod = _fn(lambda x: table_lookup(x, relay.const(table)), "int32", (6,))
    got = run_module(mod, {"x": np.array([-5, 0, 3, 9, 10, 1000], "int32")})[0]
    np.testing.assert_array_equal(got, [10, 10, 13, 19, 19, 19])
    i8 = _fn(lambda x: table_lookup(x, relay.const(np.arange(256).astype("int32"))), "int8", (3,))
    np.testing.assert_array_equal(run_module(i8, {"x": np.array([-128, 0, 127], "int8")})[0], [0, 128, 255])
    with pytest.raises(tvm.error.TVMError, match="integer"):
        _fn(lambda x: table_lookup(x, relay.const(table)), "float32", (6,))


def _near_a_rounding_boundary(y, s):
    """``(k, c)``: an entry ``k`` of ``y`` and a constant ``c`` such that ``round(y[k] * s + c)``
    differs between rounding the product and then the sum (numpy, a plain ``llvm`` build) and one
    rounding of both (a fused multiply-add): ``fl(y[k] * s) + c`` is exactly ``m + 0.5``."""
    for k, v in enumerate(y.astype(np.float64)):
        p = np.float32(v * np.float64(s))
        for m in range(100, 140):
            c = np.float32((m + 0.5) - np.float64(p))
            if np.float32(p + c) != np.float32(m + 0.5):
                continue
            fused = np.float32(v * np.float64(s) + np.float64(c))
            if np.round(fused) != np.round(np.float32(p + c)):
                return k, c
    raise AssertionError("no entry near a rounding boundary")


@pytest.mark.parametrize("op", ["tanh", "erf"])
def test_tables_are_the_oracle_s_values_on_any_host(op):
    """Built for the host (FMA on every AVX2 or aarch64 host), the table is still what a plain ``llvm``
    build of the chain computes: ``op(dq(x)) * s`` rounded, then ``+ c`` rounded. ``c`` puts one entry
    where one rounding of both (a contracted multiply-add) gives the next integer."""
    s = np.float32(100.3)

    def dq(x):
        return relay.multiply(relay.cast(relay.subtract(relay.cast(x, "int32"), relay.const(128)), "float32"),
                              relay.const(np.float32(0.03)))

    xs = np.arange(256).astype("uint8")
    y = run_module(_fn(lambda x: getattr(relay, op)(dq(x)), shape=(256,)), {"x": xs})[0]
    k, c = _near_a_rounding_boundary(y, s)

    def body(x):
        v = relay.add(relay.multiply(getattr(relay, op)(dq(x)), relay.const(s)), relay.const(c))
        return relay.cast(relay.clip(relay.round(v), 0, 255), "uint8")

    before = _fn(body, shape=(256,))
    want = run_module(before, {"x": xs})[0]
    assert want[k] == np.round(np.float32(np.float32(y[k] * s) + c))
    built = tvm_ext.build(before, passes=[TabulateEightBit()])
    assert "table_lookup" in built.get_graph_json() and op not in built.get_graph_json()
    np.testing.assert_array_equal(run_module(built, {"x": xs})[0], want)


def test_float64_chain_gets_a_float64_table():
    """A chain computing in float64 (AddAsOnnxRuntime's adds) is tabulated with a float64 table:
    relay.const alone made the table float32 (a type error where the chain's readers expect float64)."""
    def body(x):
        v = relay.multiply(relay.cast(x, "float64"), relay.const(0.1, "float64"))
        return relay.add(relay.sigmoid(v), relay.const(1e-9, "float64"))

    before = _fn(body)
    after = TabulateEightBit()(before)
    assert "sigmoid" not in after.astext() and "Tensor[(256), float64]" in after.astext()
    xs = _all_values("uint8")
    got = run_module(after, {"x": xs})[0]
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, run_module(before, {"x": xs})[0])


def test_kernel_reports_know_the_op_in_a_fresh_process():
    """report.op_pattern registers tvm-ext's ops first: the lookup is elementwise (0), never an anchor."""
    import subprocess
    import sys

    code = ("from tvm_ext.core.report import op_pattern, anchor_of; "
            "print(op_pattern('tvm_ext.table_lookup'), anchor_of(['tvm_ext.table_lookup', 'image.resize2d']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["0", "None"]


def _qdq_silu_onnx(path):
    """A QDQ conv + SiLU (Sigmoid, Mul) as ONNX Runtime's quantizer writes it, 1x8x12x12."""
    rng = np.random.default_rng(3)
    init = [helper.make_tensor("w", TensorProto.INT8, [8, 8, 3, 3], rng.integers(-90, 90, 576).tolist()),
            helper.make_tensor("ws", TensorProto.FLOAT, [], [0.01]),
            helper.make_tensor("wz", TensorProto.INT8, [], [0])]
    for n, s, z in [("i", 0.02, 128), ("c", 0.05, 100), ("s", 1 / 256, 0), ("o", 0.03, 10)]:
        init += [helper.make_tensor(n + "s", TensorProto.FLOAT, [], [s]),
                 helper.make_tensor(n + "z", TensorProto.UINT8, [], [z])]
    nodes = [helper.make_node("QuantizeLinear", ["x", "is", "iz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "is", "iz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "cs", "cz"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "cs", "cz"], ["cd"]),
             helper.make_node("Sigmoid", ["cd"], ["sg"]),
             helper.make_node("QuantizeLinear", ["sg", "ss", "sz"], ["sq"]),
             helper.make_node("DequantizeLinear", ["sq", "ss", "sz"], ["sd"]),
             helper.make_node("Mul", ["cd", "sd"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "os", "oz"], ["mq"]),
             helper.make_node("DequantizeLinear", ["mq", "os", "oz"], ["y"])]
    g = helper.make_graph(nodes, "qdq_silu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 12, 12])], init)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)


def test_int8_pipeline_tabulates_qdq_silu_bit_exact_to_stock(tmp_path, monkeypatch):
    """pipelines.int8() on an ONNX QDQ SiLU: the sigmoid becomes a table, outputs equal stock TVM's.
    The 8-channel conv stays float as in stock TVM on every host (on AVX2 and AVX-512 VNNI hosts
    QDQToInteger would convert it: within one step, tested in its own module, not bit-exact)."""
    from tvm_ext.core.frontend import from_onnx
    from tvm_ext.passes import qdq_to_integer

    monkeypatch.setattr(qdq_to_integer, "PADDED_INT8_MIN_MACS_BY_ISA", {})

    path = str(tmp_path / "silu.onnx")
    _qdq_silu_onnx(path)
    mod, params = from_onnx(path, shape={"x": (1, 8, 12, 12)})
    with tvm.transform.PassContext(opt_level=3):
        stock = relay.build(mod, target=tvm_ext.build_target(), params=params)
    ours = tvm_ext.build(mod, params=params, passes=pipelines.int8())
    assert "table_lookup" in ours.get_graph_json() and "sigmoid" not in ours.get_graph_json()
    xv = np.random.default_rng(1).uniform(-2.6, 2.6, (1, 8, 12, 12)).astype("float32")
    np.testing.assert_array_equal(run_module(ours, {"x": xv})[0], run_module(stock, {"x": xv})[0])


def _conv_onnx_hard_swish():
    """uint8 x int8 1x1 conv, requantized, then a QDQ hard-swish in the form TVM's ONNX importer gives
    HardSwish, ``x * clip(x / 6 + 0.5, 0, 1)``: no transcendental op, 18 ops where the pipeline runs
    the pass."""
    rng = np.random.default_rng(3)
    x = relay.var("x", shape=(1, 16, 10, 10), dtype="uint8")
    w = relay.const(rng.integers(-100, 100, (32, 16, 1, 1)).astype("int8"))
    c = relay.qnn.op.conv2d(x, w, relay.const(3), relay.const(0), relay.const(0.1), relay.const(0.02),
                            kernel_size=(1, 1), channels=32)
    r = relay.qnn.op.requantize(c, relay.const(0.002), relay.const(0), relay.const(0.05), relay.const(3),
                                out_dtype="uint8")
    d = relay.qnn.op.dequantize(r, relay.const(0.05), relay.const(3))
    h = relay.multiply(d, relay.clip(relay.add(relay.multiply(d, relay.const(1 / 6)), relay.const(0.5)), 0.0, 1.0))
    return infer(relay.Function([x], relay.qnn.op.quantize(h, relay.const(0.04), relay.const(3), out_dtype="uint8")))


def test_int8_pipeline_tabulates_an_imported_hard_swish_bit_exact_to_plain_llvm():
    """The default ``long_chain`` takes a hard-swish as TVM imports ONNX's HardSwish: int8() builds
    it as a lookup in the conv's kernel for this host, and the output equals ``relay.build`` of the
    graph as written at plain ``llvm`` (no tvm-ext pass, no int8 SIMD: exact integer arithmetic and
    the float chain itself), on every value of the conv's output range the inputs reach."""
    mod = _conv_onnx_hard_swish()
    ours = tvm_ext.build(mod, passes=pipelines.int8())
    assert "tvm_ext.table_lookup" in ours.tvm_ext_module.astext()  # the module relay.build was handed
    with tvm.transform.PassContext(opt_level=3):
        plain = relay.build(mod, target="llvm")
    for seed in range(3):
        xv = np.random.default_rng(seed).integers(0, 256, (1, 16, 10, 10)).astype("uint8")
        np.testing.assert_array_equal(run_module(ours, {"x": xv})[0], run_module(plain, {"x": xv})[0])


def test_a_chain_tvm_cannot_build_is_left_alone_and_the_others_tabulated(caplog):
    """clip(SiLU(x), -20, 100) on uint8: TVM 0.19 cannot make -20 a uint8 bound, so that chain has no
    table and stays as written (the reason logged); the SiLU of ``y`` in the same function still
    becomes a lookup."""
    x, y = (relay.var(n, shape=SHAPE, dtype="uint8") for n in "xy")
    before = infer(relay.Function([x, y], relay.Tuple([relay.clip(_silu(x), -20, 100), _silu(y)])))
    with caplog.at_level("DEBUG", logger="tvm_ext.passes.TabulateEightBit"):
        after = TabulateEightBit()(before)
    assert "TVM cannot build the chain" in caplog.text
    text = after.astext()
    assert text.count("tvm_ext.table_lookup(") == 1 and "sigmoid(" in text and "a_min=-20f" in text
    assert_unchanged(TabulateEightBit(), after)
