"""MergeComposite and BYOC registration for pattern tables.

Design note
-----------
``merge_composite(table)`` is ``relay.transform.MergeComposite`` fed with the table's
``(name, pattern, check)`` triples (checks adapted to the bool TVM wants; rejections logged under
the entry name). It runs InferType first, works on a copy, and never touches the caller's module.

``register(table, compiler)`` registers the table for BYOC: ``AnnotateTarget`` only offloads a
composite whose name starts with ``"<compiler>."``, so entries are registered as
``"<compiler>.<entry name>"`` unless ``compiler`` equals the table name.
:func:`count_composites` strips that prefix again.

``inline_composites`` is the codegen-free way back: it inlines composite functions and, with
``compiler=``, the partitioned ``Compiler=<compiler>`` functions, so the graph builds with TVM alone
(used to prove a partitioned model still computes the same thing).
"""
from __future__ import annotations

import logging

import tvm
from tvm import relay
from tvm.relay.op.contrib.register import get_pattern_table, register_pattern_table

from ._table import PatternTable

logger = logging.getLogger("tvm_ext.patterns")

__all__ = ["merge_composite", "register", "partition_for", "count_composites", "inline_composites"]


def _as_table(table) -> PatternTable:
    if isinstance(table, PatternTable):
        return table
    if isinstance(table, str):
        from ._table import get_table

        return get_table(table)
    raise ValueError(f"expected a PatternTable or a table name, got {type(table).__name__}")


def merge_composite(table, extra_checks=()):
    """The pass making one ``Composite="<entry name>"`` function per match of ``table``.

    Parameters
    ----------
    table : PatternTable or str
        The table (or a registered table's name). Order is priority.
    extra_checks : sequence of callable
        Checks applied after each entry's own check (``check(ctx) -> bool | Reject``).

    Returns
    -------
    tvm.transform.Pass
    """
    table = _as_table(table)
    triples = table.triples(extra_checks)

    @tvm.transform.module_pass(opt_level=0, name="MergeCompositeTable")
    def _pass(mod, _ctx):
        mod = relay.transform.InferType()(mod)
        return relay.transform.MergeComposite(triples)(mod)

    return _pass


def register(table, compiler: str = None):
    """Register ``table`` as the BYOC pattern table of ``compiler`` (default: the table name).

    Returns the registered ``[(name, pattern, check), ...]`` list.
    """
    table = _as_table(table)
    compiler = compiler or table.name
    if not isinstance(compiler, str) or not compiler or "." in compiler:
        raise ValueError(f"register: compiler {compiler!r} must be a non-empty name without '.'")
    prefix = "" if compiler == table.name else compiler + "."
    triples = table.triples(prefix=prefix)
    register_pattern_table(compiler, lambda: triples)
    return triples


def partition_for(compiler: str):
    """``MergeComposite(registered table) -> AnnotateTarget -> MergeCompilerRegions -> PartitionGraph``."""
    triples = get_pattern_table(compiler)
    if triples is None:
        raise ValueError(f"no pattern table registered for compiler {compiler!r} (call register first)")
    return tvm.transform.Sequential(
        [
            relay.transform.InferType(),
            relay.transform.MergeComposite(triples),
            relay.transform.AnnotateTarget(compiler),
            relay.transform.MergeCompilerRegions(),
            relay.transform.PartitionGraph(),
        ],
        name=f"PartitionFor[{compiler}]",
    )


def count_composites(mod, compiler: str = None) -> dict:
    """``{entry name: count}`` of composite functions anywhere in ``mod`` (compiler prefix stripped)."""
    counts: dict = {}
    prefix = f"{compiler}." if compiler else None

    def visit(e):
        if isinstance(e, relay.Function) and e.attrs and "Composite" in e.attrs:
            name = str(e.attrs["Composite"])
            if prefix and name.startswith(prefix) and name.count(".") > 1:
                name = name[len(prefix):]
            counts[name] = counts.get(name, 0) + 1

    for gv in mod.get_global_vars():
        relay.analysis.post_order_visit(mod[gv], visit)
    return dict(sorted(counts.items()))


def inline_composites(mod, compiler: str = None):
    """A new module with composite functions (and ``Compiler=compiler`` globals) inlined back.

    The input module is not modified.
    """
    drop = set()
    if compiler:
        for gv in mod.get_global_vars():
            f = mod[gv]
            if f.attrs and "Compiler" in f.attrs and str(f.attrs["Compiler"]) == compiler:
                drop.add(gv.name_hint)

    class _Inline(relay.ExprMutator):
        def visit_call(self, call):
            new = super().visit_call(call)
            fn = new.op
            if isinstance(fn, relay.GlobalVar) and fn.name_hint in drop:
                fn = self.visit(mod[fn])
            if isinstance(fn, relay.Function) and (
                (fn.attrs and "Composite" in fn.attrs) or (fn.attrs and "Compiler" in fn.attrs)
            ):
                body = self.visit(fn.body)
                return relay.bind(body, dict(zip(fn.params, new.args)))
            return new

    out = tvm.IRModule({}, mod.type_definitions)
    for gv in mod.get_global_vars():
        if gv.name_hint in drop:
            continue
        f = mod[gv]
        if isinstance(f, relay.Function):
            f = relay.Function(f.params, _Inline().visit(f.body), f.ret_type, f.type_params, f.attrs)
        out[gv] = f
    return relay.transform.InferType()(out)
