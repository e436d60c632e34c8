"""``tvm_ext.x86.requantize``: ``q_multiply_shift`` in even/odd int32 lanes.

Vectorised ``q_multiply_shift`` and ``q_multiply_shift_per_axis`` built with the lowering for AVX2,
AVX-512 and AVX-512 VNNI, executed where the host has the instructions, against numpy's int64
arithmetic: worst-case multipliers and shifts, int32 extremes, negative values, rounding ties.
Requantized convs built by ``tvm_ext.build`` (the lowering at the AVX2 and AVX-512 targets; per tensor
and per channel, to uint8 and int8) against a plain ``llvm`` build. The lowering's code read back: no int64
widening or narrowing. Where the x86 back end enters it.
"""
import numpy as np
import pytest
import tvm
from tvm import relay, te, tir

from tvm_ext.x86 import requantize
from tvm_ext.x86.isa import runs_on_host

TARGETS = {
    "avx2": "llvm -mcpu=x86-64-v3",
    "avx512": "llvm -mcpu=x86-64-v4",
    "avx512_vnni": "llvm -mcpu=cascadelake",
}
N, C = 2048, 16  # elements, channels (per-axis parameters repeat every C elements)


def _runnable(name):
    target = TARGETS[name]
    return pytest.param(target, id=name, marks=pytest.mark.skipif(
        not runs_on_host(target), reason=f"host lacks instructions of '{target}'"))


RUNNABLE = [_runnable(n) for n in TARGETS]


def _oracle(x, m, ls, rs, q=31):
    """round(x * 2^ls * m / 2^(q + rs)), half up, in numpy int64 (TVM's generic lowering)."""
    p = (x.astype(np.int64) << np.asarray(ls, np.int64)) * np.asarray(m, np.int64)
    n = q + np.asarray(rs, np.int64)
    return ((p + (np.int64(1) << (n - 1))) >> n).astype(np.int32)


def _data(rng, ls=0):
    """int32 extremes, small values on both sides of 0 (rounding ties), then random values."""
    x = rng.integers(-2**31, 2**31, N, dtype=np.int64)
    x[:1024] = np.arange(-512, 512)
    x[1024:1032] = [-2**31, 2**31 - 1, -2**31 + 1, 2**31 - 2, 0, -1, 1, 65536]
    return (x >> ls).astype(np.int32)  # a left shift must keep x * 2^ls in int32, as in TVM's domain


def _build(compute, args, target, lanes, lowered=True):
    s = te.create_schedule(compute.op)
    _, inner = s[compute].split(compute.op.axis[0], lanes)
    s[compute].vectorize(inner)
    if not lowered:
        return tvm.build(s, args, target)
    with tvm.transform.PassContext(config=requantize.lower_config()):
        return tvm.build(s, args, target)


def _lanes(target):
    return 8 if "v3" in target else 16


def _per_tensor(m, s, target, lowered=True):
    a = te.placeholder((N,), "int32", name="a")
    b = te.compute((N,), lambda i: tir.q_multiply_shift(a[i], tir.const(m, "int32"), tir.const(31, "int32"),
                                                         tir.const(s, "int32")))
    return _build(b, [a, b], target, _lanes(target), lowered)


def _per_axis(target, need_ls, lowered=True):
    a = te.placeholder((N,), "int32", name="a")
    m, ls, rs = (te.placeholder((C,), "int32", name=n) for n in ("m", "ls", "rs"))
    b = te.compute((N,), lambda i: tir.q_multiply_shift_per_axis(
        a[i], m[i % C], ls[i % C], rs[i % C], tir.const(31, "int32"), tir.const(need_ls, "bool"),
        tir.const(True, "bool")))
    return _build(b, [a, m, ls, rs, b], target, _lanes(target), lowered)


def _call(f, *arrays):
    out = tvm.nd.empty((N,), "int32")
    f(*[tvm.nd.array(a) for a in arrays], out)
    return out.numpy()


# (multiplier, shift): shift < 0 is a right shift by -shift (n = 31 - shift), > 0 a left shift
PER_TENSOR = [
    (2**31 - 1, 0), (2**31 - 1, -1), (2**31 - 1, -32), (2**30 + 1, -31), (1518500250, -7),
    (3 << 28, -1), (3 << 28, -4), (1, 0), (-(2**31), -3), (-1518500250, -9), (2**31 - 1, 1), (1518500250, 5),
]


def test_two_lanes_keep_tvms_lowering_without_an_error(caplog):
    """A 2-lane q_multiply_shift (a 2-channel requantize: PP-OCR cls's classifier) is left to TVM's rule
    without raising and logging on the way, and is exact (x86-64-v3, run on any host of the suite)."""
    import logging

    a = te.placeholder((N,), "int32", name="a")
    b = te.compute((N,), lambda i: tir.q_multiply_shift(a[i], tir.const(1518500250, "int32"), tir.const(31, "int32"),
                                                         tir.const(-7, "int32")))
    assert requantize.lower_even_odd(tir.Broadcast(tir.const(5, "int32"), 2), tir.const(3, "int32"), 0, 7, 31) is None
    with caplog.at_level(logging.WARNING, logger=requantize.__name__):
        f = _build(b, [a, b], TARGETS["avx2"], 2)
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    x = _data(np.random.default_rng(7))
    assert np.array_equal(_call(f, x), _oracle(x, 1518500250, 0, 7))


@pytest.mark.parametrize("target", RUNNABLE)
@pytest.mark.parametrize("m,s", PER_TENSOR)
def test_per_tensor_matches_int64(target, m, s):
    ls, rs = max(s, 0), max(-s, 0)
    x = _data(np.random.default_rng(abs(s)), ls)
    expected = _oracle(x, m, ls, rs)
    np.testing.assert_array_equal(_call(_per_tensor(m, s, target), x), expected)


def _per_tensor_plus(m, s, c, target):
    """``q_multiply_shift(a, m, 31, s) + c``: a requantize and its output zero point, as an epilogue has them."""
    a = te.placeholder((N,), "int32", name="a")
    b = te.compute((N,), lambda i: tir.q_multiply_shift(a[i], tir.const(m, "int32"), tir.const(31, "int32"),
                                                         tir.const(s, "int32")) + tir.const(c, "int32"))
    return _build(b, [a, b], target, _lanes(target)), a, b


@pytest.mark.parametrize("target", RUNNABLE)
@pytest.mark.parametrize("m,s,c", [(1518500250, -7, 5), (2**31 - 1, 0, -128), (3 << 28, -1, 127),
                                   (-(2**31), -3, 255), (2**31 - 1, -32, -1), (2**31 - 1, 1, 3)])
def test_zero_point_in_the_rounding_term_matches_int64(target, m, s, c):
    """The int32 add after the requantize (wrapping like TVM's at the int32 extremes) folded into the rounding
    term where the shifts are constant and right; a left shift keeps the add."""
    ls, rs = max(s, 0), max(-s, 0)
    x = _data(np.random.default_rng(abs(s) + 11), ls)
    f, _, _ = _per_tensor_plus(m, s, c, target)
    expected = (_oracle(x, m, ls, rs).astype(np.int64) + c).astype(np.int32)  # int32 wrap, as TVM's add
    np.testing.assert_array_equal(_call(f, x), expected)


@pytest.mark.parametrize("s,folded", [(-7, True), (1, False)])
def test_zero_point_folded_into_the_rounding_term(s, folded):
    """Lowered: no add of the zero point after the even/odd form (one vector add fewer per 16 outputs); with a
    left shift, where the sum could leave int64, the add stays."""
    a = te.placeholder((N,), "int32", name="a")
    b = te.compute((N,), lambda i: tir.q_multiply_shift(a[i], tir.const(1518500250, "int32"), tir.const(31, "int32"),
                                                         tir.const(s, "int32")) + tir.const(77, "int32"))
    sch = te.create_schedule(b.op)
    sch[b].vectorize(sch[b].split(b.op.axis[0], 16)[1])
    with tvm.transform.PassContext(config=requantize.lower_config()):
        script = tvm.lower(sch, [a, b])["main"].script()
    assert "q_multiply_shift" not in script
    assert ("T.Broadcast(77, 16)" in script) is not folded


def test_rounding_ties_are_in_the_data():
    x = _data(np.random.default_rng(0))
    p = x[:1024].astype(np.int64) * (3 << 28)  # n = 32: x * 3 / 16, ties at x * 3 = 8 (mod 16)
    ties = (p % 2**32) == 2**31
    assert ties.sum() > 50 and (ties & (x[:1024] < 0)).sum() > 25  # negative ties round up (towards 0)


@pytest.mark.parametrize("target", RUNNABLE)
@pytest.mark.parametrize("need_ls", [False, True])
def test_per_axis_matches_int64(target, need_ls):
    rng = np.random.default_rng(1)
    m = np.array([2**31 - 1, 2**30, 2**30 + 1, 1518500250, 3 << 28, 1, 2**31 - 2, 1234567891] * 2, np.int32)
    rs = np.array([0, 1, 7, 31, 32, 4, 12, 0, 3, 2, 30, 9, 16, 24, 5, 6], np.int32)
    ls = np.zeros(C, np.int32)
    if need_ls:
        ls[[0, 7, 9]] = [1, 3, 2]
        rs[[0, 7, 9]] = 0
    x = _data(rng, 3 if need_ls else 0)
    expected = _oracle(x, np.tile(m, N // C), np.tile(ls if need_ls else 0 * ls, N // C), np.tile(rs, N // C))
    np.testing.assert_array_equal(_call(_per_axis(target, need_ls), x, m, ls, rs), expected)


@pytest.mark.parametrize("target", list(TARGETS.values()))
@pytest.mark.parametrize("form", ["per_tensor", "per_axis"])
def test_no_int64_widening(target, form):
    """Compiled only: TVM's lowering widens and narrows (vpmov[sz]xdq, vpmovqd); the even/odd one does not."""
    def asm(lowered):
        f = _per_tensor(1518500250, -7, target, lowered) if form == "per_tensor" else _per_axis(target, False, lowered)
        return f.get_source("asm")

    widening = ("vpmovsxdq", "vpmovzxdq", "vpmovqd", "vinserti64x4", "vinserti128")
    assert any(w in asm(False) for w in widening)
    lowered = asm(True)
    assert "vpmuldq" in lowered and not any(w in lowered for w in widening)


def _conv_requantize(per_channel, out_dtype, seed=0):
    """uint8 x int8 1x1 conv, bias, qnn.requantize (per tensor or per output channel) to ``out_dtype``."""
    rng = np.random.default_rng(seed)
    ci, co, hw = 64, 64, 8
    x = relay.var("x", shape=(1, ci, hw, hw), dtype="uint8")
    w = relay.const(rng.integers(-128, 128, (co, ci, 1, 1)).astype("int8"))
    w_scale = (rng.random(co) * 0.02 + 1e-3).astype("float32") if per_channel else 0.01
    y = relay.qnn.op.conv2d(x, w, relay.const(3), relay.const(0), relay.const(0.02), relay.const(w_scale),
                            kernel_size=(1, 1), channels=co, out_dtype="int32")
    y = relay.nn.bias_add(y, relay.const(rng.integers(-20000, 20000, co).astype("int32")))
    in_scale = relay.const((0.02 * w_scale).astype("float32") if per_channel else 0.0002)
    zero_point = relay.const(5 if out_dtype == "uint8" else -3)
    y = relay.qnn.op.requantize(y, in_scale, relay.const(0), relay.const(0.05), zero_point, axis=1,
                                compute_dtype="int64", out_dtype=out_dtype)  # the fixed-point form in both builds
    return tvm.IRModule.from_expr(relay.Function([x], y)), rng.integers(0, 256, (1, ci, hw, hw)).astype("uint8")


def _run(lib, x):
    from tvm.contrib import graph_executor

    m = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    m.set_input("x", x)
    m.run()
    return m.get_output(0).numpy()


# The default tier runs a diagonal, each class once, each output type and each scale form at least once
# ([uint8-False-avx2], [int8-True-avx2], [int8-False-avx512], [uint8-True-avx512_vnni]); the slow tier
# every combination
@pytest.mark.parametrize("out_dtype, per_channel, target", [
    pytest.param(out_dtype, per_channel, TARGETS[name], id=f"{out_dtype}-{per_channel}-{name}",
                 marks=(*_runnable(name).marks, *(() if (out_dtype, per_channel, name) in {
                     ("uint8", False, "avx2"), ("int8", True, "avx2"), ("int8", False, "avx512"),
                     ("uint8", True, "avx512_vnni")}
                     else (pytest.mark.slow,))))
    for out_dtype in ("uint8", "int8") for per_channel in (False, True) for name in TARGETS])
def test_requantized_conv_matches_plain_llvm(target, per_channel, out_dtype):
    import tvm_ext
    from tvm_ext.core import pipelines

    mod, x = _conv_requantize(per_channel, out_dtype)
    with tvm.transform.PassContext(opt_level=3):
        ref = _run(relay.build(mod, target="llvm"), x)
    got = _run(tvm_ext.build(mod, target=target, passes=pipelines.int8()), x)
    assert got.dtype == np.dtype(out_dtype) and np.unique(ref).size > 50  # saturated and unsaturated outputs
    assert (ref == np.iinfo(out_dtype).min).any() and (ref == np.iinfo(out_dtype).max).any()
    np.testing.assert_array_equal(got, ref)


def _lower_pass_names(config):
    return [p[1].info.name for p in config.get("tir.add_lower_pass", [])]


@pytest.mark.parametrize("target,kernels,amx,added", [
    ("llvm -mcpu=cascadelake", True, False, True), ("llvm -mcpu=x86-64-v4", True, False, True),
    ("llvm -mcpu=cascadelake", False, False, False), ("llvm -mcpu=x86-64-v3", True, False, True),
    ("llvm -mcpu=znver3", True, False, True), ("llvm -mcpu=x86-64-v2", True, False, False),
    ("llvm -mcpu=sapphirerapids", True, True, True),
])
def test_added_at_avx2_and_avx512_with_tvm_ext_kernels(target, kernels, amx, added):
    """Without tvm-ext's kernels an x86 build lowers as relay.build does; below AVX2 builds keep TVM's lowering.
    The pass is in the build's PassContext options, next to the user's lower passes and AMX's."""
    from tvm_ext.backend import BuildRequest
    from tvm_ext.x86.backend import X86

    plan = X86().plan(BuildRequest(target=tvm.target.Target(target), mod=None, kernels=kernels, eight_bit=True,
                                   options={"amx": amx}))
    user = (0, tvm.tir.transform.prim_func_pass(lambda f, m, c: f, opt_level=0, name="user_pass"))
    names = _lower_pass_names(plan.configure({"tir.add_lower_pass": [user]}))
    assert names[0] == "user_pass" and (requantize.PASS_NAME in names) == added
    assert ("ConfigureTiles" in names) == amx


def test_not_seen_by_other_builds():
    """The lowering belongs to one build's PassContext: a plain build next to it keeps TVM's lowering."""
    from tvm_ext.backend import BuildRequest
    from tvm_ext.x86.backend import X86

    X86().plan(BuildRequest(target=tvm.target.Target(TARGETS["avx512"]), mod=None, kernels=True, eight_bit=True))
    widening = ("vpmovsxdq", "vpmovzxdq", "vpmovqd")
    assert any(w in _per_tensor(1518500250, -7, TARGETS["avx512"], lowered=False).get_source("asm")
               for w in widening)
