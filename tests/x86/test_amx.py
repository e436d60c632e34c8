"""tvm_ext.x86.amx: the process's tile state, the AMX targets' policy, and ConfigureTiles.

Builds with ``amx=True`` are tested in test_amx_build (compiled for AMX CPUs, run only on one) and
test_amx_emulated (run here with every tile instruction emulated).
"""
import errno
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
    fields = ("vector_bits", "dot", "per_row", "channel_blocks", "int8_out_blocks", "tile_accumulators",
              "tile_accumulators_1x1")
    assert [getattr(tiles, f) for f in fields] == [getattr(vnni, f) for f in fields]
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
