"""tvm_ext.x86.isa and the per-ISA kernel policy: what is compiled where, and what may run here.

Cross-CPU checks compile only and read the generated assembly (in a child process, so an LLVM
abort cannot take the test session with it); nothing built for a foreign CPU is executed.
"""
import json
import subprocess
import sys

import pytest

import tvm_ext
from tvm_ext.x86 import isa


def test_host_features_come_from_cpuid_not_the_cpu_name():
    feats = isa.host_features()
    assert "sse2" in feats and "avx2" in feats, "the suite's floor is x86-64 with AVX2"
    assert isa.runs_on_host(tvm_ext.host_target()), "the host target must run on the host"
    assert isa.runs_on_host(tvm_ext.build_target()), "tvm_ext.build's default target must run on the host"
    assert isa.runs_on_host("llvm -mcpu=x86-64-v3"), "AVX2 code (x86-64-v3) runs on every host of the suite"
    # a named CPU's code runs only where all of its code-generation features do: znver3 enables
    # AMD's sse4a, which no Intel CPU has, and VAES, which Zen 1 and 2 lack
    runs = isa.runs_on_host("llvm -mcpu=znver3")
    assert runs == (isa.missing_on_host("llvm -mcpu=znver3") == [])
    if not {"avx2", "fma", "bmi2", "sse4a", "vaes"} <= feats:
        assert not runs


def test_code_for_another_architecture_never_runs_on_host():
    """An aarch64 target names no x86 feature the host lacks; its architecture decides."""
    assert not isa.runs_on_host("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1 -mattr=+neon,+dotprod")
    assert isa.runs_on_host("llvm -mtriple=x86_64-linux-gnu -mcpu=x86-64-v3")


def test_avx2_code_is_vendor_neutral():
    """x86-64-v3 asks for nothing that an AVX2 CPU of either vendor lacks (compile-time features only)."""
    v3 = isa._codegen(isa.llvm_features("llvm -mcpu=x86-64-v3"))
    assert {"avx2", "fma", "bmi2"} <= v3
    for cpu in ("haswell", "alderlake", "sapphirerapids", "znver3", "znver4"):
        assert v3 <= isa._codegen(isa.llvm_features(f"llvm -mcpu={cpu}")), cpu
    assert "sse4a" in isa.llvm_features("llvm -mcpu=znver3"), "znver3 is AMD code"


@pytest.mark.parametrize("target, expected", [
    ("llvm -mcpu=x86-64-v3", "avx2"),
    ("llvm -mcpu=znver3", "avx2"),
    ("llvm -mcpu=x86-64-v4", "avx512"),
    ("llvm -mcpu=sapphirerapids", "amx"),
    ("llvm -mcpu=sapphirerapids -mattr=-amx-int8", "avx512_vnni"),
    ("llvm -mcpu=alderlake", "avx2"),          # AVX-VNNI only: TVM has no 256-bit VNNI intrinsic
    ("llvm -mcpu=skylake-avx512", "avx512"),
    ("llvm -mcpu=znver4 -mattr=-avx512vnni", "avx512"),
    ("llvm -mcpu=cascadelake", "avx512_vnni"),
    ("llvm -mcpu=znver4", "avx512_vnni"),
    ("llvm -mcpu=znver4 -mattr=-avx512f", "avx2"),
    ("llvm -mcpu=nehalem", "sse"),
    ("llvm -mtriple=aarch64-linux-gnu", "other"),
    ("c", "other"),
])
def test_isa_class(target, expected):
    assert isa.isa_class(target) == expected


def test_missing_on_host_lists_codegen_features_only(monkeypatch):
    znver3 = isa.llvm_features("llvm -mcpu=znver3")
    monkeypatch.setattr(isa, "host_features", lambda: znver3 - {"pku", "rdpru"})
    assert isa.missing_on_host("llvm -mcpu=znver3") == [], "system features never block running"
    missing = isa.missing_on_host("llvm -mcpu=znver4")
    assert "avx512f" in missing and "avx512vnni" in missing and "pku" not in missing
    assert not isa.runs_on_host("llvm -mcpu=znver4")


def test_host_target_masks_features_a_hypervisor_hides(monkeypatch):
    """A Zen 4 guest without AVX-512: the CPU name says znver4, the target must not use AVX-512."""
    from tvm.target import codegen

    znver3 = isa.llvm_features("llvm -mcpu=znver3")
    monkeypatch.setattr(isa, "host_features", lambda: znver3)
    monkeypatch.setattr(codegen, "llvm_get_system_cpu", lambda: "znver4")
    monkeypatch.delenv("TVM_EXT_MCPU", raising=False)
    t = tvm_ext.host_target()
    assert str(t.attrs["mcpu"]) == "znver4"
    assert isa.isa_class(t) == "avx2" and isa.runs_on_host(t)
    # an explicit CPU is a cross-compilation request and is kept as asked
    assert isa.isa_class(tvm_ext.host_target("znver4", allow_vnni=True)) == "avx512_vnni"


def test_host_target_enables_features_an_older_cpu_name_leaves_out(monkeypatch):
    """A Sapphire Rapids guest whose CPUID model LLVM names rocketlake: AMX, AVX-VNNI and AVX512-FP16
    are the host's even though the name lacks them, and the target must say so."""
    from tvm.target import codegen

    spr = isa.llvm_features("llvm -mcpu=sapphirerapids")
    monkeypatch.setattr(isa, "host_features", lambda: spr)
    monkeypatch.setattr(codegen, "llvm_get_system_cpu", lambda: "rocketlake")
    monkeypatch.delenv("TVM_EXT_MCPU", raising=False)
    assert "avxvnni" in isa.unnamed_on_host("llvm -mcpu=rocketlake")
    plain = tvm_ext.host_target()
    assert str(plain.attrs["mcpu"]) == "rocketlake"
    assert "avx512fp16" in isa.llvm_features(plain) and isa.runs_on_host(plain)
    # VNNI and AMX are masked as on any host, and the mask leaves no "+feature" behind it
    assert isa.isa_class(plain) == "avx512"
    assert not any(a in ("+avxvnni", "+amx-int8", "+amx-tile") for a in plain.attrs["mattr"])
    assert isa.isa_class(tvm_ext.x86.target.build_target()) == "avx512_vnni"
    amx = tvm_ext.x86.target.build_target(allow_amx=True)
    assert isa.isa_class(amx) == "amx" and isa.runs_on_host(amx)
    # a host with nothing beyond its CPU's name gets the name alone
    monkeypatch.setattr(isa, "host_features", lambda: isa.llvm_features("llvm -mcpu=rocketlake"))
    assert isa.unnamed_on_host("llvm -mcpu=rocketlake") == []


# What each CPU's target must compile a uint8 x int8 conv to (the instruction-set promise).
ISA_PROMISE = {
    "x86-64-v3": {"isa": "avx2", "dot": "vpmaddubsw", "zmm": False},
    "znver3": {"isa": "avx2", "dot": "vpmaddubsw", "zmm": False},
    "alderlake": {"isa": "avx2", "dot": "vpmaddubsw", "zmm": False},
    "skylake-avx512": {"isa": "avx512", "dot": "vpmaddubsw", "zmm": True},
    "cascadelake": {"isa": "avx512_vnni", "dot": "vpdpbusd", "zmm": True},
    "znver4": {"isa": "avx512_vnni", "dot": "vpdpbusd", "zmm": True},
}

_COMPILE = r"""
import json, re, sys
import numpy as np, tvm
from tvm import relay
import tvm_ext
from tvm_ext.x86 import int8_policy
x = relay.var("x", shape=(1, 64, 14, 14), dtype="uint8")
# weights in [-64, 64]: no vpmaddubsw pair can saturate, so the saturating dot product stays (full-range
# weights take the exact int16 pairs without VNNI: tests/x86/test_exact_int8.py)
w = relay.const(np.random.default_rng(0).integers(-64, 65, (64, 64, 3, 3)).astype("int8"))
y = relay.nn.conv2d(x, w, padding=1, channels=64, kernel_size=3, out_dtype="int32")
y = relay.cast(relay.clip(relay.right_shift(y, relay.const(8)), 0, 255), "uint8")
mod = tvm.IRModule.from_expr(relay.Function([x], y))
out = {}
for cpu in sys.argv[1:]:
    lib = tvm_ext.build(mod, target=f"llvm -mcpu={cpu}")  # compiled only: never run here
    asm = lib.get_lib().get_source("asm")
    pol = int8_policy.policy(tvm_ext.build_target(f"llvm -mcpu={cpu}"))
    out[cpu] = {"policy": {"isa": pol.isa, "dot": pol.dot, "vector_bits": pol.vector_bits},
                **{k: len(re.findall(k, asm)) for k in ("vpdpbusd", "vpmaddubsw", "zmm", "ymm")}}
print("RESULT " + json.dumps(out))
"""


def test_int8_conv_uses_the_promised_instruction_set_per_cpu():
    r = subprocess.run([sys.executable, "-c", _COMPILE, *ISA_PROMISE], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.split("RESULT ", 1)[1])
    for cpu, want in ISA_PROMISE.items():
        g = got[cpu]
        assert g["policy"]["isa"] == want["isa"], (cpu, g)
        assert g["policy"]["dot"] == want["dot"], (cpu, g)
        assert g["policy"]["vector_bits"] == (512 if want["zmm"] else 256), (cpu, g)
        other = "vpmaddubsw" if want["dot"] == "vpdpbusd" else "vpdpbusd"
        assert g[want["dot"]] > 0 and g[other] == 0, f"{cpu}: expected {want['dot']} only: {g}"
        if want["zmm"]:
            assert g["zmm"] > 0, f"{cpu}: AVX-512 promised, no zmm register used: {g}"
        else:
            assert g["zmm"] == 0 and g["ymm"] > 0, f"{cpu}: AVX2 promised: {g}"


_AMX_COMPILE = r"""
import json, re, sys
import numpy as np, tvm
from tvm import relay
import tvm_ext
from tvm_ext.x86 import int8_conv as x86_int8

rng = np.random.default_rng(0)
x = relay.var("x", shape=(32, 128), dtype="uint8")
w = relay.const(rng.integers(-128, 128, (64, 128)).astype("int8"))
dense = tvm.IRModule.from_expr(relay.Function([x], relay.nn.dense(x, w, out_dtype="int32")))
d = relay.var("d", shape=(1, 64, 14, 14), dtype="uint8")
k = relay.const(rng.integers(-128, 128, (64, 64, 3, 3)).astype("int8"))
conv = tvm.IRModule.from_expr(relay.Function([d], relay.nn.conv2d(d, k, padding=1, channels=64, kernel_size=3,
                                                                  out_dtype="int32")))


def count(lib):
    asm = lib.get_lib().get_source("asm")
    return {i: len(re.findall(rf"\b{i}\w*", asm)) for i in ("tdpbusd", "ldtilecfg", "tileloadd", "vpdpbusd")}


out = {}
for cpu in sys.argv[1:]:
    target = f"llvm -mcpu={cpu}"
    out[cpu] = {"ext_dense": count(tvm_ext.build(dense, target=target)),  # compiled only: never run here
                "ext_conv": count(tvm_ext.build(conv, target=target))}
    with x86_int8.kernels(schedule=False), tvm.transform.PassContext(opt_level=3):  # TVM's own choice
        out[cpu]["tvm_dense"] = count(relay.build(dense, target=target))
print("RESULT " + json.dumps(out))
"""


def test_no_amx_code_leaves_tvm_ext_builds():
    """TVM 0.19 puts an AMX-capable CPU's uint8 x int8 dense on tiles (tdpbusd) without ldtilecfg: such code
    dies with SIGILL. Builds through tvm-ext mask AMX, so neither tile instruction appears; the dense and
    the conv still compute with VNNI. Compiled in a child process, never run."""
    cpus = ["sapphirerapids", "graniterapids", "x86-64-v3", "znver4"]
    r = subprocess.run([sys.executable, "-c", _AMX_COMPILE, *cpus], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.split("RESULT ", 1)[1])
    for cpu in cpus:
        for kind in ("ext_dense", "ext_conv"):
            g = got[cpu][kind]
            assert g["tdpbusd"] == g["ldtilecfg"] == g["tileloadd"] == 0, (cpu, kind, g)
            if cpu != "x86-64-v3":
                assert g["vpdpbusd"] > 0, (cpu, kind, g)
    for cpu in ("sapphirerapids", "graniterapids"):
        tvm_own = got[cpu]["tvm_dense"]
        assert tvm_own["tdpbusd"] > 0 and tvm_own["ldtilecfg"] == 0, (
            f"TVM's own AMX dense at {cpu}: {tvm_own} (tile code without tile configuration is why AMX is masked)")
