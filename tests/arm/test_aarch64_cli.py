"""tvm-ext compile --target <aarch64> and tvm-ext run --rpc, end to end against the emulated server.

The model is ONNX ``ConvInteger`` (uint8 x int8 -> int32, input zero point 77, 64 input channels:
TVM's arm_cpu int8 strategy at +dotprod), so the oracle is numpy integer arithmetic.
"""
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_ext.testing.aarch64 import TARGETS
from tvm_ext.tools import deploy
from tvm_ext.tools.cli import main
from tvm_ext.tools.rpc import parse_address

X_ZP = 77


def _conv_integer_onnx(path, rng):
    w = rng.integers(-127, 128, (16, 64, 3, 3)).astype(np.int8)
    nodes = [helper.make_node("ConvInteger", ["x", "w", "x_zp"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(
        nodes, "conv_integer",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 64, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 16, 6, 6])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(X_ZP, np.uint8), "x_zp")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path, w


def _reference(x, w):
    xs = np.pad(x.astype(np.int64) - X_ZP, ((0, 0), (0, 0), (1, 1), (1, 1)))
    h, wd = x.shape[2:]
    return sum(np.einsum("nchw,oc->nohw", xs[:, :, ky:ky + h, kx:kx + wd], w[:, :, ky, kx].astype(np.int64))
               for ky in range(3) for kx in range(3)).astype(np.int32)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("arm_cli")
    rng = np.random.default_rng(0)
    path, w = _conv_integer_onnx(d / "conv_integer.onnx", rng)
    x = rng.integers(0, 256, (1, 64, 6, 6)).astype(np.uint8)
    np.save(d / "x.npy", x)
    return d, path, x, _reference(x, w)


@pytest.mark.parametrize("suffix, pipeline", [(".so", "none"), (".tar", "int8")])
def test_compile_for_aarch64_and_run_over_rpc_is_exact(model, arm_server, capsys, suffix, pipeline):
    """A .so is linked by compile with aarch64-linux-gnu-g++; a .tar by run, here, before upload."""
    d, path, x, ref = model
    lib = d / f"conv_{pipeline}{suffix}"
    assert main(["compile", str(path), "-o", str(lib), "--target", TARGETS["neoverse-n1"],
                 "--pipeline", pipeline]) == 0
    err = capsys.readouterr().err
    assert "architecture aarch64" in err and "cannot run here" in err
    meta = json.loads(deploy.sidecar_path(lib).read_text())
    assert "aarch64" in meta["target"]
    if suffix == ".so":
        assert lib.read_bytes()[:4] == b"\x7fELF" and lib.read_bytes()[18] == 183  # e_machine EM_AARCH64
    out = d / f"out_{pipeline}.npz"
    assert main(["run", str(lib), "--rpc", arm_server.address, "--input", str(d / "x.npy"),
                 "--output", str(out), "--repeat", "2"]) == 0
    text = capsys.readouterr().out
    assert f"on the RPC server {arm_server.address}" in text and "timed by the server" in text
    np.testing.assert_array_equal(np.load(out)["output_0"], ref)


def test_run_refuses_aarch64_library_here_and_names_unreachable_server(model, capsys):
    d, path, _, _ = model
    lib = d / "refuse.tar"
    assert main(["compile", str(path), "-o", str(lib), "--target", TARGETS["cortex-a72"]]) == 0
    capsys.readouterr()
    assert main(["run", str(lib), "--input", str(d / "x.npy")]) == 2
    assert "architecture aarch64" in capsys.readouterr().err
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["run", str(lib), "--rpc", f"127.0.0.1:{port}", "--input", str(d / "x.npy")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot reach a TVM RPC server at 127.0.0.1:{port}" in err[0]


def test_compile_so_without_cross_compiler_says_so(model, capsys, monkeypatch, tmp_path):
    d, path, _, _ = model
    monkeypatch.setenv("PATH", str(tmp_path))  # no aarch64-linux-gnu-g++ on it
    assert main(["compile", str(path), "-o", str(d / "nocc.so"), "--target", TARGETS["neoverse-n1"]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "aarch64-linux-gnu-g++" in err[0] and "write a .tar" in err[0]
    assert not (d / "nocc.so").exists()


@pytest.mark.parametrize("text, error", [(":9090", r"expected HOST\[:PORT\]"), ("", r"expected HOST\[:PORT\]"),
                                         ("h:x", "not an integer"), ("h:70000", "out of range"),
                                         ("::1", r"\[ADDR\]:PORT"), ("[::1", r"expected HOST\[:PORT\]")])
def test_parse_address_rejects(text, error):
    with pytest.raises(deploy.DeployError, match=error):
        parse_address(text)


def test_parse_address():
    assert parse_address("127.0.0.1:9090") == ("127.0.0.1", 9090)
    assert parse_address("[::1]:9090") == ("::1", 9090)
    assert parse_address("board.local") == ("board.local", 9090)  # TVM's and tvmc's default port
    assert parse_address("[::1]") == ("::1", 9090)
    assert parse_address("10.0.0.7:9190") == ("10.0.0.7", 9190)
