"""``tvm-ext report --ir relax``: float ONNX models through the Relax frontend and tvm_ext.relax.build."""
from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tvm_ext.tools.cli import main


def conv_bias_relu_onnx(path):
    # Conv(+bias) -> Relu -> Gemm: the generic table groups conv+bias+relu and gemm+bias
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w", (4, 3, 3, 3)), ("b", (4,)), ("g", (5, 256)), ("gb", (5,)))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("Gemm", ["f", "g", "gb"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "cbr", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def test_report_relax_json(tmp_path, capsys):
    model = conv_bias_relu_onnx(tmp_path / "m.onnx")
    assert main(["report", str(model), "--ir", "relax", "--tables", "generic", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ir"] == "relax" and out["tables"] == ["generic"]
    assert out["num_kernels"] == 2 and out["anchors"] == {"conv2d": 1, "matmul": 1}
    assert out["crossing"]["bytes"] == {"float32": 4 * 8 * 8 * 4}


def test_report_relax_table(tmp_path, capsys):
    model = conv_bias_relu_onnx(tmp_path / "m.onnx")
    assert main(["report", str(model), "--ir", "relax"]) == 0
    out = capsys.readouterr().out
    assert "ir:     relax" in out and "conv2d" in out and "kernels" in out


def _err(capsys, text):
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and text in err[0], err


def test_report_relax_user_errors(tmp_path, capsys):
    model = conv_bias_relu_onnx(tmp_path / "m.onnx")
    assert main(["report", str(model), "--ir", "relax", "--tables", "nope"]) == 2
    _err(capsys, "unknown pattern table 'nope'")
    assert main(["report", str(model), "--ir", "relax", "--passes", "CombineParallelCast"]) == 2
    _err(capsys, "--passes names Relay passes")
    assert main(["report", str(model), "--tables", "generic"]) == 2
    _err(capsys, "--tables applies to --ir relax")
    assert main(["report", str(tmp_path / "missing.onnx"), "--ir", "relax"]) == 2
    _err(capsys, "no such file")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf \x00\xff")
    assert main(["report", str(bad), "--ir", "relax"]) == 2
    _err(capsys, "not an ONNX model")
