"""The nodes of FuseOps' indexed forward graph as the replay (:mod:`._fusion_sim`) records them.

:class:`Node` (one expression, its ``TOpPattern`` and its readers), :class:`DomNode` (its
post-dominator), :class:`Decision` (why it was or was not fused in one phase); the dataflow
children of an expression as FuseOps visits them, and the labels the explainer prints.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..._op_pattern import K_OPAQUE

__all__ = ["Node", "DomNode", "Decision", "is_primitive_function", "callee_label", "node_label", "function_label"]


@dataclass
class Node:
    """One node of FuseOps' indexed forward graph."""

    index: int
    expr: object
    kind: str  # call | closure_call | var | const | tuple | getitem | other
    op: Optional[str]  # op name, "fn:<name>" for a call of a Primitive function literal, None otherwise
    pattern: int = K_OPAQUE
    extern: bool = False
    outputs: list = field(default_factory=list)  # [(node index, edge pattern)]
    outer: bool = True  # False: inside a Primitive (or Compiler) function body, which FuseMutator leaves alone
    noncomputational: bool = False  # stop_fusion and TNonComputational ops: no kernel


@dataclass
class DomNode:
    parent: Optional[int]
    depth: int
    pattern: int


@dataclass
class Decision:
    """Why node ``index`` was or was not fused into its post-dominator in ``phase``."""

    phase: int
    code: str
    group_pattern: int
    dom: Optional[int] = None
    dom_pattern: Optional[int] = None
    failed_at: Optional[int] = None  # node where CheckPath's condition failed
    count: Optional[int] = None  # nodes the fused group would have (max_depth)


def _op_attr(op, name):
    try:
        return op.get_attr(name)
    except Exception:  # unknown attribute registry
        return None


def _is_dynamic(ty) -> bool:
    from tvm import relay, tir

    if isinstance(ty, relay.TensorType):
        return any(not isinstance(d, tir.IntImm) for d in ty.shape)
    if isinstance(ty, relay.TupleType):
        return any(_is_dynamic(f) for f in ty.fields)
    return False


def _shape_key(ty):
    from tvm import tir

    return tuple(int(d) if isinstance(d, tir.IntImm) else str(d) for d in ty.shape)


def _children(e) -> list:
    """The operands IndexedForwardGraphCreator marks external for a Let/If/Match/Ref node."""
    from tvm import relay

    if isinstance(e, relay.Call):
        return list(e.args)
    if isinstance(e, relay.Tuple):
        return list(e.fields)
    if isinstance(e, relay.TupleGetItem):
        return [e.tuple_value]
    if isinstance(e, relay.Let):
        return [e.var, e.value, e.body]
    if isinstance(e, relay.If):
        return [e.cond, e.true_branch, e.false_branch]
    if isinstance(e, relay.adt.Match):
        return [e.data, *(c.rhs for c in e.clauses)]
    if isinstance(e, relay.RefWrite):
        return [e.ref, e.value]
    if isinstance(e, relay.RefRead):
        return [e.ref]
    if isinstance(e, relay.RefCreate):
        return [e.value]
    return []


def is_primitive_function(e) -> bool:
    """A function literal with a nonzero ``Primitive`` attribute (FuseMutator leaves it alone)."""
    from tvm import relay

    if not isinstance(e, relay.Function) or e.attrs is None or "Primitive" not in e.attrs:
        return False
    try:
        return int(e.attrs["Primitive"]) != 0
    except (TypeError, ValueError):
        return False


def callee_label(callee) -> str:
    """What a ``closure_call`` calls, for messages: ``%f``, ``@g``, ``an If``, ``a function literal``, ..."""
    import tvm
    from tvm import relay

    if isinstance(callee, relay.Var):
        return f"the closure %{callee.name_hint}"
    if isinstance(callee, tvm.ir.GlobalVar):
        return f"the global function @{callee.name_hint}"
    if isinstance(callee, relay.If):
        return "the function an If returns"
    if isinstance(callee, relay.Let):
        return "the function a Let returns"
    if isinstance(callee, relay.Function):
        return "a function literal (not Primitive)"
    if type(callee).__name__ == "Constructor":
        return f"the constructor {getattr(callee, 'name_hint', '?')}"
    return f"a {type(callee).__name__}"


def node_label(n: Node) -> str:
    """A node's name in messages: its op, its function's name, or what a closure call calls."""
    if n.kind == "closure_call":
        return "call of " + callee_label(n.expr.op)
    if n.op:
        return n.op[3:] if n.op.startswith("fn:") else n.op
    return n.kind


def function_label(fn) -> str:
    """A function's name for messages: its pattern-table entry, Composite or Compiler name."""
    attrs = getattr(fn, "attrs", None)
    if attrs is not None:
        for key in ("tvm_ext.pattern", "Composite", "Compiler", "global_symbol"):
            if key in attrs:
                return str(attrs[key])
        if "Primitive" in attrs:  # made by a pass, not by a pattern table: name it by its ops
            import tvm
            from tvm import relay

            ops = []
            relay.analysis.post_order_visit(fn.body, lambda x: ops.append(x.op.name) if isinstance(x, relay.Call)
                                            and isinstance(x.op, tvm.ir.Op) else None)
            shown = ",".join(ops[:4]) + (",..." if len(ops) > 4 else "")
            return f"Primitive[{shown}]"
    name = getattr(fn, "name_hint", None)
    return str(name) if name else "function"
