"""What bounds a hot loop in llvm-mca's model (``tvm_ext.tools.mca._llvm_mca.Limit``), its spills, and
``benchmarks/kernel_mca.py --limits``' grouping.

The loops are written by hand so that each has one known bound; llvm-mca runs on them (nothing is
executed), so the classification is checked against the model's own report.
"""
import importlib.util
from pathlib import Path

import pytest

from tvm_ext.tools import mca
from tvm_ext.tools.mca import _asm, _llvm_mca, _peak

from _mca_marks import needs_mca


_AARCH64, _X86 = "aarch64-linux-gnu", "x86_64-unknown-linux-gnu"

#: 12 independent ``sdot``: two vector pipes at Neoverse-N1, nothing else on them.
_INDEPENDENT_SDOT = "".join(f"sdot v{i}.4s, v20.16b, v21.16b\n" for i in range(12)) + \
    "subs x0, x0, #1\nb.ne .L0\n"

#: four ``vpdpbusd`` into one accumulator: a chain of four latencies per iteration.
_ONE_CHAIN = "vpdpbusd %zmm1, %zmm2, %zmm3\n" * 4 + "decq %rax\njne .L0\n"

#: a depthwise tile's shape at Neoverse-N1: LLVM's model makes a paired q load 3 micro-ops and a q store 4,
#: each dispatched in one cycle, so 3-wide dispatch leaves slots unused while the vector pipes have room.
_PAIRS_AND_STORES = """\
ldp q19, q24, [x5]
ldp q21, q25, [x5, #416]
ldp q22, q23, [x5, #832]
movi v18.2d, #0000000000000000
movi v20.2d, #0000000000000000
movi v17.2d, #0000000000000000
tbl v19.16b, { v19.16b }, v26.16b
tbl v21.16b, { v21.16b }, v26.16b
tbl v22.16b, { v22.16b }, v26.16b
sdot v18.4s, v19.16b, v0.16b
sdot v20.4s, v21.16b, v1.16b
sdot v17.4s, v22.16b, v2.16b
str q18, [x6]
str q20, [x6, #256]
str q17, [x6, #512]
add x5, x5, #4
add x6, x6, #16
subs x4, x4, #1
b.ne .L0
"""


@needs_mca
def test_independent_dots_are_bound_by_their_units():
    r = _llvm_mca.run(_INDEPENDENT_SDOT, _AARCH64, "neoverse-n1")
    lim = r.limit
    assert lim.kind == "resources", lim
    assert set(lim.resources) == {"N1UnitV0", "N1UnitV1"}
    assert lim.users[0][0] == "sdot" and lim.users[0][1] == pytest.approx(6.0, abs=0.1)
    assert lim.resource_cycles == pytest.approx(r.cycles_per_iteration, rel=0.05)
    assert r.bound == "ports N1UnitV0/N1UnitV1"
    assert str(lim).startswith("units N1UnitV0/N1UnitV1: 6.0 of")


@needs_mca
def test_one_accumulator_chain_is_latency():
    r = _llvm_mca.run(_ONE_CHAIN, _X86, "cascadelake")
    lim = r.limit
    assert lim.kind == "latency", lim
    assert lim.resource_cycles < 0.5 * r.cycles_per_iteration
    assert lim.dependencies > 0.5
    assert r.bound == "dependencies"
    assert "data dependencies" in str(lim)


@needs_mca
def test_multi_micro_op_instructions_make_a_loop_dispatch_bound():
    r = _llvm_mca.run(_PAIRS_AND_STORES, _AARCH64, "neoverse-n1")
    lim = r.limit
    assert lim.kind == "dispatch", lim
    assert lim.dispatch_width == 3
    assert lim.uops == 3 * 3 + 3 * 4 + 13  # ldp q, str q and the 13 instructions of one micro-op
    assert lim.resource_cycles < 0.9 * r.cycles_per_iteration
    assert lim.idle_dispatch < 0.1 * r.cycles_per_iteration
    assert str(lim).startswith("dispatch: 34 micro-ops, 3 a cycle at most")


@needs_mca
def test_peak_loops_are_bound_by_their_dot_units():
    """The peak loops (12 independent dots of the peak form) read as resource-bound by the dot itself at
    every CPU model, so the limit agrees with what the peak means."""
    for cpu in ("znver4", "cascadelake", "x86-64-v3", "neoverse-n1", "neoverse-v1", "cortex-a72"):
        p = _peak.peak(cpu)
        model = mca.cpu_model(cpu)
        r = _llvm_mca.run(_peak.loop_text(p.form), model.triple, model.mcpu, model.mattr)
        assert r.limit.kind == "resources", (cpu, r.limit)
        assert r.limit.users[0][0] == p.form.split()[0], (cpu, r.limit)


def test_report_without_pressure_views_has_no_limit():
    r = _llvm_mca.parse("Iterations: 100\nInstructions: 400\nTotal Cycles: 250\nBlock RThroughput: 2.0\n")
    assert r.limit is None and r.bound == ""


def test_stack_accesses_count_spills_and_reloads():
    hot = _asm.HotLoop("k", "f", ("ldp q0, q1, [sp, #32]", "str q2, [sp]", "ldr q3, [x0, #16]",
                                  "vmovdqu64 %zmm1, -64(%rsp)", "vpdpbusd (%rsp,%rax), %zmm2, %zmm3",
                                  "vmovdqu64 (%rsi), %zmm4"))
    assert hot.stack_accesses == 4


def _kernel_mca():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "kernel_mca.py"
    spec = importlib.util.spec_from_file_location("kernel_mca", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _estimate(name, share, limit, macs=10**6):
    """A kernel whose hot loop does 100 MACs an iteration at ``share`` of a 100-MAC-a-cycle peak."""
    peak = _peak.Peak("sdot", 100.0, 1.0)
    hot = _asm.HotLoop(name, name, ("sdot v0.4s, v1.16b, v2.16b",), {"sdot .4s": 1}, 100, 1)
    result = _llvm_mca.McaResult(100, int(100 / share), 1, 1.0, {}, 0, limit)
    return mca.KernelEstimate(name, macs, 1, hot, result, peak)


def test_limit_rows_group_loops_under_the_bar_by_their_limit():
    km = _kernel_mca()
    units = _llvm_mca.Limit("resources", 2.0, 4, 3, ("V0", "V1"), 2.0, (("sdot", 1.0), ("tbl", 1.0)))
    dispatch = _llvm_mca.Limit("dispatch", 2.0, 6, 3, ("V0",), 1.0, (("sdot", 1.0),))
    ks = [_estimate("a", 0.9, units), _estimate("b", 0.5, units), _estimate("c", 0.5, dispatch),
          _estimate("d", 0.25, units, macs=2 * 10**6)]
    an = mca.Analysis("neoverse-n1", ks[0].peak, ks)
    rows = km.limit_rows(an)
    body = [r.split(" | ") for r in rows[2:]]
    assert [b[0].lstrip("| ") for b in body] == ["at 85% of the peak or more", "units V0/V1", "dispatch"]
    # cycles: a 10**4 / 0.9, b 2 * 10**4, c 2 * 10**4, d 8 * 10**4
    total = 10**4 / 0.9 + 12 * 10**4
    assert body[1][1:4] == ["2", "3.0", f"{100 * 10 ** 5 / total:.0f}%"]
    assert body[1][4] == "30%"  # 3 MMAC at the peak: 3 * 10**4 cycles of 10**5
    assert body[1][5] == "sdot 50%, tbl 50%"


def test_limit_classes_tell_a_dot_form_rate_from_shared_units():
    km = _kernel_mca()
    own = _llvm_mca.Limit("resources", 2.0, 4, 3, ("V0",), 2.0, (("sdot", 1.8), ("add", 0.2)))
    shared = _llvm_mca.Limit("resources", 2.0, 4, 3, ("V0",), 2.0, (("sdot", 1.0), ("tbl", 0.6), ("str", 0.4)))
    latency = _llvm_mca.Limit("latency", 2.0, 4, 3, ("V0",), 0.5, (("sdot", 0.5),))
    ks = [_estimate("a", 0.9, own), _estimate("b", 0.5, own), _estimate("c", 0.5, shared),
          _estimate("d", 0.5, latency)]
    assert [km.limit_class(k) for k in ks] == ["at the bar", "dot form's rate", "units shared", "latency"]
    an = mca.Analysis("neoverse-n1", ks[0].peak, ks)
    summary = km.limit_summary(an)
    total = 10**4 / 0.9 + 3 * 2 * 10**4
    assert summary["dot form's rate"] == pytest.approx(2 * 10**4 / total, rel=1e-3)  # cycles are whole
    assert summary["dispatch"] == 0.0
    # the three loops under the bar weigh alike: tbl 0.6 / 2 of c's busy cycles, add 0.2 / 2 of b's
    assert summary["others"] == [("tbl", pytest.approx(0.1)), ("str", pytest.approx(0.2 / 3)),
                                 ("add", pytest.approx(0.1 / 3))]
    row = km.limit_summary_rows({"neoverse-n1": (an, summary)})[2]
    assert row.startswith("| neoverse-n1 | ") and "tbl 10%" in row
