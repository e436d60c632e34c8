"""tvm-ext: Relay passes, pattern tables, a relay.build with insertion points, and kernel reports.

Built on Apache TVM 0.19 (the last release with Relay). Importing :mod:`tvm_ext` sets
``TOPHUB_LOCATION=NONE`` when unset (no network) and installs a small ``onnx.mapping`` shim so
TVM 0.19's ONNX frontend works with current onnx releases. It asks nothing of the operating system:
the AMX tile permission is requested when AMX code is built or loaded (:mod:`tvm_ext.x86.amx`).

Layout: :mod:`tvm_ext.core` (build, pipelines, report, explain, registry, frontend),
:mod:`tvm_ext.x86` (instruction sets, targets, the int8 kernel policy, tuned records, AMX),
:mod:`tvm_ext.tools` (cli, bench, zoo, ort_isa, deploy, tune), :mod:`tvm_ext.passes`,
:mod:`tvm_ext.patterns`, :mod:`tvm_ext.relax` and :mod:`tvm_ext.testing`. Each module has one
import path, the one of its file (``tvm_ext.tools.zoo``, ``tvm_ext.x86.int8_conv``, ...).
"""
import importlib

from . import _compat  # noqa: F401  (environment and onnx compatibility, before TVM is used)
from .core.build import build, copy_module
from .core.explain import explain
from .core.report import KernelReport
from .x86.target import build_target, host_target, safe_target

__version__ = "0.1.0"

_SUBPACKAGES = ("core", "x86", "tools", "passes", "patterns", "relax", "testing")


def __getattr__(name):
    """Import the subpackages lazily (``tvm_ext.x86``, ``tvm_ext.tools``, ...)."""
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["build", "build_target", "copy_module", "explain", "KernelReport", "host_target", "safe_target",
           "__version__"]
