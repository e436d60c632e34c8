"""Host targets that TVM 0.19 + LLVM 22 can build without aborting the process.

Three traps of this stack are handled here, once:

* ``-mcpu=native`` is not understood by TVM 0.19 with LLVM 22: TVM logs an error and silently
  falls back to ``-mcpu=generic`` (plain x86-64, 26-86x slower than ONNX Runtime on int8 models).
  :func:`host_target` asks LLVM for the real CPU name instead.
* On CPUs with AVX-512 VNNI / AVX-VNNI (Zen 4/5, Ice Lake and later), TVM's x86 int8 tensor
  intrinsic passes ``int32x16`` operands to ``llvm.x86.avx512.vpdpbusd.512``, whose signature
  changed in newer LLVM; LLVM 22 then aborts the *whole Python process* (SIGABRT, "Calling a
  function with a bad signature!") while generating int8 convolutions. :func:`safe_target` masks
  the VNNI features (``-mattr=-avx512vnni,-avxvnni``) and logs why. AVX-512 stays enabled, so the
  int8 kernels still use 512-bit vectors.
* On CPUs with AMX, TVM 0.19 schedules uint8 x int8 ``dense`` and ``batch_matmul`` on AMX tiles
  but emits no ``ldtilecfg`` and asks Linux for no tile state: such code dies with SIGILL. Every
  target that passes through here masks AMX (:data:`AMX_FEATURES`; AVX-512 VNNI computes those ops)
  unless ``allow_amx=True`` (``tvm_ext.build(..., amx=True)``: :mod:`tvm_ext.x86.amx` configures the
  tiles; docs/x86-kernels.md, "AMX int8 tiles").

:func:`safe_target` is what a *plain* ``relay.build`` needs (the benchmark's "stock" column).
:func:`tvm_ext.build` compiles inside :func:`tvm_ext.x86.int8_conv.kernels`, whose VNNI intrinsic
uses LLVM 22's operand types, so it builds for :func:`build_target`, which keeps AVX-512 VNNI
(about 1.8x faster int8 convolutions on Zen 4). ``allow_vnni=True`` on :func:`safe_target` is
only for a TVM whose own VNNI intrinsic matches its LLVM.
"""
from __future__ import annotations

import logging
import os
from typing import Union

from .isa import llvm_features, missing_on_host, unnamed_on_host

logger = logging.getLogger(__name__)

__all__ = ["host_target", "safe_target", "build_target", "VNNI_FEATURES", "AMX_FEATURES"]

#: LLVM feature names whose TVM 0.19 tensor intrinsic crashes LLVM 22.
VNNI_FEATURES = ("avx512vnni", "avxvnni")
#: LLVM feature names of AMX: TVM 0.19 emits tile instructions for them without configuring tiles.
AMX_FEATURES = ("amx-tile", "amx-int8", "amx-bf16", "amx-fp16", "amx-complex")

_WARNED: set[str] = set()
TargetLike = Union[str, object]  # str or tvm.target.Target


def host_target(mcpu: str | None = None, *, allow_vnni: bool = False, allow_amx: bool = False):
    """The host CPU as a TVM ``llvm`` target, safe to build with.

    Parameters
    ----------
    mcpu : str, optional
        CPU name for ``-mcpu``. Default: ``$TVM_EXT_MCPU`` if set, else LLVM's
        ``getHostCPUName()`` (what ``-mcpu=native`` should have meant).
    allow_vnni : bool
        Keep VNNI features (see the module note). Default False.
    allow_amx : bool
        Keep ``amx-tile`` and ``amx-int8`` where the CPU has them (:mod:`tvm_ext.x86.amx`). Default False.

    Returns
    -------
    tvm.target.Target
    """
    import tvm
    from tvm.target import codegen

    cpu = mcpu or os.environ.get("TVM_EXT_MCPU")
    detected = not cpu
    cpu = cpu or codegen.llvm_get_system_cpu()
    if cpu in ("", "generic"):
        return safe_target(tvm.target.Target("llvm"), allow_vnni=allow_vnni)
    text = f"llvm -mcpu={cpu}"
    if detected:
        # The CPU's name promises features a hypervisor may hide (AVX-512 on a Zen 4 guest):
        # mask what this host cannot execute, or the first kernel dies with SIGILL.
        named = tvm.target.Target(text)
        hidden = missing_on_host(named)
        # ... and a hypervisor's CPUID model may name an older CPU than the one it runs on (a Sapphire
        # Rapids guest reported as model 167, which LLVM calls rocketlake: no AMX, AVX-VNNI, AVX512-FP16):
        # enable what this host executes and the name leaves out, or the target hides the host's ISA.
        unnamed = unnamed_on_host(named)
        if hidden:
            logger.info("host CPU %s lacks %s: masked", cpu, ",".join(hidden))
        if unnamed:
            logger.info("host CPU %s also has %s: enabled", cpu, ",".join(unnamed))
        if hidden or unnamed:
            text += " -mattr=" + ",".join([*(f"-{f}" for f in hidden), *(f"+{f}" for f in unnamed)])
    # the VNNI mask is the expected default here: say it at INFO, not WARNING
    return _safe(tvm.target.Target(text), allow_vnni, logging.INFO, allow_amx)


def safe_target(target: TargetLike, *, allow_vnni: bool = False, allow_amx: bool = False):
    """Return ``target`` with the features that would abort LLVM 22 or the process masked.

    VNNI (unless ``allow_vnni``) and AMX (all of it, or with ``allow_amx`` all but ``amx-tile`` and
    ``amx-int8``) are masked; ``"native"`` as ``-mcpu`` is
    replaced by the real host CPU name. Non-LLVM targets and LLVM targets without those features
    are returned unchanged (as :class:`tvm.target.Target`).

    Parameters
    ----------
    target : str or tvm.target.Target
    allow_vnni : bool
        Do not mask VNNI (only for a TVM whose VNNI intrinsic matches its LLVM).
    allow_amx : bool
        Keep ``amx-tile`` and ``amx-int8`` (:data:`tvm_ext.x86.amx.KEPT_FEATURES`): only for a build
        that configures the tiles itself (``tvm_ext.build(..., amx=True)``).

    Returns
    -------
    tvm.target.Target
    """
    return _safe(target, allow_vnni, logging.WARNING, allow_amx)


def _safe(target, allow_vnni: bool, level: int, allow_amx: bool = False):
    import tvm
    from tvm.target import codegen

    tgt = tvm.target.Target(target) if not isinstance(target, tvm.target.Target) else target
    if tgt.kind.name != "llvm":
        return tgt
    host = tgt.host
    text = str(tgt)  # str() of a Target never includes its host
    mcpu = str(tgt.attrs.get("mcpu", ""))
    if mcpu == "native":
        real = codegen.llvm_get_system_cpu()
        logger.info("-mcpu=native resolved to -mcpu=%s (TVM 0.19 + LLVM 22 would use 'generic')", real)
        text = text.replace("-mcpu=native", f"-mcpu={real}")
        tgt = tvm.target.Target(text, host=host)
    feats = llvm_features(tgt)
    amx = [f for f in AMX_FEATURES if f in feats and not (allow_amx and f in ("amx-tile", "amx-int8"))]
    vnni = [] if allow_vnni else [f for f in VNNI_FEATURES if f in feats]
    if not amx and not vnni:
        return tgt
    mattr = [str(a) for a in tgt.attrs.get("mattr", [])]
    # every VNNI feature is masked once one is present (a later -mattr=+avxvnni cannot bring one back)
    masked_feats = [*(VNNI_FEATURES if vnni else ()), *amx]
    # a masked feature's own "+f" (host_target enables what a CPU name leaves out) goes with it
    mattr = [a for a in mattr if a.lstrip("+") not in masked_feats or not a.startswith("+")]
    mattr += [f"-{f}" for f in masked_feats if f"-{f}" not in mattr]
    base = " ".join(p for p in text.split() if not p.startswith("-mattr="))
    masked = tvm.target.Target(f"{base} -mattr={','.join(mattr)}", host=host)
    if text in _WARNED:
        level = logging.DEBUG
    _WARNED.add(text)
    if vnni:
        logger.log(level, "masking %s on target '%s': TVM 0.19's VNNI int8 intrinsic aborts LLVM %s "
                   "('Calling a function with a bad signature!')", ",".join(vnni), tgt, codegen.llvm_version_major())
    if amx:
        # AMX is masked on every path, so it is expected: INFO at most
        logger.log(min(level, logging.INFO), "masking %s on target '%s': TVM 0.19's AMX schedules configure no "
                   "tiles (no ldtilecfg) and would die with SIGILL", ",".join(amx), tgt)
    logger.debug("building for '%s'", masked)
    return masked


def build_target(target: TargetLike | None = None, allow_vnni: bool | None = None, allow_amx: bool = False):
    """The target :func:`tvm_ext.build` compiles for.

    Like :func:`safe_target` (or :func:`host_target` when ``target`` is None), except that VNNI
    is kept when :mod:`tvm_ext.x86.int8_conv` can build it: ``tvm_ext.build`` compiles inside
    :func:`tvm_ext.x86.int8_conv.kernels`, whose VNNI intrinsic has LLVM 22's operand types.

    Parameters
    ----------
    target : str or tvm.target.Target, optional
        A target that already masks VNNI (``-mattr=-avx512vnni``) stays masked.
    allow_vnni : bool, optional
        None (default): keep AVX-512 VNNI when the CPU has it (with AVX-512 BW). False: mask it,
        as for a plain ``relay.build``. True: keep any VNNI feature.
    allow_amx : bool
        Keep ``amx-tile`` and ``amx-int8`` (see :func:`safe_target`). Default False.

    Returns
    -------
    tvm.target.Target
    """
    from .int8_policy import vnni_ready

    if allow_vnni is None:
        probe = (host_target(allow_vnni=True, allow_amx=allow_amx) if target is None
                 else safe_target(target, allow_vnni=True, allow_amx=allow_amx))
        if probe.kind.name == "llvm" and vnni_ready(probe):
            logger.debug("building for '%s' with AVX-512 VNNI (tvm_ext.x86.int8_conv kernels)", probe)
            return probe
        allow_vnni = False
    return (host_target(allow_vnni=allow_vnni, allow_amx=allow_amx) if target is None
            else safe_target(target, allow_vnni=allow_vnni, allow_amx=allow_amx))
