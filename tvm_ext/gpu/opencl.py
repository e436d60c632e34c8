"""An OpenCL device for the wheel's TVM: TVM's OpenCL runtime compiled as a plugin, and PoCL.

The TVM 0.19 wheel's runtime has no OpenCL device (``USE_OPENCL=OFF``): its ``target.build.opencl``
compiles kernels into a source-only module. ``make gpu-env`` (``tests/gpu/gpu-env.sh``) compiles
``tvm/src/runtime/opencl`` of the wheel into ``.gpu/libtvm_opencl_runtime.so``, linked against the
wheel's ``libtvm.so``. :func:`load_runtime` loads it (``RTLD_GLOBAL``), which registers
``device_api.opencl`` and the OpenCL module loaders, so ``tvm.opencl(0)`` exists; nothing happens at
import. :func:`runnable` turns the source-only module of a build into one the plugin runs: the GPU
back end applies it to every ``opencl`` build once the plugin is loaded (:mod:`tvm_ext.gpu.backend`).

PoCL runs the kernels on the CPU: a correctness check, never a GPU speed.
"""
from __future__ import annotations

import ctypes
import logging
import os
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["PLUGIN_NAME", "gpu_dir", "plugin_path", "load_runtime", "loaded", "missing", "describe", "runnable"]

PLUGIN_NAME = "libtvm_opencl_runtime.so"

_STATE: dict = {}


def gpu_dir() -> Path:
    """The folder ``make gpu-env`` writes to: ``$TVM_EXT_GPU_DIR``, else ``.gpu`` of the source tree."""
    env = os.environ.get("TVM_EXT_GPU_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".gpu"


def plugin_path() -> Path:
    """Where the OpenCL runtime plugin is expected."""
    return gpu_dir() / PLUGIN_NAME


def loaded() -> bool:
    """True when this process has an OpenCL runtime (the plugin, or a TVM built with OpenCL)."""
    import tvm

    return tvm.get_global_func("device_api.opencl", allow_missing=True) is not None


def load_runtime(path=None) -> bool:
    """Load the OpenCL runtime plugin (``path``, default :func:`plugin_path`) into this process.

    Sets ``POCL_CACHE_DIR`` (unless set) to ``pocl-cache`` next to the plugin, so PoCL keeps the
    kernels it compiles. Returns True when ``tvm.opencl(0)`` is usable afterwards; never raises for a
    missing plugin or device (:func:`missing` says why).
    """
    if loaded():
        return True
    plugin = Path(path) if path is not None else plugin_path()
    if not plugin.is_file():
        _STATE["error"] = f"no OpenCL runtime plugin at {plugin} (run `make gpu-env`)"
        return False
    os.environ.setdefault("POCL_CACHE_DIR", str(plugin.parent / "pocl-cache"))
    try:
        _STATE["lib"] = ctypes.CDLL(str(plugin), mode=ctypes.RTLD_GLOBAL)
    except OSError as err:
        _STATE["error"] = f"the OpenCL runtime plugin {plugin} does not load: {err}"
        return False
    logger.info("loaded TVM's OpenCL runtime from %s", plugin)
    return loaded()


def missing() -> str:
    """Why OpenCL kernels cannot run in this process (``""``: they can). Loads the plugin first."""
    if not load_runtime():
        return _STATE.get("error", "no OpenCL runtime in this TVM")
    import tvm

    try:
        if not tvm.opencl(0).exist:
            return "the OpenCL runtime is loaded but finds no OpenCL device (is pocl-opencl-icd installed?)"
    except tvm.TVMError as err:
        return f"the OpenCL runtime finds no device: {str(err).splitlines()[-1]}"
    return ""


def describe() -> str:
    """The OpenCL device 0 in words (its name and driver), or why there is none."""
    why = missing()
    if why:
        return why
    import tvm

    dev = tvm.opencl(0)
    return f"OpenCL device 0: {dev.device_name} ({dev.driver_version}), {dev.multi_processor_count} compute units"


def runnable(module):
    """``module`` (a module of a build, or any of its imports) with every source-only OpenCL module
    among its imports replaced by one the loaded runtime runs; ``module`` itself when nothing changes.

    The wheel's source-only module and the runtime's module serialise the same way (format, function
    table, source), so the module is exported and loaded back: the runtime's loader builds the OpenCL
    module. Requires :func:`load_runtime`.
    """
    import tvm

    if not loaded():
        raise RuntimeError("tvm_ext.gpu.opencl.runnable: no OpenCL runtime in this process (load_runtime())")
    if not any(m.type_key == "opencl" and not m.is_runnable for m in _walk(module)):
        return module
    with tempfile.TemporaryDirectory(prefix="tvm_ext_opencl_") as tmp:
        path = os.path.join(tmp, "lib.so")
        module.export_library(path)
        return tvm.runtime.load_module(path)


def _walk(module):
    yield module
    for m in module.imported_modules:
        yield from _walk(m)
