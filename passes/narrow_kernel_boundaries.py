"""NarrowKernelBoundaries: at a join of two fused chains, the 8-bit value crosses, not the wide one.

Design note
-----------
Where. A *join* is an elementwise/broadcast call with two non-constant arguments (the residual
``add`` of a quantized ResNet after QNN lowering). Each argument is the end of a *private chain*:
calls of TOpPattern <= broadcast whose other arguments are constants and whose only user is the
next call of the chain. When both chains start at an anchor (an out-elemwise-fusable call such as
``nn.contrib_conv2d_NCHWc``), FuseOps (``src/relay/analysis/graph_partitioner.cc``) fuses one
anchor through the join and stops the other anchor's chain right in front of it: that kernel
writes the chain's last value, which is the *widened* one (``int32`` or ``float32``: the
requantize of the shortcut, ``cast -> subtract -> multiply -> add -> floor -> cast``), although
the chain passed through an 8-bit value on the way (QLinearAdd's dequantize input).

Rule (one, applied to the first argument whose chain starts at an anchor and holds a narrow
point; the other anchor keeps fusing through the join)::

    # chain: anchor -> ... -> n -> w1 -> ... -> wk -> join,  n 8-bit typed
    #   n                                -> stop_fusion(n)
    # chain: anchor -> ... -> n = clip(y, lo, hi) -> w1 -> ... -> join, y int, [lo, hi] in [0, 255]
    #   n                                -> cast(stop_fusion(cast(n, u8)), int32)   (same for i8)
    # chain: ... -> n = clip(round(y), lo, hi) -> ..., y float (a float quantize)
    #   n                                -> cast(stop_fusion(cast(n, u8)), float32)

``annotation.stop_fusion`` is opaque to FuseOps (``FuseMutator`` drops it after partitioning):
the producer's kernel ends at the 8-bit value; ``w1 ... wk`` (elemwise/broadcast) then fuse into
the join's group, i.e. into the *consumer* kernel of the other anchor (the phase-0 rule for
elemwise nodes accepts an out-elemwise-fusable sink). No kernel is added, no kernel gets a second
anchor (FuseOps never merges two), and the arithmetic is unchanged: ``clip`` to ``[0, 255]`` makes
``cast(cast(n, u8), int32) == n`` exactly (and for a float ``n`` of integral values, which
``round``/``floor``/``ceil``/``trunc`` in front of the clip guarantee). The narrow point nearest to
the join is used, so the least work moves to the consumer.

A chain that reaches the join through a *broadcast* edge (its shape differs from the join's:
the squeeze-and-excitation gate ``[1, C, 1, 1]`` of ``x * gate``) never fuses through the join
(FuseOps fuses an anchor only through elementwise edges), so it is cut at its 8-bit point
whether or not the other side starts at an anchor, and the other side's anchor is left to fuse
through the join. Such a chain may also pass through one-argument injective calls on its way
(the gate's ``layout_transform`` back to the join's layout after AlterOpLayout, a ``reshape``);
the anchor's kernel ends in front of the first of them, so the cut is made upstream of it::

    # chain: anchor -> ... -> n -> w1 -> layout_transform -> ... -> join (broadcast edge)
    #   n                                -> (as above)   only n upstream of every injective call

Left alone, with a logged reason: joins where fewer than two chains start at an anchor (the
argument that does not is already a kernel boundary: e.g. the identity shortcut, an 8-bit value
also read by a convolution), joins whose two chains start at the *same* anchor (a diamond, which
FuseOps fuses into one kernel: a cut would add one; e.g. a max pool read by two
widening chains after ``WidenInEachReader``), chains without a narrow point, dynamic shapes.
Run it at stage ``before_fuse`` (after QNN lowering, ``SimplifyExpr`` removes the explicit ``cast(u8)`` of
``clip -> cast(u8) -> cast(f32)``, hence the ``clip`` form). Idempotent: after the rewrite the
chain starts at ``stop_fusion``, not an anchor. Functions with ``If``/``Let``/``Match``/
references/closures are skipped; untyped input raises
:class:`~tvm_ext.passes._util.UntypedModuleError`.

Walked by hand, not with ``tvm.relay.dataflow_pattern``: it walks chains of unbounded length back
from a join with a per-link type check and one reader per link, and compares the two chains'
sources, which a fixed pattern cannot express.
"""
from __future__ import annotations

from tvm import relay

from tvm_ext._op_pattern import K_BROADCAST, K_OUT_EWISE_FUSABLE, call_pattern
from tvm_ext.core.registry import register_pass

from ._chains import walk_chain
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
        for src, nar in anchored:
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

    Returns
    -------
    tvm.transform.Pass
        A Relay function pass named ``"NarrowKernelBoundaries"`` (opt_level 1).

    Raises
    ------
    tvm_ext.passes._util.UntypedModuleError
        When run on a module that was not type-inferred.

    Notes
    -----
    Joins are left alone when fewer than two of their chains start at an anchor or when no chain
    has a narrow point; the reason is logged at DEBUG on ``tvm_ext.passes.NarrowKernelBoundaries``
    (cuts at INFO).
    """
    return substitution_pass(PASS_NAME, _collect)
