"""Which back end a target belongs to: the ordered table of families.

:data:`FAMILIES` is data: the first back end that claims a target builds it, and a target no family
claims gets :class:`~tvm_ext.backend.Backend`'s defaults (``relay.build`` unchanged). A new
family is a package with a ``backend.py`` and one row here (docs/backends.md).
"""
from __future__ import annotations

from .arm.backend import AArch64
from .gpu.backend import GPU
from .x86.backend import X86
from .backend import Backend

__all__ = ["FAMILIES", "for_target", "family", "isa_class", "build_target", "as_target", "describe_target"]

#: The families, in the order they are asked.
FAMILIES: tuple = (X86(), AArch64(), GPU())

_GENERIC = Backend()


def as_target(target):
    """``target`` as a ``tvm.target.Target`` (None: the host CPU, as LLVM names it)."""
    import tvm

    if target is None:
        from tvm.target import codegen

        return tvm.target.Target(f"llvm -mcpu={codegen.llvm_get_system_cpu()}")
    return target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)


def for_target(target) -> Backend:
    """The back end of ``target`` (str or Target; None is the host CPU)."""
    tgt = as_target(target)
    for backend in FAMILIES:
        if backend.claims(tgt):
            return backend
    return _GENERIC


def family(target) -> str:
    """The family name of ``target``: ``x86``, ``aarch64``, ``gpu`` or ``generic``."""
    return for_target(target).family


def isa_class(target) -> str:
    """The int8 instruction-set class of ``target`` as its family names it (x86: ``avx2``,
    ``avx512_vnni``, ...; aarch64: ``aarch64_neon``, ``aarch64_dotprod``, ``aarch64_i8mm``; other: ``other``)."""
    tgt = as_target(target)
    return for_target(tgt).isa_class(tgt)


def build_target(target=None, **options):
    """The target :func:`tvm_ext.build` compiles for: the family's resolution of ``target`` (None: the
    host CPU), with its host. ``options`` are the family's (x86: ``allow_vnni``, ``amx``)."""
    return for_target(target).target(target, **options)


def describe_target(target) -> dict:
    """A JSON-friendly description of a target: string, kind, cpu, family, int8 instruction-set class
    (:func:`isa_class`) and vector features."""
    from .x86.isa import llvm_features

    tgt = as_target(target)
    feats = llvm_features(tgt)
    return {
        "target": str(tgt),
        "kind": tgt.kind.name,
        "mcpu": str(tgt.attrs.get("mcpu", "")),
        "family": family(tgt),
        "isa": isa_class(tgt),
        "features": sorted(f for f in feats if f.startswith(("avx", "sse4", "fma", "neon", "sve"))),
    }
