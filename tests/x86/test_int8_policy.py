"""tvm_ext.x86.int8_policy: which int8 conv schedule each instruction-set class takes, and the
target policy of tvm_ext.build (VNNI kept or masked).

Compiled only where the host cannot run the code; executed only where it can
(:func:`tvm_ext.x86.isa.runs_on_host`).
"""

import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_ext.x86 import int8_conv as x86_int8
from tvm_ext.x86 import int8_policy
from tvm_ext.x86.isa import llvm_features as _llvm_features
from tvm_ext.x86.target import build_target

from ._int8_cases import (NON_VNNI_TARGETS, _conv_epilogue, _run, _runnable)


def test_vnni_operand_types_only_where_llvm_needs_them():
    from tvm.target import codegen

    assert int8_policy.needs_operand_fix() == (codegen.llvm_version_major() >= 22)


def test_build_target_policy():
    masked = "llvm -mcpu=x86-64-v4"
    assert "avx512vnni" not in _llvm_features(build_target(masked)), "an explicit mask is kept"
    assert "avx512vnni" not in _llvm_features(build_target("llvm -mcpu=x86-64-v4 -mattr=+avx512vnni", allow_vnni=False))
    assert "avx512vnni" in _llvm_features(build_target("llvm -mcpu=x86-64-v4 -mattr=+avx512vnni")), "auto keeps VNNI"
    assert "avx512vnni" not in _llvm_features(build_target("llvm -mcpu=x86-64-v3")), "no VNNI to keep"
    assert build_target("cuda").kind.name == "cuda"


# The default tier runs a diagonal: the 1x1 conv at AVX2, the 3x3 conv (epilogue_per_row) at AVX-512. The slow tier
# adds the 3x3 conv at AVX2 and the 1x1 conv at AVX-512, both per tile, as
# test_int8_schedules.py::test_per_tile_schedule_is_bit_identical[3x3-avx2] and [1x1-avx512] run them by default
@pytest.mark.parametrize("k, target", [
    pytest.param(k, target, id=f"{k}-{name}", marks=[*_runnable(target).marks, *(
        [] if (k, name) in {(1, "avx2"), (3, "avx512")} else [pytest.mark.slow])])
    for k in (3, 1) for name, target in NON_VNNI_TARGETS.items()])
def test_policy_conv_schedules_are_bit_identical_without_vnni(k, target):
    """The policy's int8 conv schedules without VNNI (AVX2: ``per_tile_accumulators``; AVX-512:
    ``epilogue_per_row`` for 3x3, per tile for 1x1): same bits as TVM's own schedule with the same
    dot product (``kernels(schedule=False)``: TVM's schedules, the exact dot of
    :mod:`tvm_ext.x86.exact_int8`)."""
    mod = _conv_epilogue(k)
    x = np.random.default_rng(1).integers(0, 256, (1, 64, 14, 14)).astype("uint8")
    outs = {}
    for schedule in (False, True):
        with x86_int8.kernels(schedule=schedule), tvm.transform.PassContext(opt_level=3):
            outs[schedule] = _run(relay.build(mod, target=target), x)
    assert np.array_equal(outs[False], outs[True])


@pytest.mark.parametrize("target,expected", [("llvm -mcpu=x86-64-v3", "per_tile"),
                                             ("llvm -mcpu=x86-64-v4", "per_row"),
                                             ("llvm -mcpu=core2", "tvm")])
def test_conv_schedule_follows_the_isa_policy(target, expected):
    """Compiled only: kernels() changes the 3x3 conv's code exactly where policy() says per-row
    (AVX-512) or per-tile (AVX2), and keeps TVM's where it says so (SSE)."""
    mod = _conv_epilogue(3)

    def asm(**kw):
        with x86_int8.kernels(**kw), tvm.transform.PassContext(opt_level=3):
            return relay.build(mod, target=target).get_lib().get_source("asm")

    chosen = int8_policy.policy(tvm.target.Target(target)).conv_schedule
    assert chosen == expected
    assert (asm(schedule=True) != asm(schedule=False)) == (chosen != "tvm")


@pytest.mark.parametrize("target", [
    "llvm -mcpu=x86-64-v3",
    # AVX-512 without VNNI takes the per-tile form as AVX-512 VNNI does ([llvm -mcpu=x86-64-v4 -mattr=+avx512vnni] in
    # the default tier); test_int8_schedules.py::test_per_tile_schedule_is_bit_identical[1x1-avx512] builds it there
    pytest.param("llvm -mcpu=x86-64-v4", marks=pytest.mark.slow),
    "llvm -mcpu=x86-64-v4 -mattr=+avx512vnni", "llvm -mcpu=core2"])
def test_1x1_conv_schedule_follows_the_isa_policy(target):
    """Compiled only: 1x1 int8 convs are computed per register tile on AVX2 and AVX-512
    (``per_tile_accumulators``).
    30 pixels wide: TVM's fallback takes a whole row (30 accumulators on AVX-512, 60 on AVX2),
    more than either budget, so the tile differs from TVM's row block on both."""
    mod = _conv_epilogue(1, size=30)

    def asm(**kw):
        with x86_int8.kernels(**kw), tvm.transform.PassContext(opt_level=3):
            return relay.build(mod, target=target).get_lib().get_source("asm")

    chosen = int8_policy.policy(tvm.target.Target(target)).conv1x1_schedule
    assert chosen == ("tvm" if "core2" in target else "per_tile")
    # on a VNNI target schedule=False still swaps in the LLVM 22 intrinsic: compare the 1x1 per-tile
    # form with TVM's 1x1 form under the same intrinsic
    with x86_int8.kernels(schedule="per_row"), tvm.transform.PassContext(opt_level=3):
        tvm_form = relay.build(mod, target=target).get_lib().get_source("asm")  # per_row: TVM's 1x1 form
    assert (asm(schedule=True) != tvm_form) == (chosen == "per_tile")
