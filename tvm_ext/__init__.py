"""tvm-ext: Relay passes, pattern tables, a relay.build with insertion points, and kernel reports.

Built on Apache TVM 0.19 (the last release with Relay). Importing :mod:`tvm_ext` sets
``TOPHUB_LOCATION=NONE`` when unset (no network) and installs a small ``onnx.mapping`` shim so
TVM 0.19's ONNX frontend works with current onnx releases.

Layout: :mod:`tvm_ext.core` (build, pipelines, report, explain, registry, frontend),
:mod:`tvm_ext.x86` (instruction sets, targets, the int8 kernel policy, tuned records, AMX),
:mod:`tvm_ext.tools` (cli, bench, zoo, ort_isa, deploy, tune), :mod:`tvm_ext.passes`,
:mod:`tvm_ext.patterns`, :mod:`tvm_ext.relax` and :mod:`tvm_ext.testing`. The modules' flat names
(``tvm_ext.zoo``, ``tvm_ext.x86_int8``, ...) stay importable: they are the same module objects.
"""
import importlib
import importlib.abc
import importlib.util
import sys

from . import _compat  # noqa: F401  (environment and onnx compatibility, before TVM is used)
from .x86 import amx as _amx

_amx.prepare_process()  # on an AMX host, ask Linux for the tile state (cheap; nothing elsewhere)
from .core.build import build, copy_module  # noqa: E402
from .core.report import KernelReport  # noqa: E402
from .x86.target import build_target, host_target, safe_target  # noqa: E402

__version__ = "0.1.0"

#: Flat module names -> where the module lives.
MODULE_PATHS = {
    "build": "core.build", "pipelines": "core.pipelines", "report": "core.report", "explain": "core.explain",
    "registry": "core.registry", "frontend": "core.frontend", "tvm_bugs": "core.tvm_bugs",
    "isa": "x86.isa", "target": "x86.target", "x86_int8": "x86.int8_conv", "x86_conv_transpose": "x86.conv_transpose",
    "tuning": "x86.tuning", "amx": "x86.amx",
    "cli": "tools.cli", "bench": "tools.bench", "zoo": "tools.zoo", "zoo_real": "tools.zoo_real",
    "ort_isa": "tools.ort_isa", "deploy": "tools.deploy", "tune": "tools.tune",
}
_SUBPACKAGES = ("core", "x86", "tools", "passes", "patterns", "relax", "testing")


class _FlatNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import tvm_ext.<flat name>`` gives the module at its place in the layout (one module object)."""

    def find_spec(self, fullname, path=None, target=None):
        pkg, _, leaf = fullname.rpartition(".")
        if pkg == __name__ and leaf in MODULE_PATHS:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(f"{__name__}.{MODULE_PATHS[spec.name.rpartition('.')[2]]}")

    def exec_module(self, module):
        pass


if not any(isinstance(f, _FlatNames) for f in sys.meta_path):
    sys.meta_path.insert(0, _FlatNames())  # before any path finder: a flat name never loads a second copy
# registered now, so that importing the flat name never replaces the function tvm_ext.build
sys.modules.setdefault(f"{__name__}.build", sys.modules[f"{__name__}.core.build"])


def __getattr__(name):
    """Import submodules lazily (``tvm_ext.zoo``, ``tvm_ext.pipelines``, ``tvm_ext.x86``, ...)."""
    if name in MODULE_PATHS:
        return importlib.import_module(f"{__name__}.{MODULE_PATHS[name]}")
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["build", "build_target", "copy_module", "KernelReport", "host_target", "safe_target", "__version__"]
