"""Float products rounded before they are summed, at targets with fused multiply-add.

Design note
-----------
TVM creates every ``llvm`` TargetMachine with ``AllowFPOpFusion = Fast``, so wherever the CPU has fused
multiply-add (x86 with FMA, aarch64) LLVM contracts ``a * s + c`` into one ``vfmadd`` / ``fmla``: one
rounding where the graph, numpy and a plain ``llvm`` build round the product, then the sum. In an
integer graph's float requantize, ``q(dq(a) + dq(b))``, that moves outputs by a level.
:func:`FenceProducts` guards each float product that is an operand of a float add or subtract::

    # x * s + y -> fence(x * s) + y       vector stores: llvm.arithmetic.fence, no instruction
    # x * s + y -> min(x * s, MAX) + y    scalar stores: one minps / fminnm (LLVM still vectorises them)
    # acc[i] = acc[i] + x * w             unchanged: an accumulation (conv, dense, pool sums)

(``x * s - y``, ``y - x * s`` and ``broadcast(x * s) + y`` alike.) LLVM's vectorisers do not widen the
fence, so loops TVM left scalar get the bound, equal to the product unless it is +inf or NaN.
Accumulations keep their fused multiply-adds; integer arithmetic is not touched. The fence takes one
signature argument, its operand (docs/numerics.md). The x86 and aarch64 back ends add the pass to
their build's PassContext (``tir.add_lower_pass``, :func:`lower_config`) for 8-bit graphs built with
their kernels; other builds never see it.
"""
from __future__ import annotations

__all__ = ["FenceProducts", "lower_config", "PASS_NAME", "LOWER_PHASE", "FENCE"]

#: The pass's name in ``tir.add_lower_pass`` (one per PassContext).
PASS_NAME = "tvm_ext.FenceProducts"
#: ``tir.add_lower_pass`` phase: after ``VectorizeLoop`` (the fence gets the vector type of its product).
LOWER_PHASE = 3
#: The LLVM intrinsic.
FENCE = "llvm.arithmetic.fence"


def _is_float(dtype) -> bool:
    import tvm

    return tvm.DataType(dtype).type_code in (tvm.DataTypeCode.FLOAT, tvm.DataTypeCode.BFLOAT)


def _fenced(e, fence):
    """``e`` with its product fenced: ``x * s`` or ``broadcast(x * s)``; else None."""
    from tvm import tir

    if isinstance(e, tir.Mul) and _is_float(e.dtype):
        return fence(e)
    if isinstance(e, tir.Broadcast) and isinstance(e.value, tir.Mul) and _is_float(e.value.dtype):
        return tir.Broadcast(fence(e.value), e.lanes)
    return None


def _reads(e, buffer) -> bool:
    from tvm import tir

    return isinstance(e, tir.BufferLoad) and e.buffer.same_as(buffer)


def FenceProducts():  # noqa: N802  (a TVM pass, named like TVM's)
    """A ``tir.PrimFunc`` pass: every float product that a float add or subtract reads is wrapped in
    ``llvm.arithmetic.fence`` (in vector stores) or bounded by the type's largest value (in scalar
    stores), except the product an accumulation (``acc[i] = acc[i] + x * w``) adds. Idempotent; a
    function without such products is returned unchanged."""
    import tvm
    from tvm import tir

    fence_id = tvm.target.codegen.llvm_lookup_intrinsic_id(FENCE)

    def fence(e):
        return tir.call_llvm_pure_intrin(e.dtype, fence_id, tir.const(1, "uint32"), e)

    def bound(e):  # min(x * s, MAX): minps / fminnm, which LLVM's loop and SLP vectorisers widen
        lanes = tvm.DataType(e.dtype).lanes
        top = tir.max_value(str(e.dtype).split("x")[0])
        return tir.Min(e, top if lanes == 1 else tir.Broadcast(top, lanes))

    def rewrite_value(value, buffer):
        guard = fence if tvm.DataType(value.dtype).lanes > 1 else bound

        def visit(node):
            if not _is_float(node.dtype):
                return None
            a = None if _reads(node.b, buffer) else _fenced(node.a, guard)
            b = None if _reads(node.a, buffer) else _fenced(node.b, guard)
            if a is None and b is None:
                return None
            return type(node)(node.a if a is None else a, node.b if b is None else b)

        out = tir.stmt_functor.ir_transform(tir.Evaluate(value), None, visit, ["tir.Add", "tir.Sub"])
        return out.value

    def store(node):
        value = rewrite_value(node.value, node.buffer)
        if value.same_as(node.value):
            return None
        return tir.BufferStore(node.buffer, value, node.indices, node.predicate)

    def transform(func, _mod, _ctx):
        body = tir.stmt_functor.ir_transform(func.body, None, store, ["tir.BufferStore"])
        return func if body.same_as(func.body) else func.with_body(body)

    return tvm.tir.transform.prim_func_pass(transform, opt_level=0, name=PASS_NAME)


def lower_config(config: dict | None = None) -> dict:
    """``config`` (PassContext options) with :func:`FenceProducts` added to ``tir.add_lower_pass`` once,
    after the lower passes already there. ``config`` is not modified."""
    from ._lower_pass import with_lower_pass

    return with_lower_pass(config, LOWER_PHASE, PASS_NAME, FenceProducts)
