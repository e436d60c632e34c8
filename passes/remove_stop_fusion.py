"""RemoveStopFusion: drop relay.quantize's fusion barriers, or move them to the narrowest tensor.

Rewrites::

    # remove: bits(e) <= bits(x)                    stop_fusion(x) -> x
    # move:   m = narrowest of x..e (last on ties)  stop_fusion(x) -> x;  c(m) -> c(stop_fusion(m))
    #         (m != x)
    # keep:   otherwise (x itself is the narrowest, e.g. int8 -> cast i32 -> add of a claimed join)
    # ... but remove whenever e's kernel could not fuse into its consumer anyway (e.g.
    #     int8 -> cast i32 -> global_avg_pool2d): e is written either way, the barrier only adds a kernel

Walked by hand: each barrier's :data:`DECISIONS` row depends on the decisions made downstream.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``RemoveStopFusion``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import tvm
from tvm import relay

from tvm_ext._op_pattern import K_BROADCAST, K_COMM_REDUCE, K_INJECTIVE, op_pattern
from ._registry import register_pass

from ._doc import factory_sections
from ._util import Reject, describe, op_calls, op_name, pass_logger, static_tensor_type, substitution_pass

__all__ = ["RemoveStopFusion", "DECISIONS"]

PASS_NAME = "RemoveStopFusion"
_log = pass_logger(PASS_NAME)
_STOP = "annotation.stop_fusion"
_CONTRACTIBLE_CONSUMERS = frozenset({"add", "subtract"})


def _bits(node) -> int:
    return int(tvm.runtime.DataType(str(node.checked_type.dtype)).bits)


def _same_shape(a, b) -> bool:
    return tvm.ir.structural_equal(a.checked_type.shape, b.checked_type.shape)


def _other_branch_free(join, cur, users, decided, claimed, passed=()) -> bool:
    """No other input of ``join`` brings an anchor that FuseOps could fuse into it before ours.

    FuseOps lets only one anchor's kernel absorb a join (``add(conv_a..., conv_b...)``): the
    second anchor's path then fails ``kind <= kBroadcast`` and its kernel ends *before* the join,
    writing the wide value. So the chain may pass a join only when every other input is
    :func:`_brings_no_anchor` - or reaches a barrier not decided yet, which then finds the join
    claimed (if it brings an anchor) and ends its own chain before it. A join claimed by a
    removed barrier in ``passed`` (downstream on this chain) was claimed for the anchor behind
    this barrier: it is this chain's own.
    """
    if join in claimed and not any(claimed[join].same_as(b) for b in passed):
        return False
    return _brings_no_anchor([a for a in join.args if not a.same_as(cur)], users, decided)


def _brings_no_anchor(starts, users, decided, through_undecided: bool = False) -> bool:
    """Going upstream from ``starts`` through single-use elementwise/broadcast ops and removed
    barriers, every path ends at a kept, moved or undecided barrier, a parameter, a constant or a
    value with several users (a kernel boundary anyway): no anchor's kernel reaches ``starts``.

    With ``through_undecided`` the walk also goes through barriers not decided yet (they may be
    removed later and let an anchor through).
    """
    stack = list(starts)
    seen = set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if isinstance(node, (relay.Var, relay.Constant)):
            continue
        if not (isinstance(node, relay.Call) and op_name(node) is not None):
            return False
        if len(users.get(node, ())) > 1:
            continue
        if op_name(node) == _STOP:
            if decided.get(node) == "remove" or (through_undecided and node not in decided):
                stack.append(node.args[0])
            continue
        if op_pattern(op_name(node)) > K_BROADCAST:
            return False
        stack.extend(node.args)
    return True


def _chain(stop, users, decided, claimed, body):
    """Values x's kernel would extend over without ``stop``: ``[c1, ..., e]`` (e last; [] if none).

    ``decided``: stop node -> "remove" / "keep" / "move" for barriers downstream; ``claimed``:
    join (an op with several non-constant inputs) -> the barrier whose chain claimed it for an
    anchor.
    """
    chain = []
    passed = []  # removed barriers the chain goes through
    cur = stop
    while True:
        if cur.same_as(body):
            return chain
        us = users.get(cur, [])
        if len(us) != 1:
            return chain
        nxt = us[0][0]
        if not (isinstance(nxt, relay.Call) and op_name(nxt) is not None):
            return chain
        if op_name(nxt) == _STOP:
            if decided.get(nxt) != "remove":
                return chain
            cur = nxt  # transparent: it goes away too
            passed.append(nxt)
            continue
        if op_pattern(op_name(nxt)) > K_BROADCAST or not static_tensor_type(nxt) or not _same_shape(nxt, cur):
            return chain
        inputs = [a for a in nxt.args if not isinstance(a, relay.Constant)]
        if len(inputs) > 1 and not _other_branch_free(nxt, cur, users, decided, claimed, passed):
            return chain
        chain.append(nxt)
        cur = nxt


def _fuses_forward(end, users, body, decided):
    """``True`` if a kernel ending at ``end`` (no anchor in it) fuses into its consumer's kernel.

    FuseOps fuses an elementwise group into its post-dominator when the edge is injective or a
    reduction (``dom pattern <= kInjective or == kCommReduce``); never into an anchor such as
    conv2d, pooling (``kOutEWiseFusable``) or an opaque op, and not past a value with several
    users. When it cannot, ``end`` is written whether the barrier stays or not, so keeping the
    barrier would only add a kernel and the ``x`` tensor. A removed barrier after ``end`` is
    looked through (its consumer is ``end``'s once it is gone).
    """
    while True:
        if end.same_as(body):
            return Reject("it is the function's result")
        us = users.get(end, [])
        if len(us) != 1:
            return Reject(f"it has {len(us)} users")
        user = us[0][0]
        if not (isinstance(user, relay.Call) and op_name(user) == _STOP and decided.get(user) == "remove"):
            break
        end = user
    name = op_name(user) if isinstance(user, relay.Call) else None
    if name is None:
        return Reject(f"its user is a {type(user).__name__}")
    pat = op_pattern(name)
    if pat <= K_INJECTIVE or pat == K_COMM_REDUCE:
        return True
    return Reject(f"its user {name} (TOpPattern {pat}) takes no fused producer")


def _float_contraction(stop, x, users) -> Reject | None:
    """A Reject when fusing across ``stop`` could let LLVM contract fmul + fadd (float bits change)."""
    if str(x.checked_type.dtype).startswith(("int", "uint", "bool")):
        return None
    if not (isinstance(x, relay.Call) and op_name(x) == "multiply"):
        return None
    after = {op_name(u) for u, _ in users.get(stop, []) if isinstance(u, relay.Call)}
    if after & _CONTRACTIBLE_CONSUMERS:
        return Reject(f"float multiply -> {sorted(after & _CONTRACTIBLE_CONSUMERS)} across the barrier: "
                      "one kernel could contract them into an fma (different bits)")
    return None


def _claim(claimed, joins, stop):
    """Record ``stop`` as the claimant of ``joins`` (a join keeps its first, most downstream
    claimant: every chain through a later one passes that one too)."""
    for join in joins:
        claimed.setdefault(join, stop)


def _describe(node) -> str:
    return describe(node, unnamed="call", with_dtype=True)


@dataclass
class _Sweep:
    """What one sweep knows: the graph (``users``, ``body``), the decisions made so far for the
    barriers downstream (``decided``: stop -> "remove" / "keep" / "move"), the joins claimed
    (``claimed``: join -> its claimant barrier) and the substitution built."""

    users: dict
    body: object
    decided: dict = field(default_factory=dict)
    claimed: dict = field(default_factory=dict)
    subst: dict = field(default_factory=dict)


class _Barrier:
    """One ``stop_fusion(x)`` as the decision table sees it; ``chain`` (``[c1, ..., e]``, what x's
    kernel would extend over without it), ``end`` (``e``, or ``x``) and ``joins`` (the chain's
    joins it would claim) are computed on first use, with the decisions made until then."""

    def __init__(self, stop, sweep: _Sweep):
        self.stop, self.x, self.sweep = stop, stop.args[0], sweep

    @functools.cached_property
    def chain(self) -> list:
        s = self.sweep
        return _chain(self.stop, s.users, s.decided, s.claimed, s.body)

    @property
    def end(self):
        return self.chain[-1] if self.chain else self.x

    @functools.cached_property
    def joins(self) -> list:
        joins = [n for n in self.chain if sum(not isinstance(a, relay.Constant) for a in n.args) > 1]
        if joins and _brings_no_anchor([self.x], self.sweep.users, self.sweep.decided, through_undecided=True):
            # no anchor's kernel reaches x (a parameter, a value with other users, a kept barrier): the
            # chain's ops form a kernel of no anchor, which competes with none for the joins. Claiming
            # them would stop another barrier's chain at a join that the same barrier's chain passes
            # once this barrier is gone (a second run).
            return []
        return joins

    @functools.cached_property
    def narrowest(self):
        """The narrowest value of x..e (the last one on ties)."""
        values = [self.x, *self.chain]
        bits = min(_bits(n) for n in values)
        return [n for n in values if _bits(n) == bits][-1]


# --- the decisions, in order: the first whose condition holds decides a barrier ---------------
def _not_static(b):
    ok = static_tensor_type(b.stop)
    return None if ok else str(ok)


def _contracts(b):
    why = _float_contraction(b.stop, b.x, b.sweep.users)
    return None if why is None else str(why)


def _no_wider(b):
    return f"kernel now ends at {_describe(b.end)}" if _bits(b.end) <= _bits(b.x) else None


def _written_anyway(b):
    absorbed = _fuses_forward(b.end, b.sweep.users, b.sweep.body, b.sweep.decided)
    return None if absorbed else f"{_describe(b.end)} crosses either way: {absorbed}"


def _x_narrowest(b):
    if not b.narrowest.same_as(b.x):
        return None
    return f"without it {_describe(b.end)} ({_bits(b.end)} bits) would cross instead"


def _narrower_inside(b):
    return f"narrowest on the way to {_describe(b.end)}"


#: ``(decision, condition)`` rows; a condition returns the reason it holds, or None.
DECISIONS = (
    # keep:   stop_fusion(x), x not a tensor of static shape
    ("keep", _not_static),
    # keep:   float multiply -> add/subtract across it (one kernel could contract them into an fma)
    ("keep", _contracts),
    # remove: bits(e) <= bits(x)                            stop_fusion(x) -> x
    ("remove", _no_wider),
    # remove: e's kernel cannot fuse into its consumer      stop_fusion(x) -> x   (e is written either way)
    ("remove", _written_anyway),
    # keep:   x is the narrowest of x..e
    ("keep", _x_narrowest),
    # move:   m = narrowest of x..e (last on ties)          stop_fusion(x) -> x;  c(m) -> c(stop_fusion(m))
    ("move", _narrower_inside),
)


def _keep(b, reason):
    _log.debug("%s.keep: barrier on %s kept: %s", PASS_NAME, _describe(b.x), reason)


def _remove(b, reason):
    _claim(b.sweep.claimed, b.joins, b.stop)
    b.sweep.subst[b.stop] = b.x
    _log.info("%s.remove: barrier on %s removed (%s)", PASS_NAME, _describe(b.x), reason)


def _move(b, reason):
    m = b.narrowest
    upto = b.chain[: [i for i, n in enumerate(b.chain) if n.same_as(m)][0] + 1]
    _claim(b.sweep.claimed, [n for n in b.joins if any(n.same_as(u) for u in upto)], b.stop)
    consumer, idx = b.sweep.users[m][0]
    args = list(consumer.args)
    args[idx] = relay.annotation.stop_fusion(m)
    b.sweep.subst[b.stop] = b.x
    b.sweep.subst[consumer] = relay.Call(consumer.op, args, consumer.attrs, consumer.type_args, consumer.span)
    _log.info("%s.move: barrier on %s moved after %s (%s)", PASS_NAME, _describe(b.x), _describe(m), reason)


_ACTIONS = {"keep": _keep, "remove": _remove, "move": _move}


def _collect(nodes, users, body) -> dict:
    """Each barrier removed (replaced by its input) or moved, as :data:`DECISIONS` decides."""
    sweep = _Sweep(users, body)
    for stop in reversed(op_calls(nodes, (_STOP,))):  # downstream barriers first
        b = _Barrier(stop, sweep)
        decision, reason = next((d, r) for d, r in ((d, cond(b)) for d, cond in DECISIONS) if r is not None)
        sweep.decided[stop] = decision
        _ACTIONS[decision](b, reason)
    return sweep.subst


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def RemoveStopFusion():  # pylint: disable=invalid-name
    """Remove ``annotation.stop_fusion`` barriers, or move them so the narrowest tensor crosses.

    For each barrier ``stop_fusion(x)`` the pass follows the elementwise chain FuseOps would add
    to ``x``'s kernel without it, up to the value ``e`` the kernel would then write. If ``e`` is no
    wider than ``x`` the barrier is removed (BN + ReLU + requantize and residual adds join the
    conv's kernel); otherwise it is moved after the narrowest value of that chain, or kept when
    ``x`` is the narrowest. Outputs are bit-identical (the op is the identity; float barriers
    between a ``multiply`` and an ``add``/``subtract`` are kept because LLVM may contract them).

    Run it at stage ``"before_fuse"`` of :func:`tvm_ext.build` (after ``CanonicalizeCast``,
    ``FoldScaleAxis`` and ``SimplifyExpr``, which the barriers must still constrain).

    Notes
    -----
    Functions with ``If``/``Let``/``Match``/references/closures and barriers on non-tensor or
    dynamically shaped values are left unchanged; reasons are logged at DEBUG on
    ``tvm_ext.passes.RemoveStopFusion``, removals and moves at INFO.
    """
    return substitution_pass(PASS_NAME, _collect)
