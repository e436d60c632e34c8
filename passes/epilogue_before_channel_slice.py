"""EpilogueBeforeChannelSlice: a conv's elementwise epilogue moves in front of x86's channel slice.

Rewrites::

    # E(strided_slice(layout_transform(y, "NCHWkc", "NCHW"), C))
    #     -> strided_slice(layout_transform(E'(y), "NCHWkc", "NCHW"), C)
    # E: elementwise/broadcast ops on the slice, constants scalar or per channel (1, C, 1, 1)
    # E': the same ops on the blocked tensor, per-channel constants padded to the blocked channel
    #     count (with their last value) and blocked to (1, C'/k, 1, 1, k)

Walked by hand: the epilogue after the slice is a region of any size, each call's readers counted.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``EpilogueBeforeChannelSlice``.
"""
from __future__ import annotations

import re

import numpy as np

from tvm import relay

from tvm_ext._op_pattern import K_BROADCAST, call_pattern
from tvm_ext.core.registry import register_pass

from ._chains import narrow_type
from ._doc import factory_sections
from ._util import Reject, int_list, op_calls, op_name, pass_logger, static_shape, static_tensor_type, substitution_pass

__all__ = ["EpilogueBeforeChannelSlice"]

PASS_NAME = "EpilogueBeforeChannelSlice"
_log = pass_logger(PASS_NAME)

_INT_DIVISIONS = ("divide", "floor_divide", "trunc_divide", "mod", "floor_mod", "trunc_mod", "right_shift",
                  "left_shift")


def _match_slice(sl, users):
    """(layout_transform, blocked input y, block k, channels C) for a channel slice, or a Reject."""
    lt = sl.args[0]
    if not (isinstance(lt, relay.Call) and op_name(lt) == "layout_transform"):
        return Reject("the slice does not read a layout_transform")
    for e in (sl, lt, lt.args[0]):
        ok = static_tensor_type(e)
        if not ok:
            return ok
    m = re.fullmatch(r"NCHW(\d+)c", str(lt.attrs.src_layout))
    if not m or str(lt.attrs.dst_layout) != "NCHW":
        return Reject(f"layout_transform {lt.attrs.src_layout} -> {lt.attrs.dst_layout}, not NCHW<k>c -> NCHW")
    if len(users.get(lt, [])) != 1:
        return Reject("the layout_transform has other readers")
    full, out = static_shape(lt), static_shape(sl)
    if len(out) != 4 or [a for i, (a, b) in enumerate(zip(full, out)) if i != 1 and a != b]:
        return Reject(f"slices other axes than channels: {list(full)} -> {list(out)}")
    a = sl.attrs
    begin = int_list(a.begin)
    strides = [1] if a.strides is None else int_list(a.strides)
    if a.axes is not None or begin is None or any(b != 0 for b in begin) or strides is None \
            or any(s != 1 for s in strides):
        return Reject("the slice does not start at 0 with step 1 on every axis")
    return lt, lt.args[0], int(m.group(1)), out[1]


def _constant_ok(c, channels):
    shape = (1,) * (4 - len(c.data.shape)) + tuple(c.data.shape) if len(c.data.shape) <= 4 else None
    if shape is None or any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return Reject(f"constant of shape {list(c.data.shape)} is not scalar or per channel")
    return True


def _region(sl, nodes, users, channels):
    """The elementwise region computed from ``sl`` alone, in topological order (``sl`` first)."""
    region = [sl]
    inside = {sl}
    shape = static_shape(sl)
    for n in nodes[nodes.index(sl) + 1:]:
        if not isinstance(n, relay.Call) or op_name(n) is None or not any(a in inside for a in n.args):
            continue
        if call_pattern(n) > K_BROADCAST or not static_tensor_type(n) or static_shape(n) != shape:
            continue
        ok = all(a in inside or (isinstance(a, relay.Constant) and _constant_ok(a, channels)) for a in n.args)
        if ok and op_name(n) in _INT_DIVISIONS and not str(n.checked_type.dtype).startswith("float") \
                and n.args[1] in inside:
            ok = False  # integer division by a region value: a padded channel might divide by zero
        if ok:
            region.append(n)
            inside.add(n)
    return region


def _ancestors(e, inside):
    out, todo = set(), [e]
    while todo:
        n = todo.pop()
        if n in out:
            continue
        out.add(n)
        todo.extend(a for a in getattr(n, "args", []) if a in inside)
    return out


def _end(sl, region, users, body):
    """(e, its ancestors in the region, narrow dtype, how) for the last closed 8-bit end, or a Reject."""
    inside = set(region)
    best = None
    for e in region[1:]:
        nt = narrow_type(e)
        if not nt:
            continue
        anc = _ancestors(e, inside)
        if sl not in anc:
            continue
        if any(u.same_as(body) or any(r not in anc for r, _ in users.get(u, [])) for u in anc - {e}):
            continue
        best = (e, anc, nt[0], nt[1])
    if best is None:
        return Reject("no 8-bit value ends a closed elementwise region after the slice")
    return best


def _blocked_constant(c, k, full_channels):
    """A scalar or per-channel (1, C, 1, 1) constant in the blocked layout (1, C'/k, 1, 1, k)."""
    a = c.data.numpy()
    if a.ndim == 0:
        return c
    a4 = a.reshape((1,) * (4 - a.ndim) + a.shape)
    if a4.shape[1] == 1:
        return relay.const(a4.reshape(1, 1, 1, 1, 1))
    padded = np.pad(a4, ((0, 0), (0, full_channels - a4.shape[1]), (0, 0), (0, 0)), mode="edge")
    return relay.const(np.ascontiguousarray(padded.reshape(1, full_channels // k, k, 1, 1).transpose(0, 1, 3, 4, 2)))


def _rewrite(sl, lt, y, k, e, anc, region, dtype, how):
    full = static_shape(lt)[1]
    new = {sl: y}
    for n in region:
        if n.same_as(sl) or n not in anc:
            continue
        args = [new[a] if a in new else (_blocked_constant(a, k, full) if isinstance(a, relay.Constant) else a)
                for a in n.args]
        new[n] = relay.Call(n.op, args, n.attrs, n.type_args, n.span)
    out = new[e] if how == "typed" else relay.cast(new[e], dtype)
    out = relay.Call(lt.op, [out], lt.attrs, lt.type_args, lt.span)
    out = relay.Call(sl.op, [out], sl.attrs, sl.type_args, sl.span)
    # E(slice(lt(y))) -> slice(lt(E'(y)))   [clip end: cast to 8 bits before, back after]
    return out if how == "typed" else relay.cast(out, str(e.checked_type.dtype))


def _collect(nodes, users, body) -> dict:
    """Each movable epilogue's end, replaced by the epilogue in front of the slice."""
    subst: dict = {}
    for sl in op_calls(nodes, ("strided_slice",)):
        m = _match_slice(sl, users)
        if isinstance(m, Reject):
            _log.debug("strided_slice: not moved: %s", m)
            continue
        lt, y, k, channels = m
        region = _region(sl, nodes, users, channels)
        end = _end(sl, region, users, body)
        if isinstance(end, Reject):
            _log.debug("strided_slice %s: not moved: %s", list(static_shape(sl)), end)
            continue
        e, anc, dtype, how = end
        subst[e] = _rewrite(sl, lt, y, k, e, anc, region, dtype, how)
        _log.info("strided_slice %s: %d elementwise ops moved in front of it; %s crosses instead of %s",
                  list(static_shape(sl)), len(anc) - 1, dtype, sl.checked_type.dtype)
    return subst


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def EpilogueBeforeChannelSlice():  # pylint: disable=invalid-name
    """Move a conv's elementwise epilogue in front of the channel slice x86 legalization adds.

    ``E(strided_slice(layout_transform(y, "NCHWkc", "NCHW"), C))`` becomes
    ``strided_slice(layout_transform(E'(y), ...), C)`` when ``E`` is an elementwise region
    computed from the slice alone (constants scalar or per channel) ending in an 8-bit value:
    the conv's kernel computes the requantize in its epilogue and writes 8 bits instead of int32
    accumulators. Exact; no kernel is added.

    Use at stage ``before_fuse`` (after relay.build's prefix has legalized and blocked the convs).

    Notes
    -----
    Rejections are logged at DEBUG on ``tvm_ext.passes.EpilogueBeforeChannelSlice``, moves at INFO.
    """
    return substitution_pass(PASS_NAME, _collect)
