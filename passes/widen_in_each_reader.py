"""WidenInEachReader: a dequantized value with several readers crosses as 8 bits; each reader widens it.

Rewrites::

    # v = w_k(...w_1(n)...), readers r_1(v), ..., r_m(v)  (m >= 2; each r_i elementwise/broadcast,
    #                                                      a reduction, or a pool FuseWideningIntoPool
    #                                                      takes)
    #   -> c = n (8-bit typed) or cast(n, u8|i8) (clip);  r_i(w_k(...w_1(widen(c))...)), a copy each
    #      widen(c) = c, or cast(c, dtype(n)) for the clip form

    # v = clip(y, lo, hi) (int, [lo, hi] in 8 bits), readers cast(v, u8), r_2(v), ..., r_m(v)
    #   -> c = cast(v, u8);  cast(v, u8) -> c,  r_i(cast(c, dtype(v)))

Walked by hand: the shared value has any number of readers and its chain any length.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``WidenInEachReader``.
"""
from __future__ import annotations

from tvm import relay

from ._registry import register_pass

from ._chains import chain_arg, copy_chain, narrow_type, takes_widening
from ._doc import factory_sections
from ._util import Reject, fixed_point, function_pass, op_name, pass_logger, static_tensor_type, substitute

__all__ = ["WidenInEachReader"]

PASS_NAME = "WidenInEachReader"
_log = pass_logger(PASS_NAME)
_MAX_CHAIN = 64
#: sweeps before giving up: a rewrite can free a chain for the next sweep (docs/passes.md)
_MAX_ROUNDS = 8


def _match(v, users, body):
    """(n, narrow dtype, kind, readers) for a shared widened value ``v``, or a Reject."""
    readers = users.get(v, [])
    if len(readers) < 2:
        return Reject("fewer than two readers")
    if len({id(r) for r, _ in readers}) < 2:  # x * x: the reader's kernel widens it once either way
        return Reject("one reader, reading it more than once")
    if v.same_as(body):
        return Reject("the value is also the function's result")
    ok = static_tensor_type(v)
    if not ok:
        return ok
    nv = narrow_type(v)
    if nv and nv[1] == "typed":
        return Reject("the value is 8-bit already")
    if nv:  # v is itself a clip to 8-bit bounds, typed wider: it would cross wide
        bad = _bad_reader(readers)
        return bad if bad is not None else (v, nv[0], "clip", [], readers)
    node, chain = v, []
    for _ in range(_MAX_CHAIN):
        chain.append(node)
        prev = chain_arg(node)
        if prev is None:
            return Reject("no 8-bit point on its private elementwise chain")
        nt = narrow_type(prev)
        if nt:
            if nt[1] == "clip" and len(users.get(prev, [])) != 1:
                return Reject("the 8-bit clip has other readers")
            break
        if len(users.get(prev, [])) != 1:
            return Reject("an intermediate value of the chain has other readers")
        node = prev
    else:
        return Reject(f"chain longer than {_MAX_CHAIN} calls")
    bad = _bad_reader(readers)
    return bad if bad is not None else (prev, nt[0], nt[1], chain, readers)


def _bad_reader(readers):
    """A Reject naming the first reader that is neither elementwise/broadcast, a reduction nor a
    pool, else None."""
    for r, _ in readers:
        if not takes_widening(r):
            return Reject(f"reader {op_name(r) or type(r).__name__} is neither elementwise/broadcast, a reduction "
                          f"nor a pool")
    return None


def _is_cast_to(node, dtype: str) -> bool:
    return op_name(node) == "cast" and str(node.checked_type.dtype) == dtype


def _run(func):
    """Sweeps of :func:`_sweep` until none rewrites (at most :data:`_MAX_ROUNDS`)."""
    return fixed_point(func, _sweep, PASS_NAME, _MAX_ROUNDS)


def _collect(nodes, users, body) -> dict:
    """One sweep: each reader of a shared widened value, rewritten to read its own copy of the chain."""
    subst: dict = {}
    for v in nodes:
        if not (isinstance(v, relay.Call) and len(users.get(v, [])) >= 2):
            continue
        m = _match(v, users, body)
        if isinstance(m, Reject):
            _log.debug("%s: not rewritten: %s", op_name(v), m)
            continue
        n, dtype, kind, chain, readers = m
        c = n if kind == "typed" else relay.cast(n, dtype)  # the value crossing: 8 bits
        for r in dict.fromkeys(r for r, _ in readers):
            if not chain and _is_cast_to(r, dtype):  # the clip's own narrowing cast: it is c
                subst[r] = c
                continue
            r_new = subst.get(r, r)
            # a fresh copy of the chain per reader: w_k(...w_1(widen(c))...)
            copy = copy_chain(chain, c if kind == "typed" else relay.cast(c, str(n.checked_type.dtype)))
            args = [copy if a.same_as(v) else a for a in r_new.args]
            subst[r] = relay.Call(r_new.op, args, r_new.attrs, r_new.type_args, r_new.span)
        _log.info("%s %s %s: crosses as %s; each of its %d readers widens it", op_name(v), v.checked_type.dtype,
                  [int(d) for d in v.checked_type.shape], dtype, len(readers))
    return subst


def _sweep(func):
    return substitute(func, PASS_NAME, _collect)


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def WidenInEachReader():  # pylint: disable=invalid-name
    """Let a widened (dequantized) value with several readers cross kernels as its 8-bit source.

    ``v = w(n)``, a private elementwise chain from an 8-bit value ``n``, read by several
    elementwise/broadcast calls or pools, becomes one copy of ``w`` per reader on the 8-bit ``n``
    (``cast(n, u8)`` for a ``clip`` to 8-bit bounds): the producer's kernel writes 8 bits, each
    reader's kernel widens. Exact; no kernel added (with ``FuseWideningIntoPool`` after it for
    pool readers).

    Use at stage ``before_fuse``, before ``FuseWideningIntoPool``.

    Notes
    -----
    Rejections are logged at DEBUG on ``tvm_ext.passes.WidenInEachReader``, rewrites at INFO.
    """
    return function_pass(PASS_NAME, _run)
