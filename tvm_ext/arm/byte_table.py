"""Byte-table lookups with ``tbl``/``tbx`` (every aarch64 CPU), while tvm-ext builds.

Design note
-----------
A ``tvm_ext.table_lookup`` in a kernel's epilogue (an activation :class:`tvm_ext.passes.TabulateEightBit`
made a table of) is a gather, which LLVM emits as a lane load per byte (``ld1 {v.b}[i]`` with its
address arithmetic). NEON's ``tbl`` looks 16 bytes up in a table of up to four q registers (64 bytes),
and ``tbx`` does the same but leaves a lane whose index is out of range unchanged, so the 256-byte table
is four lookups of 64 bytes::

    # r = tbl4(T[0:64], idx)                      (indices >= 64 give 0)
    # r = tbx4(r, T[64j:64j+64], idx ^ 64j)       for j = 1, 2, 3

``idx ^ 64j`` has its top two bits clear exactly where ``idx`` lies in ``[64j, 64j + 63]``, and is then
``idx - 64j``; elsewhere it is 64 or more and ``tbx`` keeps the lane. The same bytes as the gather, so
the result is bit for bit the same. :func:`TblByteTableLookup` is the shared pass
(:mod:`tvm_ext._byte_table`) with this lookup; the aarch64 back end adds it at phase 3 (after
vectorisation) to builds of 8-bit graphs with tvm-ext's kernels.
"""
from __future__ import annotations

__all__ = ["TblByteTableLookup", "lower_config", "PASS_NAME", "LOWER_PHASE"]

#: The pass's name in ``tir.add_lower_pass`` (one per PassContext).
PASS_NAME = "tvm_ext.arm.TblByteTableLookup"
#: ``tir.add_lower_pass`` phase: after ``VectorizeLoop`` (the gathers have their vector types).
LOWER_PHASE = 3
#: Bytes per ``tbl``/``tbx`` (a q register of indices).
_WIDTH = 16
#: Bytes of table per ``tbl``/``tbx``: four q registers.
_SPAN = 64


def _lookup(table, idx):
    """``table[idx]`` for the 16 uint8 indices ``idx``: one ``tbl`` and three ``tbx`` over the table's
    four 64-byte quarters."""
    from tvm import tir

    from .._byte_table import TABLE_SIZE, table_bytes

    dtype = f"{table.dtype}x{_WIDTH}"
    regs = [table_bytes(table, k * _WIDTH, _WIDTH) for k in range(TABLE_SIZE // _WIDTH)]
    per = _SPAN // _WIDTH
    out = tir.call_llvm_pure_intrin(dtype, "llvm.aarch64.neon.tbl4", tir.const(5, "uint32"), *regs[:per], idx)
    for j in range(1, TABLE_SIZE // _SPAN):
        # lanes with idx in [64j, 64j + 63] read T[idx]; the others keep what earlier quarters gave
        key = tir.bitwise_xor(idx, tir.Broadcast(tir.const(_SPAN * j, "uint8"), _WIDTH))
        out = tir.call_llvm_pure_intrin(dtype, "llvm.aarch64.neon.tbx4", tir.const(6, "uint32"), out,
                                        *regs[per * j:per * (j + 1)], key)
    return out


def _fence():
    """``hint #0`` (a ``nop``), which LLVM must assume may write memory: the table's 16 q registers are
    loaded again after it, in each iteration of the loop over the conv's output tiles, instead of being
    hoisted out of that loop and held through the reduction, whose accumulators then spill (Neoverse-N1's
    1x1 192->192 loop: 81 instructions with 16 accumulators; with the table held, 126 and 13)."""
    from tvm import tir

    return tir.Evaluate(tir.call_llvm_intrin("int32", "llvm.aarch64.hint", tir.const(0, "uint32"),
                                             tir.const(0, "int32")))


def TblByteTableLookup():  # noqa: N802  (a TVM pass, named like TVM's)
    """A ``tir.PrimFunc`` pass: vector lookups in 256-entry byte tables as ``tbl``/``tbx`` (module
    docstring); every other load is left alone.

    Returns
    -------
    tvm.transform.Pass
    """
    from .._byte_table import ByteTableLookup

    return ByteTableLookup(PASS_NAME, _lookup, _WIDTH, fence=_fence)


def lower_config(config: dict | None = None) -> dict:
    """``config`` (PassContext options) with :func:`TblByteTableLookup` added to ``tir.add_lower_pass``
    once, after the lower passes already there. ``config`` is not modified."""
    from .._lower_pass import with_lower_pass

    return with_lower_pass(config, LOWER_PHASE, PASS_NAME, TblByteTableLookup)
