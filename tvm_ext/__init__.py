"""tvm-ext: Relay passes, pattern tables, a relay.build with insertion points, and kernel reports.

Built on Apache TVM 0.19 (the last release with Relay). Importing :mod:`tvm_ext` sets
``TOPHUB_LOCATION=NONE`` when unset (no network) and installs a small ``onnx.mapping`` shim so
TVM 0.19's ONNX frontend works with current onnx releases.

Layout: :mod:`tvm_ext.core` (build, pipelines, report, explain, registry, frontend),
:mod:`tvm_ext.x86` (instruction sets, targets, the int8 kernel policy, tuned records, AMX),
:mod:`tvm_ext.tools` (cli, bench, zoo, ort_isa, deploy, tune), :mod:`tvm_ext.passes`,
:mod:`tvm_ext.patterns`, :mod:`tvm_ext.relax` and :mod:`tvm_ext.testing`. Each module has one
import path, the one of its file (``tvm_ext.tools.zoo``, ``tvm_ext.x86.int8_conv``, ...).
"""
import importlib

from . import _compat  # noqa: F401  (environment and onnx compatibility, before TVM is used)
from .x86 import amx as _amx

_amx.prepare_process()  # on an AMX host, ask Linux for the tile state (cheap; nothing elsewhere)
from .core.build import build, copy_module  # noqa: E402
from .core.explain import explain  # noqa: E402
from .core.report import KernelReport  # noqa: E402
from .x86.target import build_target, host_target, safe_target  # noqa: E402

__version__ = "0.1.0"

_SUBPACKAGES = ("core", "x86", "tools", "passes", "patterns", "relax", "testing")


def __getattr__(name):
    """Import the subpackages lazily (``tvm_ext.x86``, ``tvm_ext.tools``, ...)."""
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["build", "build_target", "copy_module", "explain", "KernelReport", "host_target", "safe_target",
           "__version__"]
