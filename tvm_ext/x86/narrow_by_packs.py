"""Saturating 8-bit narrowing of four int32 vectors at a time with packs (AVX-512BW), while tvm-ext builds.

Design note
-----------
An int8 kernel's epilogue ends in ``cast(uint8, clip(x, 0, 255))`` per 16-lane int32 vector, which
LLVM's x86 back end emits as ``vpmaxsd`` and ``vpmovusdb``: three micro-ops per 16 bytes on the vector
ports the dot products need (``vpmovusdb`` is two on port 5 of Intel's cores). Four such vectors
narrow with two ``vpackssdw``, one ``vpackuswb`` and one ``vpermd``, one micro-op each, to the same
bytes::

    # cast(uint8, clip(x, 0, 255)) = usat8(ssat16(x))    cast(int8, clip(x, -128, 127)) = ssat8(ssat16(x))
    # p = vpackuswb(vpackssdw(x0, x1), vpackssdw(x2, x3))   (128-bit lane L: x0[4L:4L+4] x1[..] x2[..] x3[..])
    # x0 | x1 | x2 | x3 (16 bytes each) = vpermd(p, [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15])

The four vectors must be adjacent in memory (four pixels of a channel block): they become one 64-byte
store. Stores further apart are left alone, as LLVM would split their packs again, one per 16-byte
store. Saturation is exact for every int32, so the bytes are TVM's bit for bit.

:func:`NarrowByPacks` is a TIR pass at phase 3 (after vectorisation and unrolling). It takes a serial
loop of 4 to :data:`MAX_STORES` iterations whose body is one such store of 16 bytes (the pixels of a row
of an int8 kernel's epilogue tile), unrolls it, and narrows each run of four adjacent stores together;
the last ``n % 4`` stores, and runs that are not adjacent, stay as they were. Clip bounds inside the
8-bit range are kept as ``max``/``min`` before the packs. A store whose value reads the buffer it writes
is left alone (the group's four values are computed before its stores). The x86 back end adds the pass
to builds with tvm-ext's kernels for AVX-512BW targets (:func:`applies`).
"""
from __future__ import annotations

import logging

from .._tir_const import int_value

logger = logging.getLogger(__name__)

__all__ = ["NarrowByPacks", "lower_config", "applies", "PASS_NAME", "LOWER_PHASE", "MAX_STORES", "GROUP"]

#: The pass's name in ``tir.add_lower_pass`` (one per PassContext).
PASS_NAME = "tvm_ext.x86.NarrowByPacks"
#: ``tir.add_lower_pass`` phase: after ``VectorizeLoop`` and ``UnrollLoop`` (the stores have their vector types).
LOWER_PHASE = 3
#: The most iterations of a loop of stores the pass unrolls (an epilogue tile's row: 4 to 28 pixels).
MAX_STORES = 64
_LANES = 16
#: Adjacent 16-byte stores narrowed together (one 64-byte store).
GROUP = 4
_PERMUTE = [4 * lane + part for part in range(GROUP) for lane in range(4)]  # bytes of x_part, lane by lane
_RANGES = {"uint8": (0, 255), "int8": (-128, 127)}
_NARROW16 = {"uint8": "llvm.x86.avx512.packuswb.512", "int8": "llvm.x86.avx512.packsswb.512"}
_PACK32 = "llvm.x86.avx512.packssdw.512"


def _saturated(value):
    """``(x, lo, hi, dtype)`` where ``value`` is ``cast(8-bit x 16, clip(x, lo, hi))`` of an int32x16 ``x`` with
    the bounds inside the 8-bit type's range, else None."""
    import tvm
    from tvm import tir

    if not isinstance(value, tir.Cast):
        return None
    out = tvm.DataType(value.dtype)
    if out.type_code not in (tvm.DataTypeCode.INT, tvm.DataTypeCode.UINT) or out.lanes != _LANES:
        return None
    dtype = f"{'u' if out.type_code == tvm.DataTypeCode.UINT else ''}int{out.bits}"
    if dtype not in _RANGES:
        return None
    inner = value.value
    bounds = {}
    for _ in range(2):  # max(min(x, hi), lo) or min(max(x, lo), hi)
        if isinstance(inner, (tir.Max, tir.Min)) and int_value(inner.b) is not None:
            bounds["lo" if isinstance(inner, tir.Max) else "hi"] = int_value(inner.b)
            inner = inner.a
    if len(bounds) != 2 or inner.dtype != f"int32x{_LANES}":
        return None
    tmin, tmax = _RANGES[dtype]
    lo, hi = bounds["lo"], bounds["hi"]
    if not tmin <= lo <= hi <= tmax:
        return None
    return inner, lo, hi, dtype


def _reads(expr, data) -> bool:
    from tvm import tir

    found = []
    tir.stmt_functor.post_order_visit(expr, lambda n: found.append(n) if isinstance(n, tir.BufferLoad)
                                      and n.buffer.data.same_as(data) else None)
    return bool(found)


def _store_loop(loop):
    """The narrowing store (see :func:`_saturated`) at a contiguous 16-lane index that is the whole body of
    ``loop``, a serial loop of constant bounds, else None."""
    from tvm import tir

    if not isinstance(loop, tir.For) or loop.kind not in (tir.ForKind.SERIAL, tir.ForKind.UNROLLED) \
            or loop.thread_binding is not None or not isinstance(loop.min, tir.IntImm) \
            or not isinstance(loop.extent, tir.IntImm):
        return None
    store = loop.body
    if not isinstance(store, tir.BufferStore) or len(store.indices) != 1 or _saturated(store.value) is None:
        return None
    if getattr(store, "predicate", None) is not None:
        return None
    index = store.indices[0]
    if not isinstance(index, tir.Ramp) or int_value(index.stride) != 1 or int(index.lanes) != _LANES:
        return None
    if _reads(store.value, store.buffer.data):
        return None
    return store


def _packed(values, dtype):
    """The 64 bytes of four saturated int32x16 ``values``, vector by vector."""
    from tvm import tir

    zero = tir.const(0, "uint32")
    low = tir.call_llvm_pure_intrin("int16x32", _PACK32, zero, values[0], values[1])
    high = tir.call_llvm_pure_intrin("int16x32", _PACK32, zero, values[2], values[3])
    lanes = tir.call_llvm_pure_intrin(f"{dtype}x64", _NARROW16[dtype], zero, low, high)
    ordered = tir.Shuffle([tir.reinterpret("int32x16", lanes)], [tir.const(i, "int32") for i in _PERMUTE])
    return tir.reinterpret(f"{dtype}x64", ordered)


def _unrolled(loop, store):
    """The loop's stores, one per iteration, each run of four adjacent ones narrowed together; None where
    no run is adjacent."""
    import tvm
    from tvm import tir

    x, lo, hi, dtype = _saturated(store.value)
    tmin, tmax = _RANGES[dtype]
    if lo > tmin:  # bounds inside the type's range stay; the type's own are the packs' saturation
        x = tir.Max(x, tir.Broadcast(tir.const(lo, "int32"), _LANES))
    if hi < tmax:
        x = tir.Min(x, tir.Broadcast(tir.const(hi, "int32"), _LANES))
    analyzer = tvm.arith.Analyzer()
    start = int(loop.min)
    points = [{loop.loop_var: tir.const(v, loop.loop_var.dtype)} for v in range(start, start + int(loop.extent))]
    stores = [tir.stmt_functor.substitute(store, vmap) for vmap in points]
    out, packed = [], 0
    whole = len(stores) - len(stores) % GROUP
    for g in range(0, whole, GROUP):
        group = stores[g:g + GROUP]
        base = group[0].indices[0].base
        if all(analyzer.can_prove_equal(st.indices[0].base - base, _LANES * k) for k, st in enumerate(group)):
            values = [tir.stmt_functor.substitute(x, vmap) for vmap in points[g:g + GROUP]]
            out.append(tir.BufferStore(store.buffer, _packed(values, dtype),
                                       [tir.Ramp(analyzer.simplify(base), 1, _LANES * GROUP)]))
            packed += 1
        else:
            out.extend(group)
    out.extend(stores[whole:])
    if not packed:
        return None
    return out[0] if len(out) == 1 else tir.SeqStmt(out)


def NarrowByPacks():  # noqa: N802  (a TVM pass, named like TVM's)
    """A ``tir.PrimFunc`` pass: loops of saturating int32x16 -> 8-bit stores narrowed four adjacent vectors at a
    time by ``vpackssdw``/``vpackuswb``/``vpermd`` (module docstring). Every other statement is left alone;
    the rewritten function computes the same bytes.

    Returns
    -------
    tvm.transform.Pass
    """
    import tvm
    from tvm import tir

    def postorder(node):
        store = _store_loop(node)
        if store is None or not GROUP <= int(node.extent) <= MAX_STORES:
            return None
        try:
            return _unrolled(node, store)
        except Exception:  # never fail a build over a faster form: the loop as it is is exact
            logger.exception("x86 narrowing by packs: loop over %s left as it is", store.buffer.name)
            return None

    def transform(func, _mod, _ctx):
        return func.with_body(tir.stmt_functor.ir_transform(func.body, None, postorder, ["tir.For"]))

    return tvm.tir.transform.prim_func_pass(transform, opt_level=0, name=PASS_NAME)


def lower_config(config: dict | None = None) -> dict:
    """``config`` (PassContext options) with :func:`NarrowByPacks` added to ``tir.add_lower_pass`` once,
    after the lower passes already there. ``config`` is not modified."""
    from .._lower_pass import with_lower_pass

    return with_lower_pass(config, LOWER_PHASE, PASS_NAME, NarrowByPacks)


def applies(target) -> bool:
    """Whether the x86 back end narrows this way for ``target``: AVX-512BW (the 512-bit packs)."""
    from .isa import llvm_features

    return "avx512bw" in llvm_features(target)
