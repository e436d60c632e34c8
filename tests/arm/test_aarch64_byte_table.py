"""256-entry byte-table lookups as ``tbl``/``tbx`` at aarch64 (``tvm_ext.arm.byte_table``), executed under qemu.

``tvm_ext.table_lookup`` built with the pass at the three ARM classes, read back for ``tbl``/``tbx`` and
for the gather's lane loads (``ld1 {v.b}[i]``), which the build without the pass has; executed under
qemu (TVM's RPC server) on every 8-bit value, uint8 and int8 data and tables, vectors of 16 and 8
lanes and a scalar tail, against numpy. A conv whose epilogue holds a tabulated SiLU, built by
``tvm_ext.build`` with ``pipelines.int8()`` for aarch64, against the same pipeline at the host's
plain ``llvm`` (a gather, no int8 SIMD).
"""
import re

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.arm import byte_table
from tvm_ext.core import pipelines
from tvm_ext.ops import register_ops, table_lookup
from tvm_ext.testing import run_module
from tvm_ext.testing.aarch64 import TARGETS, run_on_session
from _byte_table_cases import conv_silu, random_table, values

LANE_LOAD = re.compile(r"\bld1\s*\{\s*v\d+\.b\s*\}\s*\[")
TBX = re.compile(r"\btbx\b")


def _lookup(data_dtype, table, shape, cpu, lowered=True):
    register_ops()
    x = relay.var("x", shape=shape, dtype=data_dtype)
    mod = tvm.IRModule.from_expr(relay.Function([x], table_lookup(x, relay.const(table))))
    with tvm.transform.PassContext(opt_level=3, config=byte_table.lower_config() if lowered else {}):
        return relay.build(mod, target=TARGETS[cpu])


@pytest.mark.parametrize("cpu", list(TARGETS))
def test_lookup_is_tbl_and_tbx_not_lane_loads(cpu):
    """Compile only: three ``tbx`` per ``tbl`` where the gather loaded a lane per byte."""
    table = random_table("uint8")
    asm = _lookup("uint8", table, (1, 2, 16, 16, 16), cpu).get_lib().get_source("asm")
    assert TBX.search(asm) and not LANE_LOAD.search(asm)
    gather = _lookup("uint8", table, (1, 2, 16, 16, 16), cpu, lowered=False).get_lib().get_source("asm")
    assert LANE_LOAD.search(gather) and not TBX.search(gather)


@pytest.mark.parametrize("shape", [(1, 2, 16, 16, 16), (1, 3, 7, 7, 8), (3, 5, 7)], ids=["x16", "x8", "tail"])
@pytest.mark.parametrize("data_dtype, table_dtype", [("uint8", "uint8"), ("int8", "int8"), ("int8", "uint8")])
def test_lookup_bit_exact_under_qemu(shape, data_dtype, table_dtype, arm_session, tmp_path):
    table = random_table(table_dtype)
    lib = _lookup(data_dtype, table, shape, "neoverse-n1")
    x = values(data_dtype, shape)
    (out,) = run_on_session(arm_session, lib, {"x": x}, tmp_path, f"lut_{data_dtype}_{table_dtype}")
    np.testing.assert_array_equal(out, table[x.astype(np.int64) - np.iinfo(data_dtype).min])


@pytest.mark.parametrize("cpu", ["cortex-a72", "neoverse-v1"])
def test_tabulated_conv_epilogue_bit_exact_under_qemu(cpu, arm_session, tmp_path):
    lib = tvm_ext.build(conv_silu(), TARGETS[cpu], passes=pipelines.int8())
    assert TBX.search(lib.get_lib().get_source("asm"))
    plain = tvm_ext.build(conv_silu(), "llvm", passes=pipelines.int8())
    rng = np.random.default_rng(5)
    for i, x in enumerate((values("uint8", (1, 16, 8, 8)), rng.integers(0, 256, (1, 16, 8, 8)).astype("uint8"))):
        (out,) = run_on_session(arm_session, lib, {"x": x}, tmp_path, f"silu_{cpu}_{i}")
        np.testing.assert_array_equal(out, run_module(plain, {"x": x})[0])


def _hot_loop(lib):
    from tvm_ext.tools.mca import _asm

    funcs = _asm.parse(lib.get_lib().get_source("asm"))
    loops = [_asm.hot_loop(name, funcs, kernel_funcs, "") for name, kernel_funcs in _asm.kernels(funcs).items()]
    (hot,) = [h for h in loops if h is not None]
    return hot


def test_the_table_is_not_held_through_the_reduction(monkeypatch):
    """Compile only (Neoverse-N1): the conv's hot loop has the same instructions, dots and accumulators with the
    lookup as with the gather. Held in 16 q registers for the whole kernel (no fence), the table took
    registers from that loop's accumulators (spills: more instructions)."""
    # a 1x1 192 -> 192 conv on 20x20: its reduction (48 input blocks) stays a loop, the register tile's
    # 16 accumulators live through it, the lookup follows it
    mod = conv_silu(in_channels=192, channels=192, size=20, kernel=1, tail=False)
    target = TARGETS["neoverse-n1"]
    gather = _hot_loop(tvm_ext.build(mod, target, passes=pipelines.int8(), disabled_pass=[byte_table.PASS_NAME]))
    tbl = tvm_ext.build(mod, target, passes=pipelines.int8())
    assert TBX.search(tbl.get_lib().get_source("asm"))
    hot = _hot_loop(tbl)
    assert (hot.instructions, hot.accumulators, hot.dots) == (gather.instructions, gather.accumulators, gather.dots)
    monkeypatch.setattr(byte_table, "_fence", None)
    held = _hot_loop(tvm_ext.build(mod, target, passes=pipelines.int8()))
    assert held.instructions > gather.instructions
