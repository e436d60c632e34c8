"""The GPU back end: targets whose kernels TVM schedules for GPUs (``opencl``, ``cuda``, ``nvptx``,
``vulkan``, ``rocm``, ``metal``).

The host code of a GPU build is compiled for the host CPU (``host=``; default the host's ``llvm``).
No CPU kernel policy applies: the int8 pipeline keeps only the steps whose ``families`` include
``gpu`` (:meth:`tvm_ext.core.pipelines.Pipeline.for_family`).
"""
from __future__ import annotations

from ..backend.interface import Backend, BuildPlan, BuildRequest

__all__ = ["GPU", "GPU_KINDS"]

#: TVM target kinds that compile kernels for a GPU.
GPU_KINDS = ("opencl", "cuda", "nvptx", "vulkan", "rocm", "metal")


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
        if tgt.host is None:
            tgt = tvm.target.Target(tgt, host="llvm")
        return tgt

    def plan(self, request: BuildRequest) -> BuildPlan:  # noqa: ARG002
        return BuildPlan()

    def isa_class(self, target) -> str:
        return target.kind.name
