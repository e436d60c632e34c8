"""What a remote aarch64 CPU can execute, read through a TVM RPC session, against what a target needs.

Design note
-----------
A library compiled with an ``-mcpu``/``-mattr`` the board lacks loads fine and dies with SIGILL at its
first such instruction, taking the RPC server's session with it. So before anything is run on a
remote, :func:`check_remote_cpu` reads what the remote CPU has and compares it with the LLVM features
of the library's target; a missing one is refused in one line (:class:`tvm_ext.tools.deploy.DeployError`).

Reading the remote CPU: the TVM runtime a board runs has no function that reports CPU features (it
has no LLVM), and ``/proc/cpuinfo`` is not readable through it. What every Linux process has is its
auxiliary vector: ``getauxval(AT_HWCAP)`` and ``getauxval(AT_HWCAP2)`` are the kernel's list of the
CPU features user space may use, the same bits ``/proc/cpuinfo``'s ``Features`` line prints. The
probe (:func:`remote_features`) is a two-line TIR function calling ``getauxval``, compiled here for
the remote's architecture at its baseline (no ``-mcpu``, nothing a board could lack), linked and
uploaded like any library, and run there; under qemu-user, ``getauxval`` answers for the emulated
CPU (``QEMU_CPU``). Remotes that are not aarch64 Linux are not probed (None: not checked).

What is compared (:data:`CHECKED`): the LLVM features that change the instructions LLVM emits for
ordinary arithmetic and memory code (SIMD, floating point, dot product, matrix multiply, SVE, atomics),
each with the ``/proc/cpuinfo`` names that must all be present. Features LLVM emits only from
explicit intrinsics (``crc``, ``aes``, ``sha2``, ...: TVM's kernels call none; a Raspberry Pi 4 has no
crypto extension while ``-mcpu=cortex-a72`` lists it), system-level features (``ras``, ``spe``,
``el3``, ...) and tuning flags are not compared.
"""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Iterable, Optional

from .deploy import DeployError, foreign_arch

logger = logging.getLogger(__name__)

__all__ = ["CHECKED", "HWCAP", "HWCAP2", "decode_hwcaps", "parse_cpuinfo_features", "target_features",
           "missing_features", "remote_features", "check_remote_cpu"]

#: Linux's ``AT_HWCAP`` bits on aarch64 (``arch/arm64/include/uapi/asm/hwcap.h``), by ``/proc/cpuinfo`` name.
HWCAP = ("fp", "asimd", "evtstrm", "aes", "pmull", "sha1", "sha2", "crc32", "atomics", "fphp", "asimdhp",
         "cpuid", "asimdrdm", "jscvt", "fcma", "lrcpc", "dcpop", "sha3", "sm3", "sm4", "asimddp", "sha512",
         "sve", "asimdfhm", "dit", "uscat", "ilrcpc", "flagm", "ssbs", "sb", "paca", "pacg")

#: Linux's ``AT_HWCAP2`` bits on aarch64, by ``/proc/cpuinfo`` name.
HWCAP2 = ("dcpodp", "sve2", "sveaes", "svepmull", "svebitperm", "svesha3", "svesm4", "flagm2", "frint",
          "svei8mm", "svef32mm", "svef64mm", "svebf16", "i8mm", "bf16", "dgh", "rng", "bti", "mte", "ecv",
          "afp", "rpres", "mte3", "sme")

#: LLVM feature -> the ``/proc/cpuinfo`` features a CPU needs to run code compiled with it.
CHECKED = {
    "fp-armv8": ("fp",),
    "neon": ("asimd",),
    "fullfp16": ("fphp", "asimdhp"),
    "fp16fml": ("asimdfhm",),
    "rdm": ("asimdrdm",),
    "dotprod": ("asimddp",),
    "i8mm": ("i8mm",),
    "bf16": ("bf16",),
    "sve": ("sve",),
    "sve2": ("sve2",),
    "sve-bitperm": ("svebitperm",),
    "lse": ("atomics",),
    "rcpc": ("lrcpc",),
    "rcpc-immo": ("ilrcpc",),
    "jsconv": ("jscvt",),
    "complxnum": ("fcma",),
    "fptoint": ("frint",),
}

_AT_HWCAP, _AT_HWCAP2 = 16, 26
_PROBE_SYMBOL = "tvm_ext_hwcaps"


def decode_hwcaps(hwcap: int, hwcap2: int) -> frozenset:
    """The ``/proc/cpuinfo`` feature names of an aarch64 ``AT_HWCAP``/``AT_HWCAP2`` pair."""
    names = {name for bit, name in enumerate(HWCAP) if (hwcap >> bit) & 1}
    names |= {name for bit, name in enumerate(HWCAP2) if (hwcap2 >> bit) & 1}
    return frozenset(names)


def parse_cpuinfo_features(text: str) -> frozenset:
    """The names on the first ``Features`` line of an aarch64 ``/proc/cpuinfo`` (empty if none)."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "Features":
            return frozenset(value.split())
    return frozenset()


def target_features(target) -> frozenset:
    """The LLVM features ``target`` enables (its ``-mcpu`` and ``-mattr``), as LLVM reports them."""
    import tvm
    from tvm.target import codegen

    tgt = target if isinstance(target, tvm.target.Target) else tvm.target.Target(str(target))
    return frozenset(str(k) for k in codegen.llvm_get_cpu_features(tgt))


def missing_features(needed: Iterable[str], remote: Iterable[str]) -> dict:
    """``{llvm feature: cpuinfo names the remote lacks}`` for the checked features in ``needed``."""
    have = set(remote)
    out = {}
    for feat in sorted(set(needed)):
        lacking = tuple(n for n in CHECKED.get(feat, ()) if n not in have)
        if lacking:
            out[feat] = lacking
    return out


_PROBES: dict = {}


def _probe(triple: str):
    """The probe module for ``triple``, built once per process."""
    if triple not in _PROBES:
        import tvm
        from tvm import tir

        out = tir.decl_buffer((2,), "int64", name="out")
        body = tir.SeqStmt([
            tir.BufferStore(out, tir.call_extern("int64", "getauxval", tir.const(_AT_HWCAP, "int64")), [0]),
            tir.BufferStore(out, tir.call_extern("int64", "getauxval", tir.const(_AT_HWCAP2, "int64")), [1]),
        ])
        func = tir.PrimFunc([out.data], body, buffer_map={out.data: out}).with_attr("global_symbol", _PROBE_SYMBOL)
        _PROBES[triple] = tvm.build(tvm.IRModule({_PROBE_SYMBOL: func}), target=f"llvm -mtriple={triple}")
    return _PROBES[triple]


def remote_features(sess, target, where: str) -> Optional[frozenset]:
    """The remote CPU's ``/proc/cpuinfo`` feature names, read by running the probe there; None when
    the remote is not aarch64 Linux (by ``target``'s triple) or the probe could not run (logged)."""
    import tvm

    from . import _remote

    triple = foreign_arch(target)
    if not triple or not triple.startswith("aarch64") or "linux" not in triple:
        logger.info("the CPU features of %s are not checked: only aarch64 Linux remotes are probed (target %s)",
                    where, target)
        return None
    try:
        with tempfile.TemporaryDirectory(prefix="tvm_ext_probe_") as tmp:
            lib = Path(tmp) / "tvm_ext_hwcaps.tar"
            _probe(triple).export_library(str(lib))
            mod = _remote.upload_and_load(sess, _remote.shared_object(lib, target, Path(tmp)), target, where)
        out = tvm.nd.empty((2,), "int64", sess.cpu(0))
        mod[_PROBE_SYMBOL](out)
        hwcap, hwcap2 = (int(v) & (2**64 - 1) for v in out.numpy())
    except Exception as err:  # noqa: BLE001  a remote that cannot run the probe: not checked, said so
        logger.warning("could not read the CPU features of %s (%s); the library's CPU features are not checked "
                       "against it", where, _remote.last_line(err))
        return None
    feats = decode_hwcaps(hwcap, hwcap2)
    logger.info("CPU features of %s: %s", where, " ".join(sorted(feats)))
    return feats


def check_remote_cpu(sess, target, where: str, needed: Optional[Iterable[str]] = None) -> Optional[frozenset]:
    """Refuse to run code for ``target`` on the remote behind ``sess`` when its CPU lacks a feature
    the target enables; return the remote's features (None: not read, see :func:`remote_features`).

    ``needed``: the LLVM features the code uses (a library's sidecar lists them); default those of ``target``.

    Raises
    ------
    DeployError
        One line: the target, each missing LLVM feature with its ``/proc/cpuinfo`` name, and what the
        remote has.
    """
    have = remote_features(sess, target, where)
    if have is None:
        return None
    lacking = missing_features(target_features(target) if needed is None else needed, have)
    if lacking:
        names = ", ".join(f"{feat} (cpuinfo: {' '.join(cpu)})" for feat, cpu in lacking.items())
        raise DeployError(f"the CPU at {where} lacks {names}, which code for {target} uses (it would die with "
                          f"SIGILL there); its features: {' '.join(sorted(have))}. Compile for that CPU: "
                          f"docs/arm.md, 'Pick the target'")
    return have
