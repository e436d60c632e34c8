"""tvm-ext pattern tables: ordered ``(name, pattern, check)`` records, order is priority.

Tables: :data:`GENERIC` (``generic.*``, float anchors + bias/residual/activation) and :data:`QNN`
(``qnn.*``, int8 conv2d/dense groups in source and lowered form). ``list_tables()`` lists them for
the CLI; ``merge_composite(table)`` / ``register(table, compiler)`` feed them to TVM's
MergeComposite / BYOC; ``tvm_ext.passes.FuseByPattern(table)`` turns matches into kernels.
"""
from ._table import Entry, MatchContext, PatternTable, Reject, evaluate, get_table, list_tables, register_table
from .composite import count_composites, inline_composites, merge_composite, partition_for, register
from .generic import GENERIC, make_entry, make_table
from .qnn import QNN

__all__ = [
    "Entry",
    "MatchContext",
    "PatternTable",
    "Reject",
    "evaluate",
    "get_table",
    "list_tables",
    "register_table",
    "GENERIC",
    "QNN",
    "make_entry",
    "make_table",
    "merge_composite",
    "register",
    "partition_for",
    "count_composites",
    "inline_composites",
]
