"""``tvm-ext run --rpc`` with an ``opencl`` library: it runs on the OpenCL device of a TVM RPC server
that loaded the OpenCL runtime plugin (``--load-library``), here a host server on PoCL, against numpy;
a server without the runtime is refused in one line before anything is uploaded (checked everywhere:
compiling needs no device)."""
from __future__ import annotations

import socket
import sys
from pathlib import Path

import numpy as np
import pytest
from tvm import rpc

from tvm_ext.gpu import opencl
from _opencl_cases import numpy_tiny
from tvm_ext.tools.cli import main
from tvm_ext.tools.deploy import DeployError, compile_library
from tvm_ext.tools.rpc import run_remote

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_cli import tiny_onnx  # noqa: E402  (conv 3x3, all-ones weights, pad 1, relu)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """tiny.onnx compiled for opencl with the int8 pipeline (no device needed), and an input."""
    import onnx

    from tvm_ext.core import pipelines
    from tvm_ext.core.frontend import from_onnx

    opencl.load_runtime()  # when present: the build is runnable here, and exporting it must still work
    d = tmp_path_factory.mktemp("rpc_opencl")
    mod, params = from_onnx(onnx.load(str(tiny_onnx(d / "tiny.onnx"))))
    lib = d / "tiny.so"
    compile_library(mod, params, lib, target="opencl", passes=pipelines.int8(), pipeline="int8")
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype("float32")
    np.save(d / "x.npy", x)
    return lib, x


def _server(load_library=None):
    port = _free_port()
    return rpc.Server("127.0.0.1", port=port, port_end=port + 1, load_library=load_library), f"127.0.0.1:{port}"


def test_run_rpc_opencl_library_on_the_servers_opencl_device(compiled, capsys):
    why = opencl.missing()
    if why:
        pytest.skip(f"no OpenCL device: {why}")
    lib, x = compiled
    server, address = _server(str(opencl.plugin_path()))
    try:
        res = run_remote(lib, address, {"x": x}, repeat=1)
        assert res.meta["device"] == "OpenCL device 0 of the server"
        np.testing.assert_allclose(res.outputs[0], numpy_tiny(x), rtol=1e-5, atol=1e-4)
        assert main(["run", str(lib), "--rpc", address, "--input", f"x={lib.parent / 'x.npy'}"]) == 0
    finally:
        server.terminate()
    out = capsys.readouterr().out
    assert f"on the RPC server {address} (OpenCL device 0 of the server)" in out


def test_run_rpc_opencl_library_refused_by_a_server_without_the_opencl_runtime(compiled, capsys):
    lib, x = compiled
    server, address = _server()
    try:
        with pytest.raises(DeployError, match=f"the server at {address} has no OpenCL runtime.*--load-library"):
            run_remote(lib, address, {"x": x})
        assert main(["run", str(lib), "--rpc", address, "--input", f"x={lib.parent / 'x.npy'}"]) == 2
    finally:
        server.terminate()
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "has no OpenCL runtime" in err[0]
