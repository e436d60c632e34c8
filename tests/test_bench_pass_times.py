"""benchmarks/pass_times.py: every pass of one tvm_ext.build timed (smoke run on a tiny model)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from _scripts import load_script

SCRIPT = Path(__file__).parents[1] / "benchmarks/pass_times.py"


def _script_module():
    return load_script("benchmarks/pass_times.py")


@pytest.fixture(scope="module")
def conv_relu(tmp_path_factory):
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                           helper.make_node("Relu", ["c"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], [w])
    path = tmp_path_factory.mktemp("pass_times") / "conv_relu.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          check=True).stdout


def test_summary_adds_runs_per_pass_and_separates_nested_time():
    runs = [("A", 1, 0.5, 0.5), ("B", 1, 0.25, 0.25), ("A", 1, 1.0, 1.0), ("seq", 0, 2.0, 0.25)]
    rows = {r["pass"]: r for r in _script_module().summarize(runs)}
    assert rows["A"] == {"pass": "A", "runs": 2, "total_s": 1.5, "self_s": 1.5, "max_s": 1.0}
    assert rows["seq"]["self_s"] == 0.25 and rows["seq"]["total_s"] == 2.0
    assert [r["pass"] for r in _script_module().summarize(runs)] == ["seq", "A", "B"], "largest total first"


@pytest.mark.slow  # the whole int8 pipeline timed pass by pass: minutes on 2 cores
def test_int8_pipeline_build_lists_its_passes(conv_relu, tmp_path):
    out = _run(conv_relu, "--min-seconds", "0", "--json", tmp_path / "t.json")
    table = {line.split("|")[1].strip(): line
             for line in out.splitlines() if line.startswith("| ") and "---" not in line}
    for name in ("tvm_ext.int8.start", "QDQToInteger", "tvm_ext.int8.before_fuse", "TabulateEightBit", "FuseOps"):
        assert name in table, (name, out)
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["kernels"] > 0 and data["build_s"] > 0
    assert all(r["total_s"] >= r["self_s"] - 1e-9 and r["runs"] >= 1 for r in data["passes"])
    nested = [r for r in data["runs"] if r["pass"] == "QDQToInteger"]
    assert nested and all(r["depth"] > 0 for r in nested), "a pipeline's passes run inside its Sequential"
    assert f"{data['kernels']} kernels, {len(data['runs'])} pass runs" in out


def test_no_pipeline_runs_no_tvm_ext_pass(conv_relu):
    out = _run(conv_relu, "--pipeline", "none", "--min-seconds", "0")
    assert "| FuseOps |" in out and "QDQToInteger" not in out and "tvm_ext.int8" not in out
