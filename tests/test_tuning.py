"""tvm_ext.tuning: recorded workloads, the candidate search, and records applied by tvm_ext.build."""
import numpy as np
import pytest
import tvm
from tvm import autotvm

import tvm_ext
from tvm_ext import pipelines, tuning, zoo
from tvm_ext.target import build_target
from tvm_ext.testing import run_module


@pytest.fixture(scope="module")
def small():
    m = zoo.load("resnet50_int8_qoperator", small=True)
    target = build_target()
    wls = tuning.record_workloads(m.mod, m.params, target, pipelines.int8())
    return m, target, wls


@pytest.fixture(scope="module")
def records(small, tmp_path_factory):
    _, target, wls = small
    lines = tuning.tune(wls[:2], target, number=2, repeat=1)
    path = tmp_path_factory.mktemp("tuned") / tuning.records_path(target).name
    path.write_text("\n".join(lines) + "\n")
    return path, lines


def test_recorded_workloads_are_the_compiled_nchwc_convs(small):
    _, _, wls = small
    assert wls and all(w[0] == tuning.TASK and len(w[1][1]) == 5 for w in wls)
    assert len(set(wls)) == len(wls)
    # FoldPadIntoConv ran before lowering: 3x3 convs carry their padding, not a padded input
    assert any(w[2][1][2:4] == (3, 3) and w[4] == (1, 1, 1, 1) for w in wls)


def test_tune_writes_one_record_per_workload_matching_the_layout(small, records):
    _, target, wls = small
    _, lines = records
    assert len(lines) == 2
    for line, wl in zip(lines, wls):
        inp, res = autotvm.record.decode(line)
        assert inp.task.workload == wl and res.error_no == 0 and res.costs[0] > 0
        ents = inp.config._entity_map
        assert ents["tile_ic"].size[-1] == wl[1][1][4] and ents["tile_oc"].size[-1] == 16


def test_apply_wins_over_alter_layout_update_and_keeps_bits(small, records, monkeypatch):
    m, target, wls = small
    path, lines = records
    monkeypatch.setattr(tuning, "TUNED_DIR", path.parent)
    assert len(tuning.load_records(target)) == 2
    want = autotvm.record.decode(lines[0])[0].config
    ctx = tuning.apply(target)
    with ctx, target:
        other = autotvm.task.space.FallbackConfigEntity()
        ctx.update(target, wls[0], other)  # what AlterOpLayout does for the NCHWc workload
        assert str(autotvm.task.DispatchContext.current.query(target, wls[0])) == str(want)
    x = {m.input_name: np.random.default_rng(0).standard_normal(m.input_shape).astype("float32")}
    tuned = tvm_ext.build(m.mod, target, m.params, passes=pipelines.int8())
    plain = tvm_ext.build(m.mod, target, m.params, passes=pipelines.int8(), tuned=False)
    for a, b in zip(run_module(tuned, x), run_module(plain, x)):
        np.testing.assert_array_equal(a, b)


def test_records_of_another_cpu_are_ignored(records, monkeypatch):
    path, _ = records
    monkeypatch.setattr(tuning, "TUNED_DIR", path.parent)
    host_cpu = str(build_target().attrs.get("mcpu", ""))
    other = tvm.target.Target(f"llvm -mcpu={'znver3' if host_cpu != 'znver3' else 'skylake-avx512'}")
    assert tuning.load_records(other) == []
    ctx = tuning.apply(other)
    with ctx:  # a null context: TVM's own rule
        assert not isinstance(ctx, autotvm.task.ApplyHistoryBest)


def test_shipped_records_load_for_their_cpu():
    target = build_target()
    path = tuning.records_path(target)
    if not path.is_file():
        pytest.skip(f"no records shipped for {path.name}")
    recs = tuning.load_records(target)
    assert recs and all(inp.task.name == tuning.TASK for inp, _ in recs)
