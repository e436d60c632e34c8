"""Relay ops defined by tvm-ext (registered from Python, once per process).

Design note
-----------
``tvm_ext.table_lookup(data, table)``: ``table[data]`` (``table[data + 128]`` for int8 data),
elementwise in ``data``: a Python type relation (result: ``data``'s shape, ``table``'s dtype), TOpPattern
``kElemWise`` (FuseOps fuses it into a producer's epilogue like any elementwise op), a ``te.compute``
with the index clamped to the table (never a read outside it) and TVM's injective schedule.
:class:`tvm_ext.passes.TabulateEightBit` makes it. It has no layout rule (``FInferCorrectLayout``):
create it after AlterOpLayout (``tvm_ext.build(..., at="before_fuse")``).

:func:`register_ops` is idempotent and cheap after the first call; everything in tvm-ext that looks
ops up by name (the pass, :func:`tvm_ext.report.op_pattern`) calls it first, so a kernel report read
in a fresh process knows the op's pattern. Leaf module: imports only TVM.
"""
from __future__ import annotations

__all__ = ["TABLE_LOOKUP", "EIGHT_BIT_OFFSET", "register_ops", "table_lookup"]

TABLE_LOOKUP = "tvm_ext.table_lookup"
#: dtype -> table index of value 0 (8-bit data; other integer data index from 0)
EIGHT_BIT_OFFSET = {"uint8": 0, "int8": 128}
_registered: list = []  # the lookup op, once registered in this process


def register_ops():
    """Register tvm-ext's Relay ops once per process (Relay ops are global); returns the lookup op."""
    if _registered:
        return _registered[0]
    import tvm
    from tvm import relay, te
    from tvm.relay.op import op as _op

    if TABLE_LOOKUP in tvm.ir.Op.list_op_names():  # registered by another copy of this module
        _registered.append(tvm.ir.Op.get(TABLE_LOOKUP))
        return _registered[0]
    _op.register(TABLE_LOOKUP, "table[data]: a 256-entry table indexed by an 8-bit tensor (elementwise)")
    op = tvm.ir.Op.get(TABLE_LOOKUP)
    op.set_num_inputs(2)
    op.add_argument("data", "Tensor", "integer indices (int8: entry i is value i - 128)")
    op.add_argument("table", "Tensor", "1-D table")
    op.set_support_level(10)

    def rel(arg_types, attrs):  # pylint: disable=unused-argument
        data, table = arg_types
        if not isinstance(data, relay.TensorType) or not isinstance(table, relay.TensorType):
            return None
        if not str(data.dtype).startswith(("int", "uint")):
            raise tvm.error.TVMError(f"{TABLE_LOOKUP}: data must be an integer tensor, got {data.dtype}")
        if len(table.shape) != 1 or int(table.shape[0]) < 1:
            raise tvm.error.TVMError(f"{TABLE_LOOKUP}: table must be 1-D and non-empty, got {list(table.shape)}")
        return relay.TensorType(data.shape, table.dtype)

    op.add_type_rel("TableLookupRel", rel)
    _op.register_pattern(TABLE_LOOKUP, _op.OpPattern.ELEMWISE)

    def compute(attrs, inputs, out_type):  # pylint: disable=unused-argument
        data, table = inputs
        off, last = EIGHT_BIT_OFFSET.get(str(data.dtype), 0), int(table.shape[0]) - 1

        def read(*i):  # clamped: an index outside the table reads its end, never outside memory
            idx = data(*i).astype("int32") + off
            return table[te.max(te.min(idx, last), 0)]

        return [te.compute(data.shape, read, name="table_lookup", tag="elemwise")]

    _op.register_compute(TABLE_LOOKUP, compute)
    _op.register_injective_schedule(TABLE_LOOKUP)
    _registered.append(op)
    return op


def table_lookup(data, table):
    """``tvm_ext.table_lookup(data, table)``: ``table[data]`` (``table[data + 128]`` for int8 data).

    Indices outside the table are clamped to its ends (never a read outside it).

    Parameters
    ----------
    data : tvm.relay.Expr
        An integer tensor.
    table : tvm.relay.Expr
        A 1-D tensor of any dtype; the result has ``data``'s shape and ``table``'s dtype.
    """
    from tvm import relay

    return relay.Call(register_ops(), [data, table])
