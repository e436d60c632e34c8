"""tvm_ext.x86.amx: the process's tile state, ConfigureTiles, and tvm_ext.build(..., amx=True).

Builds for AMX CPUs compile in a child process (an LLVM abort cannot take the session with it) and
are checked by reading the assembly and the LLVM IR. The same kernels run here with every tile
instruction replaced by scalar TIR that does what the instruction does (:func:`emulated_tiles`), in a
child process, after their assembly is checked free of tile instructions. Real AMX code runs in one
test only, in a child process, on a host with AMX whose kernel granted the tile state; elsewhere it
is skipped with the reason.
"""
import errno
import json
import os
import struct
import subprocess
import sys
import threading

import pytest
import tvm
from tvm.script import tir as T

from tvm_ext.x86 import amx, int8_policy, isa
from tvm_ext.x86.target import AMX_FEATURES, build_target, safe_target


# --------------------------------------------------------------------------------------------
# The tile state


@pytest.fixture
def fresh_state(monkeypatch):
    """request_tile_state as in a new process (restored afterwards)."""
    monkeypatch.setattr(amx, "_STATE", None)


def test_request_tile_state_on_this_host(fresh_state):
    granted, reason = amx.request_tile_state()
    assert isinstance(granted, bool) and isinstance(reason, str) and reason
    if not amx.host_has_amx():
        assert not granted, "Linux cannot grant tile state on a CPU without AMX"
        assert "ARCH_REQ_XCOMP_PERM" in reason or "not Linux" in reason or "not x86-64" in reason, reason


def test_request_tile_state_asks_once(fresh_state, monkeypatch):
    calls = []
    real = amx._arch_prctl

    def counting(code, arg):
        calls.append(code)
        return real(code, arg)

    monkeypatch.setattr(amx, "_arch_prctl", counting)
    results = []
    threads = [threading.Thread(target=lambda: results.append(amx.request_tile_state())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    again = amx.request_tile_state()
    assert len(set(results)) == 1 and again == results[0]
    if sys.platform.startswith("linux") and isa.host_features() & {"sse2"}:  # x86-64 Linux: asked exactly once
        assert calls.count(amx._ARCH_REQ_XCOMP_PERM) == 1, calls


def test_request_tile_state_reports_errno_and_never_raises(fresh_state, monkeypatch):
    if not sys.platform.startswith("linux"):
        pytest.skip("arch_prctl is Linux's")
    monkeypatch.setattr(amx.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(amx, "_arch_prctl", lambda code, arg: (-1, errno.EINVAL))
    granted, reason = amx.request_tile_state()
    assert not granted and "EINVAL" in reason and "no AMX" in reason

    monkeypatch.setattr(amx, "_STATE", None)

    def broken(code, arg):
        raise OSError("libc has no syscall")

    monkeypatch.setattr(amx, "_arch_prctl", broken)
    granted, reason = amx.request_tile_state()
    assert not granted and "libc has no syscall" in reason


def test_request_tile_state_checks_the_granted_mask(fresh_state, monkeypatch):
    """A request that returns 0 but leaves XTILEDATA out of the permitted features is not a grant."""
    if not sys.platform.startswith("linux"):
        pytest.skip("arch_prctl is Linux's")
    monkeypatch.setattr(amx.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(amx, "_arch_prctl", lambda code, arg: (0, 0))  # the mask stays 0
    granted, reason = amx.request_tile_state()
    assert not granted and "without XTILEDATA" in reason


def test_request_tile_state_elsewhere(fresh_state, monkeypatch):
    monkeypatch.setattr(amx.platform, "machine", lambda: "aarch64")
    called = []
    monkeypatch.setattr(amx, "_arch_prctl", lambda *a: called.append(a) or (0, 0))
    granted, reason = amx.request_tile_state()
    assert not granted and not called, "syscall 158 is arch_prctl on x86-64 only"
    assert "aarch64" in reason or "not Linux" in reason


def test_prepare_process_asks_only_where_linux_lists_amx(monkeypatch):
    asked = []
    monkeypatch.setattr(amx, "request_tile_state", lambda: asked.append(1) or (False, "refused"))
    monkeypatch.setattr(amx, "_linux_lists_amx", lambda: False)
    amx.prepare_process()
    assert not asked
    monkeypatch.setattr(amx, "_linux_lists_amx", lambda: True)
    amx.prepare_process()
    assert asked == [1]


def test_import_asks_nothing():
    """``import tvm_ext`` neither asks Linux for the tile state nor loads TVM (a child process: a new one)."""
    code = "import sys, tvm_ext; from tvm_ext.x86 import amx; print('tvm' in sys.modules, amx._STATE is None)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["False", "True"], "import tvm_ext stays cheap and leaves the tile state alone"


def test_only_an_amx_build_asks_for_the_tile_state(monkeypatch):
    """``tvm_ext.build(..., amx=True)`` asks (the result may run in this process), a build without it does not."""
    import tvm_ext
    from tvm import relay

    asked = []
    monkeypatch.setattr(amx, "prepare_process", lambda: asked.append(1))
    x = relay.var("x", shape=(1, 8), dtype="float32")
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.nn.relu(x)))
    target = "llvm -mcpu=x86-64-v3"  # AVX2 code: no AMX features, cheap to build
    tvm_ext.build(mod, target=target)
    assert not asked
    tvm_ext.build(mod, target=target, amx=True)
    assert asked == [1]


# --------------------------------------------------------------------------------------------
# Targets and the isa class


def test_amx_is_masked_unless_asked():
    spr = "llvm -mcpu=sapphirerapids"
    assert {"amx-tile", "amx-int8"} <= isa.llvm_features(spr), "LLVM's Sapphire Rapids has AMX"
    assert isa.isa_class(spr) == "amx"
    masked = safe_target(spr, allow_vnni=True)
    assert not set(AMX_FEATURES) & isa.llvm_features(masked)
    assert isa.isa_class(masked) == "avx512_vnni"
    kept = safe_target(spr, allow_vnni=True, allow_amx=True)
    assert set(amx.KEPT_FEATURES) <= isa.llvm_features(kept)
    assert not (set(AMX_FEATURES) - set(amx.KEPT_FEATURES)) & isa.llvm_features(kept), "only int8 tiles are kept"
    assert isa.isa_class(build_target(spr, allow_amx=True)) == "amx"
    assert isa.isa_class(build_target(spr)) == "avx512_vnni"
    for cpu in ("x86-64-v3", "znver4"):
        assert isa.isa_class(build_target(f"llvm -mcpu={cpu}", allow_amx=True)) == isa.isa_class(
            build_target(f"llvm -mcpu={cpu}")), "nothing to keep on a CPU without AMX"
    assert "amx" in isa.ISA_CLASSES


def test_amx_targets_take_the_vnni_conv_policy():
    spr = "llvm -mcpu=sapphirerapids"
    tiles, vnni = int8_policy.policy(build_target(spr, allow_amx=True)), int8_policy.policy(build_target(spr))
    assert tiles.isa == "amx" and vnni.isa == "avx512_vnni"
    assert (tiles.vector_bits, tiles.dot, tiles.per_row, tiles.channel_blocks, tiles.int8_out_blocks,
            tiles.tile_accumulators) == (vnni.vector_bits, vnni.dot, vnni.per_row, vnni.channel_blocks,
                                         vnni.int8_out_blocks, vnni.tile_accumulators)
    assert int8_policy.vnni_ready(build_target(spr, allow_amx=True))


# --------------------------------------------------------------------------------------------
# ConfigureTiles


def _config_words(tiles) -> list:
    """The palette-1 configuration of ``tiles`` (16 rows x 64 bytes each), as the SDM lays it out."""
    cfg = bytearray(64)
    cfg[0] = 1  # palette 1; byte 1 start_row 0
    for t in tiles:
        cfg[16 + 2 * t:18 + 2 * t] = (64).to_bytes(2, "little")  # bytes per row
        cfg[48 + t] = 16  # rows
    return list(struct.unpack("<8q", bytes(cfg)))


def test_tile_config_bytes_layout():
    got = amx.tile_config_bytes([0, 4, 6])
    assert len(got) == 64 and list(struct.unpack("<8q", got)) == _config_words([0, 4, 6])
    assert got[0] == 1 and got[1] == 0 and got[2:16] == bytes(14), "palette 1, start row 0, reserved zero"
    assert struct.unpack_from("<H", got, 16 + 2 * 4)[0] == amx.TILE_COLSB and got[48 + 4] == amx.TILE_ROWS
    assert struct.unpack_from("<H", got, 16 + 2 * 5)[0] == 0 and got[48 + 5] == 0, "unused tiles unconfigured"
    with pytest.raises(ValueError, match="ConfigureTiles: tile register 8"):
        amx.tile_config_bytes([8])


def _run(func):
    return amx.ConfigureTiles()(tvm.IRModule({"main": func}))["main"]


def check(before, expected):
    before, expected = (f.with_attr("global_symbol", "main") for f in (before, expected))
    after = _run(before)
    tvm.ir.assert_structural_equal(after, expected, map_free_vars=True)
    tvm.ir.assert_structural_equal(_run(after), after, map_free_vars=True)  # idempotent


def test_configure_tiles_in_each_parallel_iteration():
    """
    for t in parallel:                  for t in parallel:
      tilezero(0); tileload(4), (6)  ->   cfg = [...]; ldtilecfg(cfg)
      tdpbusd(0, 4, 6); tilestore(0)      tilezero(0); ...; tilestore(0)
                                          tilerelease()
    """
    w = _config_words([0, 4, 6])

    @T.prim_func
    def before(A: T.Buffer((2048,), "uint8"), B: T.Buffer((1024,), "int8"), C: T.Buffer((512,), "int32")):
        for t in T.parallel(2):
            T.call_llvm_intrin("int32", "llvm.x86.tilezero", T.uint8(1), T.uint8(0))
            T.call_llvm_intrin("int32", "llvm.x86.tileloaddt164", T.uint8(3), T.uint8(4),
                               T.tvm_access_ptr(T.type_annotation("uint8"), A.data, t * 1024, 1024, 1), T.uint64(64))
            T.call_llvm_intrin("int32", "llvm.x86.tileloaddt164", T.uint8(3), T.uint8(6),
                               T.tvm_access_ptr(T.type_annotation("int8"), B.data, 0, 1024, 1), T.uint64(64))
            T.call_llvm_intrin("int32", "llvm.x86.tdpbusd", T.uint8(3), T.uint8(0), T.uint8(4), T.uint8(6))
            T.call_llvm_intrin("int32", "llvm.x86.tilestored64", T.uint8(3), T.uint8(0),
                               T.tvm_access_ptr(T.type_annotation("int32"), C.data, t * 256, 256, 2), T.uint64(64))

    @T.prim_func
    def expected(A: T.Buffer((2048,), "uint8"), B: T.Buffer((1024,), "int8"), C: T.Buffer((512,), "int32")):
        for t in T.parallel(2):
            cfg = T.decl_buffer((8,), "int64")
            cfg[0] = T.int64(w[0])
            cfg[1] = T.int64(w[1])
            cfg[2] = T.int64(w[2])
            cfg[3] = T.int64(w[3])
            cfg[4] = T.int64(w[4])
            cfg[5] = T.int64(w[5])
            cfg[6] = T.int64(w[6])
            cfg[7] = T.int64(w[7])
            T.call_llvm_intrin("int32", "llvm.x86.ldtilecfg", T.uint32(1),
                               T.tvm_access_ptr(T.type_annotation("int64"), cfg.data, 0, 8, 1))
            T.call_llvm_intrin("int32", "llvm.x86.tilezero", T.uint8(1), T.uint8(0))
            T.call_llvm_intrin("int32", "llvm.x86.tileloaddt164", T.uint8(3), T.uint8(4),
                               T.tvm_access_ptr(T.type_annotation("uint8"), A.data, t * 1024, 1024, 1), T.uint64(64))
            T.call_llvm_intrin("int32", "llvm.x86.tileloaddt164", T.uint8(3), T.uint8(6),
                               T.tvm_access_ptr(T.type_annotation("int8"), B.data, 0, 1024, 1), T.uint64(64))
            T.call_llvm_intrin("int32", "llvm.x86.tdpbusd", T.uint8(3), T.uint8(0), T.uint8(4), T.uint8(6))
            T.call_llvm_intrin("int32", "llvm.x86.tilestored64", T.uint8(3), T.uint8(0),
                               T.tvm_access_ptr(T.type_annotation("int32"), C.data, t * 256, 256, 2), T.uint64(64))
            T.call_llvm_intrin("int32", "llvm.x86.tilerelease", T.uint32(0))

    check(before, expected)


def test_configure_serial_tile_code_past_its_allocation():
    """
    scratch = alloc                       scratch = alloc
    for i: tilezero(1); tilestore(1)  ->  cfg; ldtilecfg(cfg); for i: ...; tilerelease()
    for j: out[j] = scratch[j]            for j: out[j] = scratch[j]
    """
    w = _config_words([1])

    @T.prim_func
    def before(out: T.Buffer((512,), "int32")):
        scratch = T.decl_buffer((512,), "int32")
        for i in range(2):
            T.call_llvm_intrin("int32", "llvm.x86.tilezero", T.uint8(1), T.uint8(1))
            T.call_llvm_intrin("int32", "llvm.x86.tilestored64", T.uint8(3), T.uint8(1),
                               T.tvm_access_ptr(T.type_annotation("int32"), scratch.data, i * 256, 256, 2),
                               T.uint64(64))
        for j in range(512):
            out[j] = scratch[j]

    @T.prim_func
    def expected(out: T.Buffer((512,), "int32")):
        scratch = T.decl_buffer((512,), "int32")
        with T.allocate([8], "int64", "global") as cfg_data:  # scoped to the tile loop only
            cfg = T.decl_buffer((8,), "int64", data=cfg_data)
            cfg[0] = T.int64(w[0])
            cfg[1] = T.int64(w[1])
            cfg[2] = T.int64(w[2])
            cfg[3] = T.int64(w[3])
            cfg[4] = T.int64(w[4])
            cfg[5] = T.int64(w[5])
            cfg[6] = T.int64(w[6])
            cfg[7] = T.int64(w[7])
            T.call_llvm_intrin("int32", "llvm.x86.ldtilecfg", T.uint32(1),
                               T.tvm_access_ptr(T.type_annotation("int64"), cfg.data, 0, 8, 1))
            for i in range(2):
                T.call_llvm_intrin("int32", "llvm.x86.tilezero", T.uint8(1), T.uint8(1))
                T.call_llvm_intrin("int32", "llvm.x86.tilestored64", T.uint8(3), T.uint8(1),
                                   T.tvm_access_ptr(T.type_annotation("int32"), scratch.data, i * 256, 256, 2),
                                   T.uint64(64))
            T.call_llvm_intrin("int32", "llvm.x86.tilerelease", T.uint32(0))
        for j in range(512):
            out[j] = scratch[j]

    check(before, expected)


def test_configure_tiles_leaves_other_kernels_alone():
    @T.prim_func
    def vector_only(a: T.Buffer((64,), "int32"), b: T.Buffer((64,), "int32")):
        for i in T.parallel(64):
            b[i] = a[i] + 1

    mod = tvm.IRModule({"main": vector_only})
    out = amx.ConfigureTiles()(mod)
    assert out["main"].same_as(mod["main"]), "no tile code: the function object itself comes back"


def test_configure_tiles_leaves_configured_kernels_alone():
    @T.prim_func
    def configured(c: T.Buffer((64,), "int64")):
        T.call_llvm_intrin("int32", "llvm.x86.ldtilecfg", T.uint32(1),
                           T.tvm_access_ptr(T.type_annotation("int64"), c.data, 0, 8, 1))
        T.call_llvm_intrin("int32", "llvm.x86.tilezero", T.uint8(1), T.uint8(0))
        T.call_llvm_intrin("int32", "llvm.x86.tilerelease", T.uint32(0))

    mod = tvm.IRModule({"main": configured})
    assert amx.ConfigureTiles()(mod)["main"].same_as(mod["main"])


def test_configure_tiles_refuses_what_one_configuration_cannot_cover():
    @T.prim_func
    def mixed(c: T.Buffer((512,), "int32")):
        T.call_llvm_intrin("int32", "llvm.x86.tilezero", T.uint8(1), T.uint8(0))
        for _t in T.parallel(2):
            T.call_llvm_intrin("int32", "llvm.x86.tilezero", T.uint8(1), T.uint8(1))

    @T.prim_func
    def computed_register(c: T.Buffer((512,), "int32"), r: T.uint8):
        T.call_llvm_intrin("int32", "llvm.x86.tilezero", T.uint8(1), r)

    with pytest.raises((ValueError, tvm.TVMError), match="ConfigureTiles: .*both inside and outside parallel"):
        _run(mixed)
    with pytest.raises((ValueError, tvm.TVMError), match="ConfigureTiles: llvm.x86.tilezero takes a tile register "
                                                         "that is not a constant"):
        _run(computed_register)


def test_lower_config_adds_the_pass_once_and_keeps_the_callers():
    other = tvm.tir.transform.prim_func_pass(lambda f, m, c: f, opt_level=0, name="Other")
    given = {"tir.add_lower_pass": [(1, other)], "tir.disable_vectorize": False}
    cfg = amx.lower_config(given)
    assert given == {"tir.add_lower_pass": [(1, other)], "tir.disable_vectorize": False}, "input not modified"
    names = [(phase, p.info.name) for phase, p in cfg["tir.add_lower_pass"]]
    assert names == [(1, "Other"), (amx.LOWER_PHASE, "ConfigureTiles")]
    assert amx.lower_config(cfg)["tir.add_lower_pass"] == cfg["tir.add_lower_pass"]
    with tvm.transform.PassContext(config={"tir.add_lower_pass": [(2, other)]}):
        names = [(phase, p.info.name) for phase, p in amx.lower_config()["tir.add_lower_pass"]]
    assert names == [(2, "Other"), (amx.LOWER_PHASE, "ConfigureTiles")], "the entered context's passes are kept"


def test_tile_schedules_restore_tvms_functions():
    import importlib

    dense = importlib.import_module("tvm.topi.x86.dense")
    bmm = importlib.import_module("tvm.topi.x86.batch_matmul")
    own = dense.dense_amx_int8_schedule, bmm.batch_matmul_amx_schedule
    with amx.tile_schedules():
        with amx.tile_schedules():
            assert dense.dense_amx_int8_schedule is not own[0] and bmm.batch_matmul_amx_schedule is not own[1]
        assert dense.dense_amx_int8_schedule is not own[0], "the outer entry still holds"
    assert (dense.dense_amx_int8_schedule, bmm.batch_matmul_amx_schedule) == own


@pytest.mark.parametrize("extent, fallback, fits", [
    (64, True, True), (96, True, False), (768, True, True), (96, False, True), (48, True, False)])
def test_rows_fit_whole_tiles(extent, fallback, fits):
    """TVM's fallback splits rows by 32, then 2, 2, 2: 96 rows leave 3 blocks, which 2 does not split
    (``Tensorize failed``); 768 rows leave 24 = 2 * 2 * 2 * 3; a tuned config splits exactly."""
    assert amx._splits_exactly(extent, amx._FALLBACK_SPLITS["m"], fallback) is fits


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


# --------------------------------------------------------------------------------------------
# Tile code run here through an emulation: every tile instruction replaced by scalar TIR


def emulated_tiles():
    """A TIR pass, run after ConfigureTiles, that replaces each tile instruction by scalar TIR doing
    what Intel's SDM says it does, on a tile file and a tile configuration of its own, allocated in
    each configured region (so per parallel task, as the hardware's state is per thread):

    * ``ldtilecfg`` reads the 64-byte configuration; a malformed one (palette other than 1, a
      reserved byte set, more than 16 rows or 64 bytes a row, rows without bytes or bytes without
      rows) leaves the tiles unconfigured, where the hardware raises #GP; ``tilerelease``
      unconfigures them;
    * ``tileloadd``/``tilestored``/``tilezero`` move ``rows x colsb`` of the *configured* shape;
    * ``tdpbusd`` multiplies only when the shapes agree (C rows = A rows, C colsb = B colsb,
      B rows = A colsb / 4), with uint8 x int8 products summed into int32.

    So kernels compute the right numbers only when their configuration matches the tiles they use
    and covers every tile instruction; unconfigured tile code computes nothing. Tile code outside
    a configured region is refused (AssertionError)."""
    from tvm import tir

    ids = amx._intrinsic_ids()
    by_name = {v: k for k, v in ids.items()}
    intrin = tvm.ir.Op.get("tir.call_llvm_intrin")
    access_ptr = tvm.ir.Op.get("tir.tvm_access_ptr")

    def i32(x):
        return x if x.dtype == "int32" else tir.Cast("int32", x)

    def pointer(arg):
        assert isinstance(arg, tir.Call) and arg.op.same_as(access_ptr), arg
        dtype = arg.args[0].dtype
        view = tir.decl_buffer((1 << 30,), dtype, data=arg.args[1], name="emulated_view")
        return view, tvm.DataType(dtype).bits // 8, i32(arg.args[2])

    def region(stmt):
        tiles = tir.decl_buffer((8 * 16 * 16,), "int32", name="emulated_tiles", scope="global")
        state = tir.decl_buffer((17,), "int32", name="emulated_tilecfg", scope="global")

        def emulate(name, args):
            ib = tvm.tir.ir_builder.create()
            t, s = ib.buffer_ptr(tiles), ib.buffer_ptr(state)
            reg = [int(a.value) for a in args if isinstance(a, tir.IntImm) and a.dtype == "uint8"]
            if name == "llvm.x86.ldtilecfg":
                view, size, base = pointer(args[0])
                assert size == 8
                w = [view[base + i] for i in range(8)]
                rows = [(w[6] >> (8 * k)) & 255 for k in range(8)]
                cols = [(w[2 + k // 4] >> (16 * (k % 4))) & 0xFFFF for k in range(8)]
                ok = tir.all(w[0] == 1, w[1] == 0, w[4] == 0, w[5] == 0, w[7] == 0,
                             *[tir.all(r <= 16, c <= 64, c % 4 == 0, (r == 0) == (c == 0)) for r, c in zip(rows, cols)])
                with ib.if_scope(ok):
                    s[0] = 1
                    for k in range(8):
                        s[1 + k] = i32(rows[k])
                        s[9 + k] = i32(cols[k])
                with ib.else_scope():
                    for k in range(17):
                        s[k] = 0
                return ib.get()
            if name == "llvm.x86.tilerelease":
                for k in range(17):
                    s[k] = 0
                return ib.get()
            tile = reg[0]
            rows, words = ib.let("rows", s[1 + tile]), ib.let("words", s[9 + tile] // 4)
            with ib.if_scope(s[0] == 1):
                if name == "llvm.x86.tdpbusd":
                    a, b = reg[1], reg[2]
                    ok = tir.all(s[1 + a] == rows, s[9 + b] // 4 == words, s[1 + b] == s[9 + a] // 4)
                    with ib.if_scope(ok):
                        with ib.for_range(0, rows, name="m") as m, ib.for_range(0, words, name="n") as n, \
                                ib.for_range(0, s[9 + a] // 4, name="k") as k, ib.for_range(0, 4, name="j") as j:
                            x = (t[a * 256 + m * 16 + k] >> (8 * j)) & 255
                            y = (t[b * 256 + k * 16 + n] >> (8 * j)) & 255
                            t[tile * 256 + m * 16 + n] = t[tile * 256 + m * 16 + n] + x * (y - ((y >> 7) << 8))
                else:
                    with ib.for_range(0, rows, name="r") as r, ib.for_range(0, words, name="c") as c:
                        cell = tile * 256 + r * 16 + c
                        if name == "llvm.x86.tilezero":
                            t[cell] = 0
                        else:
                            view, size, base = pointer(args[1])
                            byte = base * size + r * i32(args[2]) + 4 * c
                            if name == "llvm.x86.tilestored64":
                                assert size == 4, "tiles are stored as int32 here"
                                ib.emit(tir.BufferStore(view, t[cell], [byte // 4]))
                            elif size == 4:
                                t[cell] = view[byte // 4]
                            else:
                                t[cell] = sum(((i32(view[byte + j]) & 255) << (8 * j)) for j in range(4))
            return ib.get()

        def post(node):
            if isinstance(node, tir.Evaluate) and isinstance(node.value, tir.Call) and node.value.op.same_as(intrin):
                name = ids.get(int(node.value.args[0].value))
                if name is not None:
                    return emulate(name, list(node.value.args[2:]))
            return None

        body = tvm.tir.stmt_functor.ir_transform(stmt, None, post, ["tir.Evaluate"])
        init = tir.SeqStmt([tir.BufferStore(state, tir.const(0, "int32"), [k]) for k in range(17)] + [body])
        return tir.Allocate(tiles.data, "int32", [8 * 16 * 16], tir.const(True, "bool"), tir.DeclBuffer(
            tiles, tir.Allocate(state.data, "int32", [17], tir.const(True, "bool"), tir.DeclBuffer(state, init))))

    def pre(node):
        if isinstance(node, tir.Allocate) and node.buffer_var.name == "amx_tile_config":
            return region(node)
        return None

    def transform(func, _mod, _ctx):
        body = tvm.tir.stmt_functor.ir_transform(func.body, pre, None, ["tir.Allocate"])
        left = []
        tvm.tir.stmt_functor.post_order_visit(body, lambda n: left.append(n) if (
            isinstance(n, tir.Call) and n.op.same_as(intrin) and isinstance(n.args[0], tir.IntImm)
            and int(n.args[0].value) in ids) else None)
        names = [ids[int(c.args[0].value)] for c in left]
        assert not left, f"tile instructions outside a configured region: {names[:4]}"
        return func.with_body(body)

    assert "llvm.x86.tdpbusd" in by_name
    return tvm.tir.transform.prim_func_pass(transform, opt_level=0, name="EmulatedTiles")


_EMULATED = r"""
import json, re, sys
import numpy as np, tvm
from tvm import relay
from tvm.contrib import graph_executor
import tvm_ext
from tvm_ext.x86 import amx
sys.path.insert(0, sys.argv[1])
from test_amx import emulated_tiles

AMX_CODE = re.compile(r"\b(tdp\w+|tileload\w*|tilestore\w*|tilezero|ldtilecfg|sttilecfg|tilerelease)\b|%tmm\d")
TARGET = "llvm -mcpu=sapphirerapids"
rng = np.random.default_rng(0)
if sys.argv[2] == "rows8":  # a configuration that does not match the tiles: results must go wrong
    amx.TILE_ROWS = 8


def dense(m, k, n, epilogue):
    x = relay.var("x", shape=(m, k), dtype="uint8")
    w = rng.integers(-128, 128, (n, k)).astype("int8")
    b = rng.integers(-99, 99, (n,)).astype("int32")
    y = relay.nn.dense(x, relay.const(w), out_dtype="int32")
    if epilogue:
        y = relay.nn.relu(relay.nn.bias_add(y, relay.const(b)))

    def ref(d):
        out = d.astype("int64") @ w.astype("int64").T
        return np.maximum(out + b, 0) if epilogue else out
    return tvm.IRModule.from_expr(relay.Function([x], y)), (m, k), ref


def batch_matmul(bs, m, k, n):
    x = relay.var("x", shape=(bs, m, k), dtype="uint8")
    w = rng.integers(-128, 128, (bs, n, k)).astype("int8")
    y = relay.nn.batch_matmul(x, relay.const(w), out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([x], y)), (bs, m, k), lambda d: np.einsum(
        "bmk,bnk->bmn", d.astype("int64"), w.astype("int64"))


def run(lib, data):
    g = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    g.set_input("x", data)
    g.run()
    return g.get_output(0).numpy()


out = {}
cases = {"dense": dense(64, 256, 64, False), "dense_parallel": dense(512, 512, 512, False),
         "dense_epilogue": dense(128, 512, 128, True), "batch_matmul": batch_matmul(2, 64, 256, 64)}
for name, (mod, shape, ref) in cases.items():
    emulated = tvm_ext.build(mod, target=TARGET, amx=True, config={
        "tir.add_lower_pass": [(3, amx.ConfigureTiles()), (3, emulated_tiles())]})
    asm = emulated.get_lib().get_source("asm")
    if AMX_CODE.search(asm):  # never execute a tile instruction here
        out[name] = {"refused": AMX_CODE.search(asm).group(0)}
        continue
    vnni = tvm_ext.build(mod, target=TARGET)
    data = rng.integers(0, 256, shape).astype("uint8")
    got, want = run(emulated, data), run(vnni, data)
    out[name] = {"emulated": "emulated_tiles" in emulated.get_lib().get_source("ll"),
                 "equal_vnni": bool(np.array_equal(got, want)), "equal_numpy": bool(np.array_equal(got, ref(data)))}
print("RESULT " + json.dumps(out))
"""


def _emulated_run(variant):
    if set(isa.missing_on_host("llvm -mcpu=sapphirerapids")) - set(AMX_FEATURES):
        pytest.skip("this host lacks Sapphire Rapids features besides AMX: the emulated kernels cannot run")
    r = subprocess.run([sys.executable, "-c", _EMULATED, os.path.dirname(__file__), variant],
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.split("RESULT ", 1)[1])


def test_amx_kernels_compute_bit_exact_on_emulated_tiles():
    """TVM's AMX dense (parallel and serial with an epilogue) and batch_matmul, as tvm_ext.build(amx=True) compiles
    them, with every tile instruction emulated (:func:`emulated_tiles`, checked free of tile instructions before it
    runs, in a child process): bit-exact with the VNNI build and numpy. This checks the tile shapes ConfigureTiles
    declares, that its configuration reaches every tile instruction in every parallel task, and TVM's tile
    addressing; not the encoding of the real instructions or Linux's tile state."""
    got = _emulated_run("configured")
    for case, g in got.items():
        assert "refused" not in g, (case, g)
        assert g["emulated"] and g["equal_vnni"] and g["equal_numpy"], (case, g)


def test_emulated_tiles_detect_a_configuration_that_does_not_match():
    """The same kernels with 8-row tiles configured where TVM's intrinsics use 16: wrong results (the emulation
    would not catch a wrong configuration otherwise)."""
    got = _emulated_run("rows8")
    assert len(got) == 4, got
    assert all("refused" not in g and g["emulated"] and not g["equal_numpy"] for g in got.values()), got
