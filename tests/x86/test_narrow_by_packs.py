"""``tvm_ext.x86.narrow_by_packs``: saturating int32 -> 8-bit stores narrowed four vectors at a time by packs.

Tiles of 16-lane ``cast(clip(x))`` stores lowered with the pass: the rewritten statement (one 64-byte
store of ``vpackssdw``/``vpackuswb`` and a dword shuffle per four adjacent stores, the rest as they were);
executed where the host has AVX-512BW against numpy on int32 extremes, both 8-bit types and clip bounds
inside the type's range; idempotence; no change where the stores are not adjacent, the clip is not a
saturation or the loop is shorter than four. A requantized 1x1 conv built by ``tvm_ext.build`` at AVX-512
VNNI against a plain ``llvm`` build, and its code read back. Where the back end adds the pass.
"""
import re

import numpy as np
import pytest
import tvm
from tvm import relay, te, tir

import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.testing import run_module
from tvm_ext.x86 import narrow_by_packs
from tvm_ext.x86.isa import runs_on_host

AVX512 = "llvm -mcpu=x86-64-v4"
VNNI = "llvm -mcpu=cascadelake"
NEEDS_AVX512 = pytest.mark.skipif(not runs_on_host(AVX512), reason=f"host lacks instructions of '{AVX512}'")
NEEDS_VNNI = pytest.mark.skipif(not runs_on_host(VNNI), reason=f"host lacks instructions of '{VNNI}'")
PACKS = re.compile(r"\bvpack[us]swb\s+%zmm")  # AVX2's narrowing packs ymm registers of its own


def _tiles(dtype="uint8", lo=None, hi=None, pixels=4, rows=2, rows_inner=False, cast_only=False):
    """``out[t, r, p, :] = cast(dtype, clip(a[t, r, p, :], lo, hi))`` for 3 tiles of ``rows x pixels`` 16-lane
    vectors, the lanes vectorized and the pixel loop innermost (adjacent stores), or with ``rows_inner``
    the row loop (stores a row apart)."""
    info = np.iinfo(dtype)
    lo, hi = info.min if lo is None else lo, info.max if hi is None else hi
    shape = (3, rows, pixels, 16)
    a = te.placeholder(shape, "int32", name="a")
    if cast_only:
        out = te.compute(shape, lambda *i: a[i].astype(dtype), name="out")
    else:
        out = te.compute(shape, lambda *i: tir.Max(tir.Min(a[i], hi), lo).astype(dtype), name="out")
    s = te.create_schedule(out.op)
    t, r, p, lane = s[out].op.axis
    if rows_inner:
        s[out].reorder(t, p, r, lane)
    s[out].vectorize(lane)
    return s, a, out


def _lowered(s, a, out, packs=True):
    config = narrow_by_packs.lower_config() if packs else {}
    with tvm.transform.PassContext(config=config):
        return tvm.lower(s, [a, out])


def _stores(mod):
    found = []
    tir.stmt_functor.post_order_visit(mod["main"].body, lambda n: found.append(n) if isinstance(n, tir.BufferStore)
                                      else None)
    return found


def _lanes(store):
    return int(store.indices[0].lanes) if isinstance(store.indices[0], tir.Ramp) else 1


def test_adjacent_stores_become_one_packed_store_each_four():
    mod = _lowered(*_tiles(pixels=6))
    lanes = sorted(_lanes(st) for st in _stores(mod))
    assert lanes == [16, 16, 64]  # pixels 0-3 packed, 4-5 as they were; the row and tile loops stay loops
    script = mod["main"].script()
    assert "llvm.x86.avx512.packssdw.512" in script and "llvm.x86.avx512.packuswb.512" in script
    assert "T.max" not in script.split("packssdw")[1].split(")")[0]  # the clip to the type's range is the packs'


def test_idempotent():
    mod = _lowered(*_tiles())
    tvm.ir.assert_structural_equal(narrow_by_packs.NarrowByPacks()(mod), mod)


@pytest.mark.parametrize("case", [
    dict(rows=4, pixels=2, rows_inner=True),  # the innermost loop's stores are a row apart: none adjacent
    dict(pixels=2),                     # a loop of two stores
    dict(cast_only=True),               # a cast without a clip wraps: not a saturation
    dict(dtype="uint8", lo=-5, hi=255),  # a bound outside uint8: the cast wraps below 0
])
def test_unchanged_where_nothing_matches(case):
    s, a, out = _tiles(**case)
    plain = _lowered(s, a, out, packs=False)
    tvm.ir.assert_structural_equal(narrow_by_packs.NarrowByPacks()(plain), plain)


def _values(shape, rng):
    """int32 extremes, values around both 8-bit and both 16-bit limits, then random values."""
    special = np.array([-2**31, 2**31 - 1, -32769, -32768, -32767, 32767, 32768, -129, -128, -1, 0, 1, 127, 128,
                        254, 255, 256, 65535, 65536], np.int64)
    x = rng.integers(-2**31, 2**31, int(np.prod(shape)), dtype=np.int64)
    x[:special.size] = special
    x[special.size:special.size + 512] = np.arange(-256, 256)
    return x.astype(np.int32).reshape(shape)


@NEEDS_AVX512
@pytest.mark.parametrize("dtype,lo,hi", [("uint8", None, None), ("int8", None, None), ("uint8", 3, 200),
                                         ("int8", -100, 0)])
def test_bytes_equal_numpy(dtype, lo, hi):
    s, a, out = _tiles(dtype, lo, hi, pixels=8)
    mod = _lowered(s, a, out)
    assert 64 in {_lanes(st) for st in _stores(mod)}
    f = tvm.build(mod, target=AVX512)
    info = np.iinfo(dtype)
    x = _values([int(d) for d in a.shape], np.random.default_rng(3))
    got = tvm.nd.empty(x.shape, dtype)
    f(tvm.nd.array(x), got)
    want = np.clip(x, info.min if lo is None else lo, info.max if hi is None else hi).astype(dtype)
    np.testing.assert_array_equal(got.numpy(), want)


def _conv_requantize(seed=0, cin=64, cout=256, size=28):
    """A uint8 x int8 1x1 conv (ResNet-50's 64 -> 256 at a smaller map), bias and requantize to uint8."""
    rng = np.random.default_rng(seed)
    x = relay.var("x", shape=(1, cin, size, size), dtype="uint8")
    w = relay.const(rng.integers(-128, 128, (cout, cin, 1, 1)).astype("int8"))
    y = relay.qnn.op.conv2d(x, w, relay.const(3), relay.const(0), relay.const(0.02), relay.const(0.01),
                            kernel_size=(1, 1), channels=cout, out_dtype="int32")
    y = relay.add(y, relay.const(rng.integers(-1000, 1000, (cout, 1, 1)).astype("int32")))
    y = relay.qnn.op.requantize(y, relay.const(0.0002), relay.const(0), relay.const(0.05), relay.const(5),
                                out_dtype="uint8")
    return tvm.IRModule.from_expr(relay.Function([x], y))


@NEEDS_VNNI
def test_requantized_conv_bit_exact_against_plain_llvm():
    mod = _conv_requantize()
    fast = tvm_ext.build(mod, VNNI, passes=pipelines.int8())
    assert PACKS.search(fast.get_lib().get_source("asm"))
    with tvm.transform.PassContext(opt_level=3):
        plain = relay.build(mod, target="llvm")
    rng = np.random.default_rng(4)
    x = rng.integers(0, 256, (1, 64, 28, 28)).astype("uint8")
    ref = run_module(plain, {"x": x})[0]
    assert (ref == 0).any() and (ref == 255).any() and np.unique(ref).size > 50  # saturated and unsaturated
    np.testing.assert_array_equal(run_module(fast, {"x": x})[0], ref)


@pytest.mark.parametrize("target, packs", [("llvm -mcpu=cascadelake", True), ("llvm -mcpu=znver4", True),
                                           ("llvm -mcpu=x86-64-v3", False)])
def test_back_end_adds_the_pass_at_avx512bw_with_its_kernels(target, packs):
    """Compile only: the 1x1 conv's 8-bit stores are packed at AVX-512BW targets, and its tiles span four
    adjacent pixels (``wide_1x1_tiles``); not at AVX2, nor without tvm-ext's kernels."""
    asm = tvm_ext.build(_conv_requantize(), target, passes=pipelines.int8()).get_lib().get_source("asm")
    assert bool(PACKS.search(asm)) is packs
    assert narrow_by_packs.applies(target) is packs
    if packs:
        assert "vpmovusdb" not in asm
        plain = tvm_ext.build(_conv_requantize(), target, passes=pipelines.int8(), kernels=False)
        assert not PACKS.search(plain.get_lib().get_source("asm"))
