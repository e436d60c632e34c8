"""tvm_ext.build(..., amx=True): compiled for AMX CPUs, and run where the host has AMX.

Builds for AMX CPUs compile in a child process (an LLVM abort cannot take the session with it) and
are checked by reading the assembly and the LLVM IR. Real AMX code runs in one test only, in a child
process, on a host with AMX whose kernel granted the tile state; elsewhere it is skipped with the reason.
"""
import json
import subprocess
import sys

import pytest

from tvm_ext.x86 import amx


# --------------------------------------------------------------------------------------------
# tvm_ext.build(..., amx=True): compiled for AMX CPUs in a child process, never run here

_COMPILE = r"""
import json, re, sys
import numpy as np, tvm
from tvm import relay
import tvm_ext
from tvm_ext.x86 import int8_conv as x86_int8

rng = np.random.default_rng(0)


def dense(m, k, n, epilogue=False):
    x = relay.var("x", shape=(m, k), dtype="uint8")
    y = relay.nn.dense(x, relay.const(rng.integers(-128, 128, (n, k)).astype("int8")), out_dtype="int32")
    if epilogue:
        y = relay.nn.relu(relay.nn.bias_add(y, relay.const(rng.integers(-99, 99, (n,)).astype("int32"))))
    return tvm.IRModule.from_expr(relay.Function([x], y))


def batch_matmul(b, m, k, n):
    x = relay.var("x", shape=(b, m, k), dtype="uint8")
    w = relay.const(rng.integers(-128, 128, (b, n, k)).astype("int8"))
    return tvm.IRModule.from_expr(relay.Function([x], relay.nn.batch_matmul(x, w, out_dtype="int32")))


def conv():
    d = relay.var("d", shape=(1, 64, 14, 14), dtype="uint8")
    k = relay.const(rng.integers(-128, 128, (64, 64, 3, 3)).astype("int8"))
    return tvm.IRModule.from_expr(relay.Function([d], relay.nn.conv2d(d, k, padding=1, channels=64, kernel_size=3,
                                                                      out_dtype="int32")))


TILE = ("tilezero", "tileloadd", "tdpbusd", "tilestored")


def blocks(body):
    # (label, text) of each basic block of an LLVM function body
    out, label, lines = [], "entry", []
    for line in body.splitlines():
        m = re.match(r"^([\w.$-]+):", line)
        if m:
            if lines:
                out.append((label, "\n".join(lines)))
            label, lines = m.group(1), []
        else:
            lines.append(line)
    out.append((label, "\n".join(lines)))
    return out


def first(text, pattern, after=-1):
    return min([m.start() for m in re.finditer(pattern, text) if m.start() > after], default=None)


def ordered(ll):
    # on every path of every LLVM function (a parallel task is one), an ldtilecfg comes before each tile
    # instruction and a tilerelease after it before the function returns
    tile, cfg, rel = r"@llvm\.x86\.(%s)" % "|".join(TILE), r"@llvm\.x86\.ldtilecfg\(", r"@llvm\.x86\.tilerelease\("
    for body in re.findall(r"^define [^\n]*\{\n(.*?)^\}", ll, re.S | re.M):
        bbs = blocks(body)
        succ = {name: re.findall(r"label %([\w.$-]+)", text) for name, text in bbs}
        text = dict(bbs)
        todo, seen = [bbs[0][0]], set()
        while todo:  # unconfigured paths from the entry
            b = todo.pop()
            if b in seen:
                continue
            seen.add(b)
            c, t = first(text[b], cfg), first(text[b], tile)
            if t is not None and (c is None or t < c):
                return False
            if c is None:
                todo += succ[b]
        todo, seen = [], set()
        for name, t in bbs:  # paths from the last tile instruction of a block to a return
            last = max([m.start() for m in re.finditer(tile, t)], default=None)
            if last is not None and first(t, rel, last) is None:
                if first(t, r"\bret ", last) is not None:
                    return False
                todo += succ[name]
        while todo:
            b = todo.pop()
            if b in seen:
                continue
            seen.add(b)
            r, ret = first(text[b], rel), first(text[b], r"\bret ")
            if ret is not None and (r is None or ret < r):
                return False
            if r is None:
                todo += succ[b]
    return True


def count(lib):
    asm, ll = lib.get_lib().get_source("asm"), lib.get_lib().get_source("ll")
    got = {i: len(re.findall(rf"\b{i}\w*", asm)) for i in ("tdpbusd", "tileloadd", "ldtilecfg", "tilerelease",
                                                             "vpdpbusd")}
    got["ll_ldtilecfg"] = len(re.findall(r"call void @llvm\.x86\.ldtilecfg\(", ll))
    got["ll_tilerelease"] = len(re.findall(r"call void @llvm\.x86\.tilerelease\(", ll))
    got["ordered"] = ordered(ll)
    return got


cases = {"dense": (dense(64, 256, 64), True), "dense_off": (dense(64, 256, 64), False),
         "dense_epilogue": (dense(128, 512, 128, True), True), "dense_small": (dense(1, 128, 64), True),
         "dense_96_rows": (dense(96, 256, 64), True), "batch_matmul": (batch_matmul(2, 64, 256, 64), True),
         "conv": (conv(), True)}
out = {}
# every case on Sapphire Rapids; Granite Rapids has the same AMX-INT8 tiles: the tile and the VNNI paths
for cpu in sys.argv[1:]:
    names = {"sapphirerapids": cases, "graniterapids": ("dense", "batch_matmul", "conv")}.get(
        cpu, ("dense", "batch_matmul"))
    out[cpu] = {n: count(tvm_ext.build(cases[n][0], target=f"llvm -mcpu={cpu}", amx=cases[n][1])) for n in names}
    if cpu == "sapphirerapids":  # TVM's own AMX dense: tile code, no configuration
        with x86_int8.kernels(schedule=False), tvm.transform.PassContext(opt_level=3):
            out[cpu]["tvm_own"] = count(relay.build(cases["dense"][0], target=f"llvm -mcpu={cpu}"))
print("RESULT " + json.dumps(out))
"""


def test_amx_opt_in_compiles_configured_tile_code():
    """With ``amx=True``, Sapphire/Granite Rapids int8 dense and batch_matmul compute with tdpbusd on tiles that
    every kernel configures (ldtilecfg before its first tile instruction, tilerelease after its last, in each LLVM
    function, so in each parallel task); shapes that are not whole tiles, and convs, use VNNI. Without the opt-in,
    or on CPUs without AMX, no tile instruction. Compiled in a child process, never run."""
    cpus = ["sapphirerapids", "graniterapids", "x86-64-v3", "znver4"]
    r = subprocess.run([sys.executable, "-c", _COMPILE, *cpus], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.split("RESULT ", 1)[1])
    assert set(got["sapphirerapids"]) > set(got["graniterapids"]) == {"dense", "batch_matmul", "conv"}
    for cpu in ("sapphirerapids", "graniterapids"):
        for case in ("dense", "dense_epilogue", "batch_matmul"):
            if case not in got[cpu]:
                continue
            g = got[cpu][case]
            assert min(g["tdpbusd"], g["tileloadd"], g["ldtilecfg"], g["tilerelease"]) > 0, (cpu, case, g)
            assert g["ll_ldtilecfg"] > 0 and g["ll_tilerelease"] > 0 and g["ordered"], (cpu, case, g)
        for case in ("dense_off", "dense_small", "dense_96_rows", "conv"):
            if case not in got[cpu]:
                continue
            g = got[cpu][case]
            assert g["tdpbusd"] == g["tileloadd"] == g["ldtilecfg"] == g["tilerelease"] == 0, (cpu, case, g)
            assert g["vpdpbusd"] > 0, (cpu, case, g)
    own = got["sapphirerapids"]["tvm_own"]
    assert own["tdpbusd"] > 0 and own["ll_ldtilecfg"] == 0 and not own["ordered"], (
        f"the path check must reject TVM's unconfigured AMX dense: {own}")
    for cpu in ("x86-64-v3", "znver4"):
        for case, g in got[cpu].items():
            assert g["tdpbusd"] == g["tileloadd"] == g["ldtilecfg"] == g["tilerelease"] == 0, (cpu, case, g)


# --------------------------------------------------------------------------------------------
# Running AMX code: only on an AMX host whose kernel grants the tile state, in a child process

_RUN = r"""
import sys
import numpy as np, tvm
from tvm import relay
from tvm.contrib import graph_executor
import tvm_ext
from tvm_ext.x86 import amx

if not (amx.host_has_amx() and amx.request_tile_state()[0]):  # checked again in this process
    print("NO_AMX " + amx.request_tile_state()[1])
    sys.exit(0)
rng = np.random.default_rng(0)
failures = []
for m, k, n, epilogue in [(64, 256, 64, False), (512, 512, 512, False), (128, 512, 128, True)]:
    x = relay.var("x", shape=(m, k), dtype="uint8")
    w = rng.integers(-128, 128, (n, k)).astype("int8")
    b = rng.integers(-99, 99, (n,)).astype("int32")
    y = relay.nn.dense(x, relay.const(w), out_dtype="int32")
    if epilogue:
        y = relay.nn.relu(relay.nn.bias_add(y, relay.const(b)))
    mod = tvm.IRModule.from_expr(relay.Function([x], y))
    data = rng.integers(0, 256, (m, k)).astype("uint8")
    outs = []
    for use_amx in (True, False):
        lib = tvm_ext.build(mod, amx=use_amx)
        asm = lib.get_lib().get_source("asm")
        if use_amx and "tdpbusd" not in asm:
            failures.append(f"{(m, k, n)}: no tile code with amx=True")
        g = graph_executor.GraphModule(lib["default"](tvm.cpu()))
        g.set_input("x", data)
        g.run()
        outs.append(g.get_output(0).numpy())
    ref = data.astype("int64") @ w.astype("int64").T
    if epilogue:
        ref = np.maximum(ref + b, 0)
    if not (np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], ref)):
        failures.append(f"{(m, k, n)}: AMX and VNNI builds differ")
print("FAILURES " + repr(failures))
"""


def test_amx_build_runs_bit_exact_where_the_host_has_amx():
    if not amx.host_has_amx():
        pytest.skip("this host has no AMX (CPUID): AMX code is compiled and read here, never run")
    granted, reason = amx.request_tile_state()
    if not granted:
        pytest.skip(f"this host has AMX but no tile state: {reason}")
    r = subprocess.run([sys.executable, "-c", _RUN], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, f"AMX kernels died ({r.returncode}): {r.stderr[-3000:]}"
    assert "NO_AMX" not in r.stdout, r.stdout
    assert "FAILURES []" in r.stdout, r.stdout
