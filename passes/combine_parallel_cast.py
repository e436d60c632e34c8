"""CombineParallelCast: merge parallel narrowing casts of one value so its producer writes them.

Rewrites::

    # before FuseOps (needs: narrowing cast, fusable producer, the casts are its only users)
    # cast(x, t), ..., cast(x, t)              -> c = cast(x, t); c, ..., c
    # after FuseOps (identical Primitive functions whose body is only a cast)
    # f(x), ..., f(x),  f = fn(p) {cast(p, t)}  -> c = f(x); c, ..., c

    # g(c1, y), g(c2, y) with c2 merged into c1 -> g(c1, y), read by both former users
    # (same op or identical Primitive function, equal attributes, the same or equal-constant args)

Walked by hand: it groups sibling casts of one producer and their identical users, a set, not one expression tree.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``CombineParallelCast``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import tvm
from tvm import relay

from tvm_ext._op_pattern import K_INJECTIVE, K_OPAQUE, K_OUT_EWISE_FUSABLE, op_pattern
from ._registry import register_pass

from ._doc import factory_sections
from ._util import (Check, Reject, consumers, dataflow_nodes, describe, function_pass, is_primitive, op_name,
                    pass_logger, rebuild, static_tensor_type, with_body)

__all__ = ["CombineParallelCast", "is_narrowing_cast", "RULES"]

PASS_NAME = "CombineParallelCast"
_log = pass_logger(PASS_NAME)


def is_narrowing_cast(src: str, dst: str) -> Check:
    """``True`` if a cast ``src -> dst`` is one this pass merges (docs/passes.md), else a Reject.

    Narrowing = fewer bits, or float to (u)int of no more bits.
    """
    a, b = tvm.runtime.DataType(src), tvm.runtime.DataType(dst)
    if a.lanes != 1 or b.lanes != 1:
        return Reject(f"vector cast {src} -> {dst}")
    if b.bits < a.bits:
        return True
    float_codes = (tvm.runtime.DataTypeCode.FLOAT, tvm.runtime.DataTypeCode.BFLOAT)
    int_codes = (tvm.runtime.DataTypeCode.INT, tvm.runtime.DataTypeCode.UINT)
    if a.type_code in float_codes and b.type_code in int_codes and b.bits <= a.bits:
        return True
    if b.bits > a.bits:
        return Reject(f"{src} -> {dst} widens: CanonicalizeCast duplicates such casts on purpose")
    return Reject(f"{src} -> {dst} keeps the width: nothing to gain")


# -- rule 1: plain casts before FuseOps ----------------------------------------------------------
def _cast_key(call):
    # cast(x, t) -> key t
    if op_name(call) != "cast":
        return None
    return ("cast", str(call.attrs.dtype))


def _fusable_producer(producer, casts, users, body) -> Check:
    if producer.same_as(body):
        return Reject("the producer is also the function's result")
    if isinstance(producer, relay.Var):
        return Reject(f"producer is parameter %{producer.name_hint}: the merged cast would be a kernel of its own")
    if isinstance(producer, relay.Constant):
        return Reject("producer is a constant (FoldConstant's job)")
    if not isinstance(producer, relay.Call):
        return Reject(f"producer is a {type(producer).__name__}, not an op call FuseOps fuses a cast into")
    name = op_name(producer)
    if name is None:
        return Reject("producer calls a function, not an op (already fused?)")
    pat = op_pattern(name)
    if not (pat <= K_INJECTIVE or pat == K_OUT_EWISE_FUSABLE):
        return Reject(f"producer {name} has TOpPattern {pat}: FuseOps fuses no consumer into it")
    others = [u for u, _ in users if not any(u.same_as(c) for c in casts)]
    if others:
        kinds = sorted({op_name(u) or type(u).__name__ for u in others})
        return Reject(f"producer {name} has other users ({', '.join(kinds)}): the merged cast would not fuse")
    return True


def _check_cast_group(producer, casts, users, body) -> Check:
    ok = static_tensor_type(casts[0])
    if not ok:
        return Reject(f"cast result: {ok}")
    ok = static_tensor_type(producer)
    if not ok:
        return Reject(f"cast input: {ok}")
    ok = is_narrowing_cast(producer.checked_type.dtype, casts[0].checked_type.dtype)
    if not ok:
        return ok
    return _fusable_producer(producer, casts, users, body)


# -- rule 2: cast-only Primitive functions after FuseOps ------------------------------------------
def _fused_cast_key(call):
    # f(x), f = fn(p) {cast(p, t)} Primitive -> key (structural hash of f)

    fn = call.op
    if not (isinstance(fn, relay.Function) and is_primitive(fn) and len(fn.params) == 1):
        return None
    body = fn.body
    if not (isinstance(body, relay.Call) and op_name(body) == "cast" and len(body.args) == 1):
        return None
    if not body.args[0].same_as(fn.params[0]):
        return None
    return ("fused_cast", tvm.ir.structural_hash(fn))


def _check_fused_group(producer, calls, users, body) -> Check:
    first = calls[0].op
    for c in calls[1:]:
        if not tvm.ir.structural_equal(c.op, first):
            return Reject("cast functions hash alike but differ structurally")
    ok = static_tensor_type(calls[0])
    if not ok:
        return Reject(f"cast result: {ok}")
    return True


@dataclass(frozen=True)
class MergeRule:
    """One merge rule: ``key(call)`` groups candidate users of a value; ``check`` accepts a group.

    Not a local rewrite (``tvm_ext._rules.Rule``): its left side is a set of sibling calls of one
    value, which a dataflow pattern, rooted at one call, cannot state."""

    name: str
    key: Callable
    check: Callable


#: Ordered rule table (order is priority).
RULES = (
    MergeRule(f"{PASS_NAME}.cast", _cast_key, _check_cast_group),
    MergeRule(f"{PASS_NAME}.fused_cast", _fused_cast_key, _check_fused_group),
)


def _groups(users_of_value):
    """(rule, key) -> list of distinct calls among a value's users (first argument only)."""
    groups: dict = {}
    for user, idx in users_of_value:
        if idx != 0 or not isinstance(user, relay.Call) or len(user.args) != 1:
            continue
        for rule in RULES:
            key = rule.key(user)
            if key is not None:
                bucket = groups.setdefault((rule, key), [])
                if not any(user.same_as(u) for u in bucket):
                    bucket.append(user)
                break
    return groups


def _same_callee(u, v) -> bool:
    if isinstance(u.op, tvm.ir.Op) or isinstance(v.op, tvm.ir.Op):
        return u.op.same_as(v.op)
    if isinstance(u.op, relay.Function) and isinstance(v.op, relay.Function):
        return u.op.same_as(v.op) or tvm.ir.structural_equal(u.op, v.op)
    return False


def _identical(u, v, resolve) -> bool:
    """u and v compute the same value: same callee and attributes, same (resolved) arguments."""
    if not (isinstance(u, relay.Call) and isinstance(v, relay.Call)) or len(u.args) != len(v.args):
        return False
    if not _same_callee(u, v) or not tvm.ir.structural_equal(u.attrs, v.attrs):
        return False
    for a, b in zip(u.args, v.args):
        a, b = resolve(a), resolve(b)
        if a.same_as(b):
            continue
        if isinstance(a, relay.Constant) and isinstance(b, relay.Constant) and tvm.ir.structural_equal(a, b):
            continue
        return False
    return True


def _propagate(first_reps, members_of, users, subst, body):
    """Merge the identical users the merges exposed (common subexpressions), downstream.

    # g(c1, y), g(c2, y) with c1, c2 merged into c1 -> g(c1, y); both uses read it
    Stops at the first users that differ. Opaque ops are not merged; a widening cast only when
    each copy has exactly one user and those users are identical too (so it ends with one user
    and CanonicalizeCast would not split it again).
    """
    def resolve(n):
        return subst.get(n, n)

    work = list(first_reps)
    while work:
        rep = work.pop()
        cand = []
        for m in members_of[rep]:
            for u, _ in users.get(m, ()):
                if isinstance(u, relay.Call) and u not in subst and not any(u.same_as(c) for c in cand):
                    cand.append(u)
        groups: list = []
        for u in cand:
            for g in groups:
                if _identical(u, g[0], resolve):
                    g.append(u)
                    break
            else:
                groups.append([u])
        for group in groups:
            if len(group) < 2:
                continue
            name = op_name(group[0])
            if name is not None and op_pattern(name) >= K_OPAQUE:
                _log.debug("%s.propagate: %d identical %s not merged: opaque op", PASS_NAME, len(group), name)
                continue
            if name == "cast":
                src, dst = group[0].args[0].checked_type.dtype, group[0].checked_type.dtype
                narrowing = is_narrowing_cast(src, dst)
                if not narrowing and not _single_identical_users(group, users, subst, body):
                    _log.debug("%s.propagate: %d identical casts not merged: %s and their users differ",
                               PASS_NAME, len(group), narrowing)
                    continue
            _log.info("%s.propagate: merged %d identical %s", PASS_NAME, len(group), name or "fused calls")
            for u in group[1:]:
                subst[u] = group[0]
            members_of[group[0]] = group
            work.append(group[0])


def _single_identical_users(group, users, subst, body) -> bool:
    """Each member has exactly one user and, with the members merged, those users are identical."""
    outs = []
    for m in group:
        us = users.get(m, ())
        if len(us) != 1 or m.same_as(body) or not isinstance(us[0][0], relay.Call):
            return False
        outs.append(us[0][0])
    trial = dict(subst)
    for m in group[1:]:
        trial[m] = group[0]
    return all(_identical(o, outs[0], lambda n: trial.get(n, n)) for o in outs[1:])


def _combine(func, min_num_branches: int):
    nodes = dataflow_nodes(func, PASS_NAME)
    if nodes is None:
        return func
    users = consumers(nodes)
    subst: dict = {}
    members_of: dict = {}
    for producer in nodes:
        for (rule, _key), calls in _groups(users.get(producer, ())).items():
            if len(calls) < min_num_branches:
                continue
            ok = rule.check(producer, calls, users[producer], func.body)
            dst = str(calls[0].checked_type.dtype) if calls[0]._checked_type_ is not None else "?"
            if not ok:
                _log.debug("%s: %d casts to %s of %s not merged: %s", rule.name, len(calls), dst,
                           describe(producer, unnamed="a fused call"), ok)
                continue
            _log.info("%s: merged %d casts to %s of %s into one", rule.name, len(calls), dst,
                      describe(producer, unnamed="a fused call"))
            for c in calls[1:]:
                subst[c] = calls[0]
            members_of[calls[0]] = calls
    _propagate(list(members_of), members_of, users, subst, func.body)
    return with_body(func, rebuild(func.body, subst))


def _check_min(min_num_branches) -> int:
    if isinstance(min_num_branches, bool) or not isinstance(min_num_branches, int):
        raise TypeError(f"{PASS_NAME}: min_num_branches must be an int, got {min_num_branches!r}")
    if min_num_branches < 2:
        raise ValueError(f"{PASS_NAME}: min_num_branches must be >= 2, got {min_num_branches}")
    return min_num_branches


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME, raises=(
    ("ValueError, TypeError", "``min_num_branches`` is not an int >= 2 (at construction)."),))
def CombineParallelCast(min_num_branches: int = 2):  # pylint: disable=invalid-name
    """Merge parallel narrowing casts of one value so FuseOps fuses the cast into the producer.

    Before FuseOps: when a value ``x`` feeds at least ``min_num_branches`` ``cast(x, t)`` and
    (1) ``x -> t`` narrows (fewer bits, or float to integer of no more bits), (2) ``x`` is an op
    call FuseOps can fuse an elementwise consumer into (elemwise / broadcast / injective /
    out-elemwise-fusable such as conv2d, dense, pooling; not a parameter, constant, reduction or
    opaque op) and (3) those casts are all of ``x``'s users, they become one cast. FuseOps then
    fuses it into ``x``'s kernel, which writes ``t`` instead of the wide type (one kernel fewer
    per extra cast, less memory traffic). Widening casts are never merged: ``CanonicalizeCast``
    duplicates them deliberately so each copy fuses into its consumer. Identical ops the merge
    made common (e.g. the ``relu`` on both branches) are merged too, until the branches differ.

    After FuseOps: calls of structurally identical ``Primitive`` functions whose body is only a
    cast, on the same argument, become one call (any direction: nothing fuses any more).

    Runs at opt_level 1, so under the default PassContext (opt_level 2) too; disable it with
    ``PassContext(disabled_pass=["CombineParallelCast"])``.

    Parameters
    ----------
    min_num_branches : int
        Smallest number of identical casts of one value that are merged (>= 2).

    Notes
    -----
    Functions with ``If``, ``Let``, ``Match``, references or closures, casts with dynamic shapes
    and tuple-typed values are left unchanged; the reason is logged at DEBUG on
    ``tvm_ext.passes.CombineParallelCast`` (merges at INFO).
    """
    n = _check_min(min_num_branches)

    return function_pass(PASS_NAME, lambda func: _combine(func, n))
