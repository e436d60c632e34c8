"""Local rewrite rules as data, and the one driver that runs them. A leaf module.

A rule is a frozen :class:`Rule`: ``pattern()`` builds its left side, a
``tvm.relay.dataflow_pattern`` rooted at the rewritten call (built on first use: importing a
table builds none); ``check(call, *context)`` tests the side conditions the pattern language cannot
say and returns what the rewrite needs (anything but ``None`` or ``False``: an array too) or a
falsy :class:`~tvm_ext._reject.Reject` carrying the reason; ``rewrite(call, found, *context)`` builds the
right side from ``found``, the check's result. A table is an ordered tuple of rules (order is
priority), each preceded by its equation as a comment (``# conv(pad(x, 0), w) -> conv(x, w)``).

The driver: :func:`first_rewrite` tries a table on one call and logs each rejection at DEBUG under
the rule's name; :func:`rewrites` does that for every call of a rule's root op in a sweep. A pattern
is matched on the call cut :attr:`Rule.depth` calls deep (:func:`cut_below`): TVM's matcher
indexes the whole graph under the expression it is given, so matching every call of a model whole
would be quadratic. The pass rebuilds its function once from the replacements, not through TVM's
``rewrite``, whose grouper refuses a match with an inner node read from outside it.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import tvm
from tvm import relay
from tvm.relay import dataflow_pattern as dfp

from tvm_ext._reject import Reject

__all__ = ["Rule", "Rewrite", "accept", "cut_below", "first_rewrite", "rewrites", "root_ops"]


def accept(call, *context) -> bool:
    """The check of a rule whose pattern says everything: accepts every match."""
    return True


@dataclass(frozen=True)
class Rule:
    """One rewrite: ``name`` (``"<Pass>.<form>"``), ``pattern()`` its left side, ``check(call,
    *context)`` its side conditions (a truthy result handed to the rewrite, or a Reject),
    ``rewrite(call, found, *context)`` its right side; ``depth``: the levels of calls the pattern
    spans, the root included (deeper calls are cut off before matching)."""

    name: str
    pattern: Callable[[], Any]
    check: Callable[..., Any]
    rewrite: Callable[..., Any]
    depth: int = 1

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a rule needs a name, not {self.name!r}")
        for field in ("pattern", "check", "rewrite"):
            if not callable(getattr(self, field)):
                raise TypeError(f"{self.name}: {field} must be callable, not {getattr(self, field)!r}")
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or self.depth < 1:
            raise ValueError(f"{self.name}: depth must be an int >= 1, not {self.depth!r}")


class Rewrite(NamedTuple):
    """What :func:`first_rewrite` found: the rule, its check's result and the replacement."""

    rule: Rule
    found: Any
    new: Any


@functools.cache
def _built(rule: Rule):
    return rule.pattern()


def _op_names(pattern) -> frozenset:
    if isinstance(pattern, dfp.AltPattern):
        return _op_names(pattern.left) | _op_names(pattern.right)
    if isinstance(pattern, dfp.ExprPattern) and isinstance(pattern.expr, tvm.ir.Op):
        return frozenset({pattern.expr.name})
    raise ValueError(f"the root of a rule's pattern must call named ops, not {pattern}")


def _roots(pattern) -> frozenset:
    if isinstance(pattern, dfp.AltPattern):
        return _roots(pattern.left) | _roots(pattern.right)
    if isinstance(pattern, dfp.CallPattern):
        return _op_names(pattern.op)
    raise ValueError(f"the pattern must be a call, not {pattern}")


def root_ops(rule: Rule) -> frozenset:
    """Names of the ops ``rule``'s pattern can be rooted at; a ``ValueError`` naming the rule when
    the pattern is not a call of named ops (an alternation of such calls included)."""
    try:
        return _roots(_built(rule))
    except ValueError as err:
        raise ValueError(f"{rule.name}: {err}") from None


def cut_below(expr, depth: int):
    """``expr`` with the calls deeper than ``depth`` replaced by fresh variables (constants and
    variables kept): what a dataflow pattern of that depth sees, without the graph below it."""
    if isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op) and depth > 0:
        return relay.Call(expr.op, [cut_below(a, depth - 1) for a in expr.args], expr.attrs, expr.type_args)
    if isinstance(expr, (relay.Var, relay.Constant)):
        return expr
    return relay.var("below")


def first_rewrite(rules, call, log: logging.Logger, *context):
    """The :class:`Rewrite` of the first of ``rules`` whose pattern matches ``call`` and whose
    ``check(call, *context)`` accepts it; else a Reject (falsy): the last matched rule's, or "no
    rule's pattern matches". Each rejection of a matched rule is logged at DEBUG under its name."""
    cuts: dict = {}
    why = Reject("no rule's pattern matches")
    for rule in rules:
        if rule.depth not in cuts:
            cuts[rule.depth] = cut_below(call, rule.depth)
        if not _built(rule).match(cuts[rule.depth]):
            continue
        found = rule.check(call, *context)
        if isinstance(found, Reject) or found is None or found is False:
            why = found if isinstance(found, Reject) else Reject(f"check returned {found!r}")
            log.debug("%s: not rewritten: %s", rule.name, why)
            continue
        return Rewrite(rule, found, rule.rewrite(call, found, *context))
    return why


@functools.cache
def _by_op(rules: tuple) -> dict:
    """op name -> the rules rooted at it, in table order."""
    table: dict = {}
    for rule in rules:
        for op in sorted(root_ops(rule)):
            table.setdefault(op, []).append(rule)
    return {op: tuple(rs) for op, rs in table.items()}


def rewrites(nodes, rules: tuple, log: logging.Logger, *context) -> dict:
    """``{call: replacement}`` for each call among ``nodes`` that :func:`first_rewrite` rewrites with
    the rules rooted at its op (see :func:`root_ops`)."""
    table = _by_op(tuple(rules))
    subst: dict = {}
    for node in nodes:
        op = getattr(node, "op", None) if isinstance(node, relay.Call) else None
        if not isinstance(op, tvm.ir.Op) or op.name not in table:
            continue
        found = first_rewrite(table[op.name], node, log, *context)
        if found:
            subst[node] = found.new
    return subst
