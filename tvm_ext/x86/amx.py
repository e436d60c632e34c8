"""AMX int8 tiles: the process's tile state, and kernels that configure their own tiles.

A leaf module (it imports only :mod:`tvm_ext.x86.isa`, lazily, and TVM). Nothing asks Linux for the
tile state on import: :func:`tvm_ext.build` with ``amx=True`` does (:func:`prepare_process`), and
:func:`tvm_ext.tools.deploy.load_library` when it loads a library.

TVM 0.19 schedules ``uint8 x int8 -> int32`` dense and batch_matmul on AMX tiles when the target
has ``amx-int8``, and leaves two things the tile instructions need to a runtime this TVM wheel
does not have:

* **the tile state**: :func:`request_tile_state` asks Linux once per process
  (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); without it the first tile
  instruction dies with SIGILL.
* **the tile configuration**: :func:`ConfigureTiles`, a TIR pass, loads the configuration of
  exactly the tiles a kernel uses (``ldtilecfg``) in each iteration of the parallel loop that
  holds the tile code, and releases it (``tilerelease``) after it.

:func:`tile_schedules` keeps TVM's AMX schedule for dense and batch_matmul whose M and N are
multiples of 32 and K of 128 (other shapes fail with ``Tensorize failed``) and gives the others
TVM's AVX-512 VNNI schedule. Convolutions stay on AVX-512 VNNI. All of it is off by default
(:data:`tvm_ext.x86.target.AMX_FEATURES`) unless ``tvm_ext.build(..., amx=True)``. What it builds
and how it is checked without an AMX CPU: docs/x86-kernels.md ("AMX int8 tiles").
"""
from __future__ import annotations

import contextlib
import ctypes
import errno as _errno
import logging
import os
import platform
import struct
import sys
import threading

from .._patch import Patch

logger = logging.getLogger(__name__)

__all__ = ["host_has_amx", "request_tile_state", "prepare_process", "ConfigureTiles", "lower_config",
           "tile_schedules", "tile_config_bytes", "KEPT_FEATURES", "TILE_ROWS", "TILE_COLSB"]

#: The AMX features ``amx=True`` keeps on a target (TVM's int8 tile code needs these two).
KEPT_FEATURES = ("amx-tile", "amx-int8")
#: Rows and bytes per row of every tile TVM 0.19's int8 AMX intrinsics use.
TILE_ROWS = 16
TILE_COLSB = 64
#: Tile registers of palette 1.
_NUM_TILES = 8

_SYS_ARCH_PRCTL = 158  # x86-64 Linux
_ARCH_GET_XCOMP_PERM = 0x1022
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18

_STATE_LOCK = threading.Lock()
_STATE: tuple | None = None  # (granted, reason) once asked

#: Tile intrinsics TVM's AMX tensor intrinsics call -> positions of their tile-register operands.
_TILE_INTRINSICS = {
    "llvm.x86.tilezero": (0,),
    "llvm.x86.tileloadd64": (0,),
    "llvm.x86.tileloaddt164": (0,),
    "llvm.x86.tilestored64": (0,),
    "llvm.x86.tdpbusd": (0, 1, 2),
    "llvm.x86.tdpbssd": (0, 1, 2),
    "llvm.x86.tdpbsud": (0, 1, 2),
    "llvm.x86.tdpbuud": (0, 1, 2),
    "llvm.x86.tdpbf16ps": (0, 1, 2),
}
_LDTILECFG = "llvm.x86.ldtilecfg"
_TILERELEASE = "llvm.x86.tilerelease"
_PASS_NAME = "ConfigureTiles"


def host_has_amx() -> bool:
    """True when this CPU has AMX int8 (``amx-tile`` and ``amx-int8`` in
    :func:`tvm_ext.x86.isa.host_features`, read from CPUID)."""
    from .isa import host_features

    return set(KEPT_FEATURES) <= host_features()


def _linux_lists_amx() -> bool:
    """``amx_tile`` among the CPU flags of ``/proc/cpuinfo`` (Linux lists it when both the CPU and
    the kernel support AMX). Cheap: no TVM import."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return "amx_tile" in line.split()
    except OSError:
        return False
    return False


def _arch_prctl(code: int, arg) -> tuple[int, int]:
    """``syscall(SYS_arch_prctl, code, arg)`` -> (return value, errno)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(_SYS_ARCH_PRCTL), ctypes.c_long(code), arg)
    return rc, ctypes.get_errno()


def _ask_linux() -> tuple[bool, str]:
    if not sys.platform.startswith("linux"):
        return False, f"not Linux ({sys.platform}): no arch_prctl to ask for the AMX tile state"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False, f"not x86-64 ({platform.machine()}): no AMX"
    rc, err = _arch_prctl(_ARCH_REQ_XCOMP_PERM, ctypes.c_long(_XFEATURE_XTILEDATA))
    if rc != 0:
        name = _errno.errorcode.get(err, str(err))
        why = {_errno.EINVAL: "the CPU or the kernel (Linux >= 5.16) has no AMX",
               _errno.EPERM: "not permitted (a seccomp filter?)",
               _errno.ENOSYS: "no arch_prctl"}.get(err, os.strerror(err))
        return False, f"arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) failed: {name} ({why})"
    mask = ctypes.c_uint64(0)
    rc, err = _arch_prctl(_ARCH_GET_XCOMP_PERM, ctypes.byref(mask))
    if rc != 0 or not mask.value >> _XFEATURE_XTILEDATA & 1:
        return False, (f"arch_prctl(ARCH_GET_XCOMP_PERM) after the request: rc {rc}, errno "
                       f"{_errno.errorcode.get(err, err)}, permitted features {mask.value:#x} without XTILEDATA")
    return True, "Linux granted the AMX tile state (XTILEDATA) to this process"


def request_tile_state() -> tuple[bool, str]:
    """Ask Linux, once per process, for the AMX tile data state; ``(granted, reason)``.

    ``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`` through ``ctypes``, then
    ``ARCH_GET_XCOMP_PERM`` to confirm. The first answer is kept: later calls (from any thread)
    return it without asking again. Never raises: on a host without AMX, or not Linux x86-64,
    it returns False with the reason (the errno's name and meaning).
    """
    global _STATE
    with _STATE_LOCK:
        if _STATE is None:
            try:
                _STATE = _ask_linux()
            except Exception as err:  # ctypes cannot reach libc's syscall: say so, never raise
                _STATE = (False, f"cannot call arch_prctl: {type(err).__name__}: {err}")
            logger.debug("AMX tile state: %s", _STATE[1])
        return _STATE


def prepare_process() -> None:
    """Request the tile state when Linux lists AMX for this CPU (``amx_tile`` in ``/proc/cpuinfo``),
    else nothing. What ``tvm_ext.build(..., amx=True)`` runs before it builds: cheap, no TVM import,
    never raises (a refusal is logged as a warning)."""
    try:
        if _linux_lists_amx():
            granted, reason = request_tile_state()
            if not granted:
                logger.warning("this CPU has AMX but %s: AMX kernels would die with SIGILL", reason)
    except Exception as err:  # a build must not fail for this
        logger.debug("AMX tile state not requested: %s", err)


# --------------------------------------------------------------------------------------------
# Tile configuration inside each kernel


def tile_config_bytes(tiles) -> bytes:
    """The 64-byte palette-1 ``ldtilecfg`` operand configuring ``tiles`` (register numbers) as
    :data:`TILE_ROWS` x :data:`TILE_COLSB`; other tiles stay unconfigured (using one faults).

    Layout: byte 0 palette (1), byte 1 start row (0), bytes 16-47 bytes per row of tiles 0-15
    (uint16, little-endian), bytes 48-63 rows of tiles 0-15.
    """
    cfg = bytearray(64)
    cfg[0] = 1
    for t in sorted(set(tiles)):
        if not 0 <= t < _NUM_TILES:
            raise ValueError(f"{_PASS_NAME}: tile register {t} does not exist (palette 1 has tmm0-tmm7)")
        struct.pack_into("<H", cfg, 16 + 2 * t, TILE_COLSB)
        cfg[48 + t] = TILE_ROWS
    return bytes(cfg)


def _intrinsic_ids() -> dict:
    """LLVM intrinsic id -> name, for the tile intrinsics this LLVM knows."""
    from tvm.target import codegen

    out = {}
    for name in (*_TILE_INTRINSICS, _LDTILECFG, _TILERELEASE):
        iid = codegen.llvm_lookup_intrinsic_id(name)
        if iid:
            out[int(iid)] = name
    return out


def _tile_uses(stmt, ids) -> tuple[set, int, bool]:
    """(tile registers used, tile calls, an ldtilecfg is present) in ``stmt``."""
    import tvm

    llvm_intrin = tvm.ir.Op.get("tir.call_llvm_intrin")
    tiles: set = set()
    found = {"calls": 0, "config": False}

    def visit(node):
        if not (isinstance(node, tvm.tir.Call) and node.op.same_as(llvm_intrin) and node.args
                and isinstance(node.args[0], tvm.tir.IntImm)):
            return
        name = ids.get(int(node.args[0].value))
        if name == _LDTILECFG:
            found["config"] = True
        elif name in _TILE_INTRINSICS:
            found["calls"] += 1
            for pos in _TILE_INTRINSICS[name]:
                reg = node.args[2 + pos]
                if not isinstance(reg, tvm.tir.IntImm):
                    raise ValueError(f"{_PASS_NAME}: {name} takes a tile register that is not a constant ({reg})")
                tiles.add(int(reg.value))

    tvm.tir.stmt_functor.post_order_visit(stmt, visit)
    return tiles, found["calls"], found["config"]


def _configured(body, tiles):
    """``ldtilecfg(cfg); body; tilerelease()`` with ``cfg`` a 64-byte stack buffer."""
    import tvm
    from tvm import tir

    words = struct.unpack("<8q", tile_config_bytes(tiles))
    buf = tir.decl_buffer((8,), "int64", name="amx_tile_config", scope="global")  # "global": a stack slot
    stores = [tir.BufferStore(buf, tir.const(w, "int64"), [tir.const(i, "int32")]) for i, w in enumerate(words)]
    load = tir.Evaluate(tir.call_llvm_intrin("int32", _LDTILECFG, tir.const(1, "uint32"), buf.access_ptr("r")))
    release = tir.Evaluate(tir.call_llvm_intrin("int32", _TILERELEASE, tir.const(0, "uint32")))
    seq = tir.SeqStmt([*stores, load, body, release])
    return tir.Allocate(buf.data, "int64", [8], tvm.tir.const(True, "bool"), tir.DeclBuffer(buf, seq))


def _around_tile_code(stmt, ids):
    """``stmt`` with the smallest statement that holds all its tile code configured
    (:func:`_configured`): descend through bindings (let, attribute, allocation, buffer
    declaration) and through sequences where one element holds it all, stop at a loop or at a
    sequence where several do. Allocations (workspace calls) around the tile code then run before
    the configuration, never between it and the tiles."""
    from tvm import tir

    if isinstance(stmt, tir.SeqStmt):
        holders = [i for i, s in enumerate(stmt.seq) if _tile_uses(s, ids)[1]]
        if len(holders) == 1:
            seq = list(stmt.seq)
            seq[holders[0]] = _around_tile_code(seq[holders[0]], ids)
            return tir.SeqStmt(seq, stmt.span)
    elif isinstance(stmt, tir.LetStmt):
        return tir.LetStmt(stmt.var, stmt.value, _around_tile_code(stmt.body, ids), stmt.span)
    elif isinstance(stmt, tir.AttrStmt):
        return tir.AttrStmt(stmt.node, stmt.attr_key, stmt.value, _around_tile_code(stmt.body, ids), stmt.span)
    elif isinstance(stmt, tir.Allocate):
        return tir.Allocate(stmt.buffer_var, stmt.dtype, stmt.extents, stmt.condition,
                            _around_tile_code(stmt.body, ids), stmt.annotations, stmt.span)
    elif isinstance(stmt, tir.DeclBuffer):
        return tir.DeclBuffer(stmt.buffer, _around_tile_code(stmt.body, ids), stmt.span)
    return _configured(stmt, _tile_uses(stmt, ids)[0])


def _configure(func, ids):
    import tvm
    from tvm import tir

    _tiles, calls, has_config = _tile_uses(func.body, ids)
    if not calls or has_config:  # no tile code, or it configures its tiles already: unchanged
        return func
    inside = {"calls": 0}

    def pre(stmt):  # the outermost parallel loop holding tile code: configure in its body
        if isinstance(stmt, tir.For) and stmt.kind == tir.ForKind.PARALLEL:
            n = _tile_uses(stmt.body, ids)[1]
            if n:
                inside["calls"] += n
                return tir.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, _around_tile_code(stmt.body, ids),
                               stmt.thread_binding, stmt.annotations, stmt.span)
        return None

    body = tvm.tir.stmt_functor.ir_transform(func.body, pre, None, ["tir.For"])
    if inside["calls"] == calls:
        return func.with_body(body)
    if inside["calls"]:
        name = func.attrs.get("global_symbol", "?") if func.attrs else "?"
        raise ValueError(f"{_PASS_NAME}: {name} has tile code both inside and outside parallel loops; "
                         "one configuration per thread cannot cover both")
    return func.with_body(_around_tile_code(func.body, ids))  # serial tile code: the calling thread


def ConfigureTiles():  # a pass factory is named like the pass
    """Configure AMX tiles inside each kernel that uses them (see the module note).

    A kernel with tile intrinsics (``tilezero``, ``tileloadd``, ``tdpbusd``, ``tilestored``, ...)
    and no ``ldtilecfg`` gets, in each iteration of the outermost parallel loop that holds its
    tile code (or in the function body when that code is serial), around the smallest statement
    that holds all of it (past allocations and bindings, never inside a loop), a 64-byte stack
    configuration of the tiles it uses (:func:`tile_config_bytes`), ``llvm.x86.ldtilecfg`` on it
    before, and ``llvm.x86.tilerelease`` after. Kernels without tile code, and kernels that already
    load a configuration, are returned unchanged, so the pass is idempotent.

    Returns
    -------
    tvm.transform.Pass
        A ``tir.PrimFunc`` pass, for ``tir.add_lower_pass`` (:func:`lower_config`).

    Raises
    ------
    ValueError (as ``tvm.TVMError`` from a build)
        A tile register that is not a constant or not tmm0-tmm7, or tile code both inside and
        outside parallel loops of one kernel.
    """
    import tvm

    state: dict = {}

    def transform(func, _mod, _ctx):
        ids = state.get("ids")
        if ids is None:
            ids = state["ids"] = _intrinsic_ids()
        return _configure(func, ids)

    return tvm.tir.transform.prim_func_pass(transform, opt_level=0, name=_PASS_NAME)


#: Lowering phase ConfigureTiles runs in: after loop partitioning, unrolling and storage rewriting,
#: so the loops and calls it sees are the kernel's final ones.
LOWER_PHASE = 3


def lower_config(config: dict | None = None) -> dict:
    """``config`` (PassContext config) with :func:`ConfigureTiles` added to ``tir.add_lower_pass``.

    Lower passes already in ``config``, or else in the PassContext the caller entered, are kept
    before it; a ConfigureTiles already there is not added twice. ``config`` is not modified.
    """
    from .._lower_pass import with_lower_pass

    return with_lower_pass(config, LOWER_PHASE, _PASS_NAME, ConfigureTiles)


# --------------------------------------------------------------------------------------------
# TVM's AMX schedules only where they build

_SAVED: dict = {}


#: The splits of TVM's fallback (untuned) AMX dense config, innermost first: rows (M) by 32 then
#: 2, 2, 2; columns (N) by 32 then 4, 4, 4; the reduction (K) by 128 then 2, 2, 2
#: (``dense_amx_int8_schedule``).
_FALLBACK_SPLITS = {"m": (32, 2, 2, 2), "n": (32, 4, 4, 4), "k": (128, 2, 2, 2)}


def _splits_exactly(extent: int, factors, fallback: bool) -> bool:
    """``extent`` splits into whole tiles (the first factor), and for an untuned config each
    further split of TVM's fallback divides what is left or covers it in one step: a split that
    leaves a remainder puts a bound check inside the tensorized block (``Tensorize failed``)."""
    tile, *outer = factors
    if extent <= 0 or extent % tile:
        return False
    left = extent // tile
    for f in outer if fallback else ():
        if left <= f:  # one outer step holds the rest
            return True
        if left % f:
            return False
        left //= f
    return True


def _fits_tiles(cfg, C) -> bool:
    """The GEMM whose output is ``C`` (``[..., M, N]``, reduction K) builds with TVM's AMX
    schedule: M and N in 32-row/column tiles, K in 128-deep slices, each further split exact."""
    from tvm.topi.utils import get_const_tuple

    try:
        m, n = get_const_tuple(C.shape)[-2:]
        (k,) = [int(ax.dom.extent) for ax in C.op.reduce_axis]
    except (TypeError, ValueError, AttributeError):  # symbolic shapes
        return False
    if not (isinstance(m, int) and isinstance(n, int)):
        return False
    fallback = bool(getattr(cfg, "is_fallback", True))
    return all(_splits_exactly(e, _FALLBACK_SPLITS[a], fallback) for a, e in (("m", m), ("n", n), ("k", k)))


def _guard_dense(amx_schedule, vnni_schedule):
    def dense_amx_int8_schedule(cfg, s, gemm, out, do_parallel=True):
        if _fits_tiles(cfg, gemm):
            return amx_schedule(cfg, s, gemm, out, do_parallel)
        logger.debug("dense %s: not in whole AMX tiles, AVX-512 VNNI instead", gemm.shape)
        return vnni_schedule(cfg, s, gemm, out, do_parallel)

    return dense_amx_int8_schedule


def _guard_batch_matmul(amx_schedule, vnni_schedule):
    def batch_matmul_amx_schedule(cfg, s, gemm, out, layout_trans):
        if _fits_tiles(cfg, gemm):
            return amx_schedule(cfg, s, gemm, out, layout_trans)
        logger.debug("batch_matmul %s: not in whole AMX tiles, AVX-512 VNNI instead", gemm.shape)
        return vnni_schedule(cfg, s, gemm, out, layout_trans)

    return batch_matmul_amx_schedule


@contextlib.contextmanager
def tile_schedules():
    """Enter to keep TVM's AMX dense and batch_matmul schedules only for shapes they build
    (:func:`_fits_tiles`); others take TVM's AVX-512 VNNI schedule for the same packed weights.

    Re-entrant and thread-safe like :func:`tvm_ext.x86.int8_conv.kernels`: TVM's functions are
    restored when the outermost entry exits.
    """
    with _PATCH.entered():
        yield


def _topi_modules():
    import importlib

    # by module path: tvm.topi.x86's ``batch_matmul`` attribute is the function, not the module
    return importlib.import_module("tvm.topi.x86.dense"), importlib.import_module("tvm.topi.x86.batch_matmul")


def _install():
    dense, bmm = _topi_modules()
    _SAVED["dense"] = dense.dense_amx_int8_schedule
    _SAVED["batch_matmul"] = bmm.batch_matmul_amx_schedule
    dense.dense_amx_int8_schedule = _guard_dense(_SAVED["dense"], dense.dense_int8_schedule)
    bmm.batch_matmul_amx_schedule = _guard_batch_matmul(_SAVED["batch_matmul"], bmm.batch_matmul_int8_schedule)


def _uninstall():
    dense, bmm = _topi_modules()
    dense.dense_amx_int8_schedule = _SAVED.pop("dense")
    bmm.batch_matmul_amx_schedule = _SAVED.pop("batch_matmul")


_PATCH = Patch(_install, _uninstall)
