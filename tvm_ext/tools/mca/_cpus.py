"""The CPU models the static analysis knows: TVM target, llvm-mca model, and the dot forms of its peak.

One row per model. ``target`` is what ``tvm_ext.build`` compiles for (x86: AVX-512 VNNI kept, AMX
masked, as ``tvm_ext.build`` does by default; aarch64: the ``-mattr`` of docs/arm.md's classes);
``mcpu``/``mattr`` what llvm-mca schedules with; ``peak_forms`` the int8 multiply forms the CPU's
peak is measured with (:mod:`tvm_ext.tools.mca._peak`; the best of them is the peak).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CpuModel", "CPU_MODELS", "cpu_model"]

_ARM = "llvm -mtriple=aarch64-linux-gnu -mcpu={cpu} -mattr={attr}"


@dataclass(frozen=True)
class CpuModel:
    name: str
    target: str
    triple: str
    mcpu: str
    mattr: str
    peak_forms: tuple
    note: str = ""


def _x86(name, note=""):
    return CpuModel(name, f"llvm -mcpu={name}", "x86_64-unknown-linux-gnu", name, "",
                    ("vpdpbusd zmm", "vpdpbusd zmm mem"), note)


def _arm(name, attr, forms, note=""):
    mca_attr = ",".join(a for a in attr.split(",") if a != "+neon")
    return CpuModel(name, _ARM.format(cpu=name, attr=attr), "aarch64-linux-gnu", name, mca_attr, forms, note)


#: name -> CpuModel, in the order tables list them.
CPU_MODELS = {m.name: m for m in (
    _x86("znver4"),
    _x86("znver5", "LLVM 22 schedules znver5 with its Zen 4 model"),
    _x86("cascadelake"),
    _x86("icelake-server"),
    _x86("sapphirerapids", "AMX masked (tvm_ext.build's default)"),
    CpuModel("x86-64-v3", "llvm -mcpu=x86-64-v3", "x86_64-unknown-linux-gnu", "haswell", "",
             ("vpmaddwd ymm", "vpmaddwd ymm mem"),
             "AVX2, tvm-ext's exact int16-pair path; llvm-mca's Haswell model"),
    CpuModel("znver3", "llvm -mcpu=x86-64-v3", "x86_64-unknown-linux-gnu", "znver3", "",
             ("vpmaddwd ymm", "vpmaddwd ymm mem"),
             "the same AVX2 code (x86-64-v3, exact path) on llvm-mca's Zen 3 model"),
    _arm("neoverse-n1", "+neon,+dotprod", ("sdot",)),
    _arm("neoverse-v1", "+neon,+dotprod,+i8mm", ("smmla", "sdot")),
    _arm("neoverse-v2", "+neon,+dotprod,+i8mm", ("smmla", "sdot")),
    _arm("cortex-a72", "+neon", ("smull .8h", "smlal .4s"), "no dot product: widening multiplies"),
)}


def cpu_model(name: str) -> CpuModel:
    """The :class:`CpuModel` called ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return CPU_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown CPU model {name!r}; known: {', '.join(CPU_MODELS)}") from None
