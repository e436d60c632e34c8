"""The GPU back end: targets whose kernels TVM schedules for GPUs (``opencl``, ``cuda``, ``nvptx``,
``vulkan``, ``rocm``, ``metal``).

The host code of a GPU build is compiled for the host CPU (``host=``; default the host's ``llvm``).
No CPU kernel policy applies: the int8 pipeline keeps only the steps whose ``families`` include
``gpu`` (:meth:`tvm_ext.core.pipelines.Pipeline.for_family`). TVM's GPU pool and softmax schedules
inline the stages a pass fused in front of the pool (:mod:`tvm_ext.gpu.schedules`).

What this TVM can build is checked before anything is compiled (:func:`unsupported`), so a target
whose code generator is missing, whose module cannot be created, or which aborts LLVM is refused with
:class:`~tvm_ext.errors.UnsupportedByTVM` instead of failing after lowering or ending the process:

* ``cuda``, ``vulkan``: the TVM 0.19 wheel has no ``target.build.cuda`` / ``target.build.vulkan``
  (``USE_CUDA=OFF``, ``USE_VULKAN=OFF``); ``nvcc`` is never reached.
* ``nvptx``, ``rocm``: the code generator exists, but it ends by creating a CUDA / ROCm module,
  which a runtime without that device refuses. ``nvptx`` also aborts the process with TVM 0.19 and
  LLVM 22 on any kernel that allocates shared memory (a pool, a reduction, a tiled conv):
  ``CodeGenNVPTX::VisitStmt_(AllocateNode)`` -> ``CodeGenLLVM::AllocateSharedMemory`` ->
  ``llvm::GlobalObject::setAlignment``, assertion ``Alignment is greater than MaximumAlignment``
  (``llvm/lib/IR/Globals.cpp``); it is refused there even with a CUDA runtime.
* ``opencl``, ``metal``: source modules; an ``opencl`` build runs once TVM's OpenCL runtime is loaded
  (:mod:`tvm_ext.gpu.opencl`), and :meth:`GPU.plan`'s ``finish`` then hands back a runnable module.
"""
from __future__ import annotations

import logging

from ..backend import Backend, BuildPlan, BuildRequest
from ..errors import UnsupportedByTVM

logger = logging.getLogger(__name__)

__all__ = ["GPU", "GPU_KINDS", "unsupported"]

#: TVM target kinds that compile kernels for a GPU.
GPU_KINDS = ("opencl", "cuda", "nvptx", "vulkan", "rocm", "metal")

#: Target kinds whose code generator creates a device module directly: kind -> the runtime's device API.
_DEVICE_MODULE = {"nvptx": "cuda", "rocm": "rocm"}

#: The LLVM major version from which TVM 0.19's NVPTX code generator aborts on shared memory.
_NVPTX_ABORT_LLVM = 22


def _llvm_major() -> int:
    import tvm

    try:
        return int(str(tvm.support.libinfo().get("LLVM_VERSION", "0")).split(".")[0])
    except ValueError:
        return 0


def unsupported(target) -> str:
    """Why this TVM cannot build ``target`` (a GPU ``tvm.target.Target``) without failing late or
    aborting the process; ``""`` when it can."""
    import tvm

    kind = target.kind.name
    if tvm.get_global_func(f"target.build.{kind}", allow_missing=True) is None:
        flag = {"cuda": "USE_CUDA", "vulkan": "USE_VULKAN", "rocm": "USE_ROCM", "metal": "USE_METAL"}.get(kind, "")
        return (f"this TVM has no {kind} code generator (target.build.{kind} is not registered"
                + (f"; it was built with {flag}=OFF" if flag else "") + ")")
    if kind == "nvptx" and _llvm_major() >= _NVPTX_ABORT_LLVM:
        return (f"TVM 0.19's nvptx code generator aborts the process with LLVM {_llvm_major()}: a kernel with "
                "shared memory (pools, reductions, tiled convs) reaches CodeGenLLVM::AllocateSharedMemory, whose "
                "llvm::GlobalObject::setAlignment fails LLVM's assertion 'Alignment is greater than "
                "MaximumAlignment'")
    device = _DEVICE_MODULE.get(kind)
    if device and tvm.get_global_func(f"device_api.{device}", allow_missing=True) is None:
        return (f"the {kind} code generator ends by creating a {device} module, and this TVM's runtime has no "
                f"{device} device (built with USE_{device.upper()}=OFF)")
    return ""


class GPU(Backend):
    """GPUs, through TVM's own GPU schedules (``topi/cuda``, ``topi/gpu``)."""

    family = "gpu"

    def claims(self, target) -> bool:
        return target.kind.name in GPU_KINDS

    def target(self, target, **options):
        import tvm

        if options:
            raise TypeError(f"tvm_ext.build: {sorted(options)} are not options of the gpu back end")
        tgt = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
        why = unsupported(tgt)
        if why:
            raise UnsupportedByTVM(f"tvm_ext.build: target {str(tgt)!r}: {why}. Build for 'opencl' (runs on an "
                                   "OpenCL device, docs/gpu.md) or for a CPU.")
        if tgt.host is None:
            tgt = tvm.target.Target(tgt, host="llvm")
        return tgt

    def plan(self, request: BuildRequest) -> BuildPlan:
        from . import exact_float, narrow_int
        from .schedules import producers_inlined

        contexts = [producers_inlined()]  # pool / softmax kernels with stages fused in front (schedules.py)
        plan = BuildPlan(contexts=contexts, configure=narrow_int.lower_config)  # C promotes char * char to int
        if request.target.kind.name == "opencl":
            # float arithmetic as TIR states it: exact constants, no contraction (exact_float.py)
            plan.contexts.append(exact_float.fp_contract_off())
            plan.add_configure(exact_float.lower_config)
            plan.finish = _runnable_opencl
        return plan

    def isa_class(self, target) -> str:
        return target.kind.name


def _runnable_opencl(factory):
    """The factory with its OpenCL kernels in a module the loaded OpenCL runtime runs (unchanged when
    no runtime is loaded: the build is then compile-only)."""
    from . import opencl

    if not opencl.loaded() or not hasattr(factory, "graph_json"):
        return factory
    lib = opencl.runnable(factory.lib)
    if lib is factory.lib:
        return factory
    import tvm

    create = tvm.get_global_func("tvm.graph_executor_factory.create")
    args = []
    for name, value in factory.params.items():
        args += [name, tvm.nd.array(value)]
    exportable = factory.module
    factory.module = create(factory.graph_json, lib, factory.libmod_name, *args)
    factory.lib = lib
    # the runnable module is loaded from a shared library, which TVM cannot save again: exports
    # write the module as built (the same kernels, serialised as the runtime's loader reads them)
    factory.export_library = exportable.export_library
    logger.debug("opencl build: kernels handed to the loaded OpenCL runtime")
    return factory
