"""Pattern tables: ordered, named ``(name, pattern, check)`` records.

Design note
-----------
*Contract.* A :class:`PatternTable` is an immutable, ordered tuple of :class:`Entry` records; order
is priority (the first entry that matches a node and passes its check claims it, exactly as
``relay.transform.MergeComposite`` treats its list). Entry names are ``"<table>.<ops>"`` and unique.

*Checks.* ``check(ctx)`` receives a :class:`MatchContext` (the matched root plus, lazily, the
pattern-node -> expression map and the named sub-patterns of the entry). It returns something
truthy to accept, or a falsy :class:`Reject` carrying the reason (raising also rejects, with the
exception text as reason). :func:`evaluate` turns either form into ``(ok, reason)`` and logs
rejections under the entry's name; :meth:`PatternTable.triples` adapts checks to the bool TVM
wants.

*Construction fails loudly.* Empty tables, duplicate names, names outside the table's namespace and
bad factory arguments raise ``ValueError`` when the table is built, never when it is run.

*Listing.* Every built-in table registers itself (:func:`register_table`); :func:`list_tables`
gives ``{table: ["<entry>  <one-line doc>", ...]}`` for the CLI.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional

# the TOpPattern values a check compares with (one copy, tvm_ext._op_pattern)
from tvm import relay
from tvm.relay.dataflow_pattern import CallPattern, DFPattern, DFPatternCallback, rewrite

from tvm_ext._op_pattern import K_BROADCAST, K_COMM_REDUCE, K_ELEMWISE, K_INJECTIVE  # noqa: F401
from tvm_ext._op_pattern import K_OPAQUE, K_OUT_EWISE_FUSABLE, K_TUPLE  # noqa: F401
from tvm_ext._reject import Reject

logger = logging.getLogger("tvm_ext.patterns")

__all__ = [
    "Reject",
    "Entry",
    "PatternTable",
    "MatchContext",
    "evaluate",
    "register_table",
    "get_table",
    "list_tables",
    "group_calls",
]

class MatchContext:
    """What a check sees: the matched ``root`` call and, on demand, the matched sub-expressions.

    ``ctx.get("bias")`` returns the expression the entry's annotation ``"bias"`` matched (or None);
    ``ctx.calls`` are the calls inside the matched group (inputs excluded), root last.
    """

    def __init__(self, root, pattern, annotations: Mapping[str, Any] = ()):
        self.root = root
        self.pattern = pattern
        self.annotations = dict(annotations)
        self._node_map = None

    @property
    def node_map(self) -> dict:
        """Pattern node -> list of matched expressions (computed once)."""
        if self._node_map is None:
            self._node_map = _node_map(self.pattern, self.root)
        return self._node_map

    def get(self, name: str):
        """The expression matched by the annotation ``name`` (a pattern or a tuple of them)."""
        pats = self.annotations.get(name)
        if pats is None:
            return None
        pats = pats if isinstance(pats, tuple) else (pats,)
        for pat in pats:
            for key, exprs in self.node_map.items():
                if key.same_as(pat) and len(exprs):
                    return exprs[0]
        return None

    @property
    def calls(self) -> list:
        return group_calls(self.node_map, self.root)


def _node_map(pattern, root) -> dict:
    """The node map of ``pattern`` matched at ``root`` (empty when it does not match there)."""
    found: dict = {}

    class _Grab(DFPatternCallback):
        def __init__(self):
            super().__init__(require_type=False, rewrite_once=True)
            self.pattern = pattern

        def callback(self, pre, post, node_map):
            if pre.same_as(root) and not found:
                found.update({k: list(v) for k, v in node_map.items()})
            return post

    rewrite(_Grab(), root)
    return found


def group_calls(node_map: Mapping, root) -> list:
    """Calls matched by call patterns (the group's interior), in post-order, root last."""
    inside = set()
    for key, exprs in node_map.items():
        if isinstance(key, CallPattern):
            for e in exprs:
                inside.add(e)
    order = []
    relay.analysis.post_order_visit(root, lambda e: order.append(e) if e in inside else None)
    return order


@dataclass(frozen=True)
class Entry:
    """One rule: ``name`` (``"<table>.<ops>"``), dataflow ``pattern``, optional ``check``.

    ``equation`` is the rule in one line (``conv2d(x, w) + b -> relu``), ``doc`` one line of prose;
    ``annotations`` names sub-patterns a check can look up with :meth:`MatchContext.get`.
    """

    name: str
    pattern: Any
    check: Optional[Callable] = None
    equation: str = ""
    doc: str = ""
    annotations: tuple = field(default=())  # ((name, pattern), ...)

    def __post_init__(self):
        if not isinstance(self.name, str) or "." not in self.name or self.name.endswith("."):
            raise ValueError(f"pattern entry name {self.name!r}: expected '<table>.<ops>'")
        if not isinstance(self.pattern, DFPattern):
            raise ValueError(f"pattern entry {self.name!r}: pattern is a {type(self.pattern).__name__}, "
                             "not a DFPattern")
        if self.check is not None and not callable(self.check):
            raise ValueError(f"pattern entry {self.name!r}: check is not callable")

    @property
    def summary(self) -> str:
        return self.doc or self.equation


def evaluate(entry: Entry, root, extra_checks=()) -> tuple:
    """Run ``entry``'s check (then ``extra_checks``) on a match at ``root``: ``(ok, reason)``.

    A falsy result or an exception rejects; the reason is logged under the entry's name.
    """
    checks = ([entry.check] if entry.check is not None else []) + list(extra_checks)
    if not checks:
        return True, ""
    ctx = MatchContext(root, entry.pattern, entry.annotations)
    for chk in checks:
        try:
            res = chk(ctx)
        except Exception as err:  # a check that raises rejects, with the reason
            reason = f"{type(err).__name__}: {err}"
            logger.debug("%s: rejected (%s)", entry.name, reason)
            return False, reason
        if not res:
            reason = getattr(res, "reason", None) or f"check {getattr(chk, '__name__', chk)!s} returned {res!r}"
            logger.debug("%s: rejected (%s)", entry.name, reason)
            return False, reason
    return True, ""


class PatternTable:
    """An ordered, immutable table of :class:`Entry`; order is priority.

    Raises ``ValueError`` for an empty table, duplicate names, or names outside ``"<name>."``.
    """

    def __init__(self, name: str, entries, doc: str = ""):
        if not isinstance(name, str) or not name or "." in name:
            raise ValueError(f"pattern table name {name!r}: expected a non-empty name without '.'")
        entries = tuple(entries)
        if not entries:
            raise ValueError(f"pattern table {name!r} is empty")
        seen = set()
        for e in entries:
            if not isinstance(e, Entry):
                raise ValueError(f"pattern table {name!r}: {e!r} is not an Entry")
            if not e.name.startswith(name + "."):
                raise ValueError(f"pattern table {name!r}: entry {e.name!r} is not named '{name}.<ops>'")
            if e.name in seen:
                raise ValueError(f"pattern table {name!r}: duplicate entry name {e.name!r}")
            seen.add(e.name)
        self._name = name
        self._entries = entries
        self._doc = doc

    name = property(lambda self: self._name)
    entries = property(lambda self: self._entries)
    doc = property(lambda self: self._doc)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, key) -> Entry:
        if isinstance(key, int):
            return self._entries[key]
        for e in self._entries:
            if e.name == key:
                return e
        raise KeyError(f"no entry {key!r} in pattern table {self._name!r}")

    def names(self) -> list:
        return [e.name for e in self._entries]

    def select(self, names, name: Optional[str] = None) -> "PatternTable":
        """A sub-table with the given entry names (kept in this table's priority order)."""
        wanted = set(names)
        missing = wanted - set(self.names())
        if missing:
            raise ValueError(f"pattern table {self._name!r} has no entries {sorted(missing)}")
        return PatternTable(name or self._name, [e for e in self._entries if e.name in wanted], self._doc)

    def triples(self, extra_checks=(), prefix: str = "") -> list:
        """``[(prefix + name, pattern, bool check), ...]`` for ``relay.transform.MergeComposite``."""
        out = []
        for e in self._entries:
            if e.check is None and not extra_checks:
                out.append((prefix + e.name, e.pattern))
                continue

            def _check(root, _e=e):
                return bool(evaluate(_e, root, extra_checks)[0])

            out.append((prefix + e.name, e.pattern, _check))
        return out

    def listing(self) -> list:
        width = max(len(e.name) for e in self._entries)
        return [f"{e.name.ljust(width)}  {e.summary}" for e in self._entries]

    def __repr__(self) -> str:
        return f"PatternTable({self._name!r}, {len(self._entries)} entries)"


_TABLES: dict = {}


def register_table(table: PatternTable) -> PatternTable:
    """Make ``table`` visible to :func:`list_tables` / :func:`get_table` (re-registering replaces)."""
    if not isinstance(table, PatternTable):
        raise ValueError(f"register_table: expected a PatternTable, got {type(table).__name__}")
    _TABLES[table.name] = table
    return table


def get_table(name: str) -> PatternTable:
    try:
        return _TABLES[name]
    except KeyError:
        raise KeyError(f"unknown pattern table {name!r}; known: {', '.join(sorted(_TABLES)) or 'none'}") from None


def list_tables() -> dict:
    """``{table: ["<entry name>  <one-line doc>", ...]}`` for every registered table."""
    return {name: _TABLES[name].listing() for name in sorted(_TABLES)}
