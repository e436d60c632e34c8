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

from ._util import Reject, cut_below

__all__ = ["Rule", "first_rewrite"]


@dataclass(frozen=True)
class Rule:
    """One rewrite. ``pattern()`` builds its left side, rooted at the rewritten call; ``depth`` is
    how many calls below the root it reads; ``rewrite(call)`` returns the right side for a call the
    pattern matched, or a :class:`~tvm_ext._reject.Reject` saying why a side condition fails."""

    name: str
    pattern: Callable
    rewrite: Callable
    depth: int = 1


@functools.cache
def _built(rule: Rule):
    return rule.pattern()


def first_rewrite(rules, call, log: logging.Logger):
    """``(rule, replacement)`` of the first of ``rules`` whose pattern matches ``call`` and whose
    rewrite accepts it, or None; each rejection is logged at DEBUG under its rule's name."""
    cuts: dict = {}
    for rule in rules:
        local = cuts.setdefault(rule.depth, cut_below(call, rule.depth))
        if not _built(rule).match(local):
            continue
        new = rule.rewrite(call)
        if isinstance(new, Reject):
            log.debug("%s: not rewritten: %s", rule.name, new)
            continue
        return rule, new
    return None
