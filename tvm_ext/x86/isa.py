"""Instruction sets: what a target compiles for, and what this host can execute.

A leaf module (it imports only TVM): :mod:`tvm_ext.x86.target`, :mod:`tvm_ext.x86.int8_conv`,
:mod:`tvm_ext.x86.tuning`, the benchmark and the tests ask it, and it asks nobody in tvm-ext.

* :func:`llvm_features` is what LLVM enables for a target (``-mcpu`` plus ``-mattr``).
* :func:`host_features` is what *this* CPU has, read by LLVM's ``getHostCPUFeatures`` (CPUID and
  XGETBV), not derived from the CPU's name (a hypervisor may hide AVX-512 from a Zen 4 guest).
* :func:`missing_on_host` lists the *code-generation* features a target enables that the host
  lacks. Code built for a target with missing features must not run here: it dies with SIGILL
  and takes the whole process with it.
* :func:`unnamed_on_host` lists the reverse: what this host executes that the target leaves out
  (a CPU name older than the CPU, as a hypervisor's CPUID model can make it).
* :func:`isa_class` names the x86 int8 instruction-set class a target compiles to (``amx``,
  ``avx512_vnni``, ``avx512``, ``avx2``, ``sse``, ``other``). TVM 0.19's int8 intrinsics decide by
  these features, and so do tvm-ext's kernel choices (:func:`tvm_ext.x86.int8_policy.policy`).

The classes' features and int8 dot products: docs/x86-kernels.md ("CPU classes and what each gets").
"""
from __future__ import annotations

import functools
import logging

logger = logging.getLogger(__name__)

__all__ = [
    "ISA_CLASSES",
    "llvm_features",
    "host_features",
    "missing_on_host",
    "unnamed_on_host",
    "runs_on_host",
    "isa_class",
]

#: Most capable first.
ISA_CLASSES = ("amx", "avx512_vnni", "avx512", "avx2", "sse", "other")

# Feature-name prefixes that change the instructions LLVM emits for tensor code. System features
# (pku, rdpru, mwaitx, wbnoinvd, ...) are left out: hypervisors hide them and kernels never use them.
_CODEGEN_PREFIXES = (
    "avx", "sse", "ssse", "fma", "f16c", "bmi", "amx", "gfni", "vaes", "vpclmulqdq", "pclmul",
    "popcnt", "lzcnt", "movbe", "adx", "sha", "aes", "xop", "cx16", "evex512",
)


def _as_target(target):
    import tvm

    return target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)


#: target string -> its LLVM features (a build asks for them hundreds of times, once per schedule).
_FEATURES: dict = {}


def llvm_features(target) -> frozenset:
    """The LLVM features enabled for ``target`` (empty for non-LLVM targets)."""
    from tvm.target import codegen

    try:
        tgt = _as_target(target)
        if tgt.kind.name != "llvm":
            return frozenset()
        key = str(tgt)
        feats = _FEATURES.get(key)
        if feats is None:
            feats = _FEATURES[key] = frozenset(str(k) for k in codegen.llvm_get_cpu_features(tgt))
        return feats
    except Exception as err:  # LLVM cannot parse it: no features to report
        logger.debug("cannot query LLVM features of %s: %s", target, err)
        return frozenset()


@functools.lru_cache(maxsize=1)
def host_features() -> frozenset:
    """The features this CPU really has (LLVM's ``getHostCPUFeatures``: CPUID, XGETBV)."""
    import tvm

    get = tvm.get_global_func("tvm.codegen.llvm.GetHostCPUFeatures", allow_missing=True)
    if get is None:  # an LLVM-less TVM build: nothing compiled here can run anyway
        return frozenset()
    return frozenset(str(k) for k, v in get().items() if bool(v))


def _codegen(features) -> set:
    return {f for f in features if f.startswith(_CODEGEN_PREFIXES)}


def missing_on_host(target) -> list[str]:
    """Code-generation features ``target`` enables that this host lacks (sorted)."""
    import tvm

    get = tvm.get_global_func("tvm.codegen.llvm.GetHostCPUFeatures", allow_missing=True)
    known = {str(k) for k in get().keys()} if get is not None else set()
    return sorted(_codegen(llvm_features(target) & known) - host_features())


def unnamed_on_host(target) -> list[str]:
    """Code-generation features this host has that ``target`` does not enable (sorted).

    The features of a CPU name are LLVM's; under a hypervisor the CPUID model, and so the name LLVM
    detects, can be older than the CPU (a Sapphire Rapids guest reported as ``rocketlake``)."""
    return sorted(_codegen(host_features()) - llvm_features(target))


def runs_on_host(target) -> bool:
    """True when code compiled for ``target`` only uses instructions this host has: the same
    architecture (``-mtriple``; an aarch64 target is never runnable on an x86 host) and no x86
    feature this host lacks."""
    from tvm.target import codegen

    tgt = _as_target(target)
    if tgt.kind.name != "llvm":
        return False
    triple = str(tgt.attrs.get("mtriple", "") or "")
    if triple and triple.split("-")[0] != str(codegen.llvm_get_system_triple()).split("-")[0]:
        return False
    return not missing_on_host(tgt)


def isa_class(target) -> str:
    """The int8 instruction-set class of ``target`` (one of :data:`ISA_CLASSES`)."""
    feats = llvm_features(target)
    if not feats or not any(f.startswith("sse") for f in feats):
        return "other"
    if {"avx512f", "avx512bw"} <= feats:
        if "avx512vnni" not in feats:
            return "avx512"
        return "amx" if {"amx-tile", "amx-int8"} <= feats else "avx512_vnni"
    if "avx2" in feats:
        return "avx2"
    return "sse"
