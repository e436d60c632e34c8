"""The tvm-ext command line: help everywhere, reports, and one-line errors with exit code 2."""
import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_ext.tools.cli import main


def tiny_onnx(path):
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])
    relu = helper.make_node("Relu", ["c"], ["y"])
    graph = helper.make_graph(
        [node, relu], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, path)
    return path


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "tvm_ext.tools.cli", *args],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("cmd", [[], ["report"], ["passes"], ["patterns"], ["zoo"], ["bench"], ["tune"]])
def test_help(cmd):
    r = run_cli(*cmd, "--help")
    assert r.returncode == 0 and "usage: tvm-ext" in r.stdout


def test_report_json(tmp_path, capsys):
    model = tiny_onnx(tmp_path / "tiny.onnx")
    assert main(["report", str(model), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_kernels"] >= 1 and out["num_anchor_kernels"] == 1
    assert "contrib_conv2d_NCHWc" in " ".join(op for k in out["kernels"] for op in k["ops"])


@pytest.mark.parametrize("target", [None, "llvm -mcpu=znver4", "llvm -mcpu=x86-64-v3"])
def test_report_builds_for_the_target_tvm_ext_build_uses(tmp_path, capsys, target):
    """report (and explain, tune) resolve --target as tvm_ext.build does: the report shows the build
    that `compile` and `bench` make (AVX-512 VNNI kept where tvm_ext.x86.int8_conv builds it), not a
    VNNI-masked one. Compiles only: nothing built for a foreign CPU runs here."""
    from tvm_ext.x86.target import build_target

    model = tiny_onnx(tmp_path / "m.onnx")
    assert main(["report", str(model), "--json", *(["--target", target] if target else [])]) == 0
    assert json.loads(capsys.readouterr().out)["target"] == str(build_target(target))


def test_report_table(tmp_path, capsys):
    model = tiny_onnx(tmp_path / "tiny.onnx")
    assert main(["report", str(model), "--opt-level", "2"]) == 0
    out = capsys.readouterr().out
    assert "kernels" in out and "nn.conv2d" in out


def _one_line_error(r, text):
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and text in lines[0], r.stderr


def test_missing_file():
    _one_line_error(run_cli("report", "/nonexistent/model.onnx"), "no such file")


def test_not_onnx(tmp_path):
    bad = tmp_path / "model.onnx"
    bad.write_text("this is not a protobuf at all \x00\xff")
    _one_line_error(run_cli("report", str(bad)), "not an ONNX model")


def test_unknown_pass(tmp_path):
    model = tiny_onnx(tmp_path / "tiny.onnx")
    _one_line_error(run_cli("report", str(model), "--passes", "NoSuchPass"), "unknown pass 'NoSuchPass'")


def test_bad_shape_flag(tmp_path):
    model = tiny_onnx(tmp_path / "tiny.onnx")
    _one_line_error(run_cli("report", str(model), "--shape", "x"), "--shape")


def test_passes_lists_registered():
    r = run_cli("passes")
    assert r.returncode == 0


@pytest.mark.parametrize("numerics", [None, "tvm", "onnxruntime"])
def test_passes_pipeline_lists_every_pass_in_order_with_its_reason(capsys, numerics):
    """`tvm-ext passes --pipeline int8 [--numerics N]` prints the pipeline's table: per stage, every
    pass in order (numbered), the target families it is limited to, what it does and why it stands
    there."""
    from tvm_ext.core import pipelines

    assert main(["passes", "--pipeline", "int8", *(["--numerics", numerics] if numerics else [])]) == 0
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    stages = pipelines.int8_stages(numerics or "tvm")
    assert flat.startswith(pipelines.int8(numerics=numerics or "tvm").name)
    for stage in stages:
        at = flat.index(f"{stage.key} (Sequential")
        for i, step in enumerate(stage.steps, 1):
            where = f" [only at {', '.join(step.families)} targets]" if step.families else ""
            at = flat.index(f"{i}. {step.label}{where} does:", at)
            why = " ".join(step.why.replace("``", "").split())
            assert flat.index(why, at) == flat.index("order: ", at) + len("order: "), step.name
    assert ("RoundHalfToEven" in out) == (numerics == "onnxruntime")
    assert "PadChannelsAtProducer   [only at x86, aarch64 targets]" in out  # a CPU-kernel step is marked


def test_passes_numerics_needs_a_pipeline():
    _one_line_error(run_cli("passes", "--numerics", "onnxruntime"), "--numerics selects a variant of --pipeline int8")


def test_tune_usage_errors(tmp_path):
    _one_line_error(run_cli("tune"), "give one ONNX model, or --zoo")
    model = tiny_onnx(tmp_path / "tiny.onnx")
    _one_line_error(run_cli("tune", str(model), "--budget", "0"), "--budget")
    _one_line_error(run_cli("tune", str(model), "--target", "llvm -mtriple=aarch64-linux-gnu"),
                    "is for aarch64, which cannot run here; give --rpc HOST[:PORT]")


def test_tune_a_float_model_writes_no_records(tmp_path):
    """A model without int8 convs or denses: nothing to tune, said plainly, exit 0."""
    model = tiny_onnx(tmp_path / "tiny.onnx")
    out = tmp_path / "records.log"
    r = run_cli("tune", str(model), "--budget", "1", "--no-layouts", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "0 conv layouts, 0 conv schedules, 0 depthwise, 0 dense" in r.stdout and "wrote 0 records" in r.stdout
