"""tvm_ext.tools._remote_cpu: the remote CPU's features against a target's, without a board.

The oracle for the HWCAP bits is Linux's uapi header (arch/arm64/include/uapi/asm/hwcap.h), written
out here; the probe's compiled code is checked on this host against ctypes' getauxval. The flow
against an emulated board (qemu's Cortex-A76 refusing a Neoverse-V1 library) is in
tests/arm/test_aarch64_board_guide.py.
"""
import ctypes
import logging

import pytest
import tvm
from tvm import rpc
from tvm.target import codegen

from tvm_ext.tools import _remote_cpu
from tvm_ext.tools.deploy import DeployError

A72 = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72 -mattr=+neon"
N1 = "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1 -mattr=+neon,+dotprod"
V1 = "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-v1 -mattr=+neon,+dotprod,+i8mm"
PI4 = frozenset("fp asimd evtstrm crc32 cpuid".split())  # a Raspberry Pi 4's /proc/cpuinfo Features

# from Linux's arch/arm64/include/uapi/asm/hwcap.h
HWCAP_FP, HWCAP_ASIMD, HWCAP_ATOMICS, HWCAP_ASIMDDP, HWCAP_SVE, HWCAP_PACG = 1 << 0, 1 << 1, 1 << 8, 1 << 20, 1 << 22, \
    1 << 31
HWCAP2_SVE2, HWCAP2_I8MM, HWCAP2_BF16, HWCAP2_SME = 1 << 1, 1 << 13, 1 << 14, 1 << 23


def test_decode_hwcaps_follows_linux_bits():
    assert _remote_cpu.decode_hwcaps(HWCAP_FP | HWCAP_ASIMD | HWCAP_ASIMDDP, HWCAP2_I8MM) == {
        "fp", "asimd", "asimddp", "i8mm"}
    assert _remote_cpu.decode_hwcaps(HWCAP_ATOMICS | HWCAP_SVE | HWCAP_PACG, HWCAP2_SVE2 | HWCAP2_BF16 | HWCAP2_SME) \
        == {"atomics", "sve", "pacg", "sve2", "bf16", "sme"}
    assert _remote_cpu.decode_hwcaps(0, 0) == set()
    assert _remote_cpu.decode_hwcaps(1 << 40, 1 << 40) == set()  # bits this table does not name are ignored


def test_parse_cpuinfo_features():
    text = "processor\t: 0\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\nCPU part\t: 0xd08\n"
    assert _remote_cpu.parse_cpuinfo_features(text) == PI4
    assert _remote_cpu.parse_cpuinfo_features("flags\t\t: fpu vme avx2\n") == set()  # x86: no Features line


def test_missing_features():
    assert _remote_cpu.missing_features(_remote_cpu.target_features(A72), PI4) == {}  # crypto is not compared
    lacking = _remote_cpu.missing_features(_remote_cpu.target_features(N1), PI4)
    assert lacking == {"dotprod": ("asimddp",), "fullfp16": ("fphp", "asimdhp"), "lse": ("atomics",),
                       "rcpc": ("lrcpc",), "rdm": ("asimdrdm",)}
    pi5 = PI4 | {"aes", "pmull", "sha1", "sha2", "atomics", "fphp", "asimdhp", "asimdrdm", "lrcpc", "dcpop", "asimddp"}
    assert _remote_cpu.missing_features(_remote_cpu.target_features(N1), pi5) == {}
    assert {"i8mm", "sve", "bf16"} <= set(_remote_cpu.missing_features(_remote_cpu.target_features(V1), pi5))
    # only the LLVM features the table knows are compared: tuning flags and system features are not
    assert _remote_cpu.missing_features({"neoversen1", "spe", "ras", "el3", "v8.2a"}, set()) == {}


def test_probe_calls_getauxval():
    """The probe, built for this host and run here, returns what libc's getauxval returns."""
    triple = str(codegen.llvm_get_system_triple())
    mod = _remote_cpu._probe(triple)
    out = tvm.nd.empty((2,), "int64")
    mod["tvm_ext_hwcaps"](out)
    libc = ctypes.CDLL(None)
    libc.getauxval.restype = ctypes.c_ulong
    libc.getauxval.argtypes = [ctypes.c_ulong]
    assert [int(v) & (2**64 - 1) for v in out.numpy()] == [libc.getauxval(16), libc.getauxval(26)]


def test_check_refuses_in_one_line(monkeypatch):
    monkeypatch.setattr(_remote_cpu, "remote_features", lambda sess, target, where: PI4)
    with pytest.raises(DeployError) as err:
        _remote_cpu.check_remote_cpu(None, N1, "10.0.0.7:9090")
    text = str(err.value)
    assert "\n" not in text and text.startswith("the CPU at 10.0.0.7:9090 lacks dotprod (cpuinfo: asimddp)")
    assert "SIGILL" in text and "its features: asimd cpuid crc32 evtstrm fp" in text
    assert _remote_cpu.check_remote_cpu(None, A72, "10.0.0.7:9090") == PI4
    # a library's sidecar lists its features: those are what is compared
    assert _remote_cpu.check_remote_cpu(None, N1, "10.0.0.7:9090", needed=["neon", "fp-armv8"]) == PI4


def test_a_remote_that_cannot_run_the_probe_is_not_checked(caplog):
    """No aarch64 CPU behind a session on this host: the probe cannot load, the check says so and passes."""
    with caplog.at_level(logging.WARNING, logger="tvm_ext.tools._remote_cpu"):
        assert _remote_cpu.check_remote_cpu(rpc.LocalSession(), N1, "local") is None
    assert "could not read the CPU features of local" in caplog.text
    # not aarch64 Linux: not probed
    assert _remote_cpu.remote_features(rpc.LocalSession(), "llvm -mtriple=armv7l-linux-gnueabihf", "local") is None
