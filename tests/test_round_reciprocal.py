"""tvm_ext._round_reciprocal: ``round(x / c)`` as a product in double, bit for bit (x86 here; aarch64
under qemu in tests/arm/test_aarch64_round_reciprocal.py).

The claim checked in numpy over many random float32 pairs (normal or overflowing quotients agree; a
subnormal one can differ); ``round(x / c)`` built with the pass at x86-64-v3 and znver5, executed where
the host has them, against numpy's float32 division and ``rint`` (ties, overflow, subnormal quotients,
signed zeros, inf, NaN, subnormal and special divisors); the compiled code read for ``divps``; other
divisions left alone; a requantized residual add built by ``tvm_ext.build`` with the pass in its
PassContext against a plain ``llvm`` build.
"""
import numpy as np
import pytest
import tvm
from tvm import relay, te, tir

import tvm_ext
from tvm_ext import _round_reciprocal as reciprocal
from tvm_ext.x86.isa import runs_on_host

TARGETS = {"avx2": "llvm -mcpu=x86-64-v3", "znver5": "llvm -mcpu=znver5"}
TINY = np.float32(2.0 ** -126)  # smallest normal float32
SPECIAL_C = [3.0, -3.0, 0.1, 1 / 3, 2.0 ** -149, 2.0 ** -130, 3e38, 0.0, -0.0, np.inf, -np.inf, np.nan, 0.0078125]


def _product(x, c):
    """float32(float64(x) * (1 / float64(c))) in numpy."""
    with np.errstate(all="ignore"):
        return (x.astype(np.float64) * (np.float64(1.0) / np.float64(c))).astype(np.float32)


def _random_floats(rng, n):
    """float32 of every exponent: random bit patterns, NaN/inf removed."""
    x = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(x), x, np.float32(1.5))


def _edge_x(c):
    """Ties of round at k + 0.5, huge values, subnormal quotients, zeros, inf and NaN for divisor c."""
    c = np.float32(c)
    with np.errstate(all="ignore"):
        ties = (np.arange(-64, 64, dtype=np.float32) + np.float32(0.5)) * c
        near = np.concatenate([np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf))])
        sub = np.float32(3.0) * np.arange(1, 64, dtype=np.float32) * np.float32(2.0 ** -149) * c
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 2.0 ** -149, -(2.0 ** -149),
                        1.0, -1.0, 0.5, -0.5, 1.5, 2.5], np.float32)
    return np.concatenate([ties, near, sub, -sub, special]).astype(np.float32)


def test_claim_normal_quotients_agree():
    rng = np.random.default_rng(0)
    x, y = _random_floats(rng, 1 << 20), _random_floats(rng, 1 << 20)
    y = np.where(y == 0, np.float32(1.0), y)
    with np.errstate(all="ignore"):
        exact = x / y
        prod = (x.astype(np.float64) * (1.0 / y.astype(np.float64))).astype(np.float32)
    normal = np.isinf(exact) | (np.abs(exact) >= TINY)
    assert normal.sum() > (1 << 18) and np.isinf(exact).any()
    assert np.array_equal(prod[normal].view(np.uint32), exact[normal].view(np.uint32))


def test_claim_subnormal_quotient_can_differ():
    # x = 49 * M * 2^-149 with M odd: x / 98 = M * 2^-150 is a subnormal midpoint, hit exactly
    m = np.arange(1, 2**18, 2, dtype=np.float64)
    x = (49 * m * 2.0 ** -149).astype(np.float32)
    assert np.array_equal(x.astype(np.float64), 49 * m * 2.0 ** -149)
    exact, prod = x / np.float32(98), _product(x, 98.0)
    assert not np.array_equal(exact.view(np.uint32), prod.view(np.uint32))
    assert np.array_equal(np.rint(exact).view(np.uint32), np.rint(prod).view(np.uint32))  # all ±0


def _half_away(q):
    """round half away from zero (``tir.round`` is ``llvm.round``), exact: |q| < 2^23 plus 0.5 in double."""
    q64 = q.astype(np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(np.abs(q) >= 2**23, q, np.trunc(q64 + np.copysign(0.5, q64))).astype(np.float32)


_ROUND_ORACLE = {"round": _half_away, "nearbyint": np.rint}


def _same(got, want):
    both_nan = np.isnan(got) & np.isnan(want)
    return np.array_equal(np.where(both_nan, 0, got).view(np.uint32), np.where(both_nan, 0, want).view(np.uint32))


def _round_div(op, n):
    """q[i] = op(x[i] / c[0]): the divisor a parameter, as in a QDQ residual add's kernel."""
    x, c = te.placeholder((n,), "float32", name="x"), te.placeholder((1,), "float32", name="c")
    return x, c, te.compute((n,), lambda i: op(x[i] / c[0]), name="q")


def _built(target, op=tir.round, n=1024, lanes=16, passed=True):
    x, c, q = _round_div(op, n)
    s = te.create_schedule(q.op)
    _, inner = s[q].split(q.op.axis[0], lanes)
    s[q].vectorize(inner)
    with tvm.transform.PassContext(config=reciprocal.lower_config() if passed else {}):
        return tvm.build(s, [x, c, q], target)


@pytest.mark.parametrize("target", [pytest.param(t, id=k, marks=pytest.mark.skipif(
    not runs_on_host(t), reason=f"host lacks instructions of '{t}'")) for k, t in TARGETS.items()])
@pytest.mark.parametrize("op", [tir.round, tir.nearbyint], ids=["round", "nearbyint"])
def test_round_div_matches_numpy(target, op):
    rng = np.random.default_rng(1)
    for c in SPECIAL_C + list(_random_floats(rng, 6)):
        c = float(np.float32(c))
        with np.errstate(over="ignore"):
            x = np.concatenate([_edge_x(c), _random_floats(rng, 2048), _random_floats(rng, 512) * np.float32(c)])
        x = np.resize(x, (len(x) + 1023) // 1024 * 1024).astype(np.float32)
        f = _built(target, op, n=len(x))
        out = tvm.nd.empty(x.shape, "float32")
        f(tvm.nd.array(x), tvm.nd.array(np.array([c], np.float32)), out)
        with np.errstate(all="ignore"):
            want = _ROUND_ORACLE[op.__name__](x / np.float32(c))
        assert _same(out.numpy(), want), f"c={c!r}"


@pytest.mark.parametrize("target", list(TARGETS.values()), ids=list(TARGETS))
def test_division_leaves_the_code(target):
    asm = _built(target).get_source("asm")
    assert asm.count("divsd") == 1 and "divps" not in asm and "vmulpd" in asm  # one 1 / c per call
    assert "divps" in _built(target, passed=False).get_source("asm")


def _rewritten(compute, args):
    mod = tvm.lower(te.create_schedule(compute.op), args)
    return reciprocal.RoundReciprocal()(mod)["main"].body, mod["main"].body


def test_other_divisions_left_alone():
    x, y = te.placeholder((8,), "float32", name="x"), te.placeholder((8,), "float32", name="y")
    d, e = te.placeholder((8,), "float64", name="d"), te.placeholder((1,), "float64", name="e")
    c = te.placeholder((1,), "float32", name="c")
    cases = [
        (te.compute((8,), lambda i: tir.round(x[i] / y[i])), [x, y]),  # a divisor per lane
        (te.compute((8,), lambda i: x[i] / c[0]), [x, c]),  # no round
        (te.compute((8,), lambda i: tir.round(d[i] / e[0])), [d, e]),  # float64
        (te.compute((8,), lambda i: tir.floor(x[i] / c[0])), [x, c]),  # floor
    ]
    for compute, args in cases:
        after, before = _rewritten(compute, args + [compute])
        tvm.ir.assert_structural_equal(after, before)
    x1, c1, q1 = _round_div(tir.round, 8)
    after, before = _rewritten(q1, [x1, c1, q1])
    assert "float64" in str(after) and "float64" not in str(before)
    mod = tvm.lower(te.create_schedule(q1.op), [x1, c1, q1])
    once = reciprocal.RoundReciprocal()(mod)
    tvm.ir.assert_structural_equal(reciprocal.RoundReciprocal()(once), once)  # idempotent


def test_written_divisor_left_alone():
    x, c = te.placeholder((8,), "float32", name="x"), te.placeholder((1,), "float32", name="c")
    q = te.compute((8,), lambda i: tir.round(x[i] / c[0]), name="q")
    mod = tvm.lower(te.create_schedule(q.op), [x, c, q])
    fn = mod["main"]
    cbuf = fn.buffer_map[fn.params[1]]
    body = tir.SeqStmt([tir.BufferStore(cbuf, tir.const(2.0, "float32"), [0]), fn.body])
    mod = tvm.IRModule({"main": fn.with_body(body)})
    tvm.ir.assert_structural_equal(reciprocal.RoundReciprocal()(mod), mod)


def _residual_add():
    """uint8 a, b -> dequantize, add, quantize to uint8, in float as the QDQ ResNet-50's fused kernels hold
    it: the second input's scale and the output scale are one-element tensors, which reach the kernel
    as parameters (``round(x / p[0])``)."""
    a = relay.var("a", shape=(1, 64, 28, 28), dtype="uint8")
    b = relay.var("b", shape=(1, 64, 28, 28), dtype="uint8")

    def dq(v, s, z):
        return (relay.cast(v, "float32") - relay.const(float(z))) * s

    one = lambda v: relay.const(np.array([v], np.float32))  # noqa: E731
    s = dq(a, relay.const(0.0473), 3) + dq(b, one(0.0219), 130)
    q = relay.round(s / one(0.0871)) + relay.const(7.0)
    out = relay.cast(relay.clip(q, 0.0, 255.0), "uint8")
    return tvm.IRModule.from_expr(relay.Function([a, b], out))


@pytest.mark.parametrize("target", [pytest.param(t, id=k, marks=pytest.mark.skipif(
    not runs_on_host(t), reason=f"host lacks instructions of '{t}'")) for k, t in TARGETS.items()])
def test_residual_add_bit_exact(target):
    from tvm.contrib import graph_executor

    from tvm_ext.core import pipelines

    mod = _residual_add()
    rng = np.random.default_rng(2)
    inputs = {n: rng.integers(0, 256, (1, 64, 28, 28), dtype=np.uint8) for n in "ab"}
    inputs["a"][0, 0, 0, :2] = [0, 255]

    def run(lib):
        m = graph_executor.GraphModule(lib["default"](tvm.cpu()))
        m.set_input(**inputs)
        m.run()
        return m.get_output(0).numpy()

    with tvm.transform.PassContext(opt_level=3):
        ref = run(relay.build(mod, "llvm"))
    # without AffineEightBitJoin, which would leave no float division for the pass to rewrite
    lib = tvm_ext.build(mod, target, passes=pipelines.int8(), config=reciprocal.lower_config(),
                        disabled_pass=["AffineEightBitJoin"])
    assert "divps" not in lib.get_lib().get_source("asm")
    np.testing.assert_array_equal(run(lib), ref)
