"""AffineEightBitJoin: an elementwise function of two 8-bit tensors becomes one integer affine form.

Rewrites, when the two agree on every pair of input values (checked exhaustively at compile time)::

    # f(a: 8-bit, b: 8-bit) -> clip((int32(a) * Ma + int32(b) * Mb + C) >> n, lo, hi)

Walked by hand: a chain is what a dataflow analysis finds to depend on two 8-bit values (or two
lookups of integer tables) and to compute in float or through an integer rounding product
(``fixed_point_multiply``: a QNN add lowered to integers). Where the whole chain has no form (two
roundings) or ends in float, the latest integer ``clip`` or ``cast`` inside it that has one is
rewritten and the rest of the chain stays.

Why, how the integers are found, what it rejects and where it runs: docs/passes.md, section "Design
notes", ``AffineEightBitJoin``.
"""
from __future__ import annotations

import numpy as np

import tvm
from tvm import relay

from ._registry import register_pass

from ._doc import factory_sections
from ._eight_bit import TRAPPING, domain, elementwise, evaluate, small_constant
from ._util import (Reject, consumers, dataflow_nodes, function_pass, op_name, pass_logger, rebuild, static_shape,
                    static_tensor_type, with_body)
from tvm_ext.ops import TABLE_LOOKUP

PASS_NAME = "AffineEightBitJoin"
RULE = "f(a: 8-bit, b: 8-bit) -> clip((a * Ma + b * Mb + C) >> n, lo, hi)"
_log = pass_logger(PASS_NAME)

_EIGHT_BIT = ("uint8", "int8")
_INT32 = (-(2 ** 31), 2 ** 31 - 1)
#: A margin the linear program's own tolerance could make (no int32 form resolves one this small).
_NO_MARGIN = 1e-9
#: Integer ops whose rounding products the form replaces: an integer chain holding one is worth rewriting.
_ROUNDING_PRODUCTS = frozenset({"fixed_point_multiply"})


def _is_float(node) -> bool:
    return str(node.checked_type.dtype).startswith(("float", "bfloat"))


def _is_int(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def _int32_at_most(dtype: str) -> bool:
    return _is_int(dtype) and tvm.DataType(dtype).bits <= 32


def _cast_in_range(node, ranges) -> bool:
    """A float -> integer cast whose operand provably fits the integer type (else its value is undefined)."""
    from ._intervals import full_range

    if op_name(node) != "cast" or not _is_float(node.args[0]):
        return True
    lo, hi = ranges.get(node.args[0], (-np.inf, np.inf))
    tlo, thi = full_range(str(node.checked_type.dtype))
    return tlo <= lo and hi <= thi


def _lookup_values(node):
    """The distinct entries of the constant integer table that ``node`` looks up (at most 256), or None."""
    if op_name(node) != TABLE_LOOKUP or not isinstance(node.args[1], relay.Constant) or not static_tensor_type(node):
        return None
    dtype = str(node.checked_type.dtype)
    if not _int32_at_most(dtype):
        return None
    values = np.unique(node.args[1].data.numpy()).astype(dtype)
    return values if values.size <= 256 else None


def _costly(node) -> bool:
    """Float arithmetic or an integer rounding product: work the integer form removes."""
    return _is_float(node) or op_name(node) in _ROUNDING_PRODUCTS


def _pair_sources(nodes, ranges):
    """``(sources, costly)``: node -> the set of at most two sources it is an elementwise function of
    (empty for a small constant, None for neither), and the nodes whose chain computes in float or
    through an integer rounding product (:func:`_costly`).

    A node inherits its arguments' sources when it is elementwise, has their shape and computes no
    trapping integer division or undefined cast; otherwise it is a source itself when it has an 8-bit
    domain or looks up a constant integer table (its values: the table's entries). Readers see an
    8-bit node as a source (an 8-bit node of two sources ends a chain): the form reads the 8-bit
    tensor the float chain read, not the wider value it was narrowed from, so what crosses kernels
    stays 8 bits.
    """
    src: dict = {}
    seen_by_readers: dict = {}
    costly = set()
    for node in nodes:
        if isinstance(node, relay.Constant):
            src[node] = seen_by_readers[node] = frozenset() if small_constant(node) else None
            continue
        inherited = None
        if elementwise(node) and static_tensor_type(node) and _cast_in_range(node, ranges) and not (
                op_name(node) in TRAPPING and _is_int(str(node.checked_type.dtype))):
            union, ok = set(), True
            for arg in node.args:
                s = seen_by_readers.get(arg)
                if s is None or (s and static_shape(arg) != static_shape(node)):
                    ok = False
                    break
                union |= s
            if ok and 1 <= len(union) <= 2:
                inherited = frozenset(union)
        if inherited is not None:
            src[node] = inherited
            if _costly(node) or any(a in costly for a in node.args):
                costly.add(node)
        else:
            is_source = domain(node, ranges) is not None or _lookup_values(node) is not None
            src[node] = frozenset({node}) if is_source else None
        eight_bit = src[node] is not None and str(node.checked_type.dtype) in _EIGHT_BIT  # a source: a tensor
        seen_by_readers[node] = frozenset({node}) if eight_bit else src[node]
    return src, costly


def _roots(nodes, body, src, costly, position):
    """``([(root, (a, b))], rejected)``: every maximal two-source chain that does costly work, those that
    end in an integer of at most 32 bits first, then ``rejected``, the same of those that do not
    (``position``: each node's index in ``nodes``, which orders a chain's two sources)."""
    users = consumers(nodes)
    found, rejected = [], []
    for node in nodes:
        s = src.get(node)
        if s is None or len(s) != 2 or node not in costly:
            continue
        dtype = str(node.checked_type.dtype)
        maximal = (dtype in _EIGHT_BIT or node.same_as(body)
                   or any(src.get(u) != s for u, _ in users.get(node, [])))
        if not maximal:
            continue
        chain = (node, tuple(sorted(s, key=position.get)))
        if _int32_at_most(dtype):
            found.append(chain)
            continue
        _log.debug("%s: not rewritten (%s): %s", RULE, Reject(f"the chain ends in {dtype}, not an integer of "
                                                              "at most 32 bits"), op_name(node))
        rejected.append(chain)
    return found, rejected


def _values(source, ranges):
    """Every value ``source`` takes: its table's entries (a lookup), else its domain."""
    table = _lookup_values(source)
    if table is not None:
        return table
    dtype, lo, n, _ = domain(source, ranges)
    return np.arange(lo, lo + n).astype(dtype)


def _tables(chains, ranges) -> list:
    """Each chain's value on every pair of its sources' values: one ``relay.build`` for plain ``llvm``
    with products rounded before their sums (no fused multiply-add), as the oracle computes."""
    outs, feeds, unique, index = [], {}, {}, []
    for root, (a, b) in chains:
        va, vb = _values(a, ranges), _values(b, ranges)
        xa = relay.var(f"a{len(outs)}", shape=(va.size * vb.size,), dtype=str(va.dtype))
        xb = relay.var(f"b{len(outs)}", shape=(va.size * vb.size,), dtype=str(vb.dtype))
        expr = relay.reshape(rebuild(root, {a: xa, b: xb}), (va.size * vb.size,))
        key = (tvm.ir.structural_hash(expr), va.tobytes(), vb.tobytes())
        if key not in unique:  # the same chain with the same constants: one evaluation
            unique[key] = len(outs)
            outs.append(expr)
            feeds[xa] = np.repeat(va, vb.size)
            feeds[xb] = np.tile(vb, va.size)
        index.append(unique[key])
    values = evaluate(feeds, outs)
    return [values[i].astype(np.int64) for i in index]


def _widest_margin(rows, bounds, a, b, f, inner, batch: int = 2000, rounds: int = 20):
    """``(ma, mb, c, d)`` maximizing ``d`` subject to ``rows @ (ma, mb, c, d) <= bounds``, or None.

    By constraint generation: a linear program over the ``batch`` rows nearest to binding under the
    least-squares fit of ``f + 1/2`` on the inner levels, then over those plus the most violated rows of
    its solution, until the solution meets every row (then it is the optimum over all of them); after
    ``rounds`` without that, over every row.
    """
    from scipy.optimize import linprog  # scipy comes with TVM's wheel

    fit = np.linalg.lstsq(np.stack([a, b, np.ones(len(a))], 1)[inner], f[inner] + 0.5, rcond=None)[0] \
        if inner.any() else np.zeros(3)
    def solve(chosen):
        lp = linprog([0, 0, 0, -1], A_ub=rows[chosen], b_ub=bounds[chosen], bounds=[(None, None)] * 3 + [(-1, 0.5)],
                     method="highs")
        return lp.x if lp.status == 0 else None

    chosen = np.argsort(bounds - rows[:, :3] @ fit)[:batch]
    for _ in range(rounds):
        x = solve(chosen)
        if x is None:
            return None
        slack = bounds - rows[:, :3] @ x[:3]
        if slack.min() >= x[3] - 1e-7:  # within HiGHS's feasibility tolerance
            return x
        chosen = np.union1d(chosen, np.argsort(slack)[:batch])
    return solve(np.arange(len(rows)))  # not converged: every row at once


def affine_form(va, vb, table):
    """``(Ma, Mb, C, n, lo, hi)`` with ``clip((a * Ma + b * Mb + C) >> n, lo, hi) == table`` for every pair
    ``(a, b)`` of ``va x vb`` (``table`` in that order, ``a`` major), every partial sum inside int32; or a
    :class:`Reject` saying why there is none.

    A linear program finds the real ``(ma, mb, c)`` with the widest margin ``d`` to the rounding
    boundaries of one output level (``table + d <= a*ma + b*mb + c <= table + 1 - d``); ``n`` is the
    largest shift for which the scaled form fits int32; the integers are the rounded solution or a
    neighbour, with ``C`` taken from the exact interval that every pair allows. The result is checked
    on every pair.
    """
    a = np.repeat(np.asarray(va, np.int64), len(vb))
    b = np.tile(np.asarray(vb, np.int64), len(va))
    f = np.asarray(table, np.int64).ravel()
    lo, hi = int(f.min()), int(f.max())
    if lo == hi:
        return Reject(f"the chain is constant ({lo})")
    above, below = f > lo, f < hi  # levels above the lowest bound the form from below, and vice versa
    ones = np.ones(len(f))
    rows = np.concatenate([np.stack([-a, -b, -ones, ones], 1)[above], np.stack([a, b, ones, ones], 1)[below]])
    bounds = np.concatenate([-f[above], f[below] + 1]).astype(np.float64)
    x = _widest_margin(rows, bounds, a, b, f, above & below)
    if x is None or x[3] <= _NO_MARGIN:
        return Reject("no affine function of the two inputs rounds to the chain's value on every pair "
                      f"(widest margin {'none' if x is None else x[3]})")
    ma, mb, c, margin = x
    corners = [(p, q) for p in (a.min(), a.max()) for q in (b.min(), b.max())]
    largest = max(max(abs(ma * p), abs(mb * q), abs(ma * p + mb * q), abs(ma * p + mb * q + c)) for p, q in corners)
    n = min(30, int(np.floor(np.log2(_INT32[1] / (largest * 1.001 + 1)))))
    if n < 1:
        return Reject(f"the form needs values beyond int32 (largest partial sum {largest:.3g} levels)")
    scale = 1 << n
    near = sorted(((i, j) for i in range(-2, 3) for j in range(-2, 3)), key=lambda p: abs(p[0]) + abs(p[1]))
    for i, j in near:
        m_a, m_b = int(round(ma * scale)) + i, int(round(mb * scale)) + j
        t = a * m_a + b * m_b
        c_lo = int((f[above] * scale - t[above]).max())
        c_hi = int(((f[below] + 1) * scale - 1 - t[below]).min())
        if c_lo > c_hi:
            continue
        c_int = (c_lo + c_hi) // 2
        partial = np.concatenate([a * m_a, b * m_b, t, t + c_int])
        if partial.min() < _INT32[0] or partial.max() > _INT32[1]:
            continue
        if np.array_equal(np.clip((t + c_int) >> n, lo, hi), f):
            return (m_a, m_b, c_int, n, lo, hi)
    return Reject(f"no integer form within int32 at shift {n} (margin {margin:.2g} of a level)")


def _as_int32(x):
    return x if str(x.checked_type.dtype) == "int32" else relay.cast(x, "int32")


def _integer(root, a, b, form):
    m_a, m_b, c, n, lo, hi = form
    i32 = "int32"
    terms = [relay.multiply(_as_int32(x), relay.const(m, i32)) for x, m in ((a, m_a), (b, m_b)) if m != 0]
    t = terms[0] if len(terms) == 1 else relay.add(terms[0], terms[1])
    t = relay.right_shift(relay.add(t, relay.const(c, i32)), relay.const(n, i32))
    out = relay.clip(t, lo, hi)
    dtype = str(root.checked_type.dtype)
    return out if dtype == i32 else relay.cast(out, dtype)


def _inner_points(root, src, costly, position):
    """The integer ``clip`` and ``cast`` calls inside ``root``'s chain (its two sources, costly work
    before them), latest first: where a requantize inside the chain ends, so the chain up to there
    rounds once less than the whole (or ends in an integer where the whole ends in float)."""
    s, found, stack, seen = src[root], [], list(root.args), set()
    while stack:
        node = stack.pop()
        if node in seen or src.get(node) != s:
            continue
        seen.add(node)
        stack.extend(node.args)
        if op_name(node) in ("clip", "cast") and node in costly and _int32_at_most(str(node.checked_type.dtype)):
            found.append(node)
    return sorted(found, key=position.get, reverse=True)


def _forms(chains, ranges) -> list:
    """The integer form (or a Reject) of each ``(root, (a, b))``."""
    return [affine_form(_values(a, ranges), _values(b, ranges), table)
            for (_, (a, b)), table in zip(chains, _tables(chains, ranges))]


def _rewrite(func):
    from ._intervals import value_ranges

    nodes = dataflow_nodes(func, PASS_NAME)
    if nodes is None:
        return func
    ranges = value_ranges(nodes)
    src, costly = _pair_sources(nodes, ranges)
    position = {node: i for i, node in enumerate(nodes)}
    chains, rejected = _roots(nodes, func.body, src, costly, position)
    if not chains and not rejected:
        return func
    subst, total = {}, len(chains) + len(rejected)
    for (root, pair), form in zip(chains, _forms(chains, ranges) if chains else []):
        if isinstance(form, Reject):
            _log.debug("%s: not rewritten (%s): %s", RULE, form, op_name(root))
            rejected.append((root, pair))
            continue
        subst[root] = _integer(root, *pair, form)
    inner = [[(point, pair) for point in _inner_points(root, src, costly, position)] for root, pair in rejected]
    candidates = [c for group in inner for c in group]
    forms = dict(zip(candidates, _forms(candidates, ranges))) if candidates else {}
    for group in inner:  # the latest point of each chain with a form; the chain after it stays
        for point, pair in group:
            form = forms[(point, pair)]
            if isinstance(form, Reject):
                _log.debug("%s: not rewritten up to an inner %s (%s)", RULE, op_name(point), form)
                continue
            _log.debug("%s: rewritten up to an inner %s; the chain after it stays", RULE, op_name(point))
            subst[point] = _integer(point, *pair, form)
            break
    if not subst:
        return func
    _log.info("%s: %d of %d two-input chain(s) rewritten in integers", RULE, len(subst), total)
    return with_body(func, rebuild(func.body, subst))


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def AffineEightBitJoin():  # pylint: disable=invalid-name
    """Replace every elementwise function of two 8-bit tensors that computes in float (or through an
    integer ``fixed_point_multiply``) and equals an integer affine form on all of their value pairs by
    that form: ``clip((a * Ma + b * Mb + C) >> n, lo, hi)`` in int32.

    A QDQ residual add, ``quantize(dequantize(a) + dequantize(b))``, computes in float32 (two
    products, a sum, a division by the output scale, a rounding, a clip); the integer form is four
    multiply-adds and a shift per element, and it fuses into the producer's kernel where the float
    chain was. The function is computed by TVM on every pair of input values at compile time, as a
    plain ``llvm`` build computes it, and the integers are found so that the form equals it on every
    pair (exact by exhaustion). A QNN add lowered to integers (each input requantized by a
    ``fixed_point_multiply``, then summed) is such a function too, and an input may be a lookup of a
    constant integer table (its values: the table's entries). When the whole chain has no form (a
    second requantize after the add rounds again) or ends in float (a dequantize for a float
    reader), the latest integer ``clip``/``cast`` inside it that has one is replaced and the rest of
    the chain reads it. Part of :func:`tvm_ext.core.pipelines.int8`; run at ``before_fuse``.

    Notes
    -----
    Skipped (left unchanged, reason logged at DEBUG on ``tvm_ext.passes.AffineEightBitJoin``): functions
    no affine form rounds to (for instance a sum of two equally scaled inputs divided by twice their
    scale, whose exact halves round away from zero on both signs), forms that need more than int32,
    chains with a per-channel (more than one element) constant, with an integer division, with a float
    cast to an integer of values outside it, ending in float with no integer point inside that has a
    form, integer chains without a ``fixed_point_multiply`` (nothing to remove), dynamic shapes,
    functions with ``If``/``Let``/``Match``/references/closures.
    """
    return function_pass(PASS_NAME, _rewrite)
