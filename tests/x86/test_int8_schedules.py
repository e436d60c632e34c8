"""tvm_ext.x86.int8_schedules: register tiles, channel chunks and vectorized global pools, each
against TVM's own schedule (same bits) and, compiled only, by the assembly it makes.

VNNI builds run in a child process. Code is executed only where the host has every instruction
it was compiled for (:func:`tvm_ext.x86.isa.runs_on_host`).
"""
import subprocess
import sys

import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_ext.x86 import int8_conv as x86_int8
from tvm_ext.x86 import int8_policy
from tvm_ext.x86.target import host_target

from ._int8_cases import (NON_VNNI_TARGETS, _requantize, _run, _runnable, needs_vnni)


#: (k, channels, size, stride, epilogue, input channels): the per-tile schedule's cases
_TILE_CASES = [
    (3, 64, 14, 1, True, None),    # tile of 2 pixels
    (3, 64, 13, 1, True, None),    # prime width: tiles of one pixel
    (3, 32, 7, 1, True, None),     # 7-wide rows on AVX2: the whole row, kw unrolled
    (3, 32, 28, 2, True, None),    # stride 2
    (3, 64, 14, 1, False, None),   # no epilogue: int32 out, the conv is the kernel's last stage
    (7, 16, 30, 2, True, 4),       # ResNet's stem: 4 input channels, 7x7, stride 2
    (1, 64, 14, 1, True, 32),      # 1x1 (the 1x1 per-tile form)
    (1, 32, 28, 2, True, 64),      # 1x1, stride 2 (ResNet's downsample)
    (1, 64, 13, 1, False, 32),     # 1x1, prime width, no epilogue
    (1, 32, 7, 1, True, 48),       # 1x1 on a 7x7 map: AVX2 takes its accumulator groups in turn
]


_TILE_IDS = ["3x3", "prime-width", "whole-row", "stride2", "no-epilogue", "stem", "1x1", "1x1-stride2",
             "1x1-prime-no-epilogue", "1x1-groups-in-turn"]
#: The class of each case in the default tier, a diagonal: each case once, each class on half of them, the 3x3 and
#: a 1x1 conv at each. The slow tier runs every case at both classes.
_TILE_DEFAULT = {"3x3": "avx2", "prime-width": "avx2", "whole-row": "avx2", "stride2": "avx512",
                 "no-epilogue": "avx512", "stem": "avx512", "1x1": "avx512", "1x1-stride2": "avx2",
                 "1x1-prime-no-epilogue": "avx2", "1x1-groups-in-turn": "avx2"}


@pytest.mark.parametrize("case, target", [
    pytest.param(case, target, id=f"{case_id}-{name}", marks=[*_runnable(target).marks, *(
        [] if _TILE_DEFAULT[case_id] == name else [pytest.mark.slow])])
    for case, case_id in zip(_TILE_CASES, _TILE_IDS) for name, target in NON_VNNI_TARGETS.items()])
def test_per_tile_schedule_is_bit_identical(case, target):
    """``per_tile_accumulators`` (forced on every class here; the policy takes it on AVX2 and for
    1x1 convs on AVX-512): same bits as TVM's schedule."""
    k, channels, size, stride, epilogue, cin = case
    cin = cin or channels
    rng = np.random.default_rng(3)
    x = relay.var("x", shape=(1, cin, size, size), dtype="uint8")
    w = relay.const(rng.integers(-128, 128, (channels, cin, k, k)).astype("int8"))
    y = relay.nn.conv2d(x, w, strides=stride, padding=k // 2, channels=channels, kernel_size=k, out_dtype="int32")
    if epilogue:
        y = _requantize(relay.add(y, relay.const(rng.integers(-900, 900, (channels, 1, 1)).astype("int32"))),
                        channels, rng)
    mod = tvm.IRModule.from_expr(relay.Function([x], y))
    xs = rng.integers(0, 256, (1, cin, size, size)).astype("uint8")
    outs = {}
    for schedule in (False, "per_tile"):
        with x86_int8.kernels(schedule=schedule), tvm.transform.PassContext(opt_level=3):
            outs[schedule] = _run(relay.build(mod, target=target), xs)
    assert np.array_equal(outs[False], outs["per_tile"])


def _blocked_global_pool(shape, dtype="uint8", out_dtype="float32"):
    """SE-style global pool over an NCHW[x]c tensor: cast -> multiply -> global_avg_pool2d."""
    x = relay.var("x", shape=shape, dtype=dtype)
    v = relay.multiply(relay.cast(x, "float32"), relay.const(0.0173, "float32"))
    y = relay.nn.global_avg_pool2d(v, layout=f"NCHW{shape[-1]}c")
    return tvm.IRModule.from_expr(relay.Function([x], relay.cast(relay.round(y), out_dtype)))


@pytest.mark.parametrize("target", ["llvm -mcpu=x86-64-v3", "llvm -mcpu=x86-64-v4 -mattr=+avx512vnni"])
def test_global_pool_is_vectorized_over_its_channel_block(target):
    """Compile-only: the pool's kernel adds a vector of 16 channels per window position with
    ``global_pool_channel_vector`` and none with TVM's schedule (strided scalar sums)."""
    mod = _blocked_global_pool((1, 6, 20, 20, 16))

    def source(schedule):
        with x86_int8.kernels(schedule=schedule), tvm.transform.PassContext(opt_level=3):
            lib = relay.build(mod, target=target)
        return lib.get_lib().get_source("ll")

    import re

    vector_adds = lambda ll: re.findall(r"fadd (?:fast )?<16 x float>", ll)  # noqa: E731
    scalar_adds = lambda ll: re.findall(r"fadd (?:fast )?float ", ll)  # noqa: E731
    ours, tvms = source(True), source(False)
    assert vector_adds(ours) and not scalar_adds(ours)
    assert scalar_adds(tvms) and not vector_adds(tvms)


@pytest.mark.parametrize("shape", [(1, 6, 20, 20, 16), (1, 3, 10, 10, 8), (1, 128, 7, 7, 16), (1, 2, 5, 5, 4)])
def test_global_pool_vectorized_is_bit_identical(shape):
    """Host target: the same bits as TVM's pool schedule (each channel sums the same positions in
    the same order)."""
    mod = _blocked_global_pool(shape, out_dtype="int32")
    x = np.random.default_rng(3).integers(0, 256, shape).astype("uint8")
    outs = []
    for schedule in (False, True):
        with x86_int8.kernels(schedule=schedule), tvm.transform.PassContext(opt_level=3):
            outs.append(_run(relay.build(mod, target=host_target()), x))
    np.testing.assert_array_equal(outs[1], outs[0])
    # and the float pool itself, before rounding
    x2 = relay.var("x", shape=shape, dtype="uint8")
    fmod = tvm.IRModule.from_expr(relay.Function([x2], relay.nn.global_avg_pool2d(
        relay.multiply(relay.cast(x2, "float32"), relay.const(0.0173, "float32")), layout=f"NCHW{shape[-1]}c")))
    fouts = []
    for schedule in (False, True):
        with x86_int8.kernels(schedule=schedule), tvm.transform.PassContext(opt_level=3):
            fouts.append(_run(relay.build(fmod, target=host_target()), x))
    assert fouts[1].tobytes() == fouts[0].tobytes()


def _pool_group(shape=(1, 16, 7, 7, 16)):
    """x -> f(x), f = fn(p: u8) {cast(round(global_avg_pool2d(cast(p, f32) * s) / t))} Primitive=1: the
    pool group FuseWideningIntoPool makes of a quantized model's global average pool."""
    x = relay.var("x", shape=shape, dtype="uint8")
    p = relay.var("p0", shape=shape, dtype="uint8")
    v = relay.multiply(relay.cast(p, "float32"), relay.const(np.float32(0.0204243)))
    y = relay.divide(relay.nn.global_avg_pool2d(v, layout=f"NCHW{shape[-1]}c"), relay.const(np.float32(0.00408715)))
    body = relay.cast(relay.clip(relay.round(y), 0.0, 255.0), "uint8")
    fn = relay.Function([p], body).with_attr("Primitive", tvm.tir.IntImm("int32", 1))
    return tvm.IRModule.from_expr(relay.Function([x], relay.Call(fn, [x])))


@pytest.mark.parametrize("target", ["llvm -mcpu=x86-64-v3", "llvm -mcpu=x86-64-v4 -mattr=+avx512vnni"])
def test_pool_keeps_a_summed_float_product_in_its_own_stage(target):
    """pool_prologue_inline inlines a pool's producers except a float product the pool's sum reads:
    inlined, LLVM fuses the multiply into the sum's add (vfmadd, one rounding where TVM's schedule
    rounds the product first), which made int8 ResNet-50 QOperator differ from stock TVM by one
    output step on rare inputs. Compile-only: no fused multiply-add in the pool kernel, as with
    TVM's schedule; the pool still adds vectors of its channel block."""
    import re

    def asm(schedule):
        with x86_int8.kernels(schedule=schedule), tvm.transform.PassContext(opt_level=3):
            return relay.build(_pool_group(), target=target).get_lib().get_source("asm")

    ours, tvms = asm(True), asm(False)
    assert not re.findall(r"vfn?madd\w*ps", tvms)
    assert not re.findall(r"vfn?madd\w*ps", ours)
    assert re.findall(r"vaddps\s+%[yz]mm", ours)


def test_pool_group_bit_identical_to_tvms_schedule():
    """Host target: the pool group built with tvm-ext's pool schedules gives TVM's bits."""
    mod = _pool_group()
    rng = np.random.default_rng(7)
    xs = [rng.integers(0, 256, (1, 16, 7, 7, 16)).astype("uint8") for _ in range(20)]
    outs = []
    for schedule in (False, True):
        with x86_int8.kernels(schedule=schedule), tvm.transform.PassContext(opt_level=3):
            lib = relay.build(mod, target=host_target())
        outs.append(np.stack([_run(lib, x) for x in xs]))
    np.testing.assert_array_equal(outs[1], outs[0])


_VNNI_TARGET = "llvm -mcpu=x86-64-v4 -mattr=+avx512vnni"


def _conv1x1(cin=64, cout=256, size=28, epilogue=True, seed=5):
    """A uint8 x int8 1x1 conv (int32 out, or requantized to uint8) and its int8 weights."""
    rng = np.random.default_rng(seed)
    x = relay.var("x", shape=(1, cin, size, size), dtype="uint8")
    w = rng.integers(-128, 128, (cout, cin, 1, 1)).astype("int8")
    y = relay.nn.conv2d(x, relay.const(w), channels=cout, kernel_size=1, out_dtype="int32")
    if epilogue:
        y = _requantize(y, cout, rng)
    return tvm.IRModule.from_expr(relay.Function([x], y)), w


def _build_chunks(mod, chunks, target=_VNNI_TARGET):
    """``mod`` built with the policy's kernels, ``tile_oc_chunks`` set to ``chunks`` on AVX-512 VNNI."""
    saved = dict(int8_policy._TILE_OC_CHUNKS)
    int8_policy._TILE_OC_CHUNKS["avx512_vnni"] = chunks
    try:
        with x86_int8.kernels(), tvm.transform.PassContext(opt_level=3):
            return relay.build(mod, target=target)
    finally:
        int8_policy._TILE_OC_CHUNKS.clear()
        int8_policy._TILE_OC_CHUNKS.update(saved)


def _loads_per_vpdpbusd(asm: str) -> float:
    """Vector loads and broadcasts from memory (as separate instructions or as vpdpbusd's memory
    operand) per vpdpbusd in ``asm``."""
    import re

    dots = len(re.findall(r"\bvpdpbusd\b", asm))
    moves = "vpbroadcastd|vmovdqu64|vmovdqu32|vmovdqa64|vmovdqa32|vmovups|vmovaps"
    loads = len(re.findall(rf"\b(?:{moves})\s+-?\w*\(", asm))
    loads += len(re.findall(r"\bvpdpbusd\s+-?\w*\(", asm))
    return loads / dots


def test_1x1_tile_of_several_channel_chunks_loads_less_per_product():
    """``tile_oc_chunks`` compiled only at an AVX-512 VNNI target: with up to 4 output-channel
    chunks per tile, the 1x1 conv's kernel loads about half a vector per vpdpbusd (4 kernel vectors
    and 4 data words per 16 products), where one chunk per tile loads about one (28 pixels, 1 vector)."""
    mod, _ = _conv1x1()
    one = _loads_per_vpdpbusd(_build_chunks(mod, 1).get_lib().get_source("asm"))
    four = _loads_per_vpdpbusd(_build_chunks(mod, 4).get_lib().get_source("asm"))
    assert one > 0.9, one
    assert four < 0.65, four


#: (output, in channels, out channels, width): ResNet's 4 x 4-pixel and 7-row tiles, and 96 channels
#: (6 chunks: 4 does not divide them) at a prime width, int32 out and requantized
_CHUNK_CASES = (("int32", 64, 256, 28), ("int32", 256, 512, 7), ("int32", 64, 96, 13), ("uint8", 64, 96, 13))

_CHILD_CHUNKS = r"""
import sys, numpy as np
sys.path.insert(0, sys.argv[1])
from x86.test_int8_schedules import _CHUNK_CASES, _build_chunks, _conv1x1, _run
outs = {}
for name, cin, cout, size in _CHUNK_CASES:
    mod, w = _conv1x1(cin, cout, size, epilogue=name == "uint8")
    x = np.random.default_rng(size).integers(0, 256, (1, cin, size, size)).astype("uint8")
    for chunks in (1, 2, 4):
        outs[f"{name}-{cin}-{cout}-{size}-{chunks}"] = _run(_build_chunks(mod, chunks), x)
    if name == "int32":  # exact integer arithmetic, independent of TVM
        ref = np.einsum("oc,chw->ohw", w[:, :, 0, 0].astype(np.int64), x[0].astype(np.int64))[None]
        outs[f"exact-{cin}-{cout}-{size}"] = ref
np.savez(sys.argv[2], **outs)
print("OK")
"""


@needs_vnni
@pytest.mark.slow  # 1, 2 and 4 chunks on four shapes (12 builds); test_int8_conv.py::test_vnni_builds_and_is_exact[1]
# runs the policy's 1x1 tile at AVX-512 VNNI (several chunks) against the intrinsic-free build in the default tier
def test_1x1_tile_of_several_channel_chunks_is_exact(tmp_path):
    """``tile_oc_chunks`` executed (host with AVX-512 VNNI, child process): 1x1 convs with 1, 2 and 4
    output-channel chunks per tile (:data:`_CHUNK_CASES`), full-range weights: int32 outputs equal
    numpy's integer products; requantized outputs are the same bits for every chunk count."""
    import os

    out = tmp_path / "outs.npz"
    r = subprocess.run([sys.executable, "-c", _CHILD_CHUNKS, os.path.dirname(os.path.dirname(__file__)), str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
    outs = np.load(out)
    for name, cin, cout, size in _CHUNK_CASES:
        for chunks in (1, 2, 4):
            got = outs[f"{name}-{cin}-{cout}-{size}-{chunks}"]
            want = outs[f"exact-{cin}-{cout}-{size}"] if name == "int32" else outs[f"{name}-{cin}-{cout}-{size}-1"]
            assert np.array_equal(got, want), (name, cin, cout, size, chunks)
