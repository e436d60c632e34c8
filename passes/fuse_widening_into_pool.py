"""FuseWideningIntoPool: a pool reads the 8-bit value and widens it itself, in one kernel.

Rewrites::

    # P(w_k(...w_1(n)...)) -> post   (post: P's private elementwise consumers, as FuseOps fuses them)
    #   -> f(c),  f = fn(p: u8) {post(P(w_k(...w_1(cast(p, i32))...)))} Primitive=1,  c = cast(n, u8)
    # (typed n: c = n and no cast inside)
    # G(...) -> post -> M -> q, G a global pool, M unary data movement, q elementwise ending in 8 bits
    #   -> the group ends at q: f = fn(p: u8) {q(M(post(G(...))))}, its kernel writes 8 bits
    # G(...) -> post -> M, post ending in 8 bits -> f = fn(p: u8) {M(post(G(...)))}: no movement-only kernel

Walked by hand: the pool's input chain and its consumers have any length, one reader per link.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``FuseWideningIntoPool``.
"""
from __future__ import annotations

import tvm
from tvm import relay

from tvm_ext._op_pattern import K_BROADCAST, call_pattern
from ._registry import register_pass

from ._chains import NARROW, POOLS, walk_chain
from ._doc import factory_sections
from ._util import (Reject, is_unlowered_qnn, lift_constants, op_calls, op_name, pass_logger, post_order, rebuild,
                    static_tensor_type, substitution_pass)

__all__ = ["FuseWideningIntoPool", "POOLS", "MOVEMENT"]

PASS_NAME = "FuseWideningIntoPool"
_log = pass_logger(PASS_NAME)


#: Unary data movement a global pool's group takes up to an 8-bit tensor behind it (a flatten between
#: the pool and the quantize in front of a dense, or a flatten of the pool's own 8-bit output).
MOVEMENT = ("reshape", "squeeze", "expand_dims", "nn.batch_flatten", "layout_transform", "transpose")

#: Pools whose output holds one value per channel (what a classifier flattens and quantizes).
_GLOBAL_POOLS = ("nn.global_avg_pool2d", "nn.global_max_pool2d")


def _is_global(pool) -> bool:
    if op_name(pool) in _GLOBAL_POOLS:
        return True
    size = getattr(pool.attrs, "output_size", None) if op_name(pool) == "nn.adaptive_avg_pool2d" else None
    return size is not None and all(int(v) == 1 for v in size)


def _post_chain(pool, users, body):
    """The end of ``pool``'s group: its last private elementwise/broadcast consumer (FuseOps' group
    end); for a global pool, the last 8-bit tensor of a chain of such consumers and unary data
    movement after it, if there is one (the group's kernel then writes 8 bits, not the wide pooled
    values, and no kernel is left that only moves the pool's 8-bit output)."""
    end, group_end, moved = pool, pool, False
    while not end.same_as(body):
        us = users.get(end, ())
        if len(us) != 1:
            break
        user = us[0][0]
        if not isinstance(user, relay.Call) or is_unlowered_qnn(user):
            break
        if any(not isinstance(a, relay.Constant) for a in user.args if not a.same_as(end)):
            break
        if call_pattern(user) > K_BROADCAST:
            if not (_is_global(pool) and op_name(user) in MOVEMENT and len(user.args) == 1):
                break
            moved = True
        end = user
        if not moved or end.checked_type.dtype in NARROW:
            group_end = end  # FuseOps' group end, or an 8-bit tensor behind the movement
    return group_end


def _primitive(params, body):
    """``fn(params) {body}`` as FuseOps makes it: Primitive=1, non-inlinable constants lifted."""
    fn, consts = lift_constants(relay.Function(list(params), body))
    attrs = tvm.ir.make_node("DictAttrs", Primitive=tvm.tir.IntImm("int32", 1))
    return relay.Function(fn.params, fn.body, None, [], attrs), consts


def _rewrite(pool, users, body):
    """The call replacing the pool group's end, with the group's end; or a Reject."""
    ok = static_tensor_type(pool)
    if not ok:
        return ok
    _, narrow = walk_chain(pool.args[0], users, body, PASS_NAME)
    if narrow is None:
        return Reject("its input chain has no 8-bit point")
    node, dtype, kind = narrow
    if node.same_as(pool.args[0]):
        return Reject(f"its input is the {dtype} value already")
    end = _post_chain(pool, users, body)
    param = relay.var("p0", relay.TensorType(node.checked_type.shape, dtype))
    # clip form: p (8-bit) -> cast(p, wide) == n exactly; typed form: p is n
    inner = param if kind == "typed" else relay.cast(param, node.checked_type.dtype)
    group = rebuild(end, {node: inner})
    qnn = sorted({op_name(n) for n in post_order(group) if is_unlowered_qnn(n)})
    if qnn:
        return Reject(f"its input chain has {', '.join(qnn)}, not lowered yet (QNN ops need constant scales "
                      "at canonicalization): run at stage before_fuse")
    fn, consts = _primitive([param], group)
    # the caller substitutes ``end`` (downstream of n), so the argument may read n itself
    arg = node if kind == "typed" else relay.cast(node, dtype)
    return end, relay.Call(fn, [arg, *consts], span=end.span)


def _collect(nodes, users, body) -> dict:
    """The pool groups' ends, each replaced by the call of its Primitive function."""
    subst: dict = {}
    for node in op_calls(nodes, POOLS):
        out = _rewrite(node, users, body)
        if not isinstance(out, tuple):
            _log.debug("%s not rewritten: %s", op_name(node), out)
            continue
        end, call = out
        _log.info("%s: now reads the 8-bit value and widens it in its own kernel", op_name(node))
        subst[end] = call
    return subst


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def FuseWideningIntoPool():  # pylint: disable=invalid-name
    """Make a pool's kernel read the 8-bit value and do the widening (requantize) itself.

    When a pooling call (global/adaptive/avg pool, global max pool) or a softmax is fed by a private chain of
    elementwise ops that passes through an 8-bit value (uint8/int8, or an integer ``clip`` within
    8-bit bounds), FuseOps would put the chain in the producer's kernel (a convolution's), which
    then writes the widened (int32/float32) value, or in a kernel of its own. This pass makes the chain after
    the 8-bit value, the pool and the pool's elementwise consumers one ``Primitive`` function
    called on the 8-bit value: the producer kernel writes 8 bits. Exact; no kernel added.

    Use at stage ``before_fuse`` (after relay.build's prefix has lowered QNN).

    Notes
    -----
    Rejections are logged at DEBUG on ``tvm_ext.passes.FuseWideningIntoPool``, rewrites at INFO.
    """
    return substitution_pass(PASS_NAME, _collect)
