"""Vector lookups in a 256-entry byte table: the shared half of the back ends' ``*ByteTableLookup`` passes.

Design note
-----------
``tvm_ext.table_lookup`` (what :class:`tvm_ext.passes.TabulateEightBit` makes of an activation chain)
computes ``table[clamp(int32(x) + offset, 0, 255)]`` for 8-bit ``x``; vectorised in a conv's epilogue it
is a gather, which LLVM emits one lane at a time (on x86 an extract and a ``vpinsrb`` per byte: about
three micro-ops per output, more than the conv's dot products for a short reduction). Both x86
(``vpermi2b``, AVX-512 VBMI) and aarch64 (``tbl``/``tbx``) can index a table held in vector registers
with a vector of bytes. This module finds such gathers after vectorisation and gives a back end the
byte index vector and the table's bytes as vectors; the back end's ``lookup`` builds the lookup::

    # table[clamp(int32(x) + off, 0, 255)] -> lookup(table bytes, uint8(x) + off)     (8-bit x, 256 entries)

Exact: for ``x`` of an 8-bit type and ``off`` the op's offset (0 for uint8, 128 for int8), ``int32(x) +
off`` lies in ``[0, 255]``, so every clamp (``min(., c)`` with ``c >= 255``, ``max(., c)`` with ``c <=
0``) leaves it unchanged, and it equals the byte ``uint8(x) + off`` (mod 256). A load is rewritten
only when its index has exactly that form and the buffer is a flat 8-bit buffer of 256 elements;
anything else (scalar loads, other tables, other index arithmetic) is left alone, and a second run
changes nothing (the rewritten form has no gather). A back end whose table would take many of its
vector registers (aarch64: 16 of 32) gives a fence, a statement put first in each innermost loop that
stores lookups, so that the compiler loads the table there instead of holding it through the
kernel's reduction.
"""
from __future__ import annotations

import logging
from typing import Callable

from ._tir_const import int_value

logger = logging.getLogger(__name__)

__all__ = ["byte_index", "table_bytes", "slices", "joined", "ByteTableLookup", "TABLE_SIZE"]

#: Entries of the tables rewritten: one per value of a byte.
TABLE_SIZE = 256
_EIGHT_BIT = ("uint8", "int8")


def byte_index(index):
    """``(x, offset)`` when ``index`` is ``int32(x) + offset`` with ``x`` an 8-bit vector and the sum in
    ``[0, 255]`` for every ``x``, under clamps to that range (which then change nothing); else a
    string saying why not."""
    import tvm
    from tvm import tir

    clamps = []
    while isinstance(index, (tir.Min, tir.Max)):
        c = int_value(index.b)
        if c is None:
            return "a clamp bound is not a constant"
        clamps.append((type(index), c))
        index = index.a
    offset = 0
    if isinstance(index, tir.Add):
        offset = int_value(index.b)
        if offset is None:
            return "the index adds a value that is not a constant"
        index = index.a
    if not isinstance(index, tir.Cast) or tvm.DataType(index.dtype).bits < 16:
        return "the index is not a widened 8-bit value"
    x = index.value
    dt = tvm.DataType(x.dtype)
    if dt.type_code not in (tvm.DataTypeCode.INT, tvm.DataTypeCode.UINT) or dt.bits != 8:
        return f"the index is widened from {x.dtype}, not an 8-bit integer type"
    name = "uint8" if dt.type_code == tvm.DataTypeCode.UINT else "int8"
    lo, hi = (0, 255) if name == "uint8" else (-128, 127)
    lo, hi = lo + offset, hi + offset
    if lo < 0 or hi > TABLE_SIZE - 1:
        return f"int32(x) + {offset} spans [{lo}, {hi}], not the table's [0, {TABLE_SIZE - 1}]"
    for kind, c in clamps:
        if (kind is tir.Min and c < hi) or (kind is tir.Max and c > lo):
            return f"a clamp to {c} changes indices in [{lo}, {hi}]"
    return x, offset


def table_bytes(buffer, start: int, lanes: int):
    """``lanes`` bytes of the table ``buffer`` from ``start``, as one vector load of its dtype."""
    from tvm import tir

    return tir.BufferLoad(buffer, [tir.Ramp(tir.const(start, "int32"), tir.const(1, "int32"), lanes)])


def _as_uint8(x, offset: int):
    """``uint8(x) + offset`` (mod 256) for the 8-bit vector ``x``."""
    import tvm
    from tvm import tir

    lanes = tvm.DataType(x.dtype).lanes
    u8 = f"uint8x{lanes}"
    if not str(x.dtype).startswith("uint8"):
        x = tir.call_intrin(u8, "tir.reinterpret", x)
    if offset % TABLE_SIZE:
        x = x + tir.Broadcast(tir.const(offset % TABLE_SIZE, "uint8"), lanes)
    return x


def slices(vector, lanes: int, width: int):
    """``vector`` (``lanes`` lanes) as vectors of ``width`` lanes: its consecutive slices, the last one
    padded with zeros. Returns ``[(slice, lanes used)]``."""
    from tvm import tir

    out = []
    for start in range(0, lanes, width):
        used = min(width, lanes - start)
        if start == 0 and used == lanes == width:
            out.append((vector, used))
            continue
        parts = [vector]
        pad = width - used
        if pad:
            zero = tir.const(0, str(vector.dtype).split("x")[0])
            parts.append(zero if pad == 1 else tir.Broadcast(zero, pad))  # a Broadcast has 2 lanes or more
        idx = list(range(start, start + used)) + list(range(lanes, lanes + pad))
        out.append((tir.Shuffle(parts, [tir.const(i, "int32") for i in idx]), used))
    return out


def joined(pieces, lanes: int):
    """The first lanes of each ``(vector, lanes used)`` piece, concatenated into ``lanes`` lanes."""
    import tvm
    from tvm import tir

    if len(pieces) == 1 and tvm.DataType(pieces[0][0].dtype).lanes == lanes:
        return pieces[0][0]
    idx, base = [], 0
    for vec, used in pieces:
        idx += range(base, base + used)
        base += tvm.DataType(vec.dtype).lanes
    return tir.Shuffle([v for v, _ in pieces], [tir.const(i, "int32") for i in idx])


def _reads_table(expr, tables) -> bool:
    """Whether ``expr`` loads whole vectors of one of the buffers whose data vars are ``tables``."""
    from tvm import tir

    found = []
    tir.stmt_functor.post_order_visit(expr, lambda n: found.append(n) if isinstance(n, tir.BufferLoad)
                                      and isinstance(n.indices[0], tir.Ramp)
                                      and any(n.buffer.data.same_as(t) for t in tables) else None)
    return bool(found)


def _stores_in_body(stmt):
    """The BufferStores of ``stmt`` outside any loop nested in it."""
    from tvm import tir

    if isinstance(stmt, tir.BufferStore):
        return [stmt]
    if isinstance(stmt, tir.For):
        return []
    if isinstance(stmt, tir.SeqStmt):
        return [s for c in stmt.seq for s in _stores_in_body(c)]
    if isinstance(stmt, tir.IfThenElse):
        return _stores_in_body(stmt.then_case) + (_stores_in_body(stmt.else_case) if stmt.else_case else [])
    body = getattr(stmt, "body", None)
    return _stores_in_body(body) if isinstance(body, tir.Stmt) else []


def ByteTableLookup(name: str, lookup: Callable, width: int, fence: Callable | None = None):  # noqa: N802
    """A ``tir.PrimFunc`` pass called ``name``: every vector load of a 256-entry 8-bit table at an index
    :func:`byte_index` accepts becomes ``lookup(table, idx)`` on slices of ``width`` lanes, where
    ``idx`` is the uint8 index vector (``width`` lanes, zero-padded) and ``lookup`` returns the table's
    bytes at it (``width`` lanes of the table's dtype), reading the table with :func:`table_bytes`.

    ``fence()``, where given, is a statement put first in the body of each innermost loop whose
    stores read a table this way: one the compiler cannot move loads across (a call that may write
    memory), so the table's vectors are loaded in each iteration of that loop rather than hoisted out
    of the kernel's loops, where they would hold registers through the conv's reduction. (A back end
    whose table takes few of its registers gives none.)

    Returns
    -------
    tvm.transform.Pass
    """
    import tvm
    from tvm import tir

    def rewrite(load):
        dt = tvm.DataType(load.dtype)
        if dt.lanes == 1 or str(load.buffer.dtype) not in _EIGHT_BIT or len(load.indices) != 1:
            return None
        shape = load.buffer.shape
        if len(shape) != 1 or not isinstance(shape[0], tir.IntImm) or int(shape[0]) != TABLE_SIZE:
            return None
        if isinstance(load.indices[0], tir.Ramp) or getattr(load, "predicate", None) is not None:
            return None  # a whole-vector read, or a masked one (kept as TVM wrote it)
        found = byte_index(load.indices[0])
        if isinstance(found, str):
            logger.debug("%s: a lookup in %s kept (%s)", name, load.buffer.name, found)
            return None
        idx = _as_uint8(*found)
        pieces = [(lookup(load.buffer, piece), used) for piece, used in slices(idx, dt.lanes, width)]
        return joined(pieces, dt.lanes)

    def transform(func, _mod, _ctx):
        tables = []  # the data vars of the tables read whole

        def rewrite_noting(load):
            out = rewrite(load)
            if out is not None:
                tables.append(load.buffer.data)
            return out

        body = tir.stmt_functor.ir_transform(func.body, None, rewrite_noting, ["tir.BufferLoad"])
        if body.same_as(func.body):
            return func
        if fence is not None:
            def fenced(loop):
                if not any(_reads_table(st.value, tables) for st in _stores_in_body(loop.body)):
                    return None
                return tir.For(loop.loop_var, loop.min, loop.extent, loop.kind,
                               tir.SeqStmt([fence(), loop.body]), loop.thread_binding, loop.annotations)

            body = tir.stmt_functor.ir_transform(body, None, fenced, ["tir.For"])
        return func.with_body(body)

    return tvm.tir.transform.prim_func_pass(transform, opt_level=0, name=name)
