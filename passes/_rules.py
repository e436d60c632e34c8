"""Local rewrite rules as data: a ``tvm.relay.dataflow_pattern`` left side, a right side, a name.

A pass states its rules as an ordered tuple of :class:`Rule` (order is priority) and asks
:func:`first_rewrite` for each candidate call. A pattern is built on first use (importing a pass
builds none) and matched on the call cut :attr:`Rule.depth` calls deep
(:func:`~tvm_ext.passes._util.cut_below`: TVM's matcher indexes the whole graph under the
expression it is given, so matching every call of a model whole would be quadratic). The pass
rebuilds the function once from the replacements (:func:`~tvm_ext.passes._util.substitute`), not
through TVM's ``rewrite``, whose grouper refuses a match with an inner node read from outside it.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from ._util import Reject, cut_below, op_calls, op_name

__all__ = ["Rule", "first_rewrite", "rewrites_by_op"]


@dataclass(frozen=True)
class Rule:
    """One rewrite. ``pattern()`` builds its left side, rooted at the rewritten call; ``depth`` is
    how many levels of calls it spans, the root included (deeper calls are cut off);
    ``rewrite(call, *context)`` returns the right side for a call the pattern matched (``context``:
    what the pass passes to :func:`first_rewrite`), or a :class:`~tvm_ext._reject.Reject` saying
    why a side condition fails."""

    name: str
    pattern: Callable
    rewrite: Callable
    depth: int = 1


@functools.cache
def _built(rule: Rule):
    return rule.pattern()


def first_rewrite(rules, call, log: logging.Logger, *context):
    """``(rule, replacement)`` of the first of ``rules`` whose pattern matches ``call`` and whose
    ``rewrite(call, *context)`` accepts it; else a Reject (falsy): the last rule's, or "no rule
    matches". Each rejection of a matched rule is logged at DEBUG under that rule's name."""
    cuts: dict = {}
    why = Reject("no rule's pattern matches")
    for rule in rules:
        if rule.depth not in cuts:
            cuts[rule.depth] = cut_below(call, rule.depth)
        if not _built(rule).match(cuts[rule.depth]):
            continue
        new = rule.rewrite(call, *context)
        if isinstance(new, Reject):
            log.debug("%s: not rewritten: %s", rule.name, new)
            why = new
            continue
        return rule, new
    return why


def rewrites_by_op(nodes, by_op: dict, log: logging.Logger) -> dict:
    """``{call: replacement}`` for each call among ``nodes`` of an op in ``by_op`` (op name -> its
    rules) that :func:`first_rewrite` rewrites."""
    subst: dict = {}
    for call in op_calls(nodes, by_op):
        found = first_rewrite(by_op[op_name(call)], call, log)
        if found:
            subst[call] = found[1]
    return subst
