"""HoistUint8Shift: the +128 shift x86 puts in front of an int8-input conv moves into the producer.

Rewrites::

    # s = cast(add(b, 128), uint8); r1(b), ..., rk(b)
    #     -> s = cast(add(b, 128), uint8); r1(subtract(cast(s, int32), 128)), ..., rk(...)

    # s = cast(add(cast(x, int32), 128), uint8); r1(x), ..., rk(x),  x int8
    #     -> r1(cast(subtract(cast(s, int32), 128), int8)), ...

Walked by hand: it reads every other reader of the shifted value and the function's value ranges.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``HoistUint8Shift``.
"""
from __future__ import annotations

from tvm import relay

from tvm_ext._op_pattern import K_INJECTIVE, K_OUT_EWISE_FUSABLE, call_pattern
from tvm_ext.core.registry import register_pass

from ._intervals import value_ranges
from ._util import Reject, constant_scalar, op_name, pass_logger, static_tensor_type, substitution_pass

__all__ = ["HoistUint8Shift"]

PASS_NAME = "HoistUint8Shift"
_log = pass_logger(PASS_NAME)


def _shift_of(add, users):
    """``s`` when ``add`` is the ``add(b, 128)`` of a shift ``s = cast(add, uint8)``, else None."""
    if not (isinstance(add, relay.Call) and op_name(add) == "add" and len(add.args) == 2):
        return None
    if constant_scalar(add.args[1]) != 128:
        return None
    readers = users.get(add, [])
    if len(readers) != 1:
        return None
    cast = readers[0][0]
    if op_name(cast) == "cast" and str(cast.attrs.dtype) == "uint8":
        return cast
    return None


def _match(add, users, ranges, body):
    """(v, s, replacement dtype, [(reader, arg index), ...]) for a shift's ``add``, or a Reject.

    ``v`` is the value the other readers read: ``b`` itself (int32), or ``x`` when
    ``b = cast(x, int32)`` of an int8 ``x`` is read by the shift alone.
    """
    s = _shift_of(add, users)
    if s is None:
        return Reject("not a +128 uint8 shift")
    b = add.args[0]
    v, vdtype, skip = b, "int32", add
    if len(users.get(b, [])) == 1 and isinstance(b, relay.Call) and op_name(b) == "cast" \
            and str(b.args[0].checked_type.dtype) == "int8":
        v, vdtype, skip = b.args[0], "int8", b  # cast(x, int32) -> add 128 -> cast u8; x read elsewhere
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
        if lo is None or lo < -128 or hi > 127:
            return Reject(f"range [{lo}, {hi}] not proven inside [-128, 127]")
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
    return v, s, vdtype, others


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
        v, s, vdtype, others = m
        for r, _ in others:
            r_new = subst.get(r, r)  # a reader of two hoisted values: rewrite the rewritten call
            # v -> subtract(cast(s, int32), 128) [-> cast int8], a copy per reader (fuses into it)
            if isinstance(r_new, relay.Tuple):
                subst[r] = relay.Tuple([_unshift(s, vdtype) if a.same_as(v) else a for a in r_new.fields], r_new.span)
                continue
            args = [_unshift(s, vdtype) if a.same_as(v) else a for a in r_new.args]
            subst[r] = relay.Call(r_new.op, args, r_new.attrs, r_new.type_args, r_new.span)
        _log.info("%s %s %s: +128 uint8 shift hoisted into the producer; %d other reader(s) read the shifted value",
                  op_name(v), vdtype, [int(d) for d in v.checked_type.shape], len(others))
    return subst


def _unshift(s, dtype):
    # s = x + 128 (uint8) -> x
    x = relay.subtract(relay.cast(s, "int32"), relay.const(128, "int32"))
    return x if dtype == "int32" else relay.cast(x, dtype)


@register_pass(PASS_NAME)
def HoistUint8Shift():  # pylint: disable=invalid-name
    """Move x86's int8 -> uint8 conv-input shift into the producer of a value with other readers.

    ``s = cast(add(b, 128), uint8)`` next to other readers ``r(b)`` of an int32 ``b`` proven in
    ``[-128, 127]`` becomes ``r(subtract(cast(s, int32), 128))`` (one copy per reader): ``b``'s
    kernel then writes the uint8 ``s``, the lone shift kernel and the int32 crossing disappear.
    Exact. For int8-activation (S8S8) models on x86, whose convs read ``x + 128``.

    Use at stage ``before_fuse`` (after relay.build's prefix has legalized and lowered QNN).

    Returns
    -------
    tvm.transform.Pass
        A Relay function pass named ``"HoistUint8Shift"`` (opt_level 1).

    Raises
    ------
    tvm_ext.passes._util.UntypedModuleError
        When run on a module that was not type-inferred.

    Notes
    -----
    Rejections (range not proven, non-elementwise readers, a non-fusable producer, the function's
    result, dynamic shapes) are logged at DEBUG on ``tvm_ext.passes.HoistUint8Shift``, rewrites
    at INFO.
    """
    return substitution_pass(PASS_NAME, _collect)
