"""Shared machinery of the tvm-ext Relay passes: input validation, graph walks, rebuilds.

Design note
-----------
Contract every pass built on this module keeps:

* **Typed input or a clear error.** :func:`require_typed` raises :class:`UntypedModuleError`
  (a ``ValueError`` naming the pass) when the function was not type-inferred.
* **Skip what the rewrite cannot reason about.** :func:`unsupported_construct` returns a falsy
  :class:`Reject` for functions containing ``If``, ``Let``, ``Match``, references or closures;
  the pass returns the function unchanged and logs why. ``Primitive`` functions are leaves.
* **Never mutate, rebuild.** :func:`rebuild` makes a new expression from a substitution map,
  iteratively, sharing every node it does not need to change.
* **Every rejection says why**, logged under ``tvm_ext.passes.<PassName>``.
* **One sweep, one frame.** :func:`substitute` gives a pass's ``collect(nodes, users, body)`` the
  dataflow nodes and their users and rebuilds from the ``{node: replacement}`` map it returns;
  :func:`fixed_point` sweeps until nothing changes, bounded, naming the pass at the bound.

Shared machinery lives in underscore modules, never in a pass's module: this one, ``_chains``
(elementwise chains), ``_intervals`` (value ranges), and the leaves ``tvm_ext._rules`` (the rule
shape and its driver), ``tvm_ext._op_pattern``, ``tvm_ext._reject`` and ``tvm_ext._attrs``.
"""
from __future__ import annotations

import logging
from typing import Iterable

import tvm
from tvm import relay

from tvm_ext._attrs import int_list
from tvm_ext._op_pattern import op_name
from tvm_ext._reject import Check, Reject

__all__ = [
    "Reject",
    "Check",
    "UntypedModuleError",
    "pass_logger",
    "require_typed",
    "dataflow_nodes",
    "unsupported_construct",
    "is_primitive",
    "post_order",
    "count_calls",
    "consumers",
    "op_calls",
    "substitute",
    "substitution_pass",
    "rebuild",
    "with_body",
    "static_tensor_type",
    "op_name",
    "is_unlowered_qnn",
    "function_pass",
    "until_unchanged",
    "fixed_point",
    "describe",
    "static_shape",
    "lift_constants",
    "SIMPLE_CONST",
    "int_list",
    "constant_scalar",
    "conv_padding",
    "ANCHOR_OPS",
]

#: Relay ops (before layout alteration) FuseOps makes a kernel's anchor: they take elementwise
#: epilogues but never a producer into their kernel.
ANCHOR_OPS = ("nn.conv2d", "nn.dense", "nn.conv2d_transpose", "nn.batch_matmul", "nn.matmul")


class UntypedModuleError(ValueError):
    """A pass was given a function without types (``InferType`` was not run)."""


def pass_logger(pass_name: str) -> logging.Logger:
    """The logger a pass reports merges and rejections on: ``tvm_ext.passes.<pass_name>``."""
    return logging.getLogger(f"tvm_ext.passes.{pass_name}")


def is_primitive(func) -> bool:
    """True for a fused (``Primitive=1``) Relay function."""
    attrs = func.attrs
    return attrs is not None and "Primitive" in attrs.keys() and int(attrs["Primitive"]) == 1


def is_unlowered_qnn(call) -> bool:
    """True for a call of a QNN op (``qnn.*``). Its scales and zero points must stay constants until
    relay.build lowers QNN: put in a Primitive function they become parameters, and QNN's
    canonicalization fails ("Expr must be a constant expr")."""
    name = op_name(call)
    return name is not None and name.startswith("qnn.")


def static_tensor_type(expr) -> Check:
    """``True`` when ``expr`` has a TensorType with only constant dimensions."""
    ty = expr._checked_type_  # pylint: disable=protected-access
    if ty is None:
        return Reject("no type")
    if not isinstance(ty, relay.TensorType):
        return Reject(f"{type(ty).__name__} value, not a tensor")
    for dim in ty.shape:
        if not isinstance(dim, tvm.tir.IntImm):
            return Reject(f"dynamic shape {list(ty.shape)}")
    return True


def _children(node) -> list:
    if isinstance(node, relay.Call):
        head = [node.op] if isinstance(node.op, relay.Function) else []
        return head + list(node.args)
    if isinstance(node, relay.Tuple):
        return list(node.fields)
    if isinstance(node, relay.TupleGetItem):
        return [node.tuple_value]
    return []  # Var, Constant, Op, GlobalVar, nested (primitive) Function: leaves


def count_calls(expr, names) -> int:
    """Calls of the ops ``names`` anywhere in ``expr`` (any construct; a bound for sweep counts)."""
    found = []

    def visit(node):
        if isinstance(node, relay.Call) and op_name(node) in names:
            found.append(node)

    relay.analysis.post_order_visit(expr, visit)
    return len(found)


def post_order(expr, resolve=None) -> list:
    """Nodes of a dataflow expression in post-order (children first), each once.

    Nested functions are leaves (their bodies are not visited). Iterative, so deep graphs do not
    hit Python's recursion limit. ``resolve(node)`` (optional) redirects every edge, e.g. through
    a substitution map. Assumes :func:`unsupported_construct` accepted the function.
    """
    resolve = resolve or (lambda n: n)
    order, seen = [], set()
    stack = [(resolve(expr), False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if node in seen:
            continue
        seen.add(node)
        stack.append((node, True))
        for child in reversed(_children(node)):
            child = resolve(child)
            if child not in seen:
                stack.append((child, False))
    return order


def consumers(nodes: Iterable) -> dict:
    """node -> list of (consumer, argument index) over ``nodes`` (one entry per use)."""
    users: dict = {}
    for node in nodes:
        if isinstance(node, relay.Call):
            for i, arg in enumerate(node.args):
                users.setdefault(arg, []).append((node, i))
        elif isinstance(node, relay.Tuple):
            for i, field in enumerate(node.fields):
                users.setdefault(field, []).append((node, i))
        elif isinstance(node, relay.TupleGetItem):
            users.setdefault(node.tuple_value, []).append((node, 0))
    return users


def require_typed(func, pass_name: str) -> None:
    """Raise :class:`UntypedModuleError` unless every node of ``func``'s dataflow is typed."""
    for node in post_order(func.body):
        if getattr(node, "_checked_type_", True) is None:
            raise UntypedModuleError(
                f"{pass_name}: the module is not type-inferred (no type on a "
                f"{type(node).__name__}); run tvm.relay.transform.InferType() before {pass_name}"
            )


def unsupported_construct(func) -> Check:
    """``True`` for pure dataflow functions; a :class:`Reject` naming the first construct otherwise.

    Rejected: ``If``, ``Let``, ``Match``, ``RefCreate/RefRead/RefWrite`` and nested functions that
    are not ``Primitive`` (closures). Found with TVM's own visitor, so nothing is missed.
    """
    found: list = []
    banned = (relay.If, relay.Let, relay.adt.Match, relay.RefCreate, relay.RefRead, relay.RefWrite)

    def visit(node):
        if found:
            return
        if isinstance(node, banned):
            found.append(type(node).__name__)
        elif isinstance(node, relay.Function) and not node.same_as(func) and not is_primitive(node):
            found.append("nested non-primitive Function")

    # post_order_visit enters primitive functions too; their bodies are plain dataflow.
    relay.analysis.post_order_visit(func, visit)
    if found:
        return Reject(f"function contains {found[0]} (only dataflow graphs are rewritten)")
    return True


def dataflow_nodes(func, pass_name: str):
    """The post-order nodes of ``func``'s body, or None when a pass must leave ``func`` alone.

    The common prologue of a function pass: ``Primitive`` functions (FuseOps output) are leaves;
    an untyped function raises :class:`UntypedModuleError`; a function with constructs the
    rewrites do not reason about (:func:`unsupported_construct`) is skipped, with the reason
    logged at DEBUG under the pass's logger.
    """
    if is_primitive(func):
        return None
    require_typed(func, pass_name)
    ok = unsupported_construct(func)
    if not ok:
        pass_logger(pass_name).debug("skipped function: %s", ok)
        return None
    return post_order(func.body)


def op_calls(nodes, ops):
    """The calls among ``nodes`` of an op named in ``ops`` (a collection of names), in order."""
    return [n for n in nodes if isinstance(n, relay.Call) and op_name(n) in ops]


def substitute(func, pass_name: str, collect):
    """``func`` rewritten by the substitution ``collect(nodes, users, body)`` returns.

    The frame of a rewrite sweep: ``nodes`` are the post-order dataflow nodes of ``func``
    (:func:`dataflow_nodes`: a function the pass leaves alone is returned as it is), ``users`` their
    :func:`consumers`, ``body`` the function's result; ``collect`` returns ``{node: replacement}``,
    which :func:`rebuild` applies (an empty map returns ``func`` itself).
    """
    nodes = dataflow_nodes(func, pass_name)
    if nodes is None:
        return func
    subst = collect(nodes, consumers(nodes), func.body)
    return with_body(func, rebuild(func.body, subst))


def substitution_pass(pass_name: str, collect, opt_level: int = 1):
    """The function pass named ``pass_name`` that rewrites each function by one :func:`substitute`
    sweep of ``collect`` (see :func:`function_pass`)."""
    return function_pass(pass_name, lambda func: substitute(func, pass_name, collect), opt_level)


def rebuild(expr, subst: dict):
    """``expr`` with every use of a node ``k`` in ``subst`` redirected to ``subst[k]`` (no mutation).

    Replacements may be other nodes of the graph (merging duplicates) or new expressions built
    from nodes of the graph; they are rebuilt too when their own inputs were redirected. Keys must
    not occur inside their own replacement. Nodes whose inputs did not change are shared with the
    input.
    """
    if not subst:
        return expr

    def resolve(node):
        seen = 0
        while node in subst:
            node = subst[node]
            seen += 1
            if seen > len(subst):
                raise RuntimeError("rebuild: cyclic substitution")
        return node

    new: dict = {}

    def get(node):
        node = resolve(node)
        return new.get(node, node)

    for node in post_order(expr, resolve):
        if isinstance(node, relay.Call):
            args = [get(a) for a in node.args]
            if any(not a.same_as(b) for a, b in zip(args, node.args)):
                new[node] = relay.Call(node.op, args, node.attrs, node.type_args, node.span)
        elif isinstance(node, relay.Tuple):
            fields = [get(f) for f in node.fields]
            if any(not a.same_as(b) for a, b in zip(fields, node.fields)):
                new[node] = relay.Tuple(fields, node.span)
        elif isinstance(node, relay.TupleGetItem):
            tup = get(node.tuple_value)
            if not tup.same_as(node.tuple_value):
                new[node] = relay.TupleGetItem(tup, node.index)
    return get(expr)


def function_pass(pass_name: str, rewrite, opt_level: int = 1):
    """The Relay function pass named ``pass_name`` that maps every function through ``rewrite(func)``.

    The one way the passes of this package are made, so each registers under its explicit name and
    ``rewrite`` stays a plain function of a function (pure: it returns a new function or its input).
    """
    def transform(func, mod, ctx):  # pylint: disable=unused-argument
        return rewrite(func)

    return relay.transform.function_pass(transform, opt_level=opt_level, name=pass_name)


def until_unchanged(func, step, log, max_rounds: int):
    """Apply ``step`` (a function -> function rewrite) until it returns its input, re-typing between
    rounds (the next round reads the types of the new nodes).

    Returns ``(func, done)``: ``done`` is False when ``max_rounds`` rounds all rewrote (the caller
    decides whether that is an error). A rewritten function that does not type-check on its own
    (calls of other module functions) ends the rounds with that round's result (logged at DEBUG).
    """
    for _ in range(max_rounds):
        new = step(func)
        if new.same_as(func):
            return func, True
        try:
            func = relay.transform.InferType()(tvm.IRModule.from_expr(new))["main"]
        except tvm.TVMError as err:
            log.debug("no further round: the rewritten function does not type-check alone: %s",
                      str(err).splitlines()[-1] if str(err) else type(err).__name__)
            return new, True
    return func, False


def fixed_point(func, step, pass_name: str, max_rounds: int, on_cap: str = "raise"):
    """``step`` applied until it changes nothing, at most ``max_rounds`` rewriting rounds.

    The bounded fixed-point loop of the passes that rewrite in sweeps (a rewrite can enable another
    in the next sweep). Rounds run through :func:`until_unchanged` (re-typed between rounds). When
    ``max_rounds`` rounds all rewrote, one more sweep tells whether the function still changes; if
    it does, ``on_cap="raise"`` raises ``RuntimeError`` naming the pass and the cap (the graph is
    taken for malformed), ``on_cap="warn"`` logs a warning on the pass's logger and returns the
    result of the last counted round.
    """
    if on_cap not in ("raise", "warn"):
        raise ValueError(f"fixed_point: on_cap must be 'raise' or 'warn', got {on_cap!r}")
    log = pass_logger(pass_name)
    func, done = until_unchanged(func, step, log, max_rounds)
    if done or step(func).same_as(func):
        return func
    if on_cap == "raise":
        raise RuntimeError(f"{pass_name}: still rewriting after {max_rounds} rounds (a malformed graph?)")
    log.warning("still rewriting after %d rounds: stopped", max_rounds)
    return func


def with_body(func, body):
    """A copy of ``func`` with a new body (params, attributes and type params kept).

    The return type is left for InferType, which the pass infrastructure runs on the result.
    """
    if body.same_as(func.body):
        return func
    return relay.Function(func.params, body, None, func.type_params, func.attrs, func.span)


def constant_scalar(expr):
    """The Python value of a one-element ``relay.Constant``; else None."""
    if not isinstance(expr, relay.Constant):
        return None
    arr = expr.data.numpy()
    if arr.size != 1:
        return None
    return arr.reshape(()).item()


def conv_padding(attrs) -> list | None:
    """Conv2d padding attribute as [top, left, bottom, right] (1, 2 or 4 entries), or None."""
    pad = int_list(attrs.padding)
    if pad is None:
        return None
    return {1: pad * 4, 2: pad + pad, 4: pad}.get(len(pad))


def static_shape(expr) -> tuple:
    """The shape of ``expr``'s tensor type as a tuple of ints (the type must be static)."""
    return tuple(int(d) for d in expr.checked_type.shape)


def describe(node, unnamed: str = "a function call", with_dtype: bool = False) -> str:
    """A short name of ``node`` for log messages: its op, ``%var``, or its node type.

    ``unnamed`` names a call of a function (no op); ``with_dtype`` appends ``:dtype`` to a call.
    """
    if isinstance(node, relay.Call):
        name = op_name(node) or unnamed
        return f"{name}:{node.checked_type.dtype}" if with_dtype else name
    if isinstance(node, relay.Var):
        return f"%{node.name_hint}"
    return type(node).__name__


#: Scalar constant dtypes FuseOps keeps inline in a kernel (``relay/transforms/fuse_ops.cc``).
SIMPLE_CONST = {"int32", "int64", "float32", "float64", "bool"}


def lift_constants(func):
    """Non-inlinable constants of ``func``'s body become parameters: (new func, extra args).

    What FuseOps does to the functions it makes: scalar constants of :data:`SIMPLE_CONST` dtypes
    stay inline, every other constant becomes a parameter (one per distinct constant), appended.
    """
    consts = []

    class _Lift(relay.ExprMutator):
        def __init__(self):
            super().__init__()
            self.vars = {}

        def visit_constant(self, const):
            if const.data.shape == () and const.data.dtype in SIMPLE_CONST:
                return const
            if const not in self.vars:
                v = relay.var(f"p_const{len(consts)}", relay.TensorType(const.data.shape, const.data.dtype))
                self.vars[const] = v
                consts.append(const)
            return self.vars[const]

    lifter = _Lift()
    body = lifter.visit(func.body)
    params = list(func.params) + [lifter.vars[c] for c in consts]
    return relay.Function(params, body, func.ret_type, func.type_params, func.attrs), consts
