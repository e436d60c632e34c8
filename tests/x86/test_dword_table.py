"""``tvm_ext.x86.dword_table``: 256-entry byte-table lookups as ``vpermi2d`` pairs at AVX-512 without VBMI.

``tvm_ext.table_lookup`` built with the pass, executed where the host runs AVX-512 (x86-64-v4), against
numpy on every 8-bit value (uint8 and int8 data and tables; vectors of 16 and 8 lanes and a scalar
tail); the code read back for the dword permutes and for the gather's ``vpinsrb``. A conv whose
epilogue holds a tabulated SiLU, built by ``tvm_ext.build`` with ``pipelines.int8()`` at Cascade Lake and
x86-64-v4, against the same pipeline at plain ``llvm`` (a gather, no int8 SIMD). Where the back end adds the pass
(AVX-512 without VBMI, with tvm-ext's kernels) and where not; idempotence and no change without a
table; the conv's hot loop unchanged by the lookup (no registers taken from its accumulators).
"""
import re

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.testing import run_module
from tvm_ext.x86 import dword_table
from tvm_ext.x86.isa import runs_on_host
from _byte_table_cases import (conv_silu, expected, lookup_module, lowered_lookup, lowered_without_table, random_table,
                               values)

#: The least CPU with AVX-512 (F, BW, DQ, VL) and no VBMI.
AVX512 = "llvm -mcpu=x86-64-v4"
CASCADELAKE = "llvm -mcpu=cascadelake"
DWORD_PERMUTES = re.compile(r"\bvperm[it]2d\b")
BYTE_PERMUTES = re.compile(r"\bvperm[it]2b\b")


def _needs(target):
    return pytest.mark.skipif(not runs_on_host(target), reason=f"host lacks instructions of '{target}'")


def _build(mod, target, lowered=True):
    config = dword_table.lower_config() if lowered else {}
    with tvm.transform.PassContext(opt_level=3, config=config):
        return relay.build(mod, target=target)


@pytest.mark.parametrize("cpu, expected", [
    ("cascadelake", True), ("skylake-avx512", True), ("cooperlake", True), ("x86-64-v4", True),
    ("znver4", False), ("icelake-server", False), ("sapphirerapids", False), ("x86-64-v3", False),
    ("znver3", False)])
def test_applies_at_avx512_without_vbmi(cpu, expected):
    assert dword_table.applies(f"llvm -mcpu={cpu}") is expected


@_needs(AVX512)
@pytest.mark.parametrize("shape", [(1, 2, 16, 16, 16), (1, 3, 7, 7, 8), (3, 5, 7)], ids=["x16", "x8", "tail"])
@pytest.mark.parametrize("data_dtype", ["uint8", "int8"])
@pytest.mark.parametrize("table_dtype", ["uint8", "int8"])
def test_lookup_bit_exact_on_every_value(shape, data_dtype, table_dtype):
    table = random_table(table_dtype)
    lib = _build(lookup_module(data_dtype, table, shape), AVX512)
    x = values(data_dtype, shape)
    out = run_module(lib, {"x": x})[0]
    np.testing.assert_array_equal(out, expected(table, x))
    asm = lib.get_lib().get_source("asm")
    assert DWORD_PERMUTES.search(asm)
    if shape[-1] in (8, 16):  # vectorised throughout: no gather left
        assert "vpinsrb" not in asm


def test_without_the_pass_the_lookup_is_a_gather():
    """The code the pass replaces (compile only): a ``vpinsrb`` per byte, no dword permute."""
    asm = _build(lookup_module("uint8", random_table("uint8"), (1, 2, 16, 16, 16)), AVX512, lowered=False) \
        .get_lib().get_source("asm")
    assert "vpinsrb" in asm and not DWORD_PERMUTES.search(asm)


def test_idempotent_and_unchanged_without_a_table():
    p = dword_table.DwordByteTableLookup()
    once = p(lowered_lookup())
    assert "vpermi2var.d" in once["main"].script()
    tvm.ir.assert_structural_equal(p(once), once)
    plain = lowered_without_table()
    tvm.ir.assert_structural_equal(p(plain), plain)


def _pipeline_build(target, **kw):
    return tvm_ext.build(conv_silu(), target, passes=pipelines.int8(), **kw)


@pytest.mark.parametrize("target", [pytest.param(t, marks=_needs(t)) for t in (CASCADELAKE, AVX512)])
def test_tabulated_conv_epilogue_bit_exact_against_plain_llvm(target):
    """Cascade Lake's VNNI kernels and x86-64-v4's exact int16-pair kernels, each with the lookup in
    its epilogue."""
    fast, plain = _pipeline_build(target), _pipeline_build("llvm")
    assert DWORD_PERMUTES.search(fast.get_lib().get_source("asm"))
    rng = np.random.default_rng(5)
    for x in (values("uint8", (1, 16, 8, 8)), rng.integers(0, 256, (1, 16, 8, 8)).astype("uint8")):
        np.testing.assert_array_equal(run_module(fast, {"x": x})[0], run_module(plain, {"x": x})[0])


@pytest.mark.parametrize("target, dwords, bytes_", [
    (CASCADELAKE, True, False), ("llvm -mcpu=znver4", False, True), ("llvm -mcpu=x86-64-v3", False, False)])
def test_back_end_adds_the_pass_at_avx512_without_vbmi(target, dwords, bytes_):
    """Compile only: the pipeline's build permutes dwords at Cascade Lake (none without the pass or
    without tvm-ext's kernels), bytes at VBMI, neither at AVX2."""
    asm = _pipeline_build(target).get_lib().get_source("asm")
    assert bool(DWORD_PERMUTES.search(asm)) is dwords
    assert bool(BYTE_PERMUTES.search(asm)) is bytes_
    if dwords:
        for kw in ({"disabled_pass": [dword_table.PASS_NAME]}, {"kernels": False}):
            assert not DWORD_PERMUTES.search(_pipeline_build(target, **kw).get_lib().get_source("asm")), kw


def _hot_loops(lib):
    from tvm_ext.tools.mca import _asm

    funcs = _asm.parse(lib.get_lib().get_source("asm"))
    loops = [_asm.hot_loop(name, funcs, kernel_funcs, "") for name, kernel_funcs in _asm.kernels(funcs).items()]
    return [(h.instructions, h.accumulators, h.dots) for h in loops if h is not None]


def test_the_table_is_not_held_through_the_reduction():
    """Compile only (Cascade Lake): the conv's hot loop has the same instructions, dots and accumulators with
    the lookup as with the gather; the table's four zmm registers take none of its 20 accumulators."""
    # a 1x1 192 -> 192 conv on 20x20: its reduction stays a loop, the register tile's accumulators live
    # through it, the lookup follows it
    mod = conv_silu(in_channels=192, channels=192, size=20, kernel=1, tail=False)
    lookup = tvm_ext.build(mod, CASCADELAKE, passes=pipelines.int8())
    assert DWORD_PERMUTES.search(lookup.get_lib().get_source("asm"))
    gather = tvm_ext.build(mod, CASCADELAKE, passes=pipelines.int8(), disabled_pass=[dword_table.PASS_NAME])
    assert _hot_loops(lookup) == _hot_loops(gather) != []
