"""tvm-ext pattern tables on Relax: each Relay ``Entry`` becomes a Relax ``FusionPattern``.

Design note
-----------
*Same tables, translated, not re-written.* :func:`translate_table` translates every entry's Relay
``tvm.relay.dataflow_pattern`` tree into the equivalent ``tvm.relax.dpl`` tree
(:mod:`._translate`: :data:`OP_MAP`, :data:`NO_COUNTERPART`). Any table built with ``make_table`` /
``make_entry`` or by hand translates the same way; there is no parallel Relax table to keep in sync.

*Checks.* The Relay entry's own ``check`` runs on a :class:`RelaxMatchContext`
(:mod:`._match_context`): Relay-like views of the Relax expressions. A check that cannot be
reproduced on Relax raises, which rejects with the error as the reason; every rejection is logged
under the entry's name on the ``tvm_ext.relax.patterns`` logger, as
:func:`tvm_ext.patterns.evaluate` does on Relay. The op map's equations and the views' contract:
docs/relax.md, section "Pattern tables on Relax".
"""
from __future__ import annotations

from typing import Callable, Optional

from tvm_ext.patterns import PatternTable

from ._match_context import RelaxMatchContext, evaluate_relax
from ._translate import NO_COUNTERPART, OP_MAP, NoRelaxCounterpart, RelaxEntry, translate_entry, translate_pattern

__all__ = [
    "OP_MAP",
    "NO_COUNTERPART",
    "NoRelaxCounterpart",
    "RelaxEntry",
    "RelaxTable",
    "RelaxMatchContext",
    "translate_table",
    "translate_pattern",
]


class RelaxTable:
    """A :class:`~tvm_ext.patterns.PatternTable` translated to Relax, in the same order."""

    def __init__(self, table: PatternTable, entries):
        self.table = table
        self.entries: tuple = tuple(entries)

    name = property(lambda self: self.table.name)

    def __iter__(self):
        return iter(self.entries)

    def __len__(self):
        return len(self.entries)

    def __getitem__(self, key) -> RelaxEntry:
        for e in self.entries:
            if e.name == key:
                return e
        raise KeyError(f"no entry {key!r} in pattern table {self.name!r}")

    @property
    def translated(self) -> list:
        return [e for e in self.entries if e.translated]

    @property
    def untranslated(self) -> list:
        return [e for e in self.entries if not e.translated]

    def fusion_patterns(self, extra_checks=(), on_reject: Optional[Callable] = None) -> list:
        """``[FusionPattern(name, pattern, annotations, check), ...]`` for ``FuseOpsByPattern``.

        ``on_reject(name, reason)`` is called for every rejected match (besides the log).
        """
        from tvm.relax.transform import FusionPattern

        out = []
        for e in self.translated:

            def check(relax_context, _e=e):
                ok, reason = evaluate_relax(_e, relax_context, extra_checks)
                if not ok and on_reject is not None:
                    on_reject(_e.name, reason)
                return ok

            out.append(FusionPattern(e.name, e.pattern, e.annotations, check))
        return out

    def listing(self) -> list:
        """One line per entry: name, then the Relay summary or ``no Relax counterpart: why``."""
        width = max(len(e.name) for e in self.entries)
        lines = []
        for e in self.entries:
            if e.translated:
                note = e.entry.summary
                if e.dropped:
                    note += f"  [dropped: {'; '.join(e.dropped)}]"
            else:
                note = f"no Relax counterpart: {e.reason}"
            lines.append(f"{e.name.ljust(width)}  {note}")
        return lines

    def __repr__(self) -> str:
        return f"RelaxTable({self.name!r}, {len(self.translated)}/{len(self.entries)} entries translated)"


def translate_table(table: PatternTable) -> RelaxTable:
    """Translate every entry of ``table`` (same names, same order, same checks) to Relax.

    Parameters
    ----------
    table : tvm_ext.patterns.PatternTable
        Any table: ``GENERIC``, ``QNN``, or one built with ``make_table``.

    Returns
    -------
    RelaxTable
        Entries with a Relax ``pattern`` or, where none exists, the ``reason``.
    """
    if not isinstance(table, PatternTable):
        raise ValueError(f"translate_table: expected a PatternTable, got {type(table).__name__}")
    return RelaxTable(table, [translate_entry(e) for e in table])

