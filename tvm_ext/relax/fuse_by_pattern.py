"""FuseByPattern on Relax: a pattern table's matches become fused functions, in one call.

Design note
-----------
``FuseByPattern(table)`` translates ``table`` (:func:`tvm_ext.relax.patterns.translate_table`) and
runs TVM's ``relax.transform.FuseOpsByPattern`` with the translated entries, in table order (order
is priority), each with the Relay entry's check (rejections logged under the entry's name).
Every accepted match becomes a private Relax function with ``Composite="<table>.<entry>"`` and
``Primitive=1``: after ``LegalizeOps`` the stock ``FuseOps`` leaves it alone and ``FuseTIR`` turns
it into one PrimFunc, i.e. one kernel, while ``FuseOps`` groups the rest: a hand-written fusing
mutator (such as a ``DenseAddFusor``) as a table entry.

Contract: a ``tvm.transform.Pass`` named ``FuseByPattern`` (the Relay pass has the same name, so
``disabled_pass=["FuseByPattern"]`` skips either); the input module is never modified (TVM
passes are functional); no match returns an equal module. ``FuseOpsByPattern`` works inside
dataflow blocks only: functions without one are left unchanged (``relax.transform.ConvertToDataflow``
makes them). Intermediates used outside a match are rejected ("used outside the group"): fusing
them would duplicate work. Matches per entry are counted on the pass (``last_counts``) and logged.
"""
from __future__ import annotations

import logging

from tvm_ext.patterns import PatternTable

from .patterns import RelaxTable, translate_table

__all__ = ["FuseByPattern", "composite_counts"]

PASS_NAME = "FuseByPattern"
_log = logging.getLogger(f"tvm_ext.relax.{PASS_NAME}")


def composite_counts(mod) -> dict:
    """``{Composite name: number of call sites}`` of the composite functions in ``mod``."""
    from tvm import relax

    comp = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function) and func.attrs is not None and "Composite" in func.attrs:
            comp[gv] = str(func.attrs["Composite"])
    counts: dict = {}
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function) or gv in comp:
            continue

        def visit(e):
            if isinstance(e, relax.Call) and isinstance(e.op, relax.GlobalVar) and e.op in comp:
                counts[comp[e.op]] = counts.get(comp[e.op], 0) + 1

        relax.analysis.post_order_visit(func, visit)
    return dict(sorted(counts.items()))


def FuseByPattern(table, extra_checks=(), bind_constants: bool = False):
    """Group each match of a pattern ``table`` into one fused Relax function (one kernel).

    Parameters
    ----------
    table : tvm_ext.patterns.PatternTable or RelaxTable
        A Relay pattern table (translated here) or an already translated one.
    extra_checks : sequence of callables
        More checks run after each entry's own (same contract: truthy or ``Reject``).
    bind_constants : bool
        Keep constants inside the fused functions (``FuseOpsByPattern``'s flag). Default False:
        ``FuseTIR`` rejects constants inside primitive functions ("Relax.Constant is not supported
        in primitive functions"), so they stay arguments of the fused call.

    Returns
    -------
    tvm.transform.Pass
        A module pass named ``FuseByPattern``.

    Raises
    ------
    ValueError
        If ``table`` is not a table, or none of its entries has a Relax counterpart.
    """
    import tvm
    from tvm import relax

    if isinstance(table, PatternTable):
        rtable = translate_table(table)
    elif isinstance(table, RelaxTable):
        rtable = table
    else:
        raise ValueError(f"{PASS_NAME}: expected a PatternTable or RelaxTable, got {type(table).__name__}")
    if not rtable.translated:
        reasons = "; ".join(sorted({e.reason for e in rtable.untranslated}))
        raise ValueError(f"{PASS_NAME}: no entry of table {rtable.name!r} has a Relax counterpart ({reasons})")

    @tvm.transform.module_pass(opt_level=0, name=PASS_NAME)
    def _pass(mod, _ctx):
        if not isinstance(mod, tvm.IRModule):
            raise ValueError(f"{PASS_NAME}: expected an IRModule, got {type(mod).__name__}")
        if not any(isinstance(f, relax.Function) for f in mod.functions.values()):
            _log.info("%s: no Relax function in the module, unchanged", PASS_NAME)
            return mod
        rejected: dict = {}

        def on_reject(name, reason):
            rejected.setdefault(name, []).append(reason)

        patterns = rtable.fusion_patterns(extra_checks, on_reject)
        before = composite_counts(mod)
        try:
            out = relax.transform.FuseOpsByPattern(patterns, bind_constants=bind_constants)(mod)
        except tvm.TVMError as err:
            raise RuntimeError(f"{PASS_NAME}: FuseOpsByPattern failed: {str(err).splitlines()[-1]}") from err
        after = composite_counts(out)
        counts = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
        _pass.last_counts = counts
        _pass.last_rejections = rejected
        for name, n in counts.items():
            _log.info("%s: %d match(es) of %s", PASS_NAME, n, name)
        for name, reasons in rejected.items():
            _log.info("%s: %s rejected %d time(s): %s", PASS_NAME, name, len(reasons), reasons[0])
        return out

    _pass.table = rtable
    _pass.last_counts = {}
    _pass.last_rejections = {}
    return _pass
