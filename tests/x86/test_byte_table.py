"""``tvm_ext.x86.byte_table``: 256-entry byte-table lookups as ``vpermi2b`` pairs at AVX-512 VBMI.

``tvm_ext.table_lookup`` built with the pass, executed where the host has VBMI, against numpy on every
8-bit value (uint8 and int8 data and tables; vectors of 16 and 8 lanes and a scalar tail); the code
read back for ``vpermi2b`` and for the gather's ``vpinsrb``. A conv whose epilogue holds a tabulated
SiLU, built by ``tvm_ext.build`` with ``pipelines.int8()`` at a VBMI target, against the same pipeline
at plain ``llvm`` (a gather, no int8 SIMD). Where the back end adds the pass (VBMI targets with
tvm-ext's kernels) and where not (Cascade Lake, AVX2, builds without kernels); idempotence and no
change without a table.
"""
import re

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.testing import run_module
from tvm_ext.x86 import byte_table
from tvm_ext.x86.isa import runs_on_host
from _byte_table_cases import (conv_silu, expected, lookup_module, lowered_lookup, lowered_without_table, random_table,
                               values)

#: The least CPU with VBMI: AVX-512 (x86-64-v4) and the byte permutes.
VBMI = "llvm -mcpu=x86-64-v4 -mattr=+avx512vbmi"
NEEDS_VBMI = pytest.mark.skipif(not runs_on_host(VBMI), reason=f"host lacks instructions of '{VBMI}'")
PERMUTES = re.compile(r"\bvperm[it]2b\b")


def _build(mod, target, lowered=True):
    config = byte_table.lower_config() if lowered else {}
    with tvm.transform.PassContext(opt_level=3, config=config):
        return relay.build(mod, target=target)


@pytest.mark.parametrize("cpu, expected", [
    ("znver4", True), ("icelake-server", True), ("sapphirerapids", True), ("cascadelake", False),
    ("x86-64-v3", False), ("x86-64-v4", False)])
def test_applies_at_vbmi(cpu, expected):
    assert byte_table.applies(f"llvm -mcpu={cpu}") is expected


@NEEDS_VBMI
@pytest.mark.parametrize("shape", [(1, 2, 16, 16, 16), (1, 3, 7, 7, 8), (3, 5, 7)], ids=["x16", "x8", "tail"])
@pytest.mark.parametrize("data_dtype", ["uint8", "int8"])
@pytest.mark.parametrize("table_dtype", ["uint8", "int8"])
def test_lookup_bit_exact_on_every_value(shape, data_dtype, table_dtype):
    table = random_table(table_dtype)
    lib = _build(lookup_module(data_dtype, table, shape), VBMI)
    x = values(data_dtype, shape)
    out = run_module(lib, {"x": x})[0]
    np.testing.assert_array_equal(out, expected(table, x))
    asm = lib.get_lib().get_source("asm")
    assert PERMUTES.search(asm)
    if shape[-1] in (8, 16):  # vectorised throughout: no gather left
        assert "vpinsrb" not in asm


def test_without_the_pass_the_lookup_is_a_gather():
    """The code the pass replaces (compile only): a ``vpinsrb`` per byte, no permute."""
    asm = _build(lookup_module("uint8", random_table("uint8"), (1, 2, 16, 16, 16)), VBMI, lowered=False) \
        .get_lib().get_source("asm")
    assert "vpinsrb" in asm and not PERMUTES.search(asm)


def test_idempotent_and_unchanged_without_a_table():
    p = byte_table.VbmiByteTableLookup()
    once = p(lowered_lookup())
    assert "vpermi2var" in once["main"].script()
    tvm.ir.assert_structural_equal(p(once), once)
    plain = lowered_without_table()
    tvm.ir.assert_structural_equal(p(plain), plain)


def _pipeline_build(target):
    return tvm_ext.build(conv_silu(), target, passes=pipelines.int8())


@NEEDS_VBMI
def test_tabulated_conv_epilogue_bit_exact_against_plain_llvm():
    fast, plain = _pipeline_build(VBMI), _pipeline_build("llvm")
    assert PERMUTES.search(fast.get_lib().get_source("asm"))
    rng = np.random.default_rng(5)
    for x in (values("uint8", (1, 16, 8, 8)), rng.integers(0, 256, (1, 16, 8, 8)).astype("uint8")):
        np.testing.assert_array_equal(run_module(fast, {"x": x})[0], run_module(plain, {"x": x})[0])


@pytest.mark.parametrize("target, permutes", [
    ("llvm -mcpu=znver4", True), ("llvm -mcpu=cascadelake", False), ("llvm -mcpu=x86-64-v3", False)])
def test_back_end_adds_the_pass_at_vbmi_with_its_kernels(target, permutes):
    """Compile only: the pipeline's build permutes at a VBMI target, gathers elsewhere and without
    tvm-ext's kernels."""
    asm = _pipeline_build(target).get_lib().get_source("asm")
    assert bool(PERMUTES.search(asm)) is permutes
    if permutes:
        plain = tvm_ext.build(conv_silu(), target, passes=pipelines.int8(), kernels=False)
        assert not PERMUTES.search(plain.get_lib().get_source("asm"))
