"""NarrowBeforeMaxPool: quantize before max pooling, so the producer kernel writes 8 bits.

Rewrites::

    # f(max_pool(x)) == max_pool(f(x))     f elementwise, monotone non-decreasing,
    #                                       constant along the pooled axes
    #   n = f(P(x))  ->  P(f(x))                          n typed 8-bit
    #   n = f(P(x))  ->  cast(P(cast(f(x), i8)), dtype(n))  n = clip(..) within int8 (u8 alike)

    # rule 2, the pool after a widening chain g of an 8-bit n (a dequantize in front of the pool):
    #   P(g(n)) -> g(P(n))                                n typed 8-bit
    #   P(g(n)) -> g(cast(P(cast(n, u8|i8)), dtype(n)))   n = clip(..) within uint8 (int8 alike)
    #   (g's first link a cast: it reads the pooled 8-bit value directly)

Walked by hand: the chains have any length, each link checked against :data:`MONOTONE` (ordered data).

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``NarrowBeforeMaxPool``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tvm import relay

from ._registry import register_pass

from . import _layout
from ._chains import copy_chain, narrow_type
from ._doc import factory_sections
from ._intervals import full_range, value_ranges
from ._util import (Reject, count_calls, fixed_point, function_pass, op_calls, op_name, pass_logger, rebuild,
                    static_tensor_type, substitute)

__all__ = ["NarrowBeforeMaxPool", "MAX_POOLS", "MAX_ROUNDS"]

PASS_NAME = "NarrowBeforeMaxPool"
_log = pass_logger(PASS_NAME)

MAX_POOLS = ("nn.max_pool1d", "nn.max_pool2d", "nn.max_pool3d", "nn.global_max_pool2d")
#: Sweeps at least allowed (:func:`_run`).
MAX_ROUNDS = 8


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def _int_range(dtype: str):
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _within(interval, dtype: str) -> bool:
    """``interval`` is a proven range strictly inside ``dtype`` (full range: may have wrapped)."""
    return interval is not None and tuple(interval) != full_range(dtype)


def _pooled_axes(pool) -> list[int]:
    """Positions of the spatial (D/H/W) axes in the pool's layout string."""
    try:
        return _layout.primal_positions(str(pool.attrs.layout), "DHW")
    except ValueError:
        return []


def _const_along(const, rank: int, axes: list[int]):
    """Reject when a (broadcast) constant varies along one of ``axes`` of a rank-``rank`` value."""
    shape = list(const.data.shape)
    if len(shape) > rank:
        return Reject(f"constant of rank {len(shape)} > {rank}")
    shape = [1] * (rank - len(shape)) + shape
    bad = [a for a in axes if shape[a] != 1]
    if bad:
        return Reject(f"constant of shape {list(const.data.shape)} varies along pooled axis {bad[0]}")
    return True


def _windows_hold_data(pool, in_shape, axes):
    """Every pooling window overlaps the unpadded input (so the padding value never wins)."""
    name = op_name(pool)
    if name == "nn.global_max_pool2d":
        return True
    a = pool.attrs
    nd = len(axes)
    size, strides, dil = list(a.pool_size), list(a.strides), list(a.dilation)
    pad = [int(p) for p in a.padding]
    pad = pad * 2 if len(pad) == nd else pad  # (before..., after...)
    out_shape = [int(d) for d in pool.checked_type.shape]
    for i, ax in enumerate(axes):
        n_in, n_out = int(in_shape[ax]), out_shape[ax]
        first_end = -pad[i] + (int(size[i]) - 1) * int(dil[i])
        last_start = (n_out - 1) * int(strides[i]) - pad[i]
        if first_end < 0 or last_start > n_in - 1:
            return Reject(f"a window along axis {ax} lies entirely in the padding")
    return True


# --- the monotone table ------------------------------------------------------------------------
@dataclass(frozen=True)
class _Link:
    """One call of the chain as a row's check sees it: ``call`` applied to the chain value ``value``
    (``prev``: the link before it, None at the pool), ``const`` its constant operand (None: unary)."""

    call: object
    value: object
    prev: object
    const: object
    ranges: object

    @property
    def name(self) -> str:
        return op_name(self.call)

    @property
    def in_dtype(self) -> str:
        return str(self.value.checked_type.dtype)

    @property
    def out_dtype(self) -> str:
        return str(self.call.checked_type.dtype)

    @property
    def value_first(self) -> bool:
        return self.call.args[0].same_as(self.value)


@dataclass(frozen=True)
class Monotone:
    """A row of :data:`MONOTONE`: calls of ``ops`` on a chain value of dtype class ``dtypes``
    (``"any"``, ``"float"``, ``"int"``) are non-decreasing when ``check(link)`` is true."""

    ops: tuple
    dtypes: str
    check: Callable


def _holds(link):
    return True


def _value_first(link):  # c - v and c / v decrease in v
    return True if link.value_first else Reject(f"constant {link.name} chain value is decreasing")


def _constant_data(link):
    data = link.const.data.numpy()
    return Reject(f"{link.name} by NaN") if np.isnan(data).any() else data


def _nonnegative_factor(link):
    data = _constant_data(link)
    if isinstance(data, Reject):
        return data
    return True if (data >= 0).all() else Reject("multiply by a negative constant (decreasing)")


def _positive_divisor(link):
    ok = _value_first(link)
    if not ok:
        return ok
    data = _constant_data(link)
    if isinstance(data, Reject):
        return data
    return True if (data > 0).all() else Reject("divide by a non-positive constant")


def _no_wrap(link):
    if link.ranges is None or not _within(link.ranges.get(link.call), link.out_dtype):
        return Reject(f"integer {link.name} can wrap around (no proven range)")
    return True


def _value_first_no_wrap(link):
    if not link.value_first:
        return Reject(f"integer {link.name} is not in the monotone table")
    return _no_wrap(link)


def _monotone_cast(link):
    in_dtype, out_dtype = link.in_dtype, link.out_dtype
    if _is_float(out_dtype):
        return True  # float -> float and int -> float: rounding is monotone
    lo, hi = _int_range(out_dtype)
    if not _is_float(in_dtype) and lo <= _int_range(in_dtype)[0] and hi >= _int_range(in_dtype)[1]:
        return True  # widening integer cast
    prev = link.prev
    if prev is not None and op_name(prev) == "clip" and lo <= float(prev.attrs.a_min) \
            and float(prev.attrs.a_max) <= hi:
        return True
    return Reject(f"narrowing cast {in_dtype}->{out_dtype} not right after a clip into its range")


#: The links accepted in a chain (``v`` the chain value, ``c`` a constant that is the same along the
#: pooled axes): the first row of the call's op and dtype class decides; a call no row names is
#: rejected. Each row: ``f`` is monotone non-decreasing in ``v`` under its check.
MONOTONE = (
    # relu(v), clip(v), round(v), floor(v), ceil(v), trunc(v), rne(v)       any dtype
    Monotone(("nn.relu", "clip", "round", "floor", "ceil", "trunc", "tvm_ext.round_half_to_even"), "any", _holds),
    # maximum(v, c), minimum(v, c), either order                            any dtype
    Monotone(("maximum", "minimum"), "any", _holds),
    # v + c, c + v                                                          float (rounding is monotone)
    Monotone(("add",), "float", _holds),
    # v - c                                                                 float
    Monotone(("subtract",), "float", _value_first),
    # v * c, c * v                                                          float, every c >= 0
    Monotone(("multiply",), "float", _nonnegative_factor),
    # v / c                                                                 float, every c > 0
    Monotone(("divide",), "float", _positive_divisor),
    # v + c, c + v                                                          integer, no wrap-around proven
    Monotone(("add",), "int", _no_wrap),
    # v - c                                                                 integer, no wrap-around proven
    Monotone(("subtract",), "int", _value_first_no_wrap),
    # cast(v): widening, int -> float, float -> float; narrowing right after a clip into its range
    Monotone(("cast",), "any", _monotone_cast),
)


def _link(call, value, prev, axes, rank, ranges=None):
    """True when ``call`` (applied to chain value ``value``) is a link of :data:`MONOTONE`; or a Reject.

    ``ranges`` (:func:`~tvm_ext.passes._intervals.value_ranges` of the function) admits integer
    ``add``/``subtract`` of a constant whose result is proven not to wrap around.
    """
    name = op_name(call)
    if name is None:
        return Reject("a function call in the chain")
    others = [a for a in call.args if not a.same_as(value)]
    if len(others) != len(call.args) - 1:
        return Reject(f"{name} reads the chain value twice")
    for c in others:
        if not isinstance(c, relay.Constant):
            return Reject(f"{name} has a non-constant operand")
        ok = _const_along(c, rank, axes)
        if not ok:
            return Reject(f"{name}: {ok}")
    link = _Link(call, value, prev, others[0] if others else None, ranges)
    kind = "float" if _is_float(link.in_dtype) else "int"
    for row in MONOTONE:
        if name in row.ops and row.dtypes in ("any", kind):
            return row.check(link)
    named = any(name in row.ops for row in MONOTONE)
    return Reject(f"{'integer ' if named and kind == 'int' else ''}{name} is not in the monotone table")


def _pool_checks(pool, users):
    """The pooled axes when either rule may apply to ``pool``; or a Reject."""
    ok = static_tensor_type(pool)
    if not ok:
        return ok
    x = pool.args[0]
    if len(users.get(x, ())) != 1:
        return Reject("its input has other users (the wide tensor crosses anyway)")
    out_layout = str(getattr(pool.attrs, "out_layout", "") or "")
    if out_layout and out_layout != str(pool.attrs.layout):
        return Reject(f"output layout {out_layout} differs from {pool.attrs.layout}")
    axes = _pooled_axes(pool)
    if not axes:
        return Reject(f"no spatial axis in layout {pool.attrs.layout}")
    ok = _windows_hold_data(pool, x.checked_type.shape, axes)
    if not ok:
        return ok
    if narrow_type(pool):  # a pool is never a clip: this is the uint8/int8 case
        return Reject("it already pools an 8-bit value")
    return axes


def _rewrite(pool, users, body, axes, ranges):
    """Rule 1: ``(n, replacement)`` for a pool and its quantizing chain after it; or a Reject."""
    x = pool.args[0]
    rank = len(pool.checked_type.shape)
    shape = [int(d) for d in pool.checked_type.shape]
    value, prev = pool, None
    while True:
        if value.same_as(body):
            return Reject("the chain ends at the function output before an 8-bit value")
        us = users.get(value, ())
        if len(us) != 1:
            return Reject(f"{'its output' if prev is None else op_name(prev)} has {len(us)} users")
        call = us[0][0]
        if not isinstance(call, relay.Call):
            return Reject(f"its chain reaches a {type(call).__name__}")
        ok = _link(call, value, prev, axes, rank, ranges)
        if not ok:
            return ok
        if [int(d) for d in call.checked_type.shape] != shape:
            return Reject(f"{op_name(call)} changes the shape")
        narrow = narrow_type(call)
        if narrow:
            break
        value, prev = call, call
    n, (dtype, kind) = call, narrow
    if kind == "clip" and not n.same_as(body):
        # prefer the typed value when the clip's only user is its cast to 8 bits
        after = users.get(n, ())
        if len(after) == 1 and isinstance(after[0][0], relay.Call) and op_name(after[0][0]) == "cast" \
                and narrow_type(after[0][0]) and _link(after[0][0], n, n, axes, rank, ranges):
            n, (dtype, kind) = after[0][0], narrow_type(after[0][0])
    chain_on_x = rebuild(n, {pool: x})
    if kind == "typed":
        # n = f(P(x)), 8-bit                     -> P(f(x))
        return n, relay.Call(pool.op, [chain_on_x], pool.attrs, pool.type_args, pool.span)
    # n = clip(...) of 8-bit integral values      -> cast(P(cast(f(x), u8|i8)), dtype(n))
    pooled = relay.Call(pool.op, [relay.cast(chain_on_x, dtype)], pool.attrs, pool.type_args, pool.span)
    return n, relay.cast(pooled, str(n.checked_type.dtype))


#: How far back from a pool rule 2 looks for the 8-bit value (elementwise links).
MAX_WIDENING_LINKS = 32


def _rewrite_widening(pool, users, axes, ranges):
    """Rule 2: ``(n, replacement)`` for a pool of a widening chain of an 8-bit ``n``; or a Reject."""
    x = pool.args[0]
    rank = len(x.checked_type.shape)
    shape = [int(d) for d in x.checked_type.shape]
    links, value = [], x
    while True:
        narrow = narrow_type(value)
        if narrow:
            break
        if len(links) >= MAX_WIDENING_LINKS or not isinstance(value, relay.Call):
            return Reject("no 8-bit value in front of it")
        if links and len(users.get(value, ())) != 1:
            return Reject(f"{op_name(value)} in front of it has other users")
        if [int(d) for d in value.checked_type.shape] != shape:
            return Reject(f"{op_name(value)} in front of it changes the shape")
        live = [a for a in value.args if not isinstance(a, relay.Constant)]
        if len(live) != 1:
            return Reject(f"{op_name(value) or 'a call'} in front of it has {len(live)} non-constant operands")
        links.append(value)
        value = live[0]
    if not links:
        return Reject("it pools a value computed in float (no 8-bit value in front of it)")
    n, (dtype, kind) = value, narrow
    if [int(d) for d in n.checked_type.shape] != shape:
        return Reject("the 8-bit value in front of it has another shape")
    prev, cur = (n if kind == "clip" else None), n
    for call in reversed(links):
        ok = _link(call, cur, prev, axes, rank, ranges)
        if not ok:
            return ok
        prev, cur = call, call
    if kind == "typed":
        # P(g(n)) -> g(P(n))                              n uint8/int8, g monotone
        pooled = relay.Call(pool.op, [n], pool.attrs, pool.type_args, pool.span)
    else:
        if len(users.get(n, ())) != 1:
            return Reject(f"the 8-bit clip in front of it has {len(users.get(n, ()))} users")
        # P(g(n)) -> g(cast(P(cast(n, u8|i8)), dtype(n)))  n = clip(..) of integral values
        pooled = relay.Call(pool.op, [relay.cast(n, dtype)], pool.attrs, pool.type_args, pool.span)
        if op_name(links[-1]) != "cast":  # a cast as g's first link reads the 8-bit value as well
            pooled = relay.cast(pooled, str(n.checked_type.dtype))
    return n, copy_chain(links, pooled)  # g on the pooled value (n occurs in it: no rebuild)


def _collect(nodes, users, body) -> dict:
    """One sweep's moves: a quantizing chain's end or a pool, replaced by the moved form."""
    subst: dict = {}
    ranges = None
    for node in op_calls(nodes, MAX_POOLS):
        axes = _pool_checks(node, users)
        if not axes:
            _log.debug("%s not rewritten: %s", op_name(node), axes)
            continue
        if ranges is None:
            ranges = value_ranges(nodes)
        out = _rewrite(node, users, body, axes, ranges)
        if isinstance(out, tuple):
            n, moved = out
            _log.info("%s now pools 8-bit values: the quantizing chain up to %s moved in front of it",
                      op_name(node), op_name(n))
            subst[n] = moved
            continue
        widening = _rewrite_widening(node, users, axes, ranges)
        if isinstance(widening, tuple):
            n, moved = widening
            _log.info("%s now pools 8-bit values: the widening chain from %s moved behind it",
                      op_name(node), op_name(n) or type(n).__name__)
            subst[node] = moved
            continue
        _log.debug("%s not rewritten: %s; %s", op_name(node), out, widening)
    return subst


def _sweep(func):
    return substitute(func, PASS_NAME, _collect)


def _run(func):
    """Sweeps until none rewrites: a chain moved in front of a pool may meet the next pool in front
    of that one (``f(pool(pool(x)))``). Each pool is crossed by a chain at most once
    per rule, so ``2 * pools + 1`` sweeps bound it (:data:`MAX_ROUNDS` at least)."""
    rounds = max(MAX_ROUNDS, 2 * count_calls(func.body, MAX_POOLS) + 1)
    return fixed_point(func, _sweep, PASS_NAME, rounds, on_cap="warn")


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def NarrowBeforeMaxPool():  # pylint: disable=invalid-name
    """Move the quantizing chain after a max pool in front of it, so the pool reads 8 bits.

    ``f(max_pool(x))`` becomes ``max_pool(f(x))`` when ``f`` is a private chain of monotone
    non-decreasing elementwise ops (the table :data:`MONOTONE`) ending at the first
    8-bit value, constant along the pooled axes. Exact (also in floating point); the chain then
    fuses into the producer's kernel, which writes the 8-bit tensor instead of a float32 one.
    Otherwise, ``max_pool(g(n))`` becomes ``g(max_pool(n))`` for such a chain ``g`` that widens
    an 8-bit ``n`` (a dequantize in front of the pool): the producer writes ``n``.

    Notes
    -----
    Rejections are logged at DEBUG on ``tvm_ext.passes.NarrowBeforeMaxPool``, rewrites at INFO.
    """
    return function_pass(PASS_NAME, _run)
