"""Tests of tvm_ext.passes.affine_eight_bit_join (a float function of two 8-bit tensors as int32 arithmetic)."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.passes import AffineEightBitJoin
from tvm_ext.ops import table_lookup
from tvm_ext.passes.affine_eight_bit_join import affine_form
from tvm_ext.testing import assert_unchanged, check, infer, run_module
from tvm_ext.testing import quantized_add as qa

from _helpers import assert_if_and_let_skipped, assert_untyped_module_raises

LOGGER = "tvm_ext.passes.AffineEightBitJoin"
RESIDUAL = qa.AddScales(0.02, 128, 0.03, 120, 0.05, 125)
#: Scales as a calibrated model has them (float32 values of no simple ratio).
CALIBRATED = [qa.AddScales(0.053623054, 210, 0.09529405, 242, 0.13522607, 63),
              qa.AddScales(0.0076181157, 209, 0.076583743, 84, 0.14865239, 115),
              qa.AddScales(0.045216013, 79, 0.083631746, 164, 0.18122068, 140)]
#: Equal input scales, the output's twice theirs: ``(a + b) / 2`` has exact halves, and TVM's ``round``
#: takes them away from zero on both signs, which no floor of an affine form does.
HALVES = qa.AddScales(0.05, 128, 0.05, 128, 0.1, 128)


def _const(v, shape, dtype="float32"):
    return relay.const(np.full(shape, v, dtype))


def _dequantize(x, scale, zp, shape):
    return relay.multiply(relay.cast(relay.subtract(relay.cast(x, "int32"), relay.const(zp)), "float32"),
                          _const(scale, shape))


def requantized_add(p: qa.AddScales, scale_shape=(), a=None, b=None, end="uint8"):
    """``q(dq(a) + dq(b))`` as QNN lowering leaves it at ``before_fuse``. ``scale_shape=()``: scalar
    constants (TIR multiplies by the reciprocal of the output scale); ``(1, 1, 1, 1)``: one-element
    parameters (the kernel divides)."""
    a = relay.var("a", shape=qa.SHAPE, dtype="uint8") if a is None else a
    b = relay.var("b", shape=qa.SHAPE, dtype="uint8") if b is None else b
    s = relay.add(_dequantize(a, p.sa, p.za, scale_shape), _dequantize(b, p.sb, p.zb, scale_shape))
    y = relay.add(relay.round(relay.divide(s, _const(p.sc, scale_shape))), _const(p.zc, scale_shape))
    if end == "float32":
        return y
    return relay.cast(relay.clip(y, 0, 255), end)


def _integer(a, b, form, dtype="uint8"):
    m_a, m_b, c, n, lo, hi = form
    t = relay.add(relay.multiply(relay.cast(a, "int32"), relay.const(m_a)),
                  relay.multiply(relay.cast(b, "int32"), relay.const(m_b)))
    return relay.cast(relay.clip(relay.right_shift(relay.add(t, relay.const(c)), relay.const(n)), lo, hi), dtype)


def _values():
    return np.arange(256, dtype="uint8")


def test_residual_add_becomes_the_integer_form_of_its_values():
    expected_table = qa.reference(*qa.pairs(), RESIDUAL).reshape(256, 256)
    form = affine_form(_values(), _values(), expected_table)
    assert not isinstance(form, str) and len(form) == 6, form
    a, b = (relay.var(n, shape=qa.SHAPE, dtype="uint8") for n in "ab")
    check(AffineEightBitJoin(), requantized_add(RESIDUAL, a=a, b=b), _integer(a, b, form))


@pytest.mark.parametrize("scale_shape,divide", [((), False), ((1, 1, 1, 1), True)], ids=["scalar", "parameter"])
@pytest.mark.parametrize("p", [RESIDUAL, *CALIBRATED], ids=lambda p: f"sc{p.sc:.4g}")
def test_differential_bit_exact_on_every_pair(p, scale_shape, divide):
    """The rewritten add equals numpy's float32 arithmetic and a plain ``llvm`` build of the float chain
    on all 65,536 input pairs, with the output scale multiplied (scalar) or divided (parameter)."""
    before = infer(requantized_add(p, scale_shape))
    with tvm.transform.PassContext(opt_level=3):
        after = AffineEightBitJoin()(before)
    assert not any(str(t).startswith("float") for t in _call_dtypes(after)), "float arithmetic left"
    a, b = qa.pairs()
    inputs = {"a": a, "b": b}
    got = run_module(after, inputs)[0]
    np.testing.assert_array_equal(got, qa.reference(a, b, p, divide=divide))
    np.testing.assert_array_equal(got, run_module(before, inputs)[0])


def _call_dtypes(mod):
    found = []

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.checked_type, relay.TensorType):
            found.append(node.checked_type.dtype)

    relay.analysis.post_order_visit(mod["main"], visit)
    return found


def test_affine_form_matches_every_pair_and_fits_int32():
    rng = np.random.default_rng(0)
    a, b = qa.pairs()
    for _ in range(8):
        s1, s2 = (float(np.float32(v)) for v in rng.uniform(0.005, 0.1, 2))
        s3 = float(np.float32(rng.uniform(max(s1, s2), 2.5 * (s1 + s2))))
        p = qa.AddScales(s1, int(rng.integers(0, 256)), s2, int(rng.integers(0, 256)), s3, int(rng.integers(0, 256)))
        table = qa.reference(a, b, p).astype(np.int64).reshape(256, 256)
        m_a, m_b, c, n, lo, hi = affine_form(_values(), _values(), table)
        x, y = np.meshgrid(np.arange(256, dtype=np.int64), np.arange(256, dtype=np.int64), indexing="ij")
        t = x * m_a + y * m_b
        for part in (x * m_a, y * m_b, t, t + c):
            assert part.min() >= -2 ** 31 and part.max() < 2 ** 31
        np.testing.assert_array_equal(np.clip((t + c) >> n, lo, hi), table)


def test_affine_form_rejects_what_no_affine_form_rounds_to():
    table = qa.reference(*qa.pairs(), HALVES).reshape(256, 256)
    assert "no affine function" in str(affine_form(_values(), _values(), table))
    assert "constant" in str(affine_form(_values(), _values(), np.full((256, 256), 7)))


def test_idempotent():
    once = AffineEightBitJoin()(infer(requantized_add(RESIDUAL)))
    assert_unchanged(AffineEightBitJoin(), once)


def test_unchanged_on_no_match(caplog):
    a, b = (relay.var(n, shape=qa.SHAPE, dtype="uint8") for n in "ab")
    cases = {
        "ties no affine form rounds to": (requantized_add(HALVES), "no affine function"),
        "chain ending in float": (requantized_add(RESIDUAL, end="float32"), "ends in float32"),
    }
    for name, (body, reason) in cases.items():
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            assert_unchanged(AffineEightBitJoin(), infer(body))
        assert reason in caplog.text, name
    per_channel = relay.cast(relay.clip(relay.multiply(relay.add(
        relay.cast(a, "float32"), relay.cast(b, "float32")), _const(0.5, (1, 16, 1, 1))), 0, 255), "uint8")
    one_source = requantized_add(RESIDUAL, a=a, b=a)
    integer_only = relay.cast(relay.clip(relay.add(relay.cast(a, "int32"), relay.cast(b, "int32")), 0, 255), "uint8")
    for body in (per_channel, one_source, integer_only):
        assert_unchanged(AffineEightBitJoin(), infer(body))


def test_tuples_and_calls_of_functions_around_the_chain():
    """A tuple output, a tuple read back, and a call of a ``Primitive`` function (a group an earlier pass
    made, such as a pool's) next to the chain: the chain is rewritten, the rest is read around."""
    a, b = (relay.var(n, shape=qa.SHAPE, dtype="uint8") for n in "ab")
    x = relay.var("x", shape=qa.SHAPE, dtype="uint8")
    double = relay.Function([x], relay.add(x, x)).with_attr("Primitive", tvm.tir.IntImm("int32", 1))
    pair = relay.Tuple([relay.Call(double, [a]), b])
    before = relay.Tuple([requantized_add(RESIDUAL, a=relay.TupleGetItem(pair, 0), b=relay.TupleGetItem(pair, 1)),
                          relay.TupleGetItem(pair, 0)])
    with tvm.transform.PassContext(opt_level=3):
        after = AffineEightBitJoin()(infer(before))
    assert not any(str(t).startswith("float") for t in _call_dtypes(after))


def test_untyped_module_raises():
    assert_untyped_module_raises(AffineEightBitJoin(), tvm.IRModule.from_expr(requantized_add(RESIDUAL)),
                                 "AffineEightBitJoin")


def test_if_and_let_skipped(caplog):
    assert_if_and_let_skipped(AffineEightBitJoin(), requantized_add(RESIDUAL), LOGGER, caplog)


@tvm.instrument.pass_instrument
class _BeforeFuse:
    """The module FuseOps receives."""

    def __init__(self):
        self.mod = None

    def run_before_pass(self, mod, info):
        if info.name == "FuseOps" and self.mod is None:
            self.mod = mod


@pytest.mark.parametrize("target", ["llvm", "llvm -mcpu=x86-64-v3"])
def test_int8_pipeline_conv_residual_add_in_integers_bit_exact(target):
    """``pipelines.int8()`` on a QDQ conv with a residual add: no float arithmetic reaches FuseOps, and
    the output equals numpy's float32 arithmetic on every pair (the scales are scalars: multiplied)."""
    p = CALIBRATED[0]
    seen = _BeforeFuse()
    lib = tvm_ext.build(qa.conv_residual_add(p), target, passes=pipelines.int8(), instruments=[seen])
    assert not any(str(t).startswith("float") for t in _call_dtypes(seen.mod))
    a, b = qa.pairs()
    np.testing.assert_array_equal(run_module(lib, {"a": a, "b": b})[0], qa.reference(a, b, p))



# -- a float chain ending in float: a requantized add dequantized again for a float reader --
def dequantized_add(p: qa.AddScales, a, b):
    """``dq(q(dq(a) + dq(b)))``, the add read by a float op (an FPN's next add)::

        a, b -> requantized add (float) -> clip -> cast i32 -> - zc -> cast f32 -> * sc
    """
    q = relay.cast(relay.clip(requantized_add(p, a=a, b=b, end="float32"), 0, 255), "int32")
    return relay.multiply(relay.cast(relay.subtract(q, relay.const(p.zc)), "float32"), _const(p.sc, ()))


def test_dequantized_add_rewritten_up_to_its_cast():
    """The chain ends in float (no form), so the form replaces it up to its integer cast; the
    dequantize after it stays."""
    form = affine_form(_values(), _values(), qa.reference(*qa.pairs(), RESIDUAL).reshape(256, 256))
    a, b = (relay.var(n, shape=qa.SHAPE, dtype="uint8") for n in "ab")
    m_a, m_b, c, n, lo, hi = form
    t = relay.add(relay.multiply(relay.cast(a, "int32"), relay.const(m_a)),
                  relay.multiply(relay.cast(b, "int32"), relay.const(m_b)))
    q = relay.clip(relay.right_shift(relay.add(t, relay.const(c)), relay.const(n)), lo, hi)
    expected = relay.multiply(relay.cast(relay.subtract(q, relay.const(RESIDUAL.zc)), "float32"),
                              _const(RESIDUAL.sc, ()))
    check(AffineEightBitJoin(), dequantized_add(RESIDUAL, a, b), expected)


@pytest.mark.parametrize("p", [RESIDUAL, *CALIBRATED], ids=lambda p: f"sc{p.sc:.4g}")
def test_dequantized_add_bit_exact_on_every_pair(p):
    a, b = (relay.var(n, shape=qa.SHAPE, dtype="uint8") for n in "ab")
    before = infer(dequantized_add(p, a, b))
    with tvm.transform.PassContext(opt_level=3):
        after = AffineEightBitJoin()(before)
    assert "round(" in before.astext() and "round(" not in after.astext()
    x, y = qa.pairs()
    got = run_module(after, {"a": x, "b": y})[0]
    expected = (qa.reference(x, y, p).astype(np.int32) - p.zc).astype(np.float32) * np.float32(p.sc)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got, run_module(before, {"a": x, "b": y})[0])


def test_dequantized_add_idempotent():
    a, b = (relay.var(n, shape=qa.SHAPE, dtype="uint8") for n in "ab")
    with tvm.transform.PassContext(opt_level=3):
        once = AffineEightBitJoin()(infer(dequantized_add(RESIDUAL, a, b)))
    assert_unchanged(AffineEightBitJoin(), once)


def test_dequantized_add_unchanged_on_no_match(caplog):
    """Ties no affine form rounds to: neither the whole chain (it ends in float) nor its cast (logged)."""
    a, b = (relay.var(n, shape=qa.SHAPE, dtype="uint8") for n in "ab")
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert_unchanged(AffineEightBitJoin(), infer(dequantized_add(HALVES, a, b)))
    assert "ends in float32" in caplog.text
    assert "not rewritten up to an inner cast (no affine function" in caplog.text

# -- integer chains: a QNN add lowered to integers (fixed_point_multiply), one input a SiLU table lookup --
#: ``fixed_point_multiply`` parameters of YOLOv8n QDQ's first C2f add: the block input's requantize to the
#: add's scale, then the concatenation's requantize of the sum.
ADD_REQUANTIZE, CONCAT_REQUANTIZE = (1539323661, 1), (1491558696, 0)


def _silu_table():
    """An int32 table as ``TabulateEightBit`` leaves a quantized SiLU requantized to the add's scale
    (zero point 3 included): 8-bit conv output (scale 0.387, zero point 167) -> SiLU quantized (0.135, 2)
    -> requantized to the add's scale (0.178, 3), the scales of YOLOv8n QDQ's first C2f add."""
    x = (np.arange(256) - 167).astype(np.float32) * np.float32(0.38706067)
    q = np.clip(np.floor(x / (1 + np.exp(-x.astype(np.float64))) / 0.13492203 + 0.5) + 2, 0, 255).astype(np.int64)
    return (_fpm(q - 2, round(0.13492203 / 0.17752476 * 2 ** 31), 0) + 3).astype("int32")


def _fpm(x, multiplier, shift):
    """TVM's ``fixed_point_multiply``: ``x * multiplier * 2**(shift - 31)`` rounded half up, in int64."""
    total = 31 - shift
    return (np.asarray(x, np.int64) * multiplier + (1 << (total - 1))) >> total


def lowered_add(a, b, end="add", inner_clip=True):
    """``qnn.add(a, silu(b))`` as QNN lowering and ``TabulateEightBit`` leave it (YOLOv8n's C2f add)::

        a(u8) -> cast i32 - 1 -> fpm -> + 3 --+
        b(u8) -> lookup(int32 table) ---------+-> add -> - 3 -> clip 0..255 -> [concatenation's
                                                   requantize: - 3 -> fpm -> + 2 -> clip] -> cast u8
    """
    table = _silu_table()
    x = relay.fixed_point_multiply(relay.subtract(relay.cast(a, "int32"), relay.const(1)), *ADD_REQUANTIZE)
    y = relay.subtract(relay.add(relay.add(relay.const(3), x), table_lookup(b, relay.const(table))),
                       relay.const(3))
    y = relay.clip(y, 0, 255) if inner_clip or end == "add" else y
    if end == "concat":
        y = relay.clip(relay.add(relay.const(2), relay.fixed_point_multiply(relay.subtract(y, relay.const(3)),
                                                                             *CONCAT_REQUANTIZE)), 0, 255)
    return relay.cast(y, "uint8")


def lowered_add_reference(a, t, end="add"):
    """The same in numpy int64, of ``a`` and the looked-up value ``t``."""
    y = np.clip(3 + _fpm(a.astype(np.int64) - 1, *ADD_REQUANTIZE) + t - 3, 0, 255)
    if end == "concat":
        y = np.clip(2 + _fpm(y - 3, *CONCAT_REQUANTIZE), 0, 255)
    return y


def _lookup_form(end="add"):
    """``(form, values)`` of the chain (to ``end``) over ``a`` x the table's entries."""
    va, vt = _values(), np.unique(_silu_table())
    table = lowered_add_reference(np.repeat(va, vt.size), np.tile(vt, va.size).astype(np.int64), end)
    return affine_form(va, vt, table), table


@pytest.mark.parametrize("end", ["add", "concat"])
def test_lowered_add_becomes_the_integer_form(end):
    """The whole add (``end="add"``) or, when the concatenation's requantize follows (a second rounding:
    no form of the whole), the add up to its clip becomes the form; the requantize after it stays."""
    form, _ = _lookup_form()
    a, b = (relay.var(n, shape=qa.SHAPE, dtype="uint8") for n in "ab")
    lookup = table_lookup(b, relay.const(_silu_table()))
    m_a, m_b, c, n, lo, hi = form
    y = relay.add(relay.add(relay.multiply(relay.cast(a, "int32"), relay.const(m_a)),
                            relay.multiply(lookup, relay.const(m_b))), relay.const(c))
    y = relay.clip(relay.right_shift(y, relay.const(n)), lo, hi)
    if end == "concat":
        y = relay.clip(relay.add(relay.const(2), relay.fixed_point_multiply(relay.subtract(y, relay.const(3)),
                                                                             *CONCAT_REQUANTIZE)), 0, 255)
    check(AffineEightBitJoin(), lowered_add(a, b, end), relay.cast(y, "uint8"))
    if end == "concat":
        whole = affine_form(_values(), np.unique(_silu_table()), _lookup_form("concat")[1])
        assert "no affine function" in str(whole), whole


@pytest.mark.parametrize("end", ["add", "concat"])
def test_lowered_add_bit_exact_on_every_pair(end):
    """The rewritten chain equals numpy's int64 arithmetic and a plain ``llvm`` build of the chain on all
    65,536 input pairs."""
    a, b = (relay.var(n, shape=qa.SHAPE, dtype="uint8") for n in "ab")
    before = infer(lowered_add(a, b, end))
    with tvm.transform.PassContext(opt_level=3):
        after = AffineEightBitJoin()(before)
    assert "fixed_point_multiply" in before.astext()
    assert after.astext().count("fixed_point_multiply(") == (1 if end == "concat" else 0)
    x, y = qa.pairs()
    got = run_module(after, {"a": x, "b": y})[0]
    np.testing.assert_array_equal(got, lowered_add_reference(x, _silu_table()[y], end))
    np.testing.assert_array_equal(got, run_module(before, {"a": x, "b": y})[0])


@pytest.mark.parametrize("end", ["add", "concat"])
def test_lowered_add_idempotent(end):
    a, b = (relay.var(n, shape=qa.SHAPE, dtype="uint8") for n in "ab")
    with tvm.transform.PassContext(opt_level=3):
        once = AffineEightBitJoin()(infer(lowered_add(a, b, end)))
    assert_unchanged(AffineEightBitJoin(), once)


def test_lowered_add_unchanged_on_no_match(caplog):
    """Two roundings and no clip between them: no form of the whole chain nor of the clip that ends it
    (both logged). An integer chain with no rounding product (nothing to gain), a float table's lookup and
    a lookup of a table of more than 256 distinct entries (not sources) are not chains here."""
    a, b = (relay.var(n, shape=qa.SHAPE, dtype="uint8") for n in "ab")
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert_unchanged(AffineEightBitJoin(), infer(lowered_add(a, b, "concat", inner_clip=False)))
    assert "not rewritten (no affine function" in caplog.text
    assert "not rewritten up to an inner clip (no affine function" in caplog.text
    table = relay.const(_silu_table())
    no_product = relay.cast(relay.clip(relay.add(relay.cast(a, "int32"), table_lookup(b, table)),
                                       0, 255), "uint8")
    float_table = relay.cast(relay.clip(relay.round(relay.add(
        relay.multiply(relay.cast(a, "float32"), _const(0.7, ())),
        table_lookup(b, relay.const(_silu_table().astype("float32") / 2)))), 0, 255), "uint8")
    wide_table = relay.cast(relay.clip(relay.add(
        relay.fixed_point_multiply(relay.cast(a, "int32"), *ADD_REQUANTIZE),
        table_lookup(b, relay.const(np.arange(0, 3000, 3, dtype="int32")))), 0, 255), "uint8")
    for body in (no_product, float_table, wide_table):
        assert_unchanged(AffineEightBitJoin(), infer(body))
