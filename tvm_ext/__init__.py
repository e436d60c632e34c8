"""tvm-ext: Relay passes, pattern tables, a relay.build with insertion points, and kernel reports.

Built on Apache TVM 0.19 (the last release with Relay). Importing :mod:`tvm_ext` sets
``TOPHUB_LOCATION=NONE`` when unset (no network) and installs a small ``onnx.mapping`` shim so
TVM 0.19's ONNX frontend works with current onnx releases.
"""
from . import _compat  # noqa: F401  (environment and onnx compatibility, before TVM is used)
from . import amx as _amx

_amx.prepare_process()  # on an AMX host, ask Linux for the tile state (cheap; nothing elsewhere)
from .build import build, copy_module
from .report import KernelReport
from .target import build_target, host_target, safe_target

__version__ = "0.1.0"

_SUBMODULES = ("bench", "cli", "explain", "frontend", "passes", "patterns", "pipelines", "report", "target", "testing",
               "tuning", "x86_int8", "zoo")


def __getattr__(name):
    """Import submodules lazily (``tvm_ext.zoo``, ``tvm_ext.pipelines``, ...)."""
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["build", "build_target", "copy_module", "KernelReport", "host_target", "safe_target", "__version__"]
