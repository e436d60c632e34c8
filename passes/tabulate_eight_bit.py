"""TabulateEightBit: an elementwise function of one 8-bit tensor becomes a 256-entry table lookup.

Walked by hand: a chain is what a dataflow analysis finds to depend on one 8-bit value, any shape.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``TabulateEightBit``.
"""
from __future__ import annotations

import collections

import numpy as np

import tvm
from tvm import relay

from tvm_ext.ops import EIGHT_BIT_OFFSET as _EIGHT_BIT
from tvm_ext.ops import register_ops, table_lookup
from ._registry import register_pass

from ._doc import factory_sections
from ._eight_bit import TRAPPING as _TRAPPING
from ._eight_bit import evaluate_each
from ._eight_bit import domain as _domain
from ._eight_bit import elementwise as _elementwise
from ._eight_bit import small_constant as _small_constant
from ._util import (Reject, consumers, dataflow_nodes, function_pass, op_name, pass_logger, rebuild, static_shape,
                    static_tensor_type, with_body)

PASS_NAME = "TabulateEightBit"
RULE = "f(x: 8-bit) -> table_lookup(x, [f(i) for i in 0..255])"
_log = pass_logger(PASS_NAME)

#: Ops whose presence makes a chain worth a table (LLVM calls libm for them, one element at a time).
TRANSCENDENTAL = frozenset({
    "sigmoid", "exp", "fast_exp", "tanh", "fast_tanh", "erf", "fast_erf", "log", "log2", "log10",
    "sqrt", "rsqrt", "power", "sin", "cos", "tan", "sinh", "cosh", "asin", "acos", "atan", "asinh",
    "acosh", "atanh",
})

#: A chain of at least this many ops is worth a table without any of them. An elementwise op costs at
#: least one vector instruction per register of lanes (16 int32/float32 lanes at AVX-512, 8 at AVX2,
#: 4 at NEON), more for the int64 fixed-point products and float conversions a requantize step holds;
#: a lookup costs a byte gather (about two instructions per element) where the back end has no vector
#: table instruction, a few instructions per 16 elements where it has one (AVX-512 VBMI, aarch64).
#: Measured (docs/passes.md): a 1x1 conv whose epilogue holds a quantized hard-swish as TVM imports
#: ONNX's HardSwish (18 ops), and PP-OCR cls v2 with its stepwise ones (21-24), run faster with the
#: lookup even as a byte gather (AVX2); a 10-op hard-sigmoid breaks even there, and a requantize
#: with a ReLU (9) stays arithmetic.
LONG_CHAIN = 16

_CONST = "const"


def _sources(nodes):
    """node -> its source (docs/passes.md), ``_CONST`` or None (depends on no single 8-bit tensor)."""
    from ._intervals import value_ranges

    ranges = value_ranges(nodes)
    src: dict = {}
    for node in nodes:
        if isinstance(node, relay.Constant):
            src[node] = _CONST if _small_constant(node) else None
            continue
        inherited = None
        if _elementwise(node) and static_tensor_type(node):
            seen, ok = set(), True
            for arg in node.args:
                s = src.get(arg)
                if s is _CONST:
                    continue
                if s is None or static_shape(arg) != static_shape(node):
                    ok = False
                    break
                seen.add(s)
            if ok and len(seen) == 1:
                inherited = seen.pop()
        if inherited is not None:
            src[node] = inherited
        else:
            src[node] = node if _domain(node, ranges) is not None else None
    return src, ranges


def _chain_ops(root, source, through=None):
    """How many times each op occurs between ``source`` and ``root`` (a ``Counter`` of op names;
    integer division ops as ``int:<name>``).

    With ``through``: the ops between ``through`` and ``root``, or None when a path from ``source``
    reaches ``root`` without passing ``through`` (``root`` is then not a function of ``through`` alone).
    """
    stop = source if through is None else through
    ops, stack, seen = collections.Counter(), [root], set()
    while stack:
        node = stack.pop()
        if node in seen or node.same_as(stop):
            continue
        if node.same_as(source):
            return None
        if not isinstance(node, relay.Call):
            continue
        seen.add(node)
        name = op_name(node)
        integer = str(node.checked_type.dtype).startswith(("int", "uint"))
        ops[f"int:{name}" if name in _TRAPPING and integer else name] += 1
        stack.extend(node.args)
    return ops


def _roots(nodes, body, src):
    """[(root, source)] of every maximal chain, in post-order."""
    users = consumers(nodes)
    found = []
    for node in nodes:
        s = src.get(node)
        if s is None or s is _CONST or s is node:
            continue
        outside = node.same_as(body) or any(src.get(u) is not s for u, _ in users.get(node, []))
        if outside:
            found.append((node, s))
    return found


def _tables(chains, ranges) -> list:
    """Evaluate every ``(root, source)`` chain on all values of its source with TVM; one build for all,
    for plain ``llvm`` with products rounded before sums, on any host (``_eight_bit.evaluate_each``);
    None for a chain TVM cannot build (the reason logged)."""
    inputs: dict = {}  # domain -> (var, values)
    outs, unique, index = [], {}, []
    for root, source in chains:
        dom = _domain(source, ranges)
        if dom not in inputs:
            dtype, lo, n, _ = dom
            inputs[dom] = (relay.var(f"values{len(inputs)}", shape=(n,), dtype=dtype),
                           np.arange(lo, lo + n).astype(dtype))
        expr = relay.reshape(rebuild(root, {source: inputs[dom][0]}), (dom[2],))
        key = tvm.ir.structural_hash(expr)
        if key not in unique:  # the same chain with the same constants: one table
            unique[key] = len(outs)
            outs.append(expr)
        index.append(unique[key])
    values = evaluate_each(dict(inputs.values()), outs)
    for value in values:
        if isinstance(value, str):
            _log.debug("%s: not tabulated (%s)", RULE, Reject(value))
    _log.debug("%s: %d distinct tables computed", PASS_NAME, sum(not isinstance(v, str) for v in values))
    return [None if isinstance(values[i], str) else values[i] for i in index]


def _existing_narrowings(nodes, roots) -> dict:
    """``(source, dtype) -> cast(source, dtype)`` for the 8-bit casts the function already has (none
    that a table replaces): a lookup of a wide source reads that cast instead of a second one, so the
    source keeps a single narrowing reader and still leaves its kernel as 8 bits."""
    found: dict = {}
    for node in nodes:
        if op_name(node) == "cast" and node not in roots and str(node.checked_type.dtype) in _EIGHT_BIT:
            found.setdefault((node.args[0], str(node.checked_type.dtype)), node)
    return found


def _lookup(source, table, ranges, narrowed):
    """``table_lookup`` of ``source``: cast to 8 bits when its proven range fits them, else shifted
    to index 0 where its domain starts elsewhere. One cast per source (``narrowed``: the function's
    own casts, then the ones made here), so a source read by several lookups, or by a lookup and an
    op that narrows it already, leaves its kernel once, as 8 bits, instead of as int32."""
    dtype, lo, _, narrow = _domain(source, ranges)
    tab = relay.const(table, str(table.dtype))  # relay.const alone makes a float64 table float32
    if narrow is not None:
        if (source, narrow) not in narrowed:
            narrowed[(source, narrow)] = relay.cast(source, narrow)
        return table_lookup(narrowed[(source, narrow)], tab)
    if dtype in _EIGHT_BIT or lo == 0:
        return table_lookup(source, tab)
    return table_lookup(relay.subtract(source, relay.const(lo, dtype)), tab)


def _why_a_table(used, ops: frozenset, long_chain: int) -> str:
    """Why the chain of op counts ``used`` is worth a table ("" when it is not): one of ``ops``, or
    at least ``long_chain`` ops."""
    slow = sorted(ops.intersection(used))
    if slow:
        return ", ".join(slow)
    length = sum(used.values())
    return f"{length} ops" if length >= long_chain else ""


def _drop_dequantized_readers(chains, ops, long_chain):
    """One table per 8-bit value: a root that is cheap arithmetic on another tabulated root of the
    same source keeps that arithmetic and reads the other root's lookup.

    ``r1 = q(silu(x))`` (uint8, read by a conv) and ``r2 = dequantize(r1)`` (float, read by a residual
    add) are both roots of ``x``; tabulated separately, ``x`` has two lookups as readers, so the
    first one cannot fuse into ``x``'s kernel and becomes a kernel of its own (ddddocr's YOLOX
    detector, QDQ: five extra kernels). ``r2`` is dropped from the chains: it then reads
    ``table_lookup(x, T1)`` through its own ops, which compute on the same values (exact).
    Roots are in post-order, so the inner root comes first; the nearest 8-bit one is taken.
    """
    kept = []
    for root, source in chains:
        inner = None
        for prev, prev_source in reversed(kept):
            if prev_source is not source or str(prev.checked_type.dtype) not in _EIGHT_BIT:
                continue
            tail = _chain_ops(root, source, through=prev)
            if tail is not None and not _why_a_table(tail, ops, long_chain):
                inner = prev
                break
        if inner is None:
            kept.append((root, source))
        else:
            _log.debug("%s: not tabulated (%s): %s", RULE, Reject(
                f"a function of the tabulated 8-bit {op_name(inner)} by cheap ops {sorted(tail)}: it reads that "
                "lookup (one table per value)"), op_name(root))
    return kept


def _rewrite(func, ops: frozenset, long_chain: int):
    nodes = dataflow_nodes(func, PASS_NAME)
    if nodes is None:
        return func
    src, ranges = _sources(nodes)
    chains, used_ops = [], set()
    for root, source in _roots(nodes, func.body, src):
        used = _chain_ops(root, source)
        why = _why_a_table(used, ops, long_chain)
        if not why:
            _log.debug("%s: not tabulated (%s): %s", RULE, Reject(
                f"no op of {sorted(ops)[:4]}... in the chain {sorted(used)}, and {sum(used.values())} ops, "
                f"fewer than {long_chain}"), op_name(root))
            continue
        trapping = sorted(o for o in used if o.startswith("int:"))
        if trapping:
            _log.debug("%s: not tabulated (%s): %s", RULE, Reject(
                f"integer division {trapping} in the chain: evaluating every value could divide by zero"),
                op_name(root))
            continue
        chains.append((root, source))
        used_ops.add(why)
    chains = _drop_dequantized_readers(chains, ops, long_chain)
    if not chains:
        return func
    tables = _tables(chains, ranges)
    chains, tables = [c for c, t in zip(chains, tables) if t is not None], [t for t in tables if t is not None]
    if not chains:
        return func
    narrowed = _existing_narrowings(nodes, {root for root, _ in chains})
    subst = {root: _lookup(source, tab, ranges, narrowed) for (root, source), tab in zip(chains, tables)}
    _log.info("%s: %d chain(s) tabulated (%s)", RULE, len(subst),
              ", ".join(sorted(used_ops)))
    return with_body(func, rebuild(func.body, subst))


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME, raises=(("TypeError", "``ops`` is not a collection of op names."),
                                     ("ValueError", "``long_chain`` is not a positive integer.")))
def TabulateEightBit(ops=TRANSCENDENTAL, long_chain=LONG_CHAIN):  # pylint: disable=invalid-name
    """Replace every elementwise function of one 8-bit tensor that calls a transcendental op, or
    that takes :data:`LONG_CHAIN` ops or more, by a 256-entry table lookup (``tvm_ext.table_lookup``),
    computed exactly by TVM at compile time.

    ``quantize(sigmoid(dequantize(x)))``, SiLU ``quantize(dequantize(x) * sigmoid(dequantize(x)))``,
    tanh, GELU (erf)...: on an 8-bit ``x`` each is a function of 256 values. The lookup is
    elementwise, so it fuses into the producer's kernel where the float chain was, and replaces one
    scalar ``expf`` call per element (LLVM has no vector exp) by one table read. So does a long chain
    of cheap ops: a quantized hard-swish exported as a quantized multiply, add, clip and divide, each
    requantized (PaddlePaddle's PP-OCR: some 50 ops with float divisions per element). Part of
    :func:`tvm_ext.core.pipelines.int8`; run at ``before_fuse``.

    Parameters
    ----------
    ops : frozenset of str, optional
        Op names that make a chain worth a table (default :data:`TRANSCENDENTAL`).
    long_chain : int, optional
        A chain of at least this many ops is worth a table without any of ``ops`` (default
        :data:`LONG_CHAIN`). Shorter chains without them are left alone: a table read costs more
        than a few vectorized arithmetic ops.

    Notes
    -----
    Skipped (left unchanged, reason logged at DEBUG on ``tvm_ext.passes.TabulateEightBit``):
    chains with an integer division or modulo (the table would evaluate it on every value, zero
    divisors included), chains with a per-channel (more than one element) constant, chains of two different tensors
    (``x * y``), broadcasting of a tensor inside the chain, dynamic shapes, functions with
    ``If``/``Let``/``Match``/references/closures, chains TVM cannot build (a ``clip`` whose bound its
    integer dtype cannot hold). The tables are computed by building the chains
    with ``relay.build`` for plain ``llvm`` with float products rounded before their sums, as the
    integer oracle and the x86 and aarch64 int8 builds compute them: the same tables on every host.
    """
    if isinstance(ops, str) or not all(isinstance(o, str) for o in ops):
        raise TypeError(f"{PASS_NAME}: ops must be a collection of op names, got {ops!r}")
    if isinstance(long_chain, bool) or not isinstance(long_chain, int) or long_chain < 1:
        raise ValueError(f"{PASS_NAME}: long_chain must be a positive integer, got {long_chain!r}")
    ops = frozenset(ops)
    register_ops()

    return function_pass(PASS_NAME, lambda func: _rewrite(func, ops, long_chain))
