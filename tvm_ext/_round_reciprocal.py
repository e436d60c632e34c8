"""Exact float32 division by a scale inside ``round``, as a product in double (``RoundReciprocal``).

Design note
-----------
A QDQ graph's residual add requantizes with ``round(x / s)`` in float32, its scale ``s`` passed to the
kernel as a parameter (TVM's simplifier already turns a constant divisor into a float32 product), and
LLVM keeps the division (``vdivps``, ``fdiv .4s``: a divider pipe for several cycles per vector). The
pass rewrites it with the reciprocal in double, computed once per call of the kernel::

    # round(x / c) -> round(float32(float64(x) * (1 / float64(c))))       (c one element of a parameter)

Exact: ``x / c`` is the exact quotient ``q`` rounded once to float32. A float32 rounding boundary in
the normal range (or the overflow threshold) is a 25-bit odd multiple of a power of two; ``q = mx /
mc * 2^e`` (24-bit integers) is never one and lies at least ``2^-49`` away relative to it, while the
double product's relative error is under ``2^-52`` (no double overflow or underflow: ``|1 / c| <=
2^149``), so both round to the same float32. A subnormal quotient can differ, but ``round`` makes it
``±0`` either way, with the sign of ``x / c``. ``c = ±0``, ``±inf``, NaN and ``x = ±0``, ``±inf``, NaN
give what ``x / c`` gives. Any other division is left alone; no match leaves the function unchanged,
and a second run changes nothing. :func:`lower_config` adds the pass to a build's PassContext at phase
3, after vectorisation. The aarch64 back end adds it (``tvm_ext.arm.backend``); the x86 back end does
not (the conversions cost more than ``vdivps`` there: docs/x86-kernels.md, docs/arm-kernels.md).
"""
from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

__all__ = ["RoundReciprocal", "lower_config", "PASS_NAME", "LOWER_PHASE"]

#: The pass's name in ``tir.add_lower_pass`` (one per PassContext).
PASS_NAME = "tvm_ext.RoundReciprocal"
#: ``tir.add_lower_pass`` phase: after ``VectorizeLoop`` (the divisions have their vector types).
LOWER_PHASE = 3
_ROUNDS = ("tir.round", "tir.nearbyint")


def _scalar(e):
    """The scalar behind ``e`` (``e`` itself, or the value of a Broadcast)."""
    import tvm

    return e.value if isinstance(e, tvm.tir.Broadcast) else e


def RoundReciprocal():  # noqa: N802  (a TVM pass, named like TVM's)
    """A ``tir.PrimFunc`` pass: ``round(x / c)`` and ``nearbyint(x / c)`` with ``x`` float32 (scalar or
    vector) and ``c`` one float32 element, at constant indices, of a parameter buffer the function
    only reads (a scale passed as a parameter), computed as ``float32(float64(x) * r)`` with ``r = 1 /
    float64(c)`` computed once at the top of the function: bit for bit the same value (module
    docstring). Every other division is left alone.

    Returns
    -------
    tvm.transform.Pass
    """
    import numpy as np
    import tvm
    from tvm import tir

    ops = [tvm.ir.Op.get(name) for name in _ROUNDS]

    def transform(func, _mod, _ctx):
        params = [b.data for b in func.buffer_map.values()]
        written, hoisted = [], []  # hoisted: (the divisor's load, the buffer of its reciprocal)
        tir.stmt_functor.post_order_visit(
            func.body, lambda n: written.append(n.buffer.data) if isinstance(n, tir.BufferStore) else None)

        def reciprocal(c):
            """A load of ``1 / float64(c)`` for the scalar float32 ``c``, computed once at the top of the
            function into a one-element local buffer, or why not."""
            if not isinstance(c, tir.BufferLoad) or not all(isinstance(i, tir.IntImm) for i in c.indices):
                return "the divisor is not one element of a buffer"
            data = c.buffer.data
            if not any(data.same_as(v) for v in params):
                return "the divisor's buffer is not a parameter"
            if any(data.same_as(v) for v in written):
                return "the divisor's buffer is written in the function"
            if len(c.indices) != 1 or not all(isinstance(d, tir.IntImm) for d in c.buffer.shape) \
                    or not 0 <= int(c.indices[0]) < int(np.prod([int(d) for d in c.buffer.shape])):
                return "the divisor's index is not inside a flat buffer of known size"
            for load, buf in hoisted:
                if load.buffer.data.same_as(data) and int(load.indices[0]) == int(c.indices[0]):
                    return tir.BufferLoad(buf, [0])
            buf = tir.decl_buffer((1,), "float64", name=f"rcp_{c.buffer.name}", scope="local")
            hoisted.append((c, buf))
            return tir.BufferLoad(buf, [0])

        def rewrite(node):
            if not any(node.op.same_as(op) for op in ops) or len(node.args) != 1:
                return None
            div = node.args[0]
            if not isinstance(div, tir.Div):
                return None
            dt = tvm.DataType(div.dtype)
            c = _scalar(div.b)
            if dt.type_code != tvm.DataTypeCode.FLOAT or dt.bits != 32 or c.dtype != "float32":
                logger.debug("RoundReciprocal: %s kept (not float32)", div)
                return None
            r = reciprocal(c)
            if isinstance(r, str):
                logger.debug("RoundReciprocal: %s kept (%s)", div, r)
                return None
            if dt.lanes > 1:
                r = tir.Broadcast(r, dt.lanes)
            f64 = "float64" if dt.lanes == 1 else f"float64x{dt.lanes}"
            # round(x / c) -> round(float32(float64(x) * (1 / float64(c))))
            return tir.Call(node.dtype, node.op, [tir.Cast(div.dtype, tir.Cast(f64, div.a) * r)], node.span)

        body = tir.stmt_functor.ir_transform(func.body, None, rewrite, ["tir.Call"])
        if not hoisted:
            return func
        # a local buffer, not a let: TVM's LLVM debug info rejects a float let variable
        for load, buf in hoisted:
            store = tir.BufferStore(buf, tir.FloatImm("float64", 1.0) / tir.Cast("float64", load), [0])
            body = tir.Allocate(buf.data, "float64", [1], tir.const(True), tir.SeqStmt([store, body]))
        return func.with_body(body)

    return tvm.tir.transform.prim_func_pass(transform, opt_level=0, name=PASS_NAME)


def lower_config(config: dict | None = None) -> dict:
    """``config`` (PassContext options) with :func:`RoundReciprocal` added to ``tir.add_lower_pass``
    once, after the lower passes already there. ``config`` is not modified."""
    from ._lower_pass import with_lower_pass

    return with_lower_pass(config, LOWER_PHASE, PASS_NAME, RoundReciprocal)
