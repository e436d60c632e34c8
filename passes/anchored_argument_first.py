"""AnchoredArgumentFirst: at a commutative join, the anchor's chain is the first argument.

Rewrites::

    # join(w, a) -> join(a, w)    join add / multiply (any dtype) or maximum / minimum (integers);
    #                             a: a private elementwise chain from an anchor (conv, dense, pool, ...),
    #                             w: a private chain from no anchor (a widening of an 8-bit value);
    #                             both of the join's shape; at a target with max_function_args only

The joins are commutative bit for bit (IEEE addition and multiplication too; float maximum /
minimum are not with a NaN, so only integer ones swap). Nothing else changes: FuseOps at a target
with ``max_function_args`` (GPU targets) postpones a fusion into a join until it reaches the join,
retries the postponed ones latest first and drops one whose join already holds an anchor; the join's
earlier argument is visited first, so ``w``'s fusion fuses only from the later side.

As data: :data:`RULES` (``tvm_ext._rules.Rule``); each argument's chain walked back to its source.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``AnchoredArgumentFirst``.
"""
from __future__ import annotations

from tvm import relay
from tvm.relay import dataflow_pattern as dfp

from tvm_ext._op_pattern import K_BROADCAST, K_OUT_EWISE_FUSABLE, call_pattern
from tvm_ext._rules import Rule, rewrites
from ._registry import register_pass

from ._chains import postpones_join_fusions
from ._doc import factory_sections
from ._util import Reject, describe, op_name, pass_logger, static_tensor_type, substitution_pass

__all__ = ["AnchoredArgumentFirst", "RULES", "COMMUTATIVE"]

PASS_NAME = "AnchoredArgumentFirst"
_log = pass_logger(PASS_NAME)

#: Joins whose arguments swap bit for bit, and the dtypes for which they do (``None``: every dtype).
COMMUTATIVE = (("add", None), ("multiply", None), ("maximum", "integer"), ("minimum", "integer"))


#: Links walked back from a join at most (a chain is a kernel's epilogue: a few dozen calls).
MAX_CHAIN = 256


def _anchored(src) -> bool:
    return isinstance(src, relay.Call) and call_pattern(src) == K_OUT_EWISE_FUSABLE


def _of_constants(expr, memo) -> bool:
    """``expr`` is a constant or a call of ops on constants only (``cast(const)``: FuseOps fuses it with
    its reader, so it is not a second input of a chain link)."""
    if expr not in memo:
        memo[expr] = isinstance(expr, relay.Constant) or (
            isinstance(expr, relay.Call) and op_name(expr) is not None
            and all(_of_constants(a, memo) for a in expr.args))
    return memo[expr]


def _chain_source(arg, users, memo):
    """Where the chain ending at ``arg`` starts: back through elementwise and broadcast calls
    (:data:`K_BROADCAST` or below) whose other arguments are :func:`_of_constants`, each the only
    reader of the one before; the first node that is not such a link (an anchor, a join, a parameter)
    or that has other readers."""
    node = arg
    for _ in range(MAX_CHAIN):
        if not (isinstance(node, relay.Call) and op_name(node) is not None and call_pattern(node) <= K_BROADCAST):
            return node
        live = [a for a in node.args if not _of_constants(a, memo)]
        if len(live) != 1:
            return node
        node = live[0]
        if len(users.get(node, ())) != 1:
            return node
    raise RuntimeError(f"{PASS_NAME}: chain walk did not terminate")


def _shape(expr):
    return [int(d) for d in expr.checked_type.shape]


def _check(join, users, body):  # noqa: ARG001  (the rules' context)
    """Check: the join's later argument is an anchor's chain and its earlier one a chain of no anchor,
    both private to the join and of its shape; else a Reject naming what is not."""
    dtypes = dict(COMMUTATIVE)
    if dtypes[op_name(join)] == "integer" and not str(join.checked_type.dtype).startswith(("int", "uint")):
        return Reject(f"{op_name(join)} of {join.checked_type.dtype} (a NaN makes it order-dependent)")
    first, second = join.args
    memo: dict = {}
    for arg in (first, second):
        if _of_constants(arg, memo):
            return Reject(f"{describe(arg)} is a constant: not a join of two chains")
        ok = static_tensor_type(arg)
        if not ok:
            return Reject(str(ok))
        if _shape(arg) != _shape(join):
            return Reject(f"{describe(arg)} is broadcast into the join (FuseOps fuses an anchor through "
                          "elementwise edges only)")
        if len(users.get(arg, ())) != 1:
            return Reject(f"{describe(arg)} has other readers: a kernel boundary anyway")
    if not isinstance(first, relay.Call) or op_name(first) is None:
        return Reject(f"its first argument {describe(first)} is no op call: no chain to fuse")
    src_first = _chain_source(first, users, memo)
    src_second = _chain_source(second, users, memo)
    if _anchored(src_first):
        return Reject(f"its first argument is already the chain of {describe(src_first)}")
    if not _anchored(src_second):
        return Reject(f"its second argument's chain starts at {describe(src_second)}, no anchor")
    if len(users.get(src_second, ())) != 1:
        return Reject(f"{describe(src_second)} has other readers: its kernel ends before the join")
    return src_first, src_second


def _swap(join, found, users, body):
    return relay.Call(join.op, [join.args[1], join.args[0]], join.attrs, join.type_args, join.span)


def _join_pattern():
    args = (dfp.wildcard(), dfp.wildcard())
    pattern = None
    for name, _ in COMMUTATIVE:
        p = dfp.is_op(name)(*args)
        pattern = p if pattern is None else pattern | p
    return pattern


#: Ordered rules (order is priority), tried on each commutative join:
RULES = (
    # join(w, a) -> join(a, w)    a an anchor's chain, w a chain of no anchor, both private, of the join's shape
    Rule(f"{PASS_NAME}.swap", _join_pattern, _check, _swap),
)


def _collect(nodes, users, body) -> dict:
    """Each join whose arguments swap (:data:`RULES`); none at a target without ``max_function_args``."""
    if not postpones_join_fusions():
        _log.debug("%s: the target has no max_function_args: FuseOps fuses either argument's chain", PASS_NAME)
        return {}
    subst = rewrites(nodes, RULES, _log, users, body)
    for join in subst:
        _log.info("%s: %s join's arguments swapped: the chain of no anchor is the later one and fuses into the "
                  "anchor's kernel", PASS_NAME, op_name(join))
    return subst


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def AnchoredArgumentFirst():  # pylint: disable=invalid-name
    """Put the anchor's chain first at a commutative join, so the other chain fuses into its kernel.

    At a target with ``max_function_args`` (TVM's GPU targets), FuseOps postpones a fusion into a
    join and retries the postponed ones latest first, dropping one whose join already holds an
    anchor (a conv, dense or pool). The earlier argument is visited first, so an elementwise chain in
    that place (a residual shortcut widened from 8 bits) is dropped once the later argument's conv
    has fused into the join, and runs as a kernel of its own that writes the widened tensor. With
    the arguments swapped it fuses, as it does at CPU targets. The joins swap bit for bit (``add``
    and ``multiply``; ``maximum`` and ``minimum`` of integers).

    Run it at stage ``"before_fuse"`` of :func:`tvm_ext.build`, after the passes that make the
    chains (``TabulateEightBit`` turns a SiLU's two readers into one table lookup, which makes a
    conv's chain private). It reads the target from ``tvm.target.Target.current()`` (the build's).

    Notes
    -----
    At targets without ``max_function_args`` (CPU targets) the module is returned unchanged.
    Functions with ``If``/``Let``/``Match``/references/closures are left unchanged; each reason is
    logged at DEBUG on ``tvm_ext.passes.AnchoredArgumentFirst``, swaps at INFO.
    """
    return substitution_pass(PASS_NAME, _collect)
