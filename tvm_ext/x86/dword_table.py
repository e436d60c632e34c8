"""Byte-table lookups with ``vpermi2d`` (AVX-512 without VBMI), while tvm-ext builds.

Design note
-----------
Without AVX-512 VBMI (Skylake-SP, Cascade Lake, Cooper Lake) there is no byte permute, and a
``tvm_ext.table_lookup`` in a kernel's epilogue stays a gather: an extract and a ``vpinsrb`` per
byte, all on port 5, where the conv's dots also issue. AVX-512F permutes dwords across two zmm
registers, so the 256-byte table is four zmm registers of 16 dwords, each dword 4 consecutive
entries, and a lookup of 16 bytes is two permutes, a select and a shift::

    # q = idx >> 2                                  (the dword holding table[idx], in [0, 63])
    # lo = vpermi2d(q, T[0:64], T[64:128])          (bits 0-4 of q pick one of 32 dwords)
    # hi = vpermi2d(q, T[128:192], T[192:256])
    # table[idx] = low byte of ((idx >= 128 ? hi : lo) >> 8 * (idx & 3))

Dword ``k`` of a 64-byte quarter holds the quarter's bytes ``4k .. 4k+3`` (x86 is little-endian), so
the shift brings byte ``idx & 3`` of it to the low byte, and the truncation keeps it: the same bytes
as the gather, bit for bit. 16 indices per lookup (one zmm of dwords); a vector of 64 is four. The
shift, the select and the narrowing go to ports 0 and 5 both, where the gather's inserts took port 5
alone (llvm-mca's Cascade Lake model: 6 cycles per 16 bytes against 32). Targets with VBMI
keep :mod:`tvm_ext.x86.byte_table` (two byte permutes per 64 bytes); AVX2 keeps the gather (its
dword permute reads one register, 8 entries, so a table takes eight permutes and a select tree).
"""
from __future__ import annotations

__all__ = ["DwordByteTableLookup", "lower_config", "applies", "PASS_NAME", "LOWER_PHASE"]

#: The pass's name in ``tir.add_lower_pass`` (one per PassContext).
PASS_NAME = "tvm_ext.x86.DwordByteTableLookup"
#: ``tir.add_lower_pass`` phase: after ``VectorizeLoop`` (the gathers have their vector types).
LOWER_PHASE = 3
#: Indices per lookup: the dwords of a zmm register.
_WIDTH = 16
#: Table bytes per permuted register.
_QUARTER = 64
_PERMUTE = "llvm.x86.avx512.vpermi2var.d.512"


def _lookup(table, idx):
    """``table[idx]`` for the 16 uint8 indices ``idx``: two ``vpermi2d`` over the table's halves, a
    select on each index's top bit and a shift to the index's byte in its dword."""
    from tvm import tir

    from .._byte_table import TABLE_SIZE, table_bytes

    dwords = f"int32x{_WIDTH}"

    def const(v):
        return tir.Broadcast(tir.const(v, "int32"), _WIDTH)

    wide = tir.Cast(dwords, idx)  # idx is uint8: 0..255
    quarter = [tir.call_intrin(dwords, "tir.reinterpret", table_bytes(table, k * _QUARTER, _QUARTER))
               for k in range(TABLE_SIZE // _QUARTER)]
    q = tir.shift_right(wide, const(2))
    lo = tir.call_llvm_pure_intrin(dwords, _PERMUTE, tir.const(0, "uint32"), quarter[0], q, quarter[1])
    hi = tir.call_llvm_pure_intrin(dwords, _PERMUTE, tir.const(0, "uint32"), quarter[2], q, quarter[3])
    word = tir.Select(wide >= const(128), hi, lo)
    byte = tir.shift_right(word, tir.shift_left(tir.bitwise_and(wide, const(3)), const(3)))
    return tir.Cast(f"{table.dtype}x{_WIDTH}", byte)  # the low byte: the bits above it are dropped


def DwordByteTableLookup():  # noqa: N802  (a TVM pass, named like TVM's)
    """A ``tir.PrimFunc`` pass: vector lookups in 256-entry byte tables as ``vpermi2d`` pairs (module
    docstring); every other load is left alone.

    Returns
    -------
    tvm.transform.Pass
    """
    from .._byte_table import ByteTableLookup

    return ByteTableLookup(PASS_NAME, _lookup, _WIDTH)


def lower_config(config: dict | None = None) -> dict:
    """``config`` (PassContext options) with :func:`DwordByteTableLookup` added to ``tir.add_lower_pass``
    once, after the lower passes already there. ``config`` is not modified."""
    from .._lower_pass import with_lower_pass

    return with_lower_pass(config, LOWER_PHASE, PASS_NAME, DwordByteTableLookup)


def applies(target) -> bool:
    """Whether the x86 back end lowers byte-table lookups this way for ``target``: AVX-512F where
    :func:`tvm_ext.x86.byte_table.applies` does not (no VBMI), so a target takes one of the two."""
    from . import byte_table
    from .isa import llvm_features

    return "avx512f" in llvm_features(target) and not byte_table.applies(target)
