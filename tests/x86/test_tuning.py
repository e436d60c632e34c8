"""tvm_ext.x86.tuning (records applied by tvm_ext.build) and tvm_ext.tools.tune (recording and search)."""
import json
import re

import numpy as np

import pytest
import tvm
from tvm import autotvm

import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.tools import _depthwise_task, _fused_timing, tune
from tvm_ext.x86 import depthwise_taps, tuning
from tvm_ext.x86 import int8_conv as x86_int8
from tvm_ext.x86.depthwise_taps import FORM_KNOB
from tvm_ext.x86.target import build_target
from tvm_ext.testing import qoperator_net, run_module

# the module's recorded and tuned builds are made once, on one worker
pytestmark = pytest.mark.xdist_group("tuning")


@pytest.fixture(scope="module")
def small():
    m = qoperator_net()  # three convs: the tuning flow, not a ResNet, is under test
    target = build_target()
    wls = tune.record_workloads(m.mod, m.params, target, pipelines.int8())
    return m, target, wls


@pytest.fixture(scope="module")
def records(small):
    _, target, wls = small
    lines, rows, hit = tune.tune_workloads(wls.conv[:2], target, number=2, repeat=1)
    return lines, rows, hit


@pytest.fixture(scope="module")
def some_records(small):
    """Records for two conv workloads (a non-default candidate each), independent of timing noise."""
    _, target, wls = small
    lines = []
    for wl in wls.conv[:2]:
        task = autotvm.task.create(wl[0], args=wl[1:], target=target)
        cfg = tune._conv_candidates(task)[-1]
        lines.append(autotvm.record.encode(autotvm.MeasureInput(target, task, cfg),
                                           autotvm.MeasureResult((1e-3,), 0, 0.0, 0.0)))
    return lines


@pytest.fixture(scope="module")
def plain(small):
    """The untuned build and its outputs on a seeded input."""
    m, target, _ = small
    x = {m.input_name: np.random.default_rng(0).standard_normal(m.input_shape).astype("float32")}
    lib = tvm_ext.build(m.mod, target, m.params, passes=pipelines.int8(), tuned=False)
    return lib, x, run_module(lib, x)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty user cache and no shipped records."""
    monkeypatch.setenv("TVM_EXT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tuning, "TUNED_DIR", tmp_path / "shipped")
    (tmp_path / "shipped").mkdir()
    return tmp_path


def test_recorded_workloads_are_layout_queries_and_compiled_convs(small):
    _, _, wls = small
    assert wls.conv and all(w[0] == tuning.TASK and len(w[1][1]) == 5 for w in wls.conv)
    assert wls.layout and all(w[0] == tuning.TASK and len(w[1][1]) == 4 for w in wls.layout)
    assert len(set(wls.conv)) == len(wls.conv)
    # FoldPadIntoConv ran before lowering: 3x3 convs carry their padding, not a padded input
    assert any(w[2][1][2:4] == (3, 3) and w[4] == (1, 1, 1, 1) for w in wls.conv)


def test_tuned_is_never_slower_than_tvms_rule_as_measured(small, records):
    _, _, wls = small
    lines, rows, hit = records
    assert not hit and len(rows) == 2
    for kind, _desc, base, best, cfg, _wl in rows:
        assert kind == "conv" and 0 < best <= base
        assert (best < base) == (cfg != "TVM's rule")
    for line in lines:  # a record only where a candidate beat TVM's rule, in the workload's layout
        inp, res = autotvm.record.decode(line)
        assert inp.task.workload in wls.conv[:2] and res.error_no == 0
        ents = inp.config._entity_map
        assert ents["tile_ic"].size[-1] == inp.task.workload[1][1][4]


def test_user_records_come_first(small, cache):
    _, target, wls = small
    wl = wls.conv[0]
    task = autotvm.task.create(wl[0], args=wl[1:], target=target)
    cands = tune._conv_candidates(task)
    assert len(cands) >= 2

    def rec(cfg, cost):
        return autotvm.record.encode(autotvm.MeasureInput(target, task, cfg),
                                     autotvm.MeasureResult((cost,), 0, 0.0, 0.0))

    tuning.shipped_path(target).write_text(rec(cands[0], 1e-6) + "\n")  # "faster", but shipped
    tune.write_records([rec(cands[1], 1.0)], target)
    assert tuning.user_path(target).is_file()
    with tuning.apply(target) as ctx, target:
        got = autotvm.task.DispatchContext.current.query(target, wl)
    assert str(got) == str(cands[1]) and ctx.hits == [wl]
    assert len(tuning.load_records(target)) == 1 and len(tuning.load_records(target, user=False)) == 1


def test_user_records_of_another_cpu_or_isa_are_ignored(small, some_records, cache):
    _, target, _ = small
    lines = some_records
    tune.write_records(lines, target)
    assert len(tuning.load_records(target, shipped=False)) == len(lines)
    host_cpu = str(target.attrs.get("mcpu", ""))
    other = tvm.target.Target(f"llvm -mcpu={'x86-64-v3' if host_cpu != 'x86-64-v3' else 'skylake-avx512'}")
    assert tuning.load_records(other, shipped=False) == []
    masked = tvm.target.Target(f"llvm -mcpu={host_cpu} -mattr=-avx512f")  # same CPU name, AVX2 code
    if tuning.target_key(masked) != tuning.target_key(target):
        assert tuning.load_records(masked, shipped=False) == []
    with tuning.apply(other, records=[]) as ctx:  # a null context: TVM's own rule
        assert not isinstance(ctx, autotvm.task.ApplyHistoryBest)


def test_tuned_build_keeps_bits_and_reports_tuned_kernels(small, some_records, plain, cache):
    m, target, _ = small
    lines = some_records
    tune.write_records(lines, target)
    lib, x, want = plain
    tuned = tvm_ext.build(m.mod, target, m.params, passes=pipelines.int8())
    for a, b in zip(run_module(tuned, x), want):
        np.testing.assert_array_equal(a, b)
    assert tuned.kernel_report.num_tuned_kernels >= len(lines) >= 1
    assert lib.kernel_report.num_tuned_kernels == 0
    assert all(k.anchor for k in tuned.kernel_report.kernels if k.tuned)
    assert "(tuned)" in tuned.kernel_report.table()


def test_layout_records_change_the_channel_blocking_and_keep_bits(small, plain, cache):
    m, target, wls = small
    recs = tune._layout_records(wls.layout, target, 32)
    assert recs and all(inp.config._entity_map["tile_oc"].size[-1] == 32 for inp, _ in recs)
    tune.write_records([autotvm.record.encode(i, r) for i, r in recs], target)
    blocked = tvm_ext.build(m.mod, target, m.params, passes=pipelines.int8())
    lib, x, want = plain
    assert "NCHW32c" in blocked.tvm_ext_module.astext() and "NCHW32c" not in lib.tvm_ext_module.astext()
    for a, b in zip(run_module(blocked, x), want):
        np.testing.assert_array_equal(a, b)


def test_kernel_nodes_are_the_kernels_reading_the_workloads_tensors(small, plain):
    _, _, wls = small
    lib = plain[0]
    report = lib.kernel_report
    graph_nodes = json.loads(lib.get_graph_json())["nodes"]
    nodes = _fused_timing.kernel_nodes(lib, wls.conv)
    for wl in wls.conv:
        found = nodes[wl]
        assert found, f"no kernel compiles {wl}"
        data, weight = [(tuple(a[1]), a[2]) for a in wl[1:] if isinstance(a, tuple) and a and a[0] == "TENSOR"][:2]
        names = {graph_nodes[i]["attrs"]["func_name"] for i in found}
        assert names == {k.func_name for k in report.kernels if data in k.inputs and weight in k.inputs}
    bogus = (wls.conv[0][0], ("TENSOR", (1, 3, 5, 5, 7), "uint8"), *wls.conv[0][2:])
    assert _fused_timing.kernel_nodes(lib, [bogus]) == {bogus: []}


def test_fused_kernel_ms_times_each_workloads_kernels_in_every_model(small, plain, some_records):
    m, target, wls = small
    recs = [autotvm.record.decode(line) for line in some_records]
    tuned = _fused_timing.build_with(m.mod, m.params, target, pipelines.int8(), recs)
    ms = _fused_timing.fused_kernel_ms({"untuned": plain[0], "tuned": tuned}, wls.conv, rounds=1, number=2, repeat=1)
    assert set(ms) == set(wls.conv)
    assert all(set(t) == {"untuned", "tuned"} and all(v > 0 for v in t.values()) for t in ms.values())


def test_a_record_not_faster_in_the_model_is_dropped(small, some_records, monkeypatch):
    """The check in the model keeps a record only where its kernels got 2 % faster there (times given, so that
    the rule, not the machine's noise, is under test)."""
    m, target, _ = small
    lines = some_records
    wls = [autotvm.record.decode(line)[0].task.workload for line in lines]
    given = {wls[0]: {"untuned": 1.0, "tuned": 0.9}, wls[1]: {"untuned": 1.0, "tuned": 0.99}}
    monkeypatch.setattr(tune, "fused_kernel_ms", lambda libs, workloads, **_: {w: given[w] for w in workloads})
    rows = [("conv", f"w{i}", 2.0, 1.0, "tile_ow=[-1, 7]", wl) for i, wl in enumerate(wls)]
    said = []
    keep, out_rows = tune._confirm_in_model(m.mod, m.params, target, pipelines.int8(), [], lines, rows, said.append,
                                            2, 1)
    assert keep == lines[:1]
    assert out_rows[0] == rows[0]
    assert out_rows[1][3] == out_rows[1][2] and out_rows[1][4].startswith("TVM's rule (the tuned config took 0.99x")
    assert any("kept" in s for s in said) and any("dropped" in s for s in said)


@pytest.fixture(scope="module")
def mobile():
    """A mobile net's block (8-bit 1x1 conv -> 3x3 depthwise conv -> 1x1 conv) and its recorded workloads."""
    from ._int8_cases import _conv_depthwise_conv

    mod = _conv_depthwise_conv(channels=32, size=14)
    target = build_target()
    return mod, target, tune.record_workloads(mod, None, target, pipelines.int8())


def _depthwise_record(target, wl):
    """A record of ``wl`` with its last layout-free candidate (whatever its speed)."""
    task = _depthwise_task.create(wl, target)
    cfg = tune._conv_candidates(task)[-1]
    return autotvm.record.encode(autotvm.MeasureInput(target, task, cfg), autotvm.MeasureResult((1e-3,), 0, 0.0, 0.0))


def test_depthwise_workloads_are_recorded_with_their_layout_free_knobs(mobile):
    """The 8-bit depthwise conv's NCHWc workload is recorded; its candidates keep the compiled block
    (``tile_ic`` = ``tile_oc`` = the data's) and differ in ``tile_ow`` x ``unroll_kw`` x the tap form
    (``regroup_taps``, both forms searched, the target's first)."""
    _, target, wls = mobile
    assert [w[0] for w in wls.depthwise] == [tuning.DEPTHWISE_TASK]
    wl = wls.depthwise[0]
    assert len(wl[1][1]) == 5 and (wl[1][2], wl[2][2]) == ("uint8", "int8")
    block = wl[1][1][4]
    cands = tune._conv_candidates(_depthwise_task.create(wl, target))
    assert len(cands) >= 2
    assert all(c._entity_map["tile_ic"].size[-1] == block == c._entity_map["tile_oc"].size[-1] for c in cands)
    knobs = {(str(c._entity_map["tile_ow"]), str(c._entity_map["unroll_kw"]), str(c._entity_map.get(FORM_KNOB)))
             for c in cands}
    assert len(knobs) == len(cands)


@pytest.mark.parametrize("cpu", ["cascadelake", "icelake-server"])
def test_depthwise_tasks_time_the_tap_kernels_in_both_forms(cpu):
    """Compile only: the task ``tvm-ext tune`` times is the kernel the build compiles (``vpdpbusd`` per 4 taps,
    not TVM's ``vpdpwssd`` per tap), and its candidates hold both tap forms, the target's first
    (``regroup_taps``), each building the form it names."""
    from ._int8_cases import _conv_depthwise_conv

    target = tvm.target.Target(f"llvm -mcpu={cpu}")
    wl = tune.record_workloads(_conv_depthwise_conv(channels=32, size=14), None, target, pipelines.int8()).depthwise[0]
    cands = tune._conv_candidates(_depthwise_task.create(wl, target))
    forms = [c._entity_map[FORM_KNOB].val for c in cands]
    assert set(forms) == {True, False} and forms[0] is depthwise_taps.regroups(target)
    task = _depthwise_task.create(wl, target)
    for regrouped in (True, False):
        with x86_int8.kernels(), target:
            sch, bufs = task.instantiate(cands[forms.index(regrouped)])
            asm = tvm.build(sch, bufs, target=target).get_source("asm")
        assert "vpdpbusd" in asm and "vpdpwssd" not in asm
        padded = bufs[-1].op.input_tensors[0].op.name
        assert padded == ("taps_grouped_data" if regrouped else "taps_padded_data"), padded


def test_a_depthwise_record_is_applied_and_keeps_results_exact(mobile, cache):
    """The build applies a depthwise record (its kernel alone is marked tuned) and computes what plain
    ``llvm`` (no int8 SIMD) computes, bit for bit."""
    mod, target, wls = mobile
    tune.write_records([_depthwise_record(target, wls.depthwise[0])], target)
    tuned = tvm_ext.build(mod, target, passes=pipelines.int8())
    assert tuned.kernel_report.num_tuned_kernels == 1
    x = {"x": np.random.default_rng(1).integers(0, 256, (1, 32, 14, 14)).astype("uint8")}
    for a, b in zip(run_module(tuned, x), run_module(mod, x)):
        np.testing.assert_array_equal(a, b)


def test_depthwise_workloads_are_tuned_as_their_own_kind(mobile):
    _, target, wls = mobile
    lines, rows, hit = tune.tune_workloads(wls.depthwise, target, number=2, repeat=1)
    assert not hit and [r[0] for r in rows] == ["depthwise"] and rows[0][1].startswith("depthwise data [1, ")
    assert 0 < rows[0][3] <= rows[0][2] and len(lines) == (rows[0][4] != "TVM's rule")


@pytest.mark.parametrize("isa, cpus", [
    ("avx2", ["x86-64-v3", "haswell", "znver3", "alderlake"]),
    ("avx512_vnni", ["znver4", "icelake-server", "cascadelake", "sapphirerapids -mattr=-amx-int8,-amx-tile,-amx-bf16"]),
])
def test_shipped_records_are_keyed_by_instruction_set_not_cpu(isa, cpus):
    """Every CPU of a class, AMD or Intel, finds the class's shipped records, all of them."""
    path = tuning.TUNED_DIR / f"x86_int8_{isa}.log"
    assert path.is_file(), f"no records shipped for {isa}"
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    for cpu in cpus:
        target = tvm.target.Target(f"llvm -mcpu={cpu}")
        assert tuning.shipped_path(target) == path, cpu
        recs = tuning.load_records(target, user=False)
        assert recs and all(inp.task.name in tuning.TASKS for inp, _ in recs)
        assert len(recs) == len(lines), f"{cpu}: records of another instruction set in {path.name}"


def test_shipped_records_of_another_instruction_set_are_not_applied():
    avx512 = tvm.target.Target("llvm -mcpu=x86-64-v4")  # AVX-512 without VNNI: nothing shipped
    assert not tuning.shipped_path(avx512).is_file()
    assert tuning.load_records(avx512, user=False) == []


def test_tune_refuses_targets_that_do_not_run_here(small):
    m, _, _ = small
    with pytest.raises(ValueError, match="not an x86 CPU target"):
        tune.tune_model(m.mod, m.params, "llvm -mtriple=aarch64-linux-gnu", budget_s=1)


def test_tune_skips_a_workload_autotvm_cannot_describe(caplog):
    """``narrow_channel_blocks`` gives an AVX2 int8 conv with 24 output channels output block 8,
    which AutoTVM's int8 conv space (multiples of 16) cannot hold: tuning logs that it keeps TVM's
    rule for that workload and goes on, rather than raising."""
    import logging

    import tvm

    from tvm_ext.x86.isa import runs_on_host
    from tvm_ext.tools.tune import tune_model

    target = tvm.target.Target("llvm -mcpu=x86-64-v3")
    if not runs_on_host(target):
        pytest.skip("host lacks AVX2")
    from ._int8_cases import _narrow_blocks_graph

    with caplog.at_level(logging.WARNING, logger="tvm_ext.tools.tune"):
        result = tune_model(_narrow_blocks_graph(), target=target, budget_s=120, layouts=False, number=1, repeat=1)
    # the kernel as AlterOpLayout packs it, or packed in pairs (its weights can saturate vpmaddubsw:
    # tvm_ext.x86.exact_int8), which AutoTVM's space cannot describe either
    assert "not tuned (TVM's rule kept)" in caplog.text
    assert re.search(r"kernel \[3, 2, 3, 3, (4, 8, 4|8, 8, 2)\]", caplog.text), caplog.text
    assert result.rows  # the other int8 conv was tuned (or kept TVM's rule after timing)


@pytest.mark.parametrize("load, cores, threads, busy", [
    (0.1, 2, 1, False), (1.0, 2, 1, False), (1.1, 2, 1, True), (0.5, 2, 2, True), (7.0, 16, 8, False),
    (9.0, 16, 8, True)])
def test_busy_note_when_other_work_shares_the_cores(load, cores, threads, busy):
    note = tune.busy_note(load, cores, threads)
    assert (note is not None) == busy
    if busy:
        assert f"load average {load:.1f} on {cores} cores" in note and "tune while nothing else runs" in note


def test_tune_model_warns_on_a_busy_machine_before_timing(small, monkeypatch, caplog):
    import logging

    m, target, _ = small

    class Stop(Exception):
        pass

    def stop(*_a, **_k):
        raise Stop

    monkeypatch.setattr(tune.os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    monkeypatch.setattr(tune, "record_workloads", stop)  # nothing is built or timed
    said = []
    with caplog.at_level(logging.WARNING, logger="tvm_ext.tools.tune"), pytest.raises(Stop):
        tune.tune_model(m.mod, m.params, target, progress=said.append)
    assert said and said[0].startswith("warning: the machine is busy (load average 64.0")
    assert "the machine is busy" in caplog.text
    monkeypatch.setattr(tune.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    said.clear()
    with pytest.raises(Stop):
        tune.tune_model(m.mod, m.params, target, progress=said.append)
    assert not any("busy" in s for s in said)
