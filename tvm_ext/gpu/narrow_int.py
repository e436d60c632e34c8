"""8- and 16-bit integer arithmetic that wraps in GPU kernels, as TIR says it does.

TIR gives ``a * b`` of two ``int8`` values the type ``int8``: the product wraps to 8 bits, as LLVM's
``mul i8`` does. TVM's C-like GPU code generators (OpenCL C, CUDA C++) print ``a * b`` as it is, and
C promotes both ``char`` operands to ``int``: where the kernel goes on to widen the value
(``convert_int(p0[i] * p1[i])``) it gets the full product, 403 where TIR says 147 (``100 * 3 + ...``).
:func:`WrapNarrowIntegers` makes the wrap explicit before code generation, for scalar ``+``, ``-``,
``*`` and ``<<`` of an 8- or 16-bit type (OpenCL and CUDA vector types do not promote)::

    # a op b : intN (N in 8, 16)  ->  ((int32(a) op int32(b) + 2^(N-1)) & (2^N - 1)) - 2^(N-1) : intN
    # a op b : uintN              ->  (int32(a) op int32(b)) & (2^N - 1)                     : uintN

Every intermediate fits in int32 and the last cast is in range, so the result is defined in C.
"""
from __future__ import annotations

__all__ = ["WrapNarrowIntegers", "lower_config", "PASS_NAME", "LOWER_PHASE"]

#: The pass's name in ``tir.add_lower_pass`` (one per PassContext).
PASS_NAME = "tvm_ext.gpu.WrapNarrowIntegers"
#: ``tir.add_lower_pass`` phase: after TVM's own simplifications of the lowered function.
LOWER_PHASE = 3

_NARROW_BITS = {"int8": 8, "uint8": 8, "int16": 16, "uint16": 16}


def _wrapped(op, a, b):
    """``op`` (an arithmetic node class or ``tir.shift_left``) of ``a`` and ``b`` in int32, wrapped
    back to their narrow type."""
    import tvm
    from tvm import tir

    dtype = a.dtype
    bits = _NARROW_BITS[dtype]
    wide_a, wide_b = tir.Cast("int32", a), tir.Cast("int32", b)
    full = (tvm.tir.call_intrin("int32", "tir.shift_left", wide_a, wide_b) if op == "shift_left"
            else op(wide_a, wide_b))
    mask = tir.IntImm("int32", (1 << bits) - 1)
    if dtype.startswith("u"):
        return tir.Cast(dtype, tir.bitwise_and(full, mask))
    half = tir.IntImm("int32", 1 << (bits - 1))
    return tir.Cast(dtype, tir.Sub(tir.bitwise_and(tir.Add(full, half), mask), half))


def WrapNarrowIntegers():  # noqa: N802  (a TVM pass, named like TVM's)
    """A ``tir.PrimFunc`` pass: scalar 8- and 16-bit ``+ - * <<`` computed in int32 and wrapped
    explicitly (module docstring), so that C's integer promotion cannot skip the wrap."""
    import tvm
    from tvm import tir

    arith = (tir.Add, tir.Sub, tir.Mul)
    shift_left = tvm.ir.Op.get("tir.shift_left")

    def rewrite(node):
        if str(node.dtype) not in _NARROW_BITS:
            return None
        if type(node) in arith:
            return _wrapped(type(node), node.a, node.b)
        if isinstance(node, tir.Call) and node.op.same_as(shift_left):
            return _wrapped("shift_left", node.args[0], node.args[1])
        return None

    def transform(func, _mod, _ctx):
        return func.with_body(tir.stmt_functor.ir_transform(func.body, None, rewrite,
                                                            ["tir.Add", "tir.Sub", "tir.Mul", "tir.Call"]))

    return tvm.tir.transform.prim_func_pass(transform, opt_level=0, name=PASS_NAME)


def lower_config(config: dict | None = None) -> dict:
    """``config`` (PassContext options) with :func:`WrapNarrowIntegers` added to
    ``tir.add_lower_pass`` once, after the lower passes already there. ``config`` is not modified."""
    from .._lower_pass import with_lower_pass

    return with_lower_pass(config, LOWER_PHASE, PASS_NAME, WrapNarrowIntegers)
