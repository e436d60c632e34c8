"""Exact fixed-point requantization on aarch64: ``q_multiply_shift`` rounded once while tvm-ext builds.

Design note
-----------
``qnn.requantize`` lowers to ``tir.q_multiply_shift(x, m, 31, s)``: ``round(x * m / 2^(31 + s))``,
rounded once (TVM's generic lowering, in int64). TVM 0.19's ``llvm.aarch64`` lowering
(``tvm.topi.arm_cpu.tensor_intrin._q_multiply_shift_arm``, ``sqrdmulh`` then ``srshl``) rounds twice,
``round(round(x * m / 2^31) / 2^s)``: one output step off on some values, 773 of 1000 logits of a
QDQ ResNet-50 at ``neoverse-n1 +dotprod`` under qemu (``docs/arm.md``).

:func:`generic_q_multiply_shift` registers, for as long as it is entered, a lowering for
``llvm.aarch64`` that is exact (docs/arm-kernels.md has the proofs): int32 vectors shifted right by a
constant ``s`` take ``sqdmulh`` (``floor(x * m / 2^31)``) and a rounding shift ``srshr #s``; a left
shift or none rounds the 64-bit product, where TVM's rule multiplies the 65-bit ``x * 2^s``::

    # q_multiply_shift(x, m, 31, -s), 1 <= s <= 31  ->  srshr(sqdmulh(x, m), s)       (4k lanes)
    # q_multiply_shift(x, m, 31, 0), m != -2^31     ->  sqrdmulh(x, m)                  (4k lanes, m constant)
    # q_multiply_shift(x, m, 31, s), 0 <= s <= 30   ->  (x * m + 2^(30 - s)) >> (31 - s)  (int64 product)
    # otherwise                                     ->  TVM's generic rule

TVM's own is registered again on the outermost exit. Lowering rules are process-wide: the replacement
is re-entrant and shared by threads (:class:`tvm_ext._patch.Patch`); each registration takes a
higher priority level than the last, since TVM keeps the highest.
"""
from __future__ import annotations

import contextlib
import itertools
import logging

import tvm
from tvm.ir import register_intrin_lowering

from .._patch import Patch
from .._tir_const import int_value

logger = logging.getLogger(__name__)

__all__ = ["generic_q_multiply_shift", "exact_q_multiply_shift", "AARCH64_LOWERING"]

#: The target key TVM's aarch64 lowering of ``q_multiply_shift`` is registered under.
AARCH64_LOWERING = "llvm.aarch64"
#: Priority levels above TVM's own registration (``level=99``); one more for every registration.
_LEVELS = itertools.count(200)


def _register(lowering) -> None:
    register_intrin_lowering("tir.q_multiply_shift", target=AARCH64_LOWERING, f=lowering, level=next(_LEVELS))


#: Lanes of one NEON int32 vector.
_LANES = 4


def _quarter(e, start: int):
    """Lanes ``start .. start + 3`` of the int32 vector ``e`` (a broadcast stays a broadcast)."""
    lanes = tvm.DataType(e.dtype).lanes
    if isinstance(e, tvm.tir.Broadcast) or lanes == 1:
        return tvm.tir.Broadcast(e.value if isinstance(e, tvm.tir.Broadcast) else e, _LANES)
    if lanes == _LANES:
        return e
    return tvm.tir.Shuffle([e], [tvm.tir.const(start + i, "int32") for i in range(_LANES)])


def exact_q_multiply_shift(op):
    """Lower ``q_multiply_shift(x, m, 31, -s)`` on int32 vectors of 4k lanes with a constant right shift
    ``s`` in 1..31 to ``srshr(sqdmulh(x, m), s)`` per 4 lanes, with no shift and a constant ``m`` other
    than -2^31 to ``sqrdmulh(x, m)``, with a left shift to the rounded 64-bit product (exact: module
    note); ``op`` unchanged otherwise, so that TVM's generic rule lowers it."""
    x, m, q, s = op.args
    shift, dtype = int_value(s), tvm.DataType(x.dtype)
    if (op.dtype != x.dtype or (dtype.type_code, dtype.bits) != (tvm.DataTypeCode.INT, 32) or int_value(q) != 31
            or shift is None or not -31 <= shift <= 30):
        return op
    if shift == 0 and int_value(m) not in (None, -(1 << 31)) and dtype.lanes % _LANES == 0:
        return _per_quarter(x, m, dtype.lanes, lambda xs, ms: _neon("sqrdmulh", xs, ms))
    if shift >= 0:  # left: round(x * m / 2^(31 - s)) from the 64-bit product (smull), no 65-bit x * 2^s
        wide = f"int64x{dtype.lanes}" if dtype.lanes > 1 else "int64"
        total = 31 - shift
        if dtype.lanes > 1 and tvm.DataType(m.dtype).lanes == 1:
            m = tvm.tir.Broadcast(m, dtype.lanes)
        product = x.astype(wide) * m.astype(wide) + tvm.tir.const(1 << (total - 1), "int64")
        return (product >> tvm.tir.const(total, "int64")).astype(x.dtype)
    if dtype.lanes % _LANES:
        return op
    rounding = tvm.tir.Broadcast(tvm.tir.const(shift, "int32"), _LANES)  # srshl by -s: srshr #s
    return _per_quarter(x, m, dtype.lanes, lambda xs, ms: _neon("srshl", _neon("sqdmulh", xs, ms), rounding))


def _neon(name: str, a, b):
    """``llvm.aarch64.neon.<name>`` on two int32x4 operands."""
    return tvm.tir.call_llvm_pure_intrin("int32x4", f"llvm.aarch64.neon.{name}", tvm.tir.const(2, "uint32"), a, b)


def _per_quarter(x, m, lanes: int, quarter):
    """``quarter(x[i:i+4], m[i:i+4])`` for each 4 lanes, joined into ``lanes`` lanes."""
    parts = [quarter(_quarter(x, start), _quarter(m, start)) for start in range(0, lanes, _LANES)]
    if len(parts) == 1:
        return parts[0]
    return tvm.tir.Shuffle(parts, [tvm.tir.const(i, "int32") for i in range(lanes)])


def _install():
    logger.debug("aarch64: exact q_multiply_shift lowering (sqdmulh + srshr, else TVM's generic rule)")
    _register(exact_q_multiply_shift)


def _uninstall():
    from tvm.topi.arm_cpu.tensor_intrin import _q_multiply_shift_arm

    _register(_q_multiply_shift_arm)


_PATCH = Patch(_install, _uninstall)


@contextlib.contextmanager
def generic_q_multiply_shift():
    """Enter to lower ``q_multiply_shift`` on aarch64 as TVM does on every other CPU (one
    rounding: exact integer requantization) instead of with ``sqrdmulh`` + ``srshl``."""
    with _PATCH.entered():
        yield
