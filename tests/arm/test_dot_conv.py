"""tvm_ext.arm.dot_conv: NCHW4c int8 convs in register tiles of independent accumulators (sdot, smull).

Compiled only (tests/arm/test_aarch64_dot_conv.py runs the kernel under qemu against numpy): the tile
rule, the policy's choice per class and the instructions of the hot loop.
"""
import collections
import re

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.target import codegen

import tvm_ext
from tvm_ext.arm import dot_conv, int8_policy
from tvm_ext.testing.aarch64 import TARGETS

_INDEXED_DOT = re.compile(r"^\s+[su]dot\s+v\d+\.4s, v\d+\.16b, v\d+\.4b\[[0-3]\]", re.M)

needs_aarch64 = pytest.mark.skipif("aarch64" not in list(codegen.llvm_get_targets()),
                                   reason="this TVM's LLVM has no AArch64 back end")


@pytest.mark.parametrize("form, oc_chunks, quads, out_height, tile", [
    ("sdot", 16, 14, 1, (2, 2, 1)), ("sdot", 16, 7, 1, (4, 1, 1)), ("sdot", 5, 3, 1, (5, 1, 1)),
    ("sdot", 1, 14, 1, (1, 5, 1)), ("sdot", 6, 1, 1, (3, 1, 1)), ("smull", 16, 14, 1, (1, 2, 1)),
    ("smull", 16, 7, 1, (2, 1, 1)), ("smull", 5, 3, 1, (1, 1, 1)),
    # rows of 28 pixels (7 groups): two rows of one group, where two groups would compute 32 columns
    ("smull", 16, 7, 28, (1, 1, 2)), ("sdot", 16, 7, 28, (2, 1, 2)),
    # rows of 56: two groups of one row cost what two rows of one group do; the tie keeps one row
    ("smull", 16, 14, 56, (1, 2, 1)), ("sdot", 16, 14, 56, (2, 2, 1)),
    ("smull", 128, 2, 7, (1, 2, 1)),  # 7 rows: only 1 and 7 divide them
])
def test_register_tile(form, oc_chunks, quads, out_height, tile):
    """The tile that fits the registers and costs least: padding columns, loads and loop per multiply."""
    blocks, groups, rows = dot_conv.register_tile(oc_chunks, quads, form, out_height=out_height)
    assert (blocks, groups, rows) == tile
    assert oc_chunks % blocks == 0 and out_height % rows == 0
    assert dot_conv._registers(form, blocks, groups * rows) <= dot_conv._REGISTERS


@pytest.mark.parametrize("data, kernel, dtypes, why", [
    ((1, 4, 8, 8, 8), (4, 4, 3, 3, 2, 4, 4), ("int8", "int8"), "not NCHW4c"),
    ((1, 4, 8, 8, 4), (4, 4, 3, 3, 1, 2, 4), ("int8", "int8"), "not OIHW1i4o4i"),
    ((1, 4, 8, 8, 4), (4, 4, 3, 3, 1, 4, 4), ("uint8", "int8"), "no instruction takes"),
    ((1, 4, 3, 3, 4), (4, 4, 3, 3, 1, 4, 4), ("int8", "int8"), "narrower than a group of 4"),
])
def test_operands_it_cannot_take_say_why(data, kernel, dtypes, why):
    out_width = dot_conv.output_width(data[3], kernel[3], 1, (1, 1), 1)
    assert why in dot_conv.check_operands(data, kernel, *dtypes, out_width=out_width)
    from tvm import te
    with pytest.raises(ValueError, match=why):
        dot_conv.conv2d_nchwc_dot(te.placeholder(data, dtypes[0]), te.placeholder(kernel, dtypes[1]),
                                  (1, 1), (1, 1), (1, 1))


def _conv(channels=64, out_channels=64, size=14, k=3):
    rng = np.random.default_rng(channels)
    x = relay.var("x", shape=(1, channels, size, size), dtype="uint8")
    w = relay.const(rng.integers(-127, 128, (out_channels, channels, k, k)).astype("int8"))
    y = relay.qnn.op.conv2d(x, w, relay.const(77), relay.const(0), relay.const(0.02), relay.const(0.01),
                            kernel_size=(k, k), channels=out_channels, padding=(k // 2, k // 2), out_dtype="int32")
    y = relay.qnn.op.requantize(y, relay.const(0.0002), relay.const(0), relay.const(0.05), relay.const(3),
                                out_dtype="uint8")
    return tvm.IRModule.from_expr(relay.Function([x], y))


def _loops(asm: str) -> list:
    """Each loop body (label to its backward branch) of the listing as a list of instruction lines."""
    lines, labels, loops = asm.splitlines(), {}, []
    for i, line in enumerate(lines):
        m = re.match(r"^([.\w$]+):", line)
        if m:
            labels[m.group(1)] = i
        m = re.match(r"^\s+b(?:\.\w+)?\s+([.\w$]+)\s*$", line) or re.match(r"^\s+(?:cbn?z|tbn?z)\s.*,\s*([.\w$]+)\s*$",
                                                                          line)
        if m and m.group(1) in labels and labels[m.group(1)] < i:
            loops.append([x for x in lines[labels[m.group(1)] + 1:i + 1] if re.match(r"^\s+[a-z]", x)])
    return loops


def _hot_loop(factory, multiply=r"[su]dot|smull2?"):
    """The loop with the most multiplies of the pattern."""
    def count(body):
        return sum(bool(re.match(rf"^\s+(?:{multiply})\s+v\d+\.(?:4s|8h)", x)) for x in body)
    return max(_loops(factory.get_lib().get_source("asm")), key=count)


@needs_aarch64
@pytest.mark.parametrize("k", [
    1,
    # the 3x3 conv's loop; [1] checks the +dotprod tile's loop, and
    # test_neon_only_hot_loop_accumulates_pairs_in_independent_registers[3] a 3x3 tile's loop, in the default tier
    pytest.param(3, marks=pytest.mark.slow)])
def test_dotprod_hot_loop_has_independent_accumulators(k):
    """TVM's schedule sums every sdot of a loop into one register; the tile spreads them over 16."""
    body = _hot_loop(tvm_ext.build(_conv(k=k), target=TARGETS["neoverse-n1"], kernels=True))
    dots = [x for x in body if re.match(r"^\s+sdot\s", x)]
    accumulators = {re.match(r"^\s+sdot\s+(v\d+)", x).group(1) for x in dots}
    assert len(dots) >= 16 and len(accumulators) >= 16, body
    assert all(".4b[" in x for x in dots), "the data operand is a lane of one 16-byte load"
    ops = collections.Counter(x.split()[0] for x in body)
    assert not ops["ld1r"], "no broadcast loads (they take a vector pipe on Neoverse-N1)"
    assert ops["str"] + ops["stp"] + ops["stur"] == 0, f"accumulators spilled: {dict(ops)}"


@needs_aarch64
@pytest.mark.parametrize("k", [
    # the 1x1 conv's loop; [3] checks the NEON-only tile's loop, and
    # test_dotprod_hot_loop_has_independent_accumulators[1] a 1x1 tile's loop, in the default tier
    pytest.param(1, marks=pytest.mark.slow),
    3])
def test_neon_only_hot_loop_accumulates_pairs_in_independent_registers(k):
    """Without a dot product: smull/smull2 and sadalp into 16 accumulators, no saddlp + add."""
    body = _hot_loop(tvm_ext.build(_conv(k=k), target=TARGETS["cortex-a72"], kernels=True))
    ops = collections.Counter(x.split()[0] for x in body)
    accumulators = {re.match(r"^\s+sadalp\s+(v\d+)", x).group(1) for x in body if re.match(r"^\s+sadalp\s", x)}
    assert ops["smull"] + ops["smull2"] >= 16 and ops["sadalp"] == ops["smull"] + ops["smull2"], dict(ops)
    assert len(accumulators) >= 16 and not ops["saddlp"], dict(ops)
    assert ops["str"] + ops["stp"] + ops["stur"] == 0, f"accumulators spilled: {dict(ops)}"


@needs_aarch64
def test_rows_narrower_than_a_pixel_group_keep_tvms_kernel():
    """A conv on a 3x3 map (a squeeze-excite conv on a pooled map has 1x1): every tile would be an edge."""
    asm = tvm_ext.build(_conv(size=3), target=TARGETS["neoverse-n1"], kernels=True).get_lib().get_source("asm")
    assert re.search(r"^\s+sdot\s", asm, re.M) and not _INDEXED_DOT.search(asm)


@needs_aarch64
def test_the_policy_record_switches_the_kernel(monkeypatch):
    """Without ``conv_tile`` the +dotprod conv is TVM's again (one accumulator, broadcast loads)."""
    import dataclasses

    by_class = dict(int8_policy._BY_CLASS)
    by_class["aarch64_dotprod"] = dataclasses.replace(by_class["aarch64_dotprod"], conv_tile="")
    monkeypatch.setattr(int8_policy, "_BY_CLASS", by_class)
    body = _hot_loop(tvm_ext.build(_conv(), target=TARGETS["neoverse-n1"], kernels=True))
    dots = [x for x in body if re.match(r"^\s+sdot\s", x)]
    assert not any(".4b[" in x for x in dots), body


@pytest.mark.parametrize("oc_chunks, quads, tile", [(16, 28, (2, 2, 1)), (2, 3, (2, 1, 1)), (6, 5, (2, 2, 1))])
def test_register_tile_in_whole_nchw8c_blocks(oc_chunks, quads, tile):
    """NCHW8c output (+i8mm): the tile takes whole blocks of 8 channels, two of 4 each."""
    assert dot_conv.register_tile(oc_chunks, quads, "sdot", halves=2) == tile


@needs_aarch64
def test_i8mm_four_channel_conv_takes_the_tile_in_nchw8c():
    """A conv of 3 input channels (padded to 4) at +i8mm writes NCHW8c for the smmla convs after it, from
    the register tile's lane-indexed sdot (TVM's NCHWc schedule: one accumulator)."""
    asm = tvm_ext.build(_conv(3, 32, 16, 7), target=TARGETS["neoverse-v1"], kernels=True).get_lib().get_source("asm")
    assert len(_INDEXED_DOT.findall(asm)) >= 16, "not the register tile"


@needs_aarch64
def test_i8mm_keeps_the_matrix_kernel():
    """The +i8mm record's conv tile takes only convs that keep the dot product: 8-channel convs take smmla."""
    asm = tvm_ext.build(_conv(), target=TARGETS["neoverse-v1"], kernels=True).get_lib().get_source("asm")
    assert re.search(r"^\s+smmla\s", asm, re.M) and not _INDEXED_DOT.search(asm)


@pytest.mark.parametrize("task_name, form, cpu, rows", [("DOT_TASK", "sdot", "neoverse-n1", {1, 3}),
                                                         ("WIDENING_TASK", "smull", "cortex-a72", {1})])
def test_tuning_searches_the_tile_knobs(task_name, form, cpu, rows):
    """``tvm-ext tune --rpc`` records the kernels' workloads (their tasks are aarch64 conv tasks) and every
    point of their space that fits the registers builds."""
    from tvm import autotvm, te
    from tvm_ext.arm import tuning

    name = getattr(tuning, task_name)
    assert name in tuning.CONV_TASKS
    data, kernel = te.placeholder((1, 8, 9, 9, 4), "int8"), te.placeholder((16, 8, 3, 3, 1, 4, 4), "int8")
    args = (data, kernel, (1, 1), (1, 1, 1, 1), (1, 1), "int32")
    target = tvm.target.Target(TARGETS[cpu])
    task = autotvm.task.create(name, args=autotvm.task.topi_integration.serialize_args(args), target=target)
    points = [task.config_space.get(i) for i in range(len(task.config_space))]
    knobs = {(c["tile_blocks"].val, c["tile_quads"].val, c["tile_rows"].val) for c in points}
    assert dot_conv.register_tile(16, 3, form, out_height=9) in knobs and len(knobs) >= 4, knobs
    # rows per tile: the divisors of 9 whose tiles fit (three rows of smull's 8 accumulators per group do not)
    assert {r for _, _, r in knobs} == rows
    built = 0
    for cfg in points:
        needs = dot_conv._registers(form, cfg["tile_blocks"].val, cfg["tile_quads"].val * cfg["tile_rows"].val)
        if needs > dot_conv._REGISTERS:
            with pytest.raises(autotvm.task.space.InstantiationError):
                task.instantiate(cfg)
            continue
        with target:
            task.instantiate(cfg)
        built += 1
    assert built >= 3
