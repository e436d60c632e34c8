"""Byte-table lookups with ``vpermi2b`` (AVX-512 VBMI), while tvm-ext builds.

Design note
-----------
A ``tvm_ext.table_lookup`` in a kernel's epilogue (an activation :class:`tvm_ext.passes.TabulateEightBit`
made a table of) is a gather, which LLVM emits as an extract and a ``vpinsrb`` per byte. With AVX-512
VBMI the 256-byte table is four zmm registers and a lookup of 64 bytes is two permutes and a select::

    # lo = vpermi2b(idx, T[0:64], T[64:128])     (bits 0-6 of each index byte pick one of 128 bytes)
    # hi = vpermi2b(idx, T[128:192], T[192:256])
    # table[idx] = idx >= 128 ? hi : lo

The same bytes as the gather, so the result is bit for bit the same. :func:`ByteTableLookup` is the
shared pass (:mod:`tvm_ext._byte_table`) with this lookup; the x86 back end adds it at phase 3
(after vectorisation) to builds with tvm-ext's kernels for targets with VBMI (Ice Lake, Sapphire
Rapids, Zen 4 and later). AVX-512 without VBMI (Cascade Lake) permutes dwords instead
(:mod:`tvm_ext.x86.dword_table`); AVX2 keeps the gather.
"""
from __future__ import annotations

__all__ = ["VbmiByteTableLookup", "lower_config", "applies", "PASS_NAME", "LOWER_PHASE"]

#: The pass's name in ``tir.add_lower_pass`` (one per PassContext).
PASS_NAME = "tvm_ext.x86.VbmiByteTableLookup"
#: ``tir.add_lower_pass`` phase: after ``VectorizeLoop`` (the gathers have their vector types).
LOWER_PHASE = 3
#: Bytes per ``vpermi2b`` on zmm registers.
_WIDTH = 64
_PERMUTE = "llvm.x86.avx512.vpermi2var.qi.512"


def _lookup(table, idx):
    """``table[idx]`` for the 64 uint8 indices ``idx``: two ``vpermi2b`` over the table's halves and a
    select on each index's top bit."""
    from tvm import tir

    from .._byte_table import TABLE_SIZE, table_bytes

    dtype = f"{table.dtype}x{_WIDTH}"  # an int8 table's bytes and the uint8 indices are both <64 x i8>
    quarter = [table_bytes(table, k * _WIDTH, _WIDTH) for k in range(TABLE_SIZE // _WIDTH)]
    lo = tir.call_llvm_pure_intrin(dtype, _PERMUTE, tir.const(0, "uint32"), quarter[0], idx, quarter[1])
    hi = tir.call_llvm_pure_intrin(dtype, _PERMUTE, tir.const(0, "uint32"), quarter[2], idx, quarter[3])
    return tir.Select(idx >= tir.Broadcast(tir.const(128, "uint8"), _WIDTH), hi, lo)


def VbmiByteTableLookup():  # noqa: N802  (a TVM pass, named like TVM's)
    """A ``tir.PrimFunc`` pass: vector lookups in 256-entry byte tables as ``vpermi2b`` pairs (module
    docstring); every other load is left alone.

    Returns
    -------
    tvm.transform.Pass
    """
    from .._byte_table import ByteTableLookup

    return ByteTableLookup(PASS_NAME, _lookup, _WIDTH)


def lower_config(config: dict | None = None) -> dict:
    """``config`` (PassContext options) with :func:`VbmiByteTableLookup` added to ``tir.add_lower_pass``
    once, after the lower passes already there. ``config`` is not modified."""
    from .._lower_pass import with_lower_pass

    return with_lower_pass(config, LOWER_PHASE, PASS_NAME, VbmiByteTableLookup)


def applies(target) -> bool:
    """Whether the x86 back end lowers byte-table lookups this way for ``target``: AVX-512 VBMI."""
    from .isa import llvm_features

    return "avx512vbmi" in llvm_features(target)
