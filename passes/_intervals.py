"""Value-range (interval) analysis of Relay dataflow, for passes that need a proven bound.

Design note
-----------
:func:`value_ranges` maps every node of a typed dataflow function to a closed interval
``(lo, hi)`` that contains every element the node can take, for *any* input. It is sound, not
tight: an op it does not model gets its dtype's full range (``int8`` -> ``[-128, 127]``,
``float32`` -> ``[-inf, inf]``). Integer arithmetic that may leave its dtype (and so wrap) also
gets the full range, so a bound is never derived from an overflowed value.

Modelled (one rule each, applied elementwise to the operands' intervals)::

    # constant c                       -> [min c, max c]
    # cast(x, t)                       -> range(x) if it fits t (float -> int truncates), else full(t)
    # x + y, x - y, x * y              -> interval arithmetic; full(dtype) if it may overflow
    # relu(x)                          -> [max(lo, 0), max(hi, 0)]
    # clip(x, a, b)                    -> [clamp(lo), clamp(hi)]
    # right_shift(x, k), 0 <= k < bits -> [lo >> k, hi >> k]      (arithmetic shift = floor)
    # round / floor / ceil / trunc     -> the function of the bounds (monotone)
    # maximum(x, y), minimum(x, y)     -> bounds of the bounds
    # stop_fusion(x), copy(x)          -> range(x)
    # max_pool2d(x)                    -> range(x)  (its padding never wins a window)

NaN is not modelled (a NaN input makes ``cast`` undefined in TVM anyway).
"""
from __future__ import annotations

import math

import tvm
from tvm import relay

__all__ = ["full_range", "value_ranges"]

_IDENTITY = frozenset({"annotation.stop_fusion", "copy", "nn.max_pool2d"})
_MONOTONE = {"round": round, "floor": math.floor, "ceil": math.ceil, "trunc": math.trunc}


def full_range(dtype: str) -> tuple:
    """The interval of every value of ``dtype`` (floats: ``(-inf, inf)``)."""
    import numpy as np

    if dtype == "bool":
        return (0, 1)
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return (int(info.min), int(info.max))
    return (-math.inf, math.inf)


def _is_int(dtype: str) -> bool:
    return dtype.startswith(("int", "uint")) or dtype == "bool"


def _bits(dtype: str) -> int:
    return int(tvm.runtime.DataType(dtype).bits)


def _fit(lo, hi, dtype: str) -> tuple:
    """``(lo, hi)`` if it lies within ``dtype`` (no wrap possible), else the full range."""
    if any(isinstance(v, float) and math.isnan(v) for v in (lo, hi)):
        return full_range(dtype)
    if _is_int(dtype):
        flo, fhi = full_range(dtype)
        if lo < flo or hi > fhi:
            return full_range(dtype)
        return (int(lo), int(hi))
    return (float(lo), float(hi))


def _const_range(const) -> tuple:
    import numpy as np

    data = const.data.numpy()
    dtype = str(const.data.dtype)
    if data.size == 0:
        return full_range(dtype)
    lo, hi = data.min(), data.max()
    if _is_int(dtype):
        return (int(lo), int(hi))
    if np.isnan(lo) or np.isnan(hi):
        return full_range(dtype)
    return (float(lo), float(hi))


def _products(a, b) -> list:
    out = []
    for x in a:
        for y in b:
            p = x * y
            if isinstance(p, float) and math.isnan(p):  # 0 * inf
                return [-math.inf, math.inf]
            out.append(p)
    return out


def _call_range(call, name, args, dtype) -> tuple:
    """Interval of one op call from its operands' intervals (``args``)."""
    full = full_range(dtype)
    if name in _IDENTITY:
        return args[0]
    if name == "cast":
        lo, hi = args[0]
        if _is_int(dtype) and not _is_int(str(call.args[0].checked_type.dtype)):
            if math.isinf(lo) or math.isinf(hi):
                return full
            lo, hi = math.trunc(lo), math.trunc(hi)
        return _fit(lo, hi, dtype)
    if name in ("add", "subtract", "multiply") and len(args) == 2:
        (alo, ahi), (blo, bhi) = args
        if name == "add":
            lo, hi = alo + blo, ahi + bhi
        elif name == "subtract":
            lo, hi = alo - bhi, ahi - blo
        else:
            prods = _products((alo, ahi), (blo, bhi))
            lo, hi = min(prods), max(prods)
        return _fit(lo, hi, dtype)
    if name == "nn.relu":
        lo, hi = args[0]
        return (max(lo, 0), max(hi, 0))
    if name == "clip":
        lo, hi = args[0]
        a_min, a_max = float(call.attrs.a_min), float(call.attrs.a_max)
        if _is_int(dtype):
            a_min, a_max = math.floor(a_min), math.ceil(a_max)
        clamp = lambda v: min(max(v, a_min), a_max)  # noqa: E731
        return _fit(clamp(lo), clamp(hi), dtype)
    if name == "right_shift" and _is_int(dtype):
        shift = call.args[1]
        if isinstance(shift, relay.Constant) and shift.data.numpy().size == 1:
            k = int(shift.data.numpy().reshape(()))
            if 0 <= k < _bits(dtype):
                lo, hi = args[0]
                return (lo >> k, hi >> k)
        return full
    if name in _MONOTONE and not _is_int(dtype):
        lo, hi = args[0]
        f = _MONOTONE[name]
        return tuple(v if math.isinf(v) else float(f(v)) for v in (lo, hi))
    if name in ("maximum", "minimum") and len(args) == 2:
        pick = max if name == "maximum" else min
        return (pick(args[0][0], args[1][0]), pick(args[0][1], args[1][1]))
    return full


def value_ranges(nodes) -> dict:
    """node -> ``(lo, hi)`` for every tensor-typed node of ``nodes`` (post-order, typed).

    Nodes that are not tensors (tuples, ops, functions) are left out.
    """
    from ._util import op_name

    out: dict = {}
    for node in nodes:
        ty = getattr(node, "_checked_type_", None)
        if not isinstance(ty, relay.TensorType):
            continue
        dtype = str(ty.dtype)
        if isinstance(node, relay.Constant):
            out[node] = _const_range(node)
            continue
        name = op_name(node) if isinstance(node, relay.Call) else None
        if name is None:
            out[node] = full_range(dtype)
            continue
        args = [out.get(a) for a in node.args]
        if any(a is None for a in args):
            out[node] = full_range(dtype)
            continue
        out[node] = _call_range(node, name, args, dtype)
    return out
