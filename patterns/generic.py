"""``generic``: float anchor ops with optional bias, residual add and activation.

Every entry is ``anchor -> [bias] -> [residual add] -> [activation]`` (ResNet order: the residual
is added before the activation), built by :func:`make_entry`. Patterns match the graph both as a
frontend produces it and as ``relay.build``'s prefix leaves it (``tvm_ext.build(at="before_fuse")``):

* ``nn.conv2d`` may have become ``nn.contrib_conv2d_NCHWc`` (AlterOpLayout on x86), ``nn.dense``
  ``nn.contrib_dense_pack``;
* ``nn.bias_add`` may have become ``add`` of a (layout-transformed) per-channel constant.

A *bias* is ``nn.bias_add(y, b)`` or ``add(y, b)`` / ``add(b, y)`` where ``b`` is a constant or a
tensor that broadcasts (per-channel: its shape differs from ``y``'s); a *residual* is ``add`` of a
non-constant tensor of ``y``'s own shape. Entry order is priority: longer variants first.
"""
from __future__ import annotations


from tvm.relay.dataflow_pattern import is_constant, is_op, wildcard

from ._table import Entry, PatternTable, Reject, register_table

__all__ = ["ANCHORS", "ACTIVATIONS", "anchor", "bias", "residual", "activation", "make_entry", "make_table", "GENERIC"]

#: anchor kind -> Relay op names it may appear as (frontend form first).
ANCHORS = {
    "conv2d": ("nn.conv2d", "nn.contrib_conv2d_NCHWc"),
    "conv2d_transpose": ("nn.conv2d_transpose",),
    "dense": ("nn.dense", "nn.contrib_dense_pack"),
    "batch_matmul": ("nn.batch_matmul",),
    "matmul": ("nn.matmul",),
}
ACTIVATIONS = ("relu", "clip", "sigmoid", "tanh", "gelu")


def _alt(pats):
    out = pats[0]
    for p in pats[1:]:
        out = out | p
    return out


def _comm(op, a, b):
    """``op(a, b) | op(b, a)`` for a commutative binary op."""
    return is_op(op)(a, b) | is_op(op)(b, a)


def anchor(kind: str):
    """Pattern of one anchor kind (any of its op spellings, two tensor operands)."""
    if kind not in ANCHORS:
        raise ValueError(f"unknown anchor {kind!r}; expected one of {sorted(ANCHORS)}")
    return _alt([is_op(name)(wildcard(), wildcard()) for name in ANCHORS[kind]])


def bias(y):
    """``bias_add(y, b) | add(y, b) | add(b, y)``; returns ``(pattern, b)`` (``b`` for checks)."""
    b = wildcard()
    return is_op("nn.bias_add")(y, b) | _comm("add", y, b), b


def residual(y):
    """``add(y, r) | add(r, y)``; returns ``(pattern, r)``."""
    r = wildcard()
    return _comm("add", y, r), r


def activation(y, kind: str):
    """Activation ``kind`` applied to ``y``; gelu as Relay frontends expand it."""
    if kind == "relu":
        return is_op("nn.relu")(y)
    if kind == "clip":
        return is_op("clip")(y)
    if kind == "sigmoid":
        return is_op("sigmoid")(y)
    if kind == "tanh":
        return is_op("tanh")(y)
    if kind == "gelu":
        # onnx: (0.5 * x) * (1 + erf(x / sqrt2)); pytorch: x * (erf(x * 1/sqrt2) * 0.5 + 0.5)
        scaled = is_op("divide")(y, is_constant()) | _comm("multiply", y, is_constant())
        erf = is_op("erf")(scaled)
        onnx = _comm("multiply", _comm("multiply", is_constant(), y), _comm("add", is_constant(), erf))
        torch = _comm("multiply", y, _comm("add", _comm("multiply", erf, is_constant()), is_constant()))
        return onnx | torch
    raise ValueError(f"unknown activation {kind!r}; expected one of {ACTIVATIONS}")


def _shape(expr):
    return [int(d) for d in expr.checked_type.shape]


def _check_bias(ctx):
    b, out = ctx.get("bias_operand"), ctx.get("bias")
    if b is None or out is None:
        return Reject("bias not found in the match")
    if out.op.name == "nn.bias_add" or b.__class__.__name__ == "Constant":
        return True
    if _shape(b) == _shape(out):
        return Reject(f"add operand of shape {_shape(b)} is neither constant nor per-channel (a residual)")
    return True


def _check_residual(ctx):
    r, out = ctx.get("residual_operand"), ctx.get("residual")
    if r is None or out is None:
        return Reject("residual not found in the match")
    if r.__class__.__name__ == "Constant":
        return Reject("residual operand is a constant (a bias, not a residual)")
    if _shape(r) != _shape(out):
        return Reject(f"residual operand {_shape(r)} broadcasts to {_shape(out)} (a bias, not a residual)")
    return True


def _all(*checks):
    checks = [c for c in checks if c is not None]
    if not checks:
        return None

    def check(ctx):
        for c in checks:
            res = c(ctx)
            if not res:
                return res
        return True

    check.__name__ = "+".join(c.__name__ for c in checks)
    return check


def make_entry(kind: str, with_bias: bool = False, act=None, with_residual: bool = False,
               table: str = "generic") -> Entry:
    """One ``<table>.<kind>[_bias][_add][_<act>]`` entry.

    Raises ``ValueError`` for an unknown anchor or activation.
    """
    if act is not None and act not in ACTIVATIONS:
        raise ValueError(f"unknown activation {act!r}; expected one of {ACTIVATIONS} or None")
    if not isinstance(with_bias, bool) or not isinstance(with_residual, bool):
        raise ValueError("with_bias and with_residual must be bools")
    y = anchor(kind)
    annotations = [("anchor", y)]
    eq = f"{kind}(x, w)"
    name = kind
    checks = []
    if with_bias:
        y, b = bias(y)
        annotations += [("bias", y), ("bias_operand", b)]
        eq, name = f"{eq} + b", name + "_bias"
        checks.append(_check_bias)
    if with_residual:
        y, r = residual(y)
        annotations += [("residual", y), ("residual_operand", r)]
        eq, name = f"{eq} + r", name + "_add"
        checks.append(_check_residual)
    if act is not None:
        y = activation(y, act)
        eq, name = f"{act}({eq})", f"{name}_{act}"
    parts = ["bias" if with_bias else "", "residual add" if with_residual else "", act or ""]
    doc = f"{kind}" + "".join(f" + {p}" for p in parts if p)
    return Entry(f"{table}.{name}", y, _all(*checks), f"{eq} -> one kernel", doc, tuple(annotations))


def make_table(name: str = "generic", kinds=tuple(ANCHORS), activations=ACTIVATIONS, bias_opts=(True, False),
               residual_opts=(True, False), doc: str = "") -> PatternTable:
    """All variants of ``kinds``, longest first (bias, residual, activation each optional)."""
    kinds = tuple(kinds)
    for k in kinds:
        if k not in ANCHORS:
            raise ValueError(f"unknown anchor {k!r}; expected one of {sorted(ANCHORS)}")
    for a in activations:
        if a not in ACTIVATIONS:
            raise ValueError(f"unknown activation {a!r}; expected one of {ACTIVATIONS}")
    entries = []
    for kind in kinds:
        variants = [(b, r, a) for b in bias_opts for r in residual_opts for a in (*activations, None)]
        variants.sort(key=lambda v: -(int(v[0]) + int(v[1]) + int(v[2] is not None)))
        for b, r, a in variants:
            entries.append(make_entry(kind, b, a, r, table=name))
    return PatternTable(name, entries, doc)


# Each entry: act(anchor(x, w) + b + r) -> one kernel, e.g.
#   relu(conv2d(x, w) + b + r)   -> generic.conv2d_bias_add_relu
#   dense(x, w) + b              -> generic.dense_bias
GENERIC = register_table(
    make_table(doc="float conv2d/conv2d_transpose/dense/batch_matmul/matmul + optional bias, residual add, activation")
)
