"""``round(x / scale)`` without ``fdiv`` at aarch64 (``tvm_ext._round_reciprocal``), executed under qemu.

The aarch64 back end adds ``RoundReciprocal`` to 8-bit builds with its kernels: a division by a scale
that reaches a kernel as a parameter becomes a product with its reciprocal in double (``fcvtl``,
``fmul .2d``, ``fcvtn``), bit for bit the float32 quotient. Checked here where the code runs (qemu-user,
through TVM's RPC server): ``round`` and ``nearbyint`` of ``x / c[0]`` against numpy (ties at k + 0.5
and their neighbours, huge values and overflow, subnormal quotients, signed zeros, inf, NaN; special
and random divisors); a requantized residual add over all 65,536 input pairs with the scales of the
QDQ ResNet-50's first residual add and with power-of-two scales whose sums fall on ties, against numpy
in TVM's float order and a plain ``llvm`` build; an int8 1x1 conv (64 -> 256 channels: the ``smmla``
tile whose epilogue holds the add) with the residual add fused into it, against a plain ``llvm`` build.
Each build is read for its ``fdiv`` (one scalar reciprocal per call; the vector ones without the pass, and
in a build without passes, compile only).
"""
import re

import numpy as np
import pytest
import tvm
from tvm import relay, te, tir

import tvm_ext
from tvm_ext import _round_reciprocal
from tvm_ext.core import pipelines
from tvm_ext.testing import quantized_add as qa
from tvm_ext.testing.aarch64 import CROSS_CXX, TARGETS, run_on_session
from test_round_reciprocal import SPECIAL_C, _edge_x, _half_away, _random_floats, _same

#: The QDQ ResNet-50's (the zoo's ``resnet50_int8_qdq``) first residual add: the conv's output scale and
#: zero point, the shortcut's, the add's output scale.
MODEL = qa.AddScales(0.01479310356080532, 125, 0.03899744898080826, 135, 0.019133638590574265, 0)
#: Power-of-two scales: ``(a - za) / 128 + (b - zb) / 128`` over ``1 / 64`` is exactly half their sum,
#: so every odd sum is a tie of ``round``.
TIES = qa.AddScales(2.0 ** -7, 128, 2.0 ** -7, 3, 2.0 ** -6, 7)
VECTOR_FDIV = re.compile(r"\bfdiv\s+v\d+\.(4s|2s)")
NO_PASS = [_round_reciprocal.PASS_NAME]
#: Keeps the residual add's float division up to the back end (``AffineEightBitJoin`` would make the add
#: integer arithmetic, with no division left for the pass to rewrite).
FLOAT_JOIN = ["AffineEightBitJoin"]


def _one(v):
    return relay.const(np.array([v], np.float32))


def _add(p: qa.AddScales):
    """``clip(round(((a - za)·sa + (b - zb)·sb) / sc) + zc)`` in float, as the QDQ ResNet-50's fused kernels
    hold it: ``sb`` and ``sc`` one-element tensors, which reach the kernel as parameters."""
    a = relay.var("a", shape=qa.SHAPE, dtype="uint8")
    b = relay.var("b", shape=qa.SHAPE, dtype="uint8")

    def dq(v, s, z):
        return (relay.cast(v, "float32") - relay.const(float(z))) * s

    s = dq(a, relay.const(np.float32(p.sa)), p.za) + dq(b, _one(p.sb), p.zb)
    out = relay.cast(relay.clip(relay.round(s / _one(p.sc)) + relay.const(float(p.zc)), 0.0, 255.0), "uint8")
    return tvm.IRModule.from_expr(relay.Function([a, b], out))


def _conv_residual(p: qa.AddScales, size=14):
    """uint8 x int8 1x1 conv 64 -> 256 with bias, requantized to uint8 at ``(sa, za)``, then the float
    residual add of ``s`` (``_add``'s form): ``pipelines.int8()`` fuses it into one kernel."""
    rng = np.random.default_rng(4)
    w = rng.integers(-127, 128, (256, 64, 1, 1)).astype("int8")
    w[0, :2, 0, 0] = (127, -127)
    x = relay.var("x", shape=(1, 64, size, size), dtype="uint8")
    s = relay.var("s", shape=(1, 256, size, size), dtype="uint8")
    y = relay.qnn.op.conv2d(x, relay.const(w), relay.const(77), relay.const(0), relay.const(np.float32(0.0231)),
                            relay.const(np.float32(0.0042)), kernel_size=(1, 1), channels=256, out_dtype="int32")
    y = relay.nn.bias_add(y, relay.const(rng.integers(-5000, 5000, 256).astype("int32")))
    y = relay.qnn.op.requantize(y, relay.const(np.float32(0.0231 * 0.0042)), relay.const(0),
                                relay.const(np.float32(p.sa)), relay.const(p.za), out_dtype="uint8")
    t = (relay.cast(y, "float32") - relay.const(float(p.za))) * relay.const(np.float32(p.sa)) + \
        (relay.cast(s, "float32") - relay.const(float(p.zb))) * _one(p.sb)
    out = relay.cast(relay.clip(relay.round(t / _one(p.sc)) + relay.const(float(p.zc)), 0.0, 255.0), "uint8")
    return tvm.IRModule.from_expr(relay.Function([x, s], out))


def _build(mod, cpu, with_pass=True):
    return tvm_ext.build(mod, TARGETS[cpu], passes=pipelines.int8(),
                         disabled_pass=FLOAT_JOIN if with_pass else FLOAT_JOIN + NO_PASS)


def _fdiv(lib):
    asm = lib.get_lib().get_source("asm")
    return len(VECTOR_FDIV.findall(asm)), len(re.findall(r"\bfdiv\s+d\d+", asm))


#: The default tier's cases of the two tests below: a diagonal (each class once, each rounding or scale at least
#: once); the slow tier runs the other cells, the same rewrite at the other classes.
DEFAULT = {("round", "neoverse-n1"), ("nearbyint", "cortex-a72"), ("nearbyint", "neoverse-v1"),
           ("model", "cortex-a72"), ("ties", "neoverse-n1"), ("model", "neoverse-v1")}


def _diagonal(rows, ids):
    return [pytest.param(row, cpu, id=f"{rid}-{cpu}", marks=() if (rid, cpu) in DEFAULT else pytest.mark.slow)
            for row, rid in zip(rows, ids) for cpu in TARGETS]


@pytest.mark.parametrize("op, cpu", _diagonal([tir.round, tir.nearbyint], ["round", "nearbyint"]))
def test_round_div_matches_numpy_under_qemu(cpu, op, arm_server, tmp_path):
    n = 4096
    x, c = te.placeholder((n,), "float32", name="x"), te.placeholder((1,), "float32", name="c")
    q = te.compute((n,), lambda i: op(x[i] / c[0]), name="q")
    s = te.create_schedule(q.op)
    s[q].vectorize(s[q].split(q.op.axis[0], 16)[1])
    with tvm.transform.PassContext(config=_round_reciprocal.lower_config()):
        lib = tvm.build(s, [x, c, q], TARGETS[cpu])
    asm = lib.get_source("asm")
    assert not VECTOR_FDIV.search(asm) and "fcvtn" in asm, "the division was not rewritten"
    session = arm_server.connect(session_timeout=300)
    lib.export_library(str(tmp_path / "rd.so"), cc=CROSS_CXX)
    session.upload(str(tmp_path / "rd.so"))
    f, dev = session.load_module("rd.so")["default_function"], session.cpu()
    rng = np.random.default_rng(1)
    oracle = {"round": _half_away, "nearbyint": np.rint}[op.__name__]
    for cv in SPECIAL_C + list(_random_floats(rng, 4)):
        cv = float(np.float32(cv))
        with np.errstate(over="ignore"):
            xs = np.concatenate([_edge_x(cv), _random_floats(rng, 1024), _random_floats(rng, 512) * np.float32(cv)])
        xs = np.resize(xs, n).astype(np.float32)
        out = tvm.nd.empty((n,), "float32", dev)
        f(tvm.nd.array(xs, dev), tvm.nd.array(np.array([cv], np.float32), dev), out)
        with np.errstate(all="ignore"):
            want = oracle(xs / np.float32(cv))
        assert _same(out.numpy(), want), f"c={cv!r}"


@pytest.mark.parametrize("scales, cpu", _diagonal([MODEL, TIES], ["model", "ties"]))
def test_residual_add_all_pairs_under_qemu(cpu, scales, arm_server, tmp_path):
    mod = _add(scales)
    a, b = qa.pairs()
    want = qa.reference(a, b, scales, divide=True)
    lib = _build(mod, cpu)
    assert _fdiv(lib) == (0, 1), "one scalar reciprocal per call, no vector fdiv"
    assert _fdiv(_build(mod, cpu, with_pass=False))[0] > 0
    session = arm_server.connect(session_timeout=300)
    (out,) = run_on_session(session, lib, {"a": a, "b": b}, tmp_path, f"add_{cpu}")
    bad = np.flatnonzero(out != want)
    assert not bad.size, (f"{bad.size} of {out.size} differ from numpy, e.g. a={a.ravel()[bad[:3]]} "
                          f"b={b.ravel()[bad[:3]]}")
    np.testing.assert_array_equal(out, _plain_llvm(mod, {"a": a, "b": b}))


def _plain_llvm(mod, inputs):
    from tvm.contrib import graph_executor

    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target="llvm")
    gm = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    gm.set_input(**inputs)
    gm.run()
    return gm.get_output(0).numpy()


@pytest.mark.parametrize("cpu", [
    # the add in the NEON-only and +dotprod conv tiles' epilogues; [neoverse-v1] runs the add fused into a conv
    # (the smmla tile), and test_residual_add_all_pairs_under_qemu each class's rewrite, in the default tier
    pytest.param("cortex-a72", marks=pytest.mark.slow), pytest.param("neoverse-n1", marks=pytest.mark.slow),
    "neoverse-v1"])
def test_conv_residual_add_under_qemu(cpu, arm_server, tmp_path):
    mod = _conv_residual(MODEL)
    rng = np.random.default_rng(6)
    inputs = {"x": rng.integers(0, 256, (1, 64, 14, 14)).astype("uint8"),
              "s": rng.integers(0, 256, (1, 256, 14, 14)).astype("uint8")}
    lib = _build(mod, cpu)
    assert _fdiv(lib) == (0, 1)
    session = arm_server.connect(session_timeout=300)
    (out,) = run_on_session(session, lib, inputs, tmp_path, f"conv_add_{cpu}")
    want = _plain_llvm(mod, inputs)
    assert 0 < np.count_nonzero(want) < want.size and len(np.unique(want)) > 50
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("cpu", [
    # the same fdiv counts at NEON only and +i8mm, which test_residual_add_all_pairs_under_qemu[model-cortex-a72]
    # and [model-neoverse-v1] check with and without the pass in the default tier
    pytest.param("cortex-a72", marks=pytest.mark.slow), "neoverse-n1",
    pytest.param("neoverse-v1", marks=pytest.mark.slow)])
def test_back_end_adds_it_to_8bit_builds_with_kernels_only(cpu):
    """Compile only: ``pipelines.int8()`` builds lose the vector ``fdiv``; a build without passes
    (``relay.build`` exactly) and one that disables the pass by name keep it."""
    mod = _add(MODEL)
    assert _fdiv(_build(mod, cpu)) == (0, 1)
    assert _fdiv(_build(mod, cpu, with_pass=False))[0] > 0
    assert _fdiv(tvm_ext.build(mod, TARGETS[cpu]))[0] > 0


@pytest.mark.parametrize("cpu", list(TARGETS))
def test_plan_adds_it_for_8bit_graphs_with_kernels(cpu):
    from tvm_ext.arm.backend import AArch64
    from tvm_ext.backend import BuildRequest

    target = tvm.target.Target(TARGETS[cpu])

    def names(**kw):
        config = AArch64().plan(BuildRequest(target=target, mod=None, **kw)).configure({})
        return [p.info.name for _, p in config.get("tir.add_lower_pass", [])]

    assert names(kernels=True, eight_bit=True).count(_round_reciprocal.PASS_NAME) == 1
    assert _round_reciprocal.PASS_NAME not in names(kernels=False, eight_bit=True)  # passes=(): relay.build's code
    assert _round_reciprocal.PASS_NAME not in names(kernels=True, eight_bit=False)
