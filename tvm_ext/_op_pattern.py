"""TVM's operator patterns (``TOpPattern``), the one copy tvm-ext reads them from.

A leaf module: it imports nothing from tvm-ext at import time (``op_pattern`` registers tvm-ext's
own ops on first use, so ``tvm_ext.table_lookup`` has a pattern too). The values are those of
``include/tvm/relay/op_attr_types.h``; FuseOps (``src/relay/analysis/graph_partitioner.cc``)
decides what fuses from them: elementwise/broadcast calls fuse into an anchor's epilogue
(``K_OUT_EWISE_FUSABLE``), injective calls into injective groups, ``K_OPAQUE`` never fuses.
"""
from __future__ import annotations

__all__ = [
    "K_ELEMWISE",
    "K_BROADCAST",
    "K_INJECTIVE",
    "K_COMM_REDUCE",
    "K_OUT_EWISE_FUSABLE",
    "K_TUPLE",
    "K_OPAQUE",
    "op_pattern",
    "call_pattern",
    "op_name",
]

K_ELEMWISE, K_BROADCAST, K_INJECTIVE, K_COMM_REDUCE, K_OUT_EWISE_FUSABLE, K_TUPLE, K_OPAQUE = 0, 1, 2, 3, 4, 7, 8


def op_pattern(op_name: str) -> int:
    """TOpPattern of the Relay op named ``op_name`` (``K_OPAQUE`` when unknown or unset)."""
    import tvm

    from .ops import register_ops

    register_ops()  # tvm-ext's own ops (tvm_ext.table_lookup) have a pattern too
    try:
        pat = tvm.ir.Op.get(op_name).get_attr("TOpPattern")
    except Exception:  # unknown op
        return K_OPAQUE
    return K_OPAQUE if pat is None else int(pat)


def op_name(call) -> str | None:
    """Name of the op a Call calls, or None when it calls a function or a global (or is no Call)."""
    import tvm

    op = getattr(call, "op", None)  # None for a node without an op (a Tuple user, e.g.)
    return op.name if isinstance(op, tvm.ir.Op) else None


def call_pattern(call) -> int:
    """TOpPattern of the op ``call`` calls; ``K_OPAQUE`` for a call of a function or a non-call."""
    name = op_name(call)
    return K_OPAQUE if name is None else op_pattern(name)
