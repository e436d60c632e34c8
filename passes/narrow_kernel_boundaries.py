"""NarrowKernelBoundaries: at a join of two fused chains, the 8-bit value crosses, not the wide one.

Rewrites::

    # chain: anchor -> ... -> n -> w1 -> ... -> wk -> join,  n 8-bit typed
    #   n                                -> stop_fusion(n)
    # chain: anchor -> ... -> n = clip(y, lo, hi) -> w1 -> ... -> join, y int, [lo, hi] in [0, 255]
    #   n                                -> cast(stop_fusion(cast(n, u8)), int32)   (same for i8)
    # chain: ... -> n = clip(round(y), lo, hi) -> ..., y float (a float quantize)
    #   n                                -> cast(stop_fusion(cast(n, u8)), float32)

    # chain: anchor -> ... -> n -> w1 -> layout_transform -> ... -> join (broadcast edge)
    #   n                                -> (as above)   only n upstream of every injective call

    # at a target with max_function_args (GPU), both chains anchored: the join's later argument is cut
    #   (FuseOps there fuses a chain into a join holding an anchor from the later side only)

Walked by hand: chains of any length back from a join, one reader per link, sources compared.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``NarrowKernelBoundaries``.
"""
from __future__ import annotations

from tvm import relay

from tvm_ext._op_pattern import K_BROADCAST, K_OUT_EWISE_FUSABLE, call_pattern
from ._registry import register_pass

from ._chains import postpones_join_fusions, walk_chain
from ._doc import factory_sections
from ._util import describe, op_name, pass_logger, static_tensor_type, substitution_pass

__all__ = ["NarrowKernelBoundaries"]

PASS_NAME = "NarrowKernelBoundaries"
_log = pass_logger(PASS_NAME)


def _cut(node, dtype, kind):
    """The replacement of narrow point ``node``: the 8-bit value behind a stop_fusion.

    Built on a copy of ``node`` (same op, arguments and attributes), so the substitution
    ``node -> replacement`` does not contain its own key (see ``rebuild``).
    """
    wide = node.checked_type.dtype
    if isinstance(node, relay.Call):
        node = relay.Call(node.op, node.args, node.attrs, node.type_args, node.span)
    if kind == "typed":
        # n (8-bit)                  -> stop_fusion(n)
        return relay.annotation.stop_fusion(node)
    # n = clip(y, lo, hi) (int)      -> cast(stop_fusion(cast(n, u8|i8)), dtype(n))
    return relay.cast(relay.annotation.stop_fusion(relay.cast(node, dtype)), wide)


def _broadcast_edge(arg, join) -> bool:
    """True when ``arg`` is broadcast into ``join`` (static shapes that differ)."""
    if not (static_tensor_type(arg) and static_tensor_type(join)):
        return False
    return [int(d) for d in arg.checked_type.shape] != [int(d) for d in join.checked_type.shape]


def _collect(nodes, users, body) -> dict:
    """The narrow points cut at the joins, each replaced by its cut (:func:`_cut`)."""
    subst: dict = {}
    for join in nodes:
        if not isinstance(join, relay.Call) or call_pattern(join) > K_BROADCAST:
            continue
        live = [a for a in join.args if not isinstance(a, relay.Constant)]
        if len(live) != 2 or live[0].same_as(live[1]):
            continue
        sides = [walk_chain(a, users, body, PASS_NAME) for a in live]
        anchored = [(src, nar) for src, nar in sides
                    if isinstance(src, relay.Call) and call_pattern(src) == K_OUT_EWISE_FUSABLE]
        name = op_name(join)
        # a side whose shape is not the join's reaches it through a broadcast edge, and FuseOps
        # fuses an anchor only through elementwise edges: that side's kernel ends before the join
        # in any case, so its chain is cut at its 8-bit point whatever the other side is
        # (the gate may reach the join through a layout_transform or reshape: walked through)
        bcast = [(src, nar) for src, nar in (walk_chain(a, users, body, PASS_NAME, injective=True)
                                             for a in live if _broadcast_edge(a, join))
                 if isinstance(src, relay.Call) and call_pattern(src) == K_OUT_EWISE_FUSABLE]
        if bcast:
            for src, nar in bcast:
                if nar is None or nar[0] in subst:
                    _log.debug("%s join: broadcast chain from %s has no 8-bit point", name, describe(src))
                    continue
                node, dtype, kind = nar
                _log.info("%s join: broadcast chain from %s cut after its %s value (a %s %s); the widening "
                          "ops fuse into the consumer", name, describe(src), dtype, kind, describe(node))
                subst[node] = _cut(node, dtype, kind)
            continue
        if len(anchored) < 2:
            others = ", ".join(describe(src) for src, _ in sides)
            _log.debug("%s join: chains start at %s: at most one anchor fuses into it, the other "
                       "input is a kernel boundary already", name, others)
            continue
        if anchored[0][0].same_as(anchored[1][0]):
            # a diamond: FuseOps fuses the anchor, both chains and the join into one kernel (the join
            # post-dominates the anchor through elementwise paths); a cut would add a kernel
            _log.debug("%s join: both chains start at the same %s: one kernel already", name,
                       describe(anchored[0][0]))
            continue
        # the later argument only, where FuseOps fuses a chain into a join that way only (above)
        for src, nar in (anchored[-1:] if postpones_join_fusions() else anchored):
            if nar is None:
                _log.debug("%s join: chain from %s has no 8-bit point", name, describe(src))
                continue
            node, dtype, kind = nar
            if node in subst:
                break
            _log.info("%s join: chain from %s cut after its %s value (a %s %s); the widening "
                      "ops fuse into the consumer", name, describe(src), dtype, kind, describe(node))
            subst[node] = _cut(node, dtype, kind)
            break
    return subst


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def NarrowKernelBoundaries():  # pylint: disable=invalid-name
    """Make the 8-bit value, not its widened form, cross between the two kernels meeting at a join.

    At an elementwise join (the residual ``add``) of two private chains that both start at an
    anchor (convolution), one chain is cut with ``annotation.stop_fusion`` right after its last
    8-bit value (a uint8/int8 tensor, or an integer ``clip`` within 8-bit bounds, which gets an
    exact ``cast`` to 8 bits and back): its producer kernel then writes uint8/int8 and the
    widening ops (dequantize/requantize: cast, subtract, multiply, ...) fuse into the consumer
    kernel with the other anchor. Same kernel count, same results bit for bit, one anchor per
    kernel (FuseOps never merges two).

    Use at stage ``before_fuse`` (after relay.build's prefix has lowered QNN).

    Notes
    -----
    Joins are left alone when fewer than two of their chains start at an anchor or when no chain
    has a narrow point; the reason is logged at DEBUG on ``tvm_ext.passes.NarrowKernelBoundaries``
    (cuts at INFO).

    At a target with ``max_function_args`` (GPU targets), TVM's FuseOps fuses a chain into a join that
    already holds an anchor only from the join's later argument: there the later chain is cut
    (``AnchoredArgumentFirst`` swaps a join whose other chain has no anchor).
    """
    return substitution_pass(PASS_NAME, _collect)
