"""HoistUint8Shift: the +-128 input shift of an 8-bit conv (x86: int8 -> uint8; aarch64: uint8 -> int8)
moves into the producer.

Rewrites::

    # s = cast(add(b, 128), uint8); r1(b), ..., rk(b)
    #     -> s = cast(add(b, 128), uint8); r1(subtract(cast(s, int32), 128)), ..., rk(...)

    # s = cast(add(cast(x, int32), 128), uint8); r1(x), ..., rk(x),  x int8
    #     -> r1(cast(subtract(cast(s, int32), 128), int8)), ...

    # s = cast(add(b, -128), int8); r1(b), ..., rk(b)     (aarch64; b in [0, 255] or a uint8 x: :data:`SHIFTS`)
    #     -> s = cast(add(b, -128), int8); r1(subtract(cast(s, int32), -128)), ..., rk(...)

Walked by hand: it reads every other reader of the shifted value and the function's value ranges.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``HoistUint8Shift``.
"""
from __future__ import annotations

from dataclasses import dataclass

from tvm import relay

from tvm_ext._op_pattern import K_INJECTIVE, K_OUT_EWISE_FUSABLE, call_pattern
from ._registry import register_pass

from ._doc import factory_sections
from ._intervals import value_ranges
from ._util import Reject, constant_scalar, op_name, pass_logger, static_tensor_type, substitution_pass

__all__ = ["HoistUint8Shift"]

PASS_NAME = "HoistUint8Shift"
_log = pass_logger(PASS_NAME)


@dataclass(frozen=True)
class _Shift:
    """One conv-input shift QNN legalization writes: ``s = cast(add(b, offset), dtype)``."""

    offset: int
    dtype: str  # the shifted value's dtype
    source: str  # the 8-bit dtype of the unshifted value (``b = cast(x, int32)``)
    lo: int  # the range of b that makes the shift exact (no wrap)
    hi: int


#: The shifts, in the order they are tried; the equations are in its design note (docs/passes.md).
SHIFTS = (
    # x86 (u8 x s8 multiply-adds): s = cast(b + 128, uint8), b in [-128, 127]
    _Shift(128, "uint8", "int8", -128, 127),
    # aarch64 (s8 x s8 dot products): s = cast(b - 128, int8), b in [0, 255]
    _Shift(-128, "int8", "uint8", 0, 255),
)


def _shift_of(add, users):
    """``(s, shift)`` when ``add`` is the ``add(b, offset)`` of a shift ``s = cast(add, dtype)``, else None."""
    if not (isinstance(add, relay.Call) and op_name(add) == "add" and len(add.args) == 2):
        return None
    offset = constant_scalar(add.args[1])
    shift = next((sh for sh in SHIFTS if sh.offset == offset), None)
    if shift is None:
        return None
    readers = users.get(add, [])
    if len(readers) != 1:
        return None
    cast = readers[0][0]
    if op_name(cast) == "cast" and str(cast.attrs.dtype) == shift.dtype:
        return cast, shift
    return None


def _match(add, users, ranges, body):
    """(v, s, shift, replacement dtype, [(reader, arg index), ...]) for a shift's ``add``, or a Reject.

    ``v`` is the value the other readers read: ``b`` itself (int32), or ``x`` when
    ``b = cast(x, int32)`` of an 8-bit ``x`` is read by the shift alone.
    """
    found = _shift_of(add, users)
    if found is None:
        return Reject("not a +-128 8-bit shift")
    s, shift = found
    b = add.args[0]
    v, vdtype, skip = b, "int32", add
    if len(users.get(b, [])) == 1 and isinstance(b, relay.Call) and op_name(b) == "cast" \
            and str(b.args[0].checked_type.dtype) == shift.source:
        v, vdtype, skip = b.args[0], shift.source, b  # cast(x, int32) -> add -> cast; x read elsewhere
    others = [(r, i) for r, i in users.get(v, []) if not r.same_as(skip)]
    if not others:
        return Reject("the shift is its only reader: it already fuses into the producer")
    for e in (v, b):
        ok = static_tensor_type(e)
        if not ok:
            return ok
    if str(b.checked_type.dtype) != "int32":
        return Reject(f"{b.checked_type.dtype} value shifted, not int32")
    if vdtype == "int32":
        lo, hi = ranges.get(b, (None, None))
        if lo is None or lo < shift.lo or hi > shift.hi:
            return Reject(f"range [{lo}, {hi}] not proven inside [{shift.lo}, {shift.hi}]")
    if v.same_as(body):
        return Reject("the value is also the function's result")
    if not isinstance(v, relay.Call) or op_name(v) is None:
        return Reject(f"produced by a {type(v).__name__}, not an op call (the shift would be a kernel)")
    if call_pattern(v) > K_OUT_EWISE_FUSABLE:
        return Reject(f"producer {op_name(v)} does not fuse an elementwise consumer")
    for r, _ in others:
        # a Tuple field is read by the tuple's users (concatenate): those must be injective too
        calls = [u for u, _ in users.get(r, [])] if isinstance(r, relay.Tuple) else [r]
        for c in calls:
            if not isinstance(c, relay.Call) or call_pattern(c) > K_INJECTIVE:
                name = op_name(c) if isinstance(c, relay.Call) else type(c).__name__
                return Reject(f"reader {name} is not elementwise/broadcast/injective (the widening would be a kernel)")
    return v, s, shift, vdtype, others


def _collect(nodes, users, body) -> dict:
    """The other readers of each hoisted value, rewritten to read the unshifted copy."""
    ranges = value_ranges(nodes)
    subst: dict = {}
    for add in nodes:
        if _shift_of(add, users) is None:
            continue
        m = _match(add, users, ranges, body)
        if isinstance(m, Reject):
            _log.debug("shift of %s: not hoisted: %s", op_name(add.args[0]) or type(add.args[0]).__name__, m)
            continue
        v, s, shift, vdtype, others = m
        for r, _ in others:
            r_new = subst.get(r, r)  # a reader of two hoisted values: rewrite the rewritten call
            # v -> subtract(cast(s, int32), offset) [-> cast to v's 8-bit dtype], a copy per reader (fuses into it)
            if isinstance(r_new, relay.Tuple):
                fields = [_unshift(s, shift, vdtype) if a.same_as(v) else a for a in r_new.fields]
                subst[r] = relay.Tuple(fields, r_new.span)
                continue
            args = [_unshift(s, shift, vdtype) if a.same_as(v) else a for a in r_new.args]
            subst[r] = relay.Call(r_new.op, args, r_new.attrs, r_new.type_args, r_new.span)
        _log.info("%s %s %s: %+d %s shift hoisted into the producer; %d other reader(s) read the shifted value",
                  op_name(v), vdtype, [int(d) for d in v.checked_type.shape], shift.offset, shift.dtype, len(others))
    return subst


def _unshift(s, shift, dtype):
    # s = x + offset (8-bit) -> x
    x = relay.subtract(relay.cast(s, "int32"), relay.const(shift.offset, "int32"))
    return x if dtype == "int32" else relay.cast(x, dtype)


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def HoistUint8Shift():  # pylint: disable=invalid-name
    """Move x86's int8 -> uint8 conv-input shift into the producer of a value with other readers.

    ``s = cast(add(b, 128), uint8)`` next to other readers ``r(b)`` of an int32 ``b`` proven in
    ``[-128, 127]`` becomes ``r(subtract(cast(s, int32), 128))`` (one copy per reader): ``b``'s
    kernel then writes the uint8 ``s``, the lone shift kernel and the int32 crossing disappear.
    Exact. For int8-activation (S8S8) models on x86, whose convs read ``x + 128``.

    Use at stage ``before_fuse`` (after relay.build's prefix has legalized and lowered QNN).

    Notes
    -----
    Rejections (range not proven, non-elementwise readers, a non-fusable producer, the function's
    result, dynamic shapes) are logged at DEBUG on ``tvm_ext.passes.HoistUint8Shift``, rewrites
    at INFO.
    """
    return substitution_pass(PASS_NAME, _collect)
