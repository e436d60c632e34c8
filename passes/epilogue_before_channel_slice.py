"""EpilogueBeforeChannelSlice: a conv's elementwise epilogue moves in front of its channel slice.

Rewrites (as data: :data:`RULES`, rules of the shared shape ``tvm_ext._rules.Rule``)::

    # E(strided_slice(layout_transform(y, "NCHWkc", "NCHW"), C))                   (x86)
    #     -> strided_slice(layout_transform(E'(y), "NCHWkc", "NCHW"), C)
    # E(layout_transform(strided_slice(y, C/k blocks), "NCHWkc", "NCHW"))          (aarch64)
    #     -> layout_transform(strided_slice(E'(y), C/k blocks), "NCHWkc", "NCHW")
    # E(strided_slice(y, C/k blocks))  -> strided_slice(E'(y), C/k blocks)         (aarch64, E blocked)
    # E: elementwise/broadcast ops on the head, constants scalar or per channel ((1, C, 1, 1) after
    #     the layout change, (1, C/k, 1, 1, k) or (1, C/k, 1, 1, 1) on the blocks)
    # E': the same ops on the blocked tensor y, per-channel constants padded to y's channel count
    #     (with their last value) and blocked to (1, C'/k, 1, 1, k)
    # fixed_point_multiply_per_axis(v, m, l, r, axes) in E: its constants are indexed by v's axes instead of
    #     broadcast, c[i] = m[i[axes]]; in E' they are (C'/k, k) on axes (1, 4)

The head (slice and layout change) is the rule's dataflow pattern; the epilogue after it is a region
of any size, walked by hand in the rule's check (each call's readers counted), which the pattern
language cannot say; the rewrite replaces the region's end.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``EpilogueBeforeChannelSlice``.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tvm import relay
from tvm.relay import dataflow_pattern as dfp

from tvm_ext._op_pattern import K_BROADCAST, call_pattern
from tvm_ext._rules import Rule, first_rewrite
from ._registry import register_pass

from ._chains import narrow_type
from ._doc import factory_sections
from ._util import (
    Reject,
    int_list,
    op_calls,
    op_name,
    pass_logger,
    static_shape,
    static_tensor_type,
    substitution_pass,
)

__all__ = ["EpilogueBeforeChannelSlice", "RULES"]

PASS_NAME = "EpilogueBeforeChannelSlice"
_log = pass_logger(PASS_NAME)

_INT_DIVISIONS = ("divide", "floor_divide", "trunc_divide", "mod", "floor_mod", "trunc_mod", "right_shift",
                  "left_shift")


def _from_zero_step_one(sl):
    a = sl.attrs
    begin = int_list(a.begin)
    strides = [1] if a.strides is None else int_list(a.strides)
    if a.axes is not None or begin is None or any(b != 0 for b in begin) or strides is None \
            or any(s != 1 for s in strides):
        return Reject("the slice does not start at 0 with step 1 on every axis")
    return True


def _channel_slice(sl, rank):
    """True for a slice of axis 1 alone (from 0, step 1) of a static rank-``rank`` tensor, else a Reject."""
    for e in (sl, sl.args[0]):
        ok = static_tensor_type(e)
        if not ok:
            return ok
    full, out = static_shape(sl.args[0]), static_shape(sl)
    if len(out) != rank or [a for i, (a, b) in enumerate(zip(full, out)) if i != 1 and a != b]:
        return Reject(f"slices other axes than channels: {list(full)} -> {list(out)}")
    return _from_zero_step_one(sl)


def _block(lt, src_first):
    """k of a layout_transform NCHW<k>c -> NCHW, else a Reject."""
    m = re.fullmatch(r"NCHW(\d+)c", str(lt.attrs.src_layout))
    if not m or str(lt.attrs.dst_layout) != "NCHW":
        where = "the slice reads" if src_first else "reads the slice:"
        return Reject(f"{where} layout_transform {lt.attrs.src_layout} -> {lt.attrs.dst_layout}, "
                      "not NCHW<k>c -> NCHW")
    return int(m.group(1))


@dataclass(frozen=True)
class Head:
    """A matched head: the blocked input ``y`` (block ``k``), the channels ``C`` the region sees, whether
    the region reads the blocked tensor, and ``rebuild(v)``: the head's calls applied to a new ``v``."""

    y: relay.Expr
    k: int
    channels: int
    blocked: bool
    rebuild: Callable


def _copy(call, arg):
    return relay.Call(call.op, [arg], call.attrs, call.type_args, call.span)


def _slice_of_layout_transform(sl, users):
    lt = sl.args[0]
    ok = _channel_slice(sl, 4)
    if not ok:
        return ok
    k = _block(lt, src_first=True)
    if isinstance(k, Reject):
        return k
    if len(users.get(lt, [])) != 1:
        return Reject("the layout_transform has other readers")
    return Head(lt.args[0], k, static_shape(sl)[1], False, lambda v: _copy(sl, _copy(lt, v)))


def _layout_transform_of_slice(lt, users):
    sl = lt.args[0]
    ok = _channel_slice(sl, 5) and static_tensor_type(lt)
    if not ok:
        return ok
    k = _block(lt, src_first=False)
    if isinstance(k, Reject):
        return k
    if static_shape(sl)[4] != k:
        return Reject(f"the slice's block {static_shape(sl)[4]} is not the layout_transform's {k}")
    if len(users.get(sl, [])) != 1:
        return Reject("the slice has other readers")
    return Head(sl.args[0], k, static_shape(lt)[1], False, lambda v: _copy(lt, _copy(sl, v)))


def _slice_of_blocks(sl, users):
    ok = _channel_slice(sl, 5)
    if not ok:
        return ok
    shape = static_shape(sl)
    return Head(sl.args[0], shape[4], shape[1] * shape[4], True, lambda v: _copy(sl, v))


_PER_AXIS = "fixed_point_multiply_per_axis"


def _rank(head):
    return 5 if head.blocked else 4


def _as_broadcast(call, c, head):
    """Constant operand ``c`` of region call ``call`` as an array broadcasting against the region's rank, or a
    Reject. fixed_point_multiply_per_axis indexes its constants by ``attrs.axes`` of its data instead."""
    a, rank = c.data.numpy(), _rank(head)
    if op_name(call) != _PER_AXIS:
        return a if a.ndim == 0 else a.reshape((1,) * (rank - a.ndim) + a.shape) if a.ndim <= rank else \
            Reject(f"constant of shape {list(a.shape)} has a higher rank than the region's {rank}")
    axes = int_list(call.attrs.axes)
    if axes is None or axes != sorted(set(axes)) or any(not 0 <= ax < rank for ax in axes) or a.ndim != len(axes):
        return Reject(f"{_PER_AXIS} on axes {axes} with a constant of shape {list(a.shape)}")
    shape = [1] * rank
    for ax, d in zip(axes, a.shape):
        shape[ax] = d
    return a.reshape(shape)


def _constant_ok(call, c, head):
    a = _as_broadcast(call, c, head)
    if isinstance(a, Reject):
        return a
    shape = a.shape
    if not shape:
        ok = True
    elif head.blocked:
        ok = shape[0] == shape[2] == shape[3] == 1 and shape[1] in (1, head.channels // head.k) \
            and shape[4] in (1, head.k)
    else:
        ok = all(d == 1 for i, d in enumerate(shape) if i != 1) and shape[1] in (1, head.channels)
    return True if ok else Reject(f"constant of shape {list(c.data.shape)} is not scalar or per channel")


def _region(sl, nodes, users, head):
    """The elementwise region computed from the head ``sl`` alone, in topological order (``sl`` first)."""
    region = [sl]
    inside = {sl}
    shape = static_shape(sl)
    for n in nodes[nodes.index(sl) + 1:]:
        if not isinstance(n, relay.Call) or op_name(n) is None or not any(a in inside for a in n.args):
            continue
        if call_pattern(n) > K_BROADCAST or not static_tensor_type(n) or static_shape(n) != shape:
            continue
        ok = all(a in inside or (isinstance(a, relay.Constant) and _constant_ok(n, a, head)) for a in n.args)
        if ok and op_name(n) == _PER_AXIS and n.args[0] not in inside:
            ok = False  # its data is outside and only its per-axis constants read the region
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


def _blocked(a, head, full_channels):
    """A scalar or per-channel array of the region (broadcast form) on y's blocks (1, C'/k, 1, 1, k or 1),
    padded with its last channel's value."""
    k = head.k
    if a.ndim == 0:
        return a
    if head.blocked:  # (1, C/k or 1, 1, 1, k or 1): pad the blocks
        return np.pad(a, ((0, 0), (0, full_channels // k - a.shape[1]), (0, 0), (0, 0), (0, 0)), mode="edge") \
            if a.shape[1] > 1 else a
    if a.shape[1] == 1:
        return a.reshape(1, 1, 1, 1, 1)
    padded = np.pad(a, ((0, 0), (0, full_channels - a.shape[1]), (0, 0), (0, 0)), mode="edge")
    return np.ascontiguousarray(padded.reshape(1, full_channels // k, k, 1, 1).transpose(0, 1, 3, 4, 2))


def _moved_call(n, args, head, full_channels):
    """Region call ``n`` on the blocked tensor: ``args`` are its moved region operands (or None for constants)."""
    consts = [_blocked(_as_broadcast(n, a, head), head, full_channels) if isinstance(a, relay.Constant) else None
              for a in n.args]
    if op_name(n) != _PER_AXIS:
        args = [m if c is None else a if c.ndim == 0 else relay.const(c) for a, m, c in zip(n.args, args, consts)]
        return relay.Call(n.op, args, n.attrs, n.type_args, n.span)
    # fixed_point_multiply_per_axis(v, m, l, r, axes) -> the same on y's blocks, constants (C'/k, k) on axes (1, 4)
    per_block = [relay.const(np.ascontiguousarray(np.broadcast_to(c, (1, full_channels // head.k, 1, 1, head.k))
                                                  [0, :, 0, 0, :])) for c in consts[1:]]
    return relay.op._make.fixed_point_multiply_per_axis(  # pylint: disable=protected-access
        args[0], *per_block, bool(n.attrs.is_lshift_required), bool(n.attrs.is_rshift_required), [1, 4])


def _rewrite(sl, head, e, anc, region, dtype, how):
    y = head.y
    full = static_shape(y)[1] * head.k
    new = {sl: y}
    for n in region:
        if n.same_as(sl) or n not in anc:
            continue
        new[n] = _moved_call(n, [new.get(a) for a in n.args], head, full)
    out = new[e] if how == "typed" else relay.cast(new[e], dtype)
    out = head.rebuild(out)
    # E(head(y)) -> head(E'(y))   [clip end: cast to 8 bits before, back after]
    return out if how == "typed" else relay.cast(out, str(e.checked_type.dtype))


# --- the rules --------------------------------------------------------------------------------
def _movable(head_of):
    """The rules' check: ``head_of(node, users)`` gives the :class:`Head` (or a Reject); then the
    elementwise region after it must end in a closed 8-bit value. Gives ``(head, end, region)``."""
    def check(sl, users, nodes, body):
        head = head_of(sl, users)
        if isinstance(head, Reject):
            return head
        region = _region(sl, nodes, users, head)
        end = _end(sl, region, users, body)
        if isinstance(end, Reject):
            return Reject(f"{list(static_shape(sl))}: {end}")
        return head, end, region

    return check


def _moved(sl, found, users, nodes, body):
    """The rules' rewrite: the replacement of the region's end ``e``, the region in front of the head."""
    head, (e, anc, dtype, how), region = found
    return _rewrite(sl, head, e, anc, region, dtype, how)


#: Ordered rule table (order is priority); the region E after the head is the same for every rule.
RULES = (
    # E(strided_slice(layout_transform(y, "NCHWkc", "NCHW"), C)) -> strided_slice(layout_transform(E'(y)), C)
    Rule(f"{PASS_NAME}.slice_of_layout_transform",
         lambda: dfp.is_op("strided_slice")(dfp.is_op("layout_transform")(dfp.wildcard())),
         _movable(_slice_of_layout_transform), _moved, depth=2),
    # E(layout_transform(strided_slice(y, C/k blocks), "NCHWkc", "NCHW")) -> layout_transform(strided_slice(E'(y)))
    Rule(f"{PASS_NAME}.layout_transform_of_slice",
         lambda: dfp.is_op("layout_transform")(dfp.is_op("strided_slice")(dfp.wildcard())),
         _movable(_layout_transform_of_slice), _moved, depth=2),
    # E(strided_slice(y, C/k blocks)) -> strided_slice(E'(y), C/k blocks)       (y: NCHWkc, rank 5)
    Rule(f"{PASS_NAME}.slice_of_blocks",
         lambda: dfp.is_op("strided_slice")(dfp.wildcard()),
         _movable(_slice_of_blocks), _moved),
)


# --- the pass ---------------------------------------------------------------------------------
def _collect(nodes, users, body) -> dict:
    """Each movable epilogue's end, replaced by the epilogue in front of the slice."""
    subst: dict = {}
    for sl in op_calls(nodes, ("strided_slice", "layout_transform")):
        found = first_rewrite(RULES, sl, _log, users, nodes, body)
        if not found:
            continue
        _, (e, anc, dtype, _how), _ = found.found
        if e in subst:
            continue
        subst[e] = found.new
        _log.info("%s %s: %d elementwise ops moved in front of it; %s crosses instead of %s", found.rule.name,
                  list(static_shape(sl)), len(anc) - 1, dtype, sl.checked_type.dtype)
    return subst


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def EpilogueBeforeChannelSlice():  # pylint: disable=invalid-name
    """Move a conv's elementwise epilogue in front of the channel slice conv legalization adds.

    ``E(strided_slice(layout_transform(y, "NCHWkc", "NCHW"), C))`` (x86) becomes
    ``strided_slice(layout_transform(E'(y), ...), C)``; at aarch64, where the slice takes whole
    channel blocks of ``y`` before (or without) the layout change, ``E(layout_transform(strided_slice(y)))``
    becomes ``layout_transform(strided_slice(E'(y)))`` and ``E(strided_slice(y))`` becomes
    ``strided_slice(E'(y))`` (:data:`RULES`). ``E`` is an elementwise region
    computed from the head alone (constants scalar or per channel) ending in an 8-bit value:
    the conv's kernel computes the requantize in its epilogue and writes 8 bits instead of int32
    accumulators. Exact; no kernel is added.

    Use at stage ``before_fuse`` (after relay.build's prefix has legalized and blocked the convs).

    Notes
    -----
    Rejections are logged at DEBUG on ``tvm_ext.passes.EpilogueBeforeChannelSlice``, moves at INFO.
    """
    return substitution_pass(PASS_NAME, _collect)
