"""``tvm_ext.explain`` and ``tvm-ext report`` at ``opencl`` agree with the built module: the same kernels,
with the graph executor's names of ``lib.kernel_report``. Compile only: no OpenCL device is needed.

At GPU targets FuseOps also limits a kernel's arguments (the target's ``max_function_args``) and
postpones fusions until their readers are grouped; the explainer's FuseOps replay follows it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.tools.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_cli import tiny_onnx  # noqa: E402


def _names(kernels):
    return sorted(k.name for k in kernels)


def test_report_cli_at_opencl_counts_the_built_kernels(tmp_path, capsys):
    model = tiny_onnx(tmp_path / "tiny.onnx")
    assert main(["report", str(model), "--json", "--target", "opencl", "--pipeline", "int8"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["target"].split()[0] == "opencl"
    from tvm_ext.core.frontend import from_onnx
    import onnx

    mod, params = from_onnx(onnx.load(str(model)))
    lib = tvm_ext.build(mod, target="opencl", params=params, passes=pipelines.int8())
    assert out["num_kernels"] == lib.kernel_report.num_kernels >= 1
    assert sorted(k["name"] for k in out["kernels"]) == _names(lib.kernel_report.kernels)


@pytest.mark.slow
@pytest.mark.parametrize("passes", ["stock", "int8"])
def test_explain_at_opencl_agrees_with_the_built_module(passes):
    """Small QDQ ResNet-50: stock TVM's FuseOps at opencl postpones the pool's fusions (max_function_args),
    giving one kernel from the global pool to the dense's input; the replay gives the same kernels."""
    from tvm_ext.tools import zoo

    m = zoo.load("resnet50_int8_qdq", small=True)
    chosen = pipelines.int8() if passes == "int8" else ()
    ex = tvm_ext.explain(m.mod, "opencl", m.params, passes=chosen, compile=True)
    assert ex.verified, ex.verify_note
    assert len(ex.kernels) == ex.kernel_report.num_kernels
    # the graph executor's names: the built function, or "__nop" for a reshape-only kernel it does not launch
    assert sorted(k.func_name for k in ex.kernels) == sorted(k.func_name for k in ex.kernel_report.kernels)


def test_reshape_only_kernel_is_counted_as_not_launched():
    """pool -> reshape -> dense at opencl: the reshape is a kernel of its own, which the graph executor
    aliases (``__nop``); report and explain count it and say it is not launched."""
    import numpy as np
    import tvm
    from tvm import relay

    x = relay.var("x", shape=(1, 8, 4, 4))
    flat = relay.reshape(relay.nn.global_avg_pool2d(relay.nn.relu(x)), (1, 8))
    out = relay.nn.dense(flat, relay.const(np.ones((4, 8), "float32")))
    mod = tvm.IRModule.from_expr(relay.Function([x], out))
    report = tvm_ext.build(mod, target="opencl").kernel_report
    nops = [k for k in report.kernels if k.func_name == "__nop"]
    assert len(nops) == 1 and report.num_launched_kernels == report.num_kernels - 1
    assert f"{report.num_launched_kernels} launched, 1 reshape-only __nop" in report.summary()
    assert report.to_dict()["num_launched_kernels"] == report.num_launched_kernels
    ex = tvm_ext.explain(mod, "opencl", compile=True)
    assert ex.verified, ex.verify_note
    assert f"{report.num_launched_kernels} launched, 1 reshape-only __nop" in ex.summary()
