"""``tvm_ext._no_contract``: float products rounded before their sum, although LLVM contracts.

TVM creates every ``llvm`` target with ``AllowFPOpFusion = Fast``, so at targets with fused multiply-add
instructions LLVM fuses ``a * s + c`` into one ``vfmadd`` / ``fmla`` (one rounding, where the graph
rounds twice). A uint8 + uint8 -> uint8 add with a float requantize, over all 65,536 input pairs, in
its three forms (QDQ, ONNX ``QLinearAdd``, a conv with the add in its epilogue), built with
``pipelines.int8()`` at x86 targets with FMA (executed where the host has them) against numpy in
TVM's float order and a plain ``llvm`` build. The pass on TIR: products fenced, accumulations and
integers left alone, idempotent. Where the back ends enter it.
"""
import re

import numpy as np
import pytest
import tvm
from tvm import relay, te

import tvm_ext
from tvm_ext import _no_contract
from tvm_ext.backend import BuildRequest, llvm_arch
from tvm_ext.core import pipelines
from tvm_ext.core.frontend import from_onnx
from tvm_ext.testing import quantized_add as qa
from tvm_ext.x86.isa import llvm_features, runs_on_host
from tvm_ext.x86.target import host_target

#: The float requantize reaches the back end only without ``AffineEightBitJoin``, which makes it integer
#: arithmetic where an integer form exists: each build is checked both ways.
JOINS = {"integer-join": (), "float-join": ("AffineEightBitJoin",)}
#: ``sa = sb``, ``sc = 2 sa`` (the output range of two equally scaled inputs is their sum): 6,195 of the
#: 65,536 pairs round differently when LLVM fuses b's product into the sum, 6,258 when a's.
DOUBLED_RANGE = qa.AddScales(0.0299846101552248, 113, 0.0299846101552248, 137, 0.0599692203104496, 110)
#: Unrelated input scales, a power-of-two output scale: 2 pairs differ, whichever product is fused.
DISTINCT = qa.AddScales(0.09746822714805603, 77, 0.03565048426389694, 149, 0.125, 144)
SCALES = {"doubled_range": DOUBLED_RANGE, "distinct": DISTINCT}
FMA_RE = re.compile(r"\bvfn?m(add|sub)\w*|\bfn?m(la|ls|add|sub)\b")

_HOST = host_target(allow_vnni=True)
_X86_HOST = llvm_arch(_HOST) in ("x86_64", "x86-64", "amd64")
TARGETS = [
    pytest.param("llvm -mcpu=x86-64-v3", id="avx2", marks=pytest.mark.skipif(
        not runs_on_host("llvm -mcpu=x86-64-v3"), reason="host lacks AVX2/FMA")),
    pytest.param(str(_HOST), id="host", marks=pytest.mark.skipif(
        not _X86_HOST or "fma" not in llvm_features(_HOST), reason="host is not an x86 CPU with FMA")),
]
FORMS = ("qdq", "qlinear_add", "conv_residual")
#: Plain ``llvm`` has no fused multiply-add only where it means generic x86-64.
needs_x86_host = pytest.mark.skipif(not _X86_HOST, reason="the plain llvm oracle is x86-64 without FMA")


def _module(form, scales):
    if form == "qdq":
        return qa.qdq_add(scales), {}
    if form == "qlinear_add":
        return from_onnx(qa.qlinear_add_onnx(scales))
    return qa.conv_residual_add(scales), {}


def _run(lib):
    from tvm.contrib import graph_executor

    a, b = qa.pairs()
    m = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    m.set_input("a", a)
    m.set_input("b", b)
    m.run()
    return m.get_output(0).numpy()


_PLAIN: dict = {}


def _plain_llvm(form, name):
    """Stock ``relay.build`` at plain ``llvm`` (x86-64 without FMA: nothing to contract), once per case."""
    key = (form, name)
    if key not in _PLAIN:
        mod, params = _module(form, SCALES[name])
        with tvm.transform.PassContext(opt_level=3):
            _PLAIN[key] = _run(relay.build(mod, target="llvm", params=params))
    return _PLAIN[key]


def _differing(out, ref):
    bad = np.argwhere(out != ref)
    a, b = qa.pairs()
    return f"{len(bad)} of {out.size} pairs differ, e.g. (a, b) = " + ", ".join(
        f"({a[tuple(i)]}, {b[tuple(i)]}): {out[tuple(i)]} != {ref[tuple(i)]}" for i in bad[:3])


@pytest.mark.parametrize("name", SCALES)
def test_scales_separate_one_rounding_from_two(name):
    """The cases can fail: with either product fused, some pairs quantize differently."""
    a, b = qa.pairs()
    ref = qa.reference(a, b, SCALES[name])
    for fused in "ab":
        assert (qa.fused_reference(a, b, SCALES[name], fused) != ref).any()


@needs_x86_host
@pytest.mark.parametrize("name", SCALES)
@pytest.mark.parametrize("form", FORMS)
def test_reference_is_the_plain_llvm_build(form, name):
    a, b = qa.pairs()
    ref = qa.reference(a, b, SCALES[name])
    out = _plain_llvm(form, name)
    assert np.array_equal(out, ref), _differing(out, ref)


@pytest.mark.parametrize("join", JOINS)
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", SCALES)
@pytest.mark.parametrize("form", FORMS)
def test_int8_build_exact_over_all_pairs(form, name, target, join):
    mod, params = _module(form, SCALES[name])
    out = _run(tvm_ext.build(mod, target, params=params, passes=pipelines.int8(), disabled_pass=JOINS[join]))
    a, b = qa.pairs()
    ref = qa.reference(a, b, SCALES[name])
    assert np.array_equal(out, ref), _differing(out, ref)
    assert np.array_equal(out, _plain_llvm(form, name))


def _asm(mod, target, **kw):
    return tvm_ext.build(mod, target, **kw).get_lib().get_source("asm")


@pytest.mark.parametrize("target", ["llvm -mcpu=x86-64-v3", "llvm -mcpu=znver5", "llvm -mcpu=cascadelake"])
def test_no_fused_multiply_add_in_the_requantize(target):
    """Compiled only: AVX2 and AVX-512 code read back, whatever this host runs."""
    for form in ("qdq", "conv_residual"):
        mod, _ = _module(form, DOUBLED_RANGE)
        asm = _asm(mod, target, passes=pipelines.int8(), disabled_pass=JOINS["float-join"])
        assert not FMA_RE.search(asm), f"{form}: {FMA_RE.search(asm).group(0)} in the code"


# -- the pass on TIR ------------------------------------------------------------------------------

def _elementwise(dtype="float32", lanes=8, n=256):
    """c = a * 0.05 + b * 0.031, vectorized."""
    a, b = te.placeholder((n,), dtype, name="a"), te.placeholder((n,), dtype, name="b")
    c = te.compute((n,), lambda i: a[i] * tvm.tir.const(0.05, dtype) + b[i] * tvm.tir.const(0.031, dtype), name="c")
    s = te.create_schedule(c.op)
    _, inner = s[c].split(c.op.axis[0], lanes)
    s[c].vectorize(inner)
    return s, [a, b, c]


def _dot(lanes=8, n=64, k=64):
    """c[i] = sum_k a[i, k] * w[k]: a float accumulation, vectorized over i."""
    a, w = te.placeholder((n, k), "float32", name="a"), te.placeholder((k,), "float32", name="w")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((n,), lambda i: te.sum(a[i, r] * w[r], axis=r), name="c")
    s = te.create_schedule(c.op)
    cc = s.cache_write(c, "global")
    outer, inner = s[c].split(c.op.axis[0], lanes)
    s[cc].compute_at(s[c], outer)
    s[cc].reorder(cc.op.reduce_axis[0], cc.op.axis[0])
    s[cc].vectorize(cc.op.axis[0])
    s[c].vectorize(inner)
    return s, [a, w, c]


def _built(sched_args, target="llvm -mcpu=x86-64-v3", fenced=True):
    s, args = sched_args
    config = _no_contract.lower_config() if fenced else {}
    with tvm.transform.PassContext(opt_level=3, config=config):
        return tvm.build(s, args, target)


@pytest.mark.parametrize("target", ["llvm -mcpu=x86-64-v3", "llvm -mcpu=znver5",
                                    "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1 -mattr=+neon"])
@pytest.mark.parametrize("lanes", [1, 4, 8, 16, 64])
def test_fenced_products_are_not_contracted(target, lanes):
    assert FMA_RE.search(_built(_elementwise(lanes=lanes), target, fenced=False).get_source("asm"))
    assert not FMA_RE.search(_built(_elementwise(lanes=lanes), target).get_source("asm"))


@pytest.mark.parametrize("lanes", [1, 8])
def test_elementwise_result_rounds_twice(lanes):
    f = _built(_elementwise(lanes=lanes))
    if not runs_on_host("llvm -mcpu=x86-64-v3"):
        pytest.skip("host lacks AVX2/FMA")
    rng = np.random.default_rng(0)
    a, b = (rng.integers(-255, 256, 256).astype("float32") for _ in range(2))
    c = tvm.nd.empty((256,), "float32")
    f(tvm.nd.array(a), tvm.nd.array(b), c)
    np.testing.assert_array_equal(c.numpy(), a * np.float32(0.05) + b * np.float32(0.031))


def test_loops_left_scalar_are_still_vectorized_by_llvm():
    """A loop TVM did not vectorise gets the bound, which LLVM's vectoriser widens (the fence it would not)."""
    asm = _built(_elementwise(lanes=1)).get_source("asm")
    assert re.search(r"vmulps\s.*ymm", asm) and re.search(r"vminps\s.*ymm", asm) and not FMA_RE.search(asm)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_other_float_types(dtype):
    assert not FMA_RE.search(_built(_elementwise(dtype)).get_source("asm"))


def test_accumulations_keep_their_fused_multiply_add():
    """A float dot product (the loop of a float conv or dense) is left to LLVM."""
    assert FMA_RE.search(_built(_dot()).get_source("asm"))


def _lowered(sched_args, config):
    s, args = sched_args
    with tvm.transform.PassContext(opt_level=3, config=config):
        return tvm.lower(s, args)


def test_integer_arithmetic_untouched_and_idempotent():
    n = 64
    a = te.placeholder((n,), "int32", name="a")
    c = te.compute((n,), lambda i: a[i] * 3 + a[i] * 5, name="c")
    before = tvm.lower(te.create_schedule(c.op), [a, c])
    tvm.ir.assert_structural_equal(_no_contract.FenceProducts()(before), before)
    once = _no_contract.FenceProducts()(tvm.lower(*_elementwise()))
    assert once["main"].script().count("arithmetic.fence") == 2
    tvm.ir.assert_structural_equal(_no_contract.FenceProducts()(once), once)
    config = _no_contract.lower_config(_no_contract.lower_config())
    assert len(config["tir.add_lower_pass"]) == 1


# -- where the back ends enter it ---------------------------------------------------------------

@pytest.mark.parametrize("target", ["llvm -mcpu=x86-64-v3",
                                    "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1 -mattr=+neon,+dotprod"])
def test_back_ends_add_it_for_8bit_graphs_with_their_kernels(target):
    from tvm_ext import families

    backend = families.for_target(target)
    tgt = backend.target(target)
    mod = qa.qdq_add(DISTINCT)

    def names(**kw):
        config = backend.plan(BuildRequest(tgt, mod, **kw)).configure({})
        return [p.info.name for _, p in config.get("tir.add_lower_pass", [])]

    assert _no_contract.PASS_NAME in names(kernels=True, eight_bit=True)
    assert _no_contract.PASS_NAME not in names(kernels=False, eight_bit=True)  # passes=(): relay.build's code
    assert _no_contract.PASS_NAME not in names(kernels=True, eight_bit=False)
