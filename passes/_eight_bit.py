"""What the passes that evaluate a function on every 8-bit value share: an 8-bit domain, a small
constant, an elementwise op, the integer ops that must never be evaluated on every value, and the
evaluation itself (as the integer oracle computes it).

A leaf: ``TabulateEightBit`` (one 8-bit source, a table) and ``AffineEightBitJoin`` (two 8-bit
sources, an integer affine form) both read a node's domain here.
"""
from __future__ import annotations

import numpy as np

from tvm import relay

from tvm_ext._op_pattern import K_BROADCAST, call_pattern
from tvm_ext.ops import EIGHT_BIT_OFFSET
from tvm_ext.ops import TABLE_LOOKUP

from ._util import op_name, static_tensor_type

__all__ = ["domain", "small_constant", "elementwise", "evaluate", "TRAPPING"]

#: Integer ops that trap (SIGFPE) on a zero divisor: evaluating them on *every* value could crash
#: the compiler on a value the model never sees.
TRAPPING = frozenset({"divide", "floor_divide", "trunc_divide", "mod", "floor_mod", "trunc_mod"})


def domain(node, ranges):
    """``(dtype, lo, n, narrow)``: the values a source takes, in table order; None if not a source.

    8-bit tensors: their whole dtype (256 values). Wider integers: ``[lo, lo + n)`` when the
    interval analysis (``ranges``, :func:`passes._intervals.value_ranges`) proves at most 256 values
    (e.g. a requantize's ``clip`` before TVM's simplifier dropped its narrowing cast). When that
    interval lies inside an 8-bit dtype, ``narrow`` names it and the domain is that dtype's whole
    range, else ``narrow`` is None.
    """
    if not static_tensor_type(node):
        return None
    dtype = str(node.checked_type.dtype)
    if dtype in EIGHT_BIT_OFFSET:
        return (dtype, -EIGHT_BIT_OFFSET[dtype], 256, None)
    if not dtype.startswith(("int", "uint")) or node not in ranges:
        return None
    lo, hi = (int(v) for v in ranges[node])
    for narrow, base in EIGHT_BIT_OFFSET.items():  # uint8 first
        if -base <= lo and hi <= 255 - base:
            return (dtype, -base, 256, narrow)
    return (dtype, lo, hi - lo + 1, None) if hi - lo + 1 <= 256 else None


def small_constant(node) -> bool:
    """A constant of one element (a scalar or a broadcast one-element tensor)."""
    return isinstance(node, relay.Constant) and int(np.prod(node.data.shape)) == 1


def elementwise(node) -> bool:
    """An elementwise or broadcast op call (not a table lookup)."""
    return op_name(node) not in (None, TABLE_LOOKUP) and call_pattern(node) <= K_BROADCAST


def evaluate(feeds: dict, outs: list) -> list:
    """The values of ``outs`` (expressions of the variables in ``feeds``, ``{var: values}``): one
    ``relay.build`` of them all for plain ``llvm``, float products rounded before their sums (no fused
    multiply-add, :mod:`tvm_ext._no_contract`), run here. That is what the integer oracle computes, and
    what the x86 and aarch64 int8 builds compute with their products fenced, on any host and for any
    target."""
    import tvm
    from tvm.contrib import graph_executor
    from tvm_ext import _no_contract

    target = tvm.target.Target("llvm")
    fn = relay.Function(list(feeds), relay.Tuple(outs))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(fn))
    with tvm.transform.PassContext(opt_level=3, config=_no_contract.lower_config()), target:
        lib = relay.build(mod, target=target)
    gm = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    for var, values in feeds.items():
        gm.set_input(var.name_hint, values)
    gm.run()
    return [gm.get_output(i).numpy() for i in range(len(outs))]


def evaluate_each(feeds: dict, outs: list) -> list:
    """:func:`evaluate`, and where TVM cannot build that (TVM 0.19: a clip whose integer bound its
    dtype cannot hold), each of ``outs`` alone: its values, or a ``str`` saying why TVM cannot build it."""
    import tvm

    try:
        return evaluate(feeds, outs)
    except tvm.TVMError:
        pass
    found = []
    for out in outs:
        try:
            found.append(evaluate(feeds, [out])[0])
        except tvm.TVMError as err:
            lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
            found.append(f"TVM cannot build the chain: {lines[-1] if lines else type(err).__name__}")
    return found
