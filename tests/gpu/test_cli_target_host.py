"""``tvm-ext compile --target opencl --target-host 'llvm -mtriple=aarch64-linux-gnu'``: an OpenCL library
for an ARM board's GPU (Mali, Adreno), cross-compiled here (compile only: no ARM OpenCL device here). Its
host code is aarch64 (the .so's ELF machine, the sidecar's ``target_host``); ``run`` on this host
refuses it with the reason; ``--target-host`` without a device target, or naming no CPU, is a usage
error."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_cli import tiny_onnx  # noqa: E402  (conv 3x3, all-ones weights, pad 1, relu)

ARM = "llvm -mtriple=aarch64-linux-gnu"
EM_AARCH64 = 183  # ELF e_machine


def _cli(*args):
    import os

    return subprocess.run([sys.executable, "-m", "tvm_ext.tools.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TOPHUB_LOCATION": "NONE"})


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_onnx(tmp_path_factory.mktemp("cli_target_host") / "tiny.onnx")


@pytest.mark.parametrize("suffix", [".so", ".tar"])
def test_compile_opencl_for_an_aarch64_host(model, tmp_path, suffix):
    if suffix == ".so" and shutil.which("aarch64-linux-gnu-g++") is None:
        pytest.skip("no aarch64-linux-gnu-g++ on PATH (Debian: g++-aarch64-linux-gnu) to link the .so")
    lib = tmp_path / f"tiny{suffix}"
    r = _cli("compile", str(model), "--target", "opencl", "--target-host", ARM, "--pipeline", "int8", "-o", str(lib))
    assert r.returncode == 0, r.stderr
    meta = json.loads(lib.with_name(lib.name + ".json").read_text())
    assert meta["target"].split()[0] == "opencl" and "-mtriple=aarch64-linux-gnu" in meta["target_host"]
    assert "host code: architecture aarch64" in r.stderr  # the compile warning: it cannot run here
    if suffix == ".so":
        objects = [lib.read_bytes()]
    else:  # object files, which the board links
        with tarfile.open(lib) as tar:
            objects = [tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".o")]
    assert objects and any(b"__kernel" in o for o in objects)  # the OpenCL C source travels in the library
    for obj in objects:
        assert obj[:4] == b"\x7fELF" and int.from_bytes(obj[18:20], "little") == EM_AARCH64
    run = _cli("run", str(lib))
    assert run.returncode == 2 and "aarch64" in run.stderr, run.stderr


@pytest.mark.parametrize("args, text", [
    (["--target-host", ARM], "--target-host is for a device target"),
    (["--target", "llvm", "--target-host", ARM], "--target-host is for a device target"),
    (["--target", "opencl", "--target-host", "opencl"], "not an llvm target"),
    (["--target", "opencl", "--target-host", "llvm -mtriple=nonsense-arch"], "bad --target"),
])
def test_target_host_usage_errors(model, tmp_path, args, text):
    r = _cli("compile", str(model), *args, "-o", str(tmp_path / "x.tar"))
    assert r.returncode == 2 and text in r.stderr, r.stderr
    assert not (tmp_path / "x.tar").exists()
