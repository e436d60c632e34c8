"""aarch64 instruction-set classes: which int8 instructions a target's kernels use.

==================  =======================  ==================================
class               target features          int8 dot product
==================  =======================  ==================================
``aarch64_i8mm``    ``+i8mm``                ``smmla`` / ``ummla`` (2x8 by 8x2)
``aarch64_dotprod`` ``+dotprod``             ``sdot`` / ``udot``
``aarch64_neon``    neither                  ``smull`` / ``smlal`` (int16)
==================  =======================  ==================================

The tuned records (:mod:`tvm_ext.arm.tuning`), the kernel policy (:mod:`tvm_ext.arm.int8_policy`) and
the per-class tables of the passes key on it.
"""
from __future__ import annotations

__all__ = ["ISA_CLASSES", "isa_class", "is_aarch64"]

#: Most capable first.
ISA_CLASSES = ("aarch64_i8mm", "aarch64_dotprod", "aarch64_neon")


def is_aarch64(target) -> bool:
    """True for an LLVM target that compiles for 64-bit ARM (``-mtriple=aarch64-...``)."""
    return target.kind.name == "llvm" and str(target.attrs.get("mtriple", "")).startswith(("aarch64", "arm64"))


def isa_class(target) -> str:
    """The int8 instruction class of an aarch64 ``target`` (one of :data:`ISA_CLASSES`)."""
    features = target.features
    if bool(features.has_matmul_i8):
        return "aarch64_i8mm"
    return "aarch64_dotprod" if bool(features.has_dotprod) else "aarch64_neon"
