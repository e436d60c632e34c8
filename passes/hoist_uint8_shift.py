"""HoistUint8Shift: the +-128 input shift of an 8-bit conv (x86: int8 -> uint8; aarch64: uint8 -> int8)
moves into the producer.

Design note
-----------
x86 has u8 x s8 multiply-adds only, so TVM's QNN legalization
(``python/tvm/relay/qnn/op/legalizations.py``, ``helper_change_dtypes_to_uint8_int8``) gives a
conv or dense with *int8* activations (ONNX Runtime's S8S8 models) a shifted input
``cast(add(cast(x, int32), 128), uint8)`` and zero point ``z + 128``. When ``x`` has no other
reader, the shift is elementwise on the producer's output and fuses into its kernel. When ``x``
has another reader too (a residual ``add`` reading a linear bottleneck's output, MobileNet's
"block input": the conv and the shortcut both read it), FuseOps cannot put the shift in the
producer's kernel (``x``'s post-dominator lies past both readers): the producer writes ``x`` (as
``int32``: QNN lowering and SimplifyExpr leave the requantize's ``clip`` in int32), the shift is a
kernel of its own, and an int32 tensor crosses two kernel boundaries. On the PP-OCR classifier
that is 6 kernels more than U8S8 in QOperator and 2 more than stock TVM in QDQ (stock keeps
those convs in float).

Two rules, one per shift (:data:`SHIFTS`). On every int32 value ``b`` proven to lie in ``[-128, 127]``
(:func:`~tvm_ext.passes._intervals.value_ranges`)::

    # s = cast(add(b, 128), uint8); r1(b), ..., rk(b)
    #     -> s = cast(add(b, 128), uint8); r1(subtract(cast(s, int32), 128)), ..., rk(...)

and its int8 form, where QNN lowering keeps the requantize's ``cast(clip, int8)``::

    # s = cast(add(cast(x, int32), 128), uint8); r1(x), ..., rk(x),  x int8
    #     -> r1(cast(subtract(cast(s, int32), 128), int8)), ...

aarch64's dot products are int8 x int8 (``sdot``), so its QNN legalization
(``helper_change_dtypes_to_be_same``) shifts a *uint8* input the other way, and a uint8 ResNet's block
output, read by the next block's conv and by the shortcut, becomes a lone shift kernel (12 of the 71
kernels of the QDQ ResNet-50 at Neoverse-N1). The mirror rule, on ``b`` in ``[0, 255]`` or
``b = cast(x, int32)`` of a uint8 ``x``::

    # s = cast(add(b, -128), int8); r1(b), ..., rk(b)
    #     -> s = cast(add(b, -128), int8); r1(subtract(cast(s, int32), -128)), ..., rk(...)

Each other reader gets its own copy of ``subtract(cast(s, int32), offset)`` (elementwise, fused into
that reader's kernel, as CanonicalizeCast does for widening casts), so ``b``'s only reader is the
shift, which fuses into ``b``'s producer: that kernel writes ``s``, the shift kernel disappears and
no int32 crosses. Exact: the ranges make ``b + offset`` fit the 8-bit type (no wrap), and
``cast(s, int32) - offset == b`` element for element.

Rewritten only when every other reader is elementwise, broadcast or injective (``TOpPattern`` <= 2,
e.g. YOLO's ``concatenate`` of a C2f block's branches: the widening copy fuses into it; a pool or
conv reading ``b`` directly would get a kernel more) and
``b`` is computed by an op FuseOps fuses an elementwise consumer into (not a parameter, constant,
reduction or opaque op) and is not the function's result. Rejected with a logged reason
otherwise, and for dynamic shapes. Functions with ``If``/``Let``/``Match``/references/closures are
skipped; untyped input raises :class:`~tvm_ext.passes._util.UntypedModuleError`. Run it at stage
``before_fuse`` (after QNN legalization and lowering created the shift). Idempotent: afterwards the
shift is ``b``'s only reader.

Walked by hand, not with ``tvm.relay.dataflow_pattern``: the rewrite reads every other reader of the
shifted value (any number of them) and the function's value ranges, which a pattern over one
expression tree does not see.
"""
from __future__ import annotations

from dataclasses import dataclass

from tvm_ext._op_pattern import K_INJECTIVE, K_OUT_EWISE_FUSABLE, call_pattern
from tvm_ext.core.registry import register_pass

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


#: The shifts, in the order they are tried; the equations are in the module note.
SHIFTS = (
    # x86 (u8 x s8 multiply-adds): s = cast(b + 128, uint8), b in [-128, 127]
    _Shift(128, "uint8", "int8", -128, 127),
    # aarch64 (s8 x s8 dot products): s = cast(b - 128, int8), b in [0, 255]
    _Shift(-128, "int8", "uint8", 0, 255),
)


def _shift_of(add, users):
    """``(s, shift)`` when ``add`` is the ``add(b, offset)`` of a shift ``s = cast(add, dtype)``, else None."""
    from tvm import relay

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
    from tvm import relay

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
    from tvm import relay

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
    from tvm import relay

    # s = x + offset (8-bit) -> x
    x = relay.subtract(relay.cast(s, "int32"), relay.const(shift.offset, "int32"))
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
