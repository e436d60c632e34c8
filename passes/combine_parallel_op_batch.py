"""CombineParallelOpBatch: TVM's parallel-op batching, made safe to call from Python.

Rewrites::

    # add(dense(x, W_i), b_i[j]) x n
    #   -> add(batch_matmul(stack(x..x), stack(W_i)), stack(expand_dims(b_i, 0)))   b: [n, 1, j]

    # dense(x, W_i; units, out_dtype) x n
    #   -> batch_matmul(stack(x..x), stack(W_1..W_n), transpose_b=True, out_dtype) -> split/squeeze
    # op(a_i, b_i) x n, op in add/subtract/multiply/divide/maximum/minimum, no broadcasting
    #   -> op(stack(a_i), stack(b_i)) -> split/squeeze

Walked by hand: it groups any number of parallel branches of any length, which a pattern cannot enumerate.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``CombineParallelOpBatch``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import tvm
from tvm import relay

from tvm_ext._op_pattern import K_BROADCAST, call_pattern
from ._registry import register_pass

from ._util import (Check, Reject, consumers, dataflow_nodes, function_pass, op_name, pass_logger, post_order, rebuild,
                    static_shape, static_tensor_type, with_body)

__all__ = ["CombineParallelOpBatch", "SUPPORTED_PAIRS"]

PASS_NAME = "CombineParallelOpBatch"
_log = pass_logger(PASS_NAME)

def _static_args(call) -> Check:
    for i, arg in enumerate(call.args):
        ok = static_tensor_type(arg)
        if not ok:
            return Reject(f"argument {i}: {ok}")
    return static_tensor_type(call)


def _same_arg_types(a, b) -> bool:
    return len(a.args) == len(b.args) and all(
        static_shape(x) == static_shape(y) and x.checked_type.dtype == y.checked_type.dtype
        for x, y in zip(a.args, b.args)
    )


# -- root rules --------------------------------------------------------------------------------------
def _dense_check(call) -> Check:
    ok = _static_args(call)
    if not ok:
        return ok
    if len(static_shape(call.args[0])) != 2:
        return Reject(f"dense data has rank {len(static_shape(call.args[0]))}; batch_matmul needs rank 2")
    return True


def _dense_compatible(a, b) -> bool:
    return _same_arg_types(a, b) and tvm.ir.structural_equal(a.attrs, b.attrs)


def _dense_make(roots, batch_op):  # pylint: disable=unused-argument
    # dense(x, W_i) x n -> batch_matmul(stack(x..x), stack(W_i), transpose_b=True, out_dtype)

    data = relay.stack([r.args[0] for r in roots], axis=0)
    weight = relay.stack([r.args[1] for r in roots], axis=0)
    out_dtype = str(roots[0].attrs.out_dtype or "")
    return relay.nn.batch_matmul(data, weight, out_dtype=out_dtype, transpose_a=False, transpose_b=True)


def _ewise_check(call) -> Check:
    ok = _static_args(call)
    if not ok:
        return ok
    out = static_shape(call)
    for i, arg in enumerate(call.args):
        if static_shape(arg) != out:
            return Reject(f"argument {i} {list(static_shape(arg))} broadcasts to {list(out)}: "
                          "stacking would change the result")
    return True


def _ewise_make(roots, batch_op):
    # op(a_i, b_i) x n -> op(stack(a_i), stack(b_i))

    args = [relay.stack([r.args[i] for r in roots], axis=0) for i in range(len(roots[0].args))]
    return relay.Call(tvm.ir.Op.get(batch_op), args)


@dataclass(frozen=True)
class PairRule:
    """How one (op, batch_op) pair is checked, grouped and built; ``delegate``: C++ may run it."""

    name: str
    check: Callable
    compatible: Callable
    make: Callable
    delegate: bool


_ELEMENTWISE = ("add", "subtract", "multiply", "divide", "maximum", "minimum")

#: (op_name, batch_op_name) -> rule. Everything else is refused at construction.
SUPPORTED_PAIRS = {
    ("nn.dense", "nn.batch_matmul"): PairRule(
        f"{PASS_NAME}.dense_to_batch_matmul", _dense_check, _dense_compatible, _dense_make, delegate=False
    ),
    **{
        (op, op): PairRule(f"{PASS_NAME}.{op}", _ewise_check, _same_arg_types, _ewise_make, delegate=True)
        for op in _ELEMENTWISE
    },
}


# -- following ops -----------------------------------------------------------------------------------
def _axis_attrs(call) -> bool:
    attrs = call.attrs
    if attrs is None:
        return False
    try:
        keys = list(attrs.keys())
    except Exception:  # attrs without reflection: be safe
        return True
    return any(k in ("axis", "axes") for k in keys)


def _broadcasts_into(shape, out) -> bool:
    """``shape`` broadcasts to ``out`` without changing it (rank at most ``len(out)``)."""
    return len(shape) <= len(out) and all(d in (1, o) for d, o in zip(reversed(shape), reversed(out)))


def _follow_check(parent, call, parent_index, exact: bool = False) -> Check:
    """A following op can be stacked when its other arguments broadcast into the branch's shape.

    ``exact``: every other argument has the branch's shape (what the C++ pass stacks correctly
    for every rank).
    """
    if _axis_attrs(call):
        return Reject(f"{op_name(call)} has an axis attribute (axis 0 is the new batch axis)")
    ok = _static_args(call)
    if not ok:
        return ok
    out = static_shape(parent)
    for i, arg in enumerate(call.args):
        if i == parent_index:
            continue
        shape = static_shape(arg)
        if exact and shape != out:
            return Reject(f"{op_name(call)} argument {i} {list(shape)} broadcasts against {list(out)}")
        if not _broadcasts_into(shape, out):
            return Reject(f"{op_name(call)} argument {i} {list(shape)} does not broadcast into {list(out)}")
    if static_shape(call) != out:
        return Reject(f"{op_name(call)} changes the shape")
    return True


def _to_rank(arg, rank: int):
    """``arg`` with leading unit axes up to ``rank`` (TVM's ``expand_dims(b, 0)`` for a 1-D bias)."""
    missing = rank - len(static_shape(arg))
    return relay.expand_dims(arg, axis=0, num_newaxis=missing) if missing > 0 else arg


def _branch(root, users, body):
    """root and the chain of single-user elementwise/broadcast op calls after it."""
    chain = [root]
    while True:
        last = chain[-1]
        us = users.get(last, ())
        if last.same_as(body) or len(us) != 1:
            return chain
        nxt = us[0][0]
        if not isinstance(nxt, relay.Call) or call_pattern(nxt) > K_BROADCAST:
            return chain
        if sum(1 for a in nxt.args if a.same_as(last)) != 1:
            return chain
        chain.append(nxt)


def _level_ok(branches, depth) -> Check:
    first = branches[0][depth]
    pidx = next(i for i, a in enumerate(first.args) if a.same_as(branches[0][depth - 1]))
    ok = _follow_check(branches[0][depth - 1], first, pidx)
    if not ok:
        return ok
    for br in branches[1:]:
        c = br[depth]
        if not c.op.same_as(first.op) or not tvm.ir.structural_equal(c.attrs, first.attrs):
            return Reject(f"branches differ at depth {depth} ({op_name(first)} vs {op_name(c)})")
        if len(c.args) != len(first.args) or not c.args[pidx].same_as(br[depth - 1]):
            return Reject(f"branches differ at depth {depth}")
        if not _same_arg_types(c, first):
            return Reject(f"{op_name(c)} argument types differ across branches")
    return pidx


def _plan(func, op, rule, min_num_branches):
    """Groups (lists of branches, each cut to its combinable depth), as C++ would form them."""
    nodes = post_order(func.body)
    users = consumers(nodes)
    plans, dependent = [], []
    for root in nodes:
        groups: list = []
        for user, idx in users.get(root, ()):
            if idx != 0 or not isinstance(user, relay.Call) or op_name(user) != op:
                continue
            if any(user.same_as(g[0]) for grp in groups for g in grp):
                continue
            ok = rule.check(user)
            if not ok:
                _log.debug("%s: %s not combined: %s", rule.name, op, ok)
                continue
            for grp in groups:
                if rule.compatible(user, grp[0][0]):
                    grp.append([user])
                    break
            else:
                groups.append([[user]])
        for grp in groups:
            if len(grp) < min_num_branches:
                if len(grp) > 1:
                    _log.debug("%s: %d parallel %s < min_num_branches=%d", rule.name, len(grp), op, min_num_branches)
                continue
            branches = [_branch(b[0], users, func.body) for b in grp]
            depth = min(len(b) for b in branches)
            pidxs = []
            for d in range(1, depth):
                ok = _level_ok(branches, d)
                if ok is False or isinstance(ok, Reject):
                    _log.debug("%s: branches stop before depth %d: %s", rule.name, d, ok)
                    depth = d
                    break
                pidxs.append(ok)
            cut = [b[:depth] for b in branches]
            ok = _independent(cut, nodes)
            if not ok:
                _log.debug("%s: group of %d %s not combined: %s", rule.name, len(cut), op, ok)
                dependent.append(ok)
                continue
            plans.append((cut, pidxs))
    return plans, dependent


def _independent(branches, nodes) -> Check:
    """No stacked argument depends on a call of the group (else stacking would need its own output).

    # add(x, y1), add(x, f(add(x, y1)))   -> not combined: branch 2's argument reads branch 1
    """
    members = {n for b in branches for n in b}
    reaches: dict = {}
    for n in nodes:  # post order: children first
        kids = []
        if isinstance(n, relay.Call):
            kids = list(n.args)
        elif isinstance(n, relay.Tuple):
            kids = list(n.fields)
        elif isinstance(n, relay.TupleGetItem):
            kids = [n.tuple_value]
        reaches[n] = any(k in members or reaches.get(k, False) for k in kids)
    for b in branches:
        for d, call in enumerate(b):
            for i, arg in enumerate(call.args):
                if (d == 0 and i == 0) or (d > 0 and arg.same_as(b[d - 1])):
                    continue
                if arg in members or reaches.get(arg, False):
                    return Reject(f"argument {i} of {op_name(call)} depends on another branch of the group")
    return True


def _rewrite(func, plans, rule, batch_op):
    subst = {}
    for branches, pidxs in plans:
        n = len(branches)
        data = rule.make([b[0] for b in branches], batch_op)
        for d, pidx in enumerate(pidxs, start=1):
            first = branches[0][d]
            rank = len(static_shape(branches[0][d - 1]))
            args = []
            for i in range(len(first.args)):
                args.append(data if i == pidx
                            else relay.stack([_to_rank(b[d].args[i], rank) for b in branches], axis=0))
            data = relay.Call(first.op, args, first.attrs)
        split = relay.split(data, n, axis=0).astuple()
        for k, b in enumerate(branches):
            subst[b[-1]] = relay.squeeze(relay.TupleGetItem(split, k), axis=[0])
        _log.info("%s: combined %d branches of depth %d", rule.name, n, len(pidxs) + 1)
    return with_body(func, rebuild(func.body, subst))


# -- delegation --------------------------------------------------------------------------------------
def _cpp_safe(func, op) -> Check:
    """Every group the C++ pass would form in ``func`` is safe for it (elementwise pairs only)."""
    nodes = post_order(func.body)
    children: dict = {}  # C++ BranchGroupFinder: an op call is a child of its first argument only
    for n in nodes:
        if isinstance(n, relay.Call):
            if not isinstance(n.op, tvm.ir.Op):
                return Reject("the function calls functions (C++ would downcast them to ops)")
            for i, a in enumerate(n.args):
                if op_name(n) != op or i == 0:
                    children.setdefault(a, []).append(n)
        elif isinstance(n, (relay.GlobalVar, relay.Function)):
            return Reject("the function refers to other functions")
    for n in nodes:
        if not (isinstance(n, relay.Call) and op_name(n) == op):
            continue
        ok = _ewise_check(n)
        if not ok:
            return ok
        last = n
        while len(children.get(last, ())) == 1:
            nxt = children[last][0]
            if call_pattern(nxt) > K_BROADCAST:
                break
            pidx = [i for i, a in enumerate(nxt.args) if a.same_as(last)]
            if len(pidx) != 1:
                return Reject("a following op reads the branch twice")
            ok = _follow_check(last, nxt, pidx[0], exact=True)
            if not ok:
                return ok
            if any(len(static_shape(a)) < 2 for a in nxt.args):
                return Reject("a following op has a rank-1 argument (C++ would expand it)")
            last = nxt
    return True


def _run_cpp(func, op, batch_op, min_num_branches):
    cur = tvm.transform.PassContext.current()
    config = {str(k): v for k, v in cur.config.items()} if cur.config else {}
    cpp = tvm.get_global_func("relay._transform.CombineParallelOpBatch")(op, batch_op, min_num_branches)
    tmp = tvm.IRModule.from_expr(func)
    with tvm.transform.PassContext(opt_level=max(4, int(cur.opt_level)), config=config):
        tmp = tvm.transform.Sequential([relay.transform.InferType(), cpp, relay.transform.InferType()])(tmp)
    return tmp["main"]


def _combine(func, op, batch_op, rule, min_num_branches):
    if dataflow_nodes(func, PASS_NAME) is None:
        return func
    plans, dependent = _plan(func, op, rule, min_num_branches)
    if not plans:
        return func
    if rule.delegate:
        ok = dependent[0] if dependent else _cpp_safe(func, op)  # C++ does not check dependences
        if ok:
            _log.info("%s: delegating to relay._transform.CombineParallelOpBatch (checked safe)", rule.name)
            return _run_cpp(func, op, batch_op, min_num_branches)
        _log.debug("%s: not delegated to C++: %s; rewriting in Python", rule.name, ok)
    return _rewrite(func, plans, rule, batch_op)


def _validate(op_name_, batch_op_name, min_num_branches):
    for label, name in (("op_name", op_name_), ("batch_op_name", batch_op_name)):
        if not isinstance(name, str):
            raise TypeError(f"{PASS_NAME}: {label} must be a str, got {name!r}")
        try:
            tvm.ir.Op.get(name)
        except Exception:  # TVM raises an InternalError for unregistered ops
            raise ValueError(f"{PASS_NAME}: {label}={name!r} is not a registered Relay op") from None
    if (op_name_, batch_op_name) not in SUPPORTED_PAIRS:
        pairs = ", ".join(f"{a}->{b}" for a, b in SUPPORTED_PAIRS)
        raise ValueError(
            f"{PASS_NAME}: unsupported pair {op_name_}->{batch_op_name} (TVM's C++ pass builds the batch op "
            f"with empty attributes and may crash or change results); supported: {pairs}"
        )
    if isinstance(min_num_branches, bool) or not isinstance(min_num_branches, int) or min_num_branches < 2:
        raise ValueError(f"{PASS_NAME}: min_num_branches must be an int >= 2, got {min_num_branches!r}")


@register_pass(PASS_NAME)
def CombineParallelOpBatch(op_name: str, batch_op_name: str, min_num_branches: int = 3):  # pylint: disable=invalid-name,redefined-outer-name
    """Combine at least ``min_num_branches`` parallel ``op_name`` calls into one ``batch_op_name``.

    The safe Python binding of TVM's ``relay._transform.CombineParallelOpBatch``: calls of
    ``op_name`` sharing their first argument, with equal argument shapes, dtypes and attributes,
    are stacked on a new axis 0 and computed by one ``batch_op_name`` call; single-user
    elementwise/broadcast ops following them are stacked too while their other arguments broadcast
    into the branch's shape (a lower-rank one, such as a dense's 1-D bias, gets leading unit axes
    first, as TVM's ``CombineParallelDense(to_batch=True)`` does); ``split`` + ``squeeze`` give each
    branch its result back.

    Supported pairs: ``("nn.dense", "nn.batch_matmul")`` (built in Python with ``transpose_b=True``
    and the dense's ``out_dtype``; the graph TVM's ``CombineParallelDense(to_batch=True)`` builds,
    1-D bias and scale included; a scalar argument of a following op, which makes TVM's graph
    ill-typed, is stacked as ``[n, 1, 1]``),
    and ``(op, op)`` for ``op`` in add, subtract, multiply, divide, maximum, minimum without
    broadcasting (delegated to the C++ pass when proven safe, else rewritten in Python).

    Runs at opt_level 1 (the C++ pass is registered at 4 and would not run under a default
    PassContext); disable with ``PassContext(disabled_pass=["CombineParallelOpBatch"])``.

    Parameters
    ----------
    op_name : str
        The op whose parallel calls are combined.
    batch_op_name : str
        The op computing the stacked calls.
    min_num_branches : int
        Smallest group combined (>= 2; default 3, like TVM).

    Returns
    -------
    tvm.transform.Pass
        A Relay function pass named ``"CombineParallelOpBatch"``.

    Raises
    ------
    ValueError
        An op name is not registered, the pair is not supported, or ``min_num_branches`` < 2;
        raised here, before any C++ runs.
    TypeError
        An op name is not a string.
    """
    _validate(op_name, batch_op_name, min_num_branches)
    rule = SUPPORTED_PAIRS[(op_name, batch_op_name)]

    return function_pass(PASS_NAME, lambda func: _combine(func, op_name, batch_op_name, rule, min_num_branches))
