"""``tvm-ext compile --target opencl`` then ``tvm-ext run`` on an OpenCL device (PoCL, ``make gpu-env``),
in fresh processes as a user runs them: ``run`` loads TVM's OpenCL runtime plugin before the library.
The oracle is numpy (a direct convolution). Skips with the reason when the OpenCL set-up is missing;
the refusal without a plugin is checked everywhere."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tvm_ext.gpu import opencl
from _opencl_cases import numpy_tiny

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_cli import tiny_onnx  # noqa: E402  (conv 3x3, all-ones weights, pad 1, relu)


def _cli(*args, env=None):
    import os

    return subprocess.run([sys.executable, "-m", "tvm_ext.tools.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TOPHUB_LOCATION": "NONE", **(env or {})})


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """tiny.onnx compiled by `tvm-ext compile --target opencl --pipeline int8` in a child process."""
    d = tmp_path_factory.mktemp("cli_opencl")
    model = tiny_onnx(d / "tiny.onnx")
    lib = d / "tiny.so"
    r = _cli("compile", str(model), "--target", "opencl", "--pipeline", "int8", "-o", str(lib))
    assert r.returncode == 0, r.stderr
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype("float32")
    np.save(d / "x.npy", x)
    return d, model, lib, x


def test_compile_opencl_writes_an_opencl_library(compiled):
    _, _, lib, _ = compiled
    meta = json.loads(lib.with_name(lib.name + ".json").read_text())
    assert meta["target"].split()[0] == "opencl" and meta["target_host"].startswith("llvm")
    assert b"__kernel" in lib.read_bytes()  # the OpenCL C source travels in the library


def test_run_executes_the_opencl_library_on_the_opencl_device(compiled):
    why = opencl.missing()
    if why:
        pytest.skip(f"no OpenCL device: {why}")
    d, _, lib, x = compiled
    out = d / "out.npz"
    r = _cli("run", str(lib), "--input", f"x={d / 'x.npy'}", "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert "on OpenCL device 0" in r.stdout
    with np.load(out) as z:
        got = z["output_0"]
    np.testing.assert_allclose(got, numpy_tiny(x), rtol=1e-5, atol=1e-4)


def test_run_without_the_opencl_runtime_is_a_one_line_error(compiled, tmp_path):
    d, _, lib, _ = compiled
    r = _cli("run", str(lib), "--input", f"x={d / 'x.npy'}", env={"TVM_EXT_GPU_DIR": str(tmp_path)})
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and "no OpenCL runtime plugin" in lines[0] and "make gpu-env" in lines[0]


@pytest.mark.slow
def test_bench_opencl_compares_stock_and_tvm_ext_on_pocl(compiled, tmp_path):
    """`tvm-ext bench --target opencl`: both builds run on the OpenCL device, the table says it is PoCL."""
    why = opencl.missing()
    if why:
        pytest.skip(f"no OpenCL device: {why}")
    _, model, _, _ = compiled
    r = _cli("bench", "--target", "opencl", "--model", str(model), "--repeat", "2", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert "PoCL" in res["environment"]["device"] and "not GPU speed" in res["environment"]["device"]
    pipes = res["variants"][0]["pipelines"]
    assert "error" not in pipes["tvm"] and "error" not in pipes["tvm_ext"], pipes
    assert pipes["tvm"]["latency"] and pipes["tvm_ext"]["latency"]
    assert "device (stock TVM and tvm-ext): OpenCL device 0" in (tmp_path / "results.md").read_text()
