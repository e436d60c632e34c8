"""Relay ops defined by tvm-ext (registered from Python, once per process).

``tvm_ext.table_lookup(data, table)``: ``table[data]`` (``table[data + 128]`` for int8 data),
elementwise in ``data``: a Python type relation (result: ``data``'s shape, ``table``'s dtype), TOpPattern
``kElemWise`` (FuseOps fuses it into a producer's epilogue like any elementwise op), a ``te.compute``
with the index clamped to the table (never a read outside it) and TVM's injective schedule.
:class:`tvm_ext.passes.TabulateEightBit` makes it. It has no layout rule (``FInferCorrectLayout``):
create it after AlterOpLayout (``tvm_ext.build(..., at="before_fuse")``).

``tvm_ext.round_half_to_even(data)``: float ``data`` rounded to the nearest integer, ties to even
(ONNX's ``Round`` and ``QuantizeLinear``), as one TIR ``nearbyint`` call (LLVM's
``llvm.nearbyint``: ``vroundps``/``vrndscaleps`` with the default rounding mode, round to nearest
even; the floating-point environment is never changed by TVM code). Same shape and dtype, TOpPattern
``kElemWise``, TVM's injective schedule, and a layout rule (the output takes the input's layout, as
any elementwise unary op), so it can be created before AlterOpLayout. *Why an op:* the same rounding
written with Relay's ops (``floor``, ``where``, ...) reads its operand seven times; TVM inlines a fused
kernel's elementwise chain into one TIR expression, so ``k`` such roundings in one kernel make an
expression of ``7**k`` copies, and TIR's simplifier took minutes per kernel (the YOLOv8n
``int8(numerics="onnxruntime")`` build: > 23 CPU-minutes). ``nearbyint`` returns ``-0.0`` for
``-0.5 <= x < 0`` (and ``-0.0``) where the Relay formula gives ``+0.0``: equal values.
:class:`tvm_ext.passes.RoundHalfToEven` and :class:`tvm_ext.passes.AddAsOnnxRuntime` make it.

:func:`register_ops` is idempotent and cheap after the first call; everything in tvm-ext that looks
ops up by name (the pass, :func:`tvm_ext.core.report.op_pattern`) calls it first, so a kernel report read
in a fresh process knows the op's pattern. Leaf module: imports only TVM.
"""
from __future__ import annotations

__all__ = ["TABLE_LOOKUP", "ROUND_HALF_TO_EVEN", "EIGHT_BIT_OFFSET", "register_ops", "table_lookup",
           "round_half_to_even"]

TABLE_LOOKUP = "tvm_ext.table_lookup"
ROUND_HALF_TO_EVEN = "tvm_ext.round_half_to_even"
_FLOATS = ("float16", "float32", "float64")
#: dtype -> table index of value 0 (8-bit data; other integer data index from 0)
EIGHT_BIT_OFFSET = {"uint8": 0, "int8": 128}
_registered: list = []  # the lookup op, once both ops are registered in this process


def register_ops():
    """Register tvm-ext's Relay ops once per process (Relay ops are global); returns the lookup op."""
    if _registered:
        return _registered[0]
    import tvm

    names = set(tvm.ir.Op.list_op_names())  # an op may be registered by another copy of this module
    if ROUND_HALF_TO_EVEN not in names:
        _register_round_half_to_even()
    _registered.append(tvm.ir.Op.get(TABLE_LOOKUP) if TABLE_LOOKUP in names else _register_table_lookup())
    return _registered[0]


def _register_table_lookup():
    import tvm
    from tvm import relay, te
    from tvm.relay.op import op as _op
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
    return op


def _register_round_half_to_even():
    import tvm
    from tvm import relay, te
    from tvm.relay.op import op as _op
    from tvm.relay.transform.infer_layout_utils import InferCorrectLayoutOutput

    _op.register(ROUND_HALF_TO_EVEN, "round to the nearest integer, ties to even (elementwise)")
    op = tvm.ir.Op.get(ROUND_HALF_TO_EVEN)
    op.set_num_inputs(1)
    op.add_argument("data", "Tensor", "a float tensor")
    op.set_support_level(10)

    def rel(arg_types, attrs):  # pylint: disable=unused-argument
        (data,) = arg_types
        if not isinstance(data, relay.TensorType):
            return None
        if str(data.dtype) not in _FLOATS:
            raise tvm.error.TVMError(f"{ROUND_HALF_TO_EVEN}: data must be a float tensor, got {data.dtype}")
        return relay.TensorType(data.shape, data.dtype)

    op.add_type_rel("RoundHalfToEvenRel", rel)
    _op.register_pattern(ROUND_HALF_TO_EVEN, _op.OpPattern.ELEMWISE)

    def compute(attrs, inputs, out_type):  # pylint: disable=unused-argument
        (data,) = inputs
        return [te.compute(data.shape, lambda *i: te.nearbyint(data(*i)), name="round_half_to_even",
                           tag="elemwise")]

    _op.register_compute(ROUND_HALF_TO_EVEN, compute)
    _op.register_injective_schedule(ROUND_HALF_TO_EVEN)

    def layout(attrs, new_in_layouts, old_in_layouts, old_in_types):  # pylint: disable=unused-argument
        # elementwise unary: the output has whatever layout the input has (as relay's own unary ops)
        lay = new_in_layouts[0] if new_in_layouts and new_in_layouts[0].name else old_in_layouts[0]
        return InferCorrectLayoutOutput([lay], [lay], attrs)

    _op.register_infer_correct_layout(ROUND_HALF_TO_EVEN, layout)
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


def round_half_to_even(data):
    """``tvm_ext.round_half_to_even(data)``: ``data`` rounded to the nearest integer, ties to even.

    One ``nearbyint`` per element (module note); ``data`` must be a float tensor.

    Parameters
    ----------
    data : tvm.relay.Expr
        A float16/32/64 tensor; the result has its shape and dtype.
    """
    import tvm
    from tvm import relay

    register_ops()
    return relay.Call(tvm.ir.Op.get(ROUND_HALF_TO_EVEN), [data])
