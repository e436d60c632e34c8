"""tvm-ext: Relay passes, pattern tables, a relay.build with insertion points, and kernel reports.

Built on Apache TVM 0.19 (the last release with Relay). Importing :mod:`tvm_ext` changes nothing in
the process: TVM's compatibility settings (no TopHub download, the ``onnx.mapping`` stand-in) are
applied while tvm-ext builds or imports a model and undone after (:mod:`tvm_ext._compat`).

Layout, top first: :mod:`tvm_ext.tools` and :mod:`tvm_ext.testing`; :mod:`tvm_ext.relax`;
:mod:`tvm_ext.core` (build, pipelines, report, explain, registry, frontend); :mod:`tvm_ext.passes`
and :mod:`tvm_ext.patterns`; :mod:`tvm_ext.families` (the table of target families); one back end
per family (:mod:`tvm_ext.x86`, :mod:`tvm_ext.arm`, :mod:`tvm_ext.gpu`); leaf modules, among them
:mod:`tvm_ext.backend` (the interface every family implements). Each module has one
import path, the one of its file (``tvm_ext.tools.zoo``, ``tvm_ext.x86.int8_conv``, ...).
"""
import importlib

from .core.build import build, copy_module
from .core.explain import explain
from .core.report import KernelReport
from .families import build_target
from .x86.target import host_target, safe_target

__version__ = "0.1.0"

_SUBPACKAGES = ("core", "x86", "arm", "gpu", "tools", "passes", "patterns", "relax", "testing")


def __getattr__(name):
    """Import the subpackages lazily (``tvm_ext.x86``, ``tvm_ext.tools``, ...)."""
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["build", "build_target", "copy_module", "explain", "KernelReport", "host_target", "safe_target",
           "__version__"]
