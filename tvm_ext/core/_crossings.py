"""Why a float or wide-integer tensor crosses a kernel boundary (used by :mod:`tvm_ext.core.report`).

Two local facts per kernel, read from the fused Relay ``Primitive`` function the build lowered
(``function_metadata[...].relay_primfuncs``), then joined along the graph executor's edges:

* **What an output holds** (walking back from the output): ``"q8"`` (8-bit levels in float),
  ``"float"`` (real float compute) or ``"param:i"`` (it only moves input ``i``; the graph then
  looks at that input's producer).
* **What a reader does with an input** (walking forward): float inputs are ``"quantize"``d or used
  by ``"float"`` compute; integer inputs are narrowed to 8 bits (``"narrow"``), turned into float
  (``"dequantize"``) or used by integer compute (``"int"``); ``"out:k"`` when they only move to the
  kernel's output ``k`` (the graph then follows that output's readers).

Only ops listed below are looked through; anything else counts as compute, so an unknown op
makes a crossing "float compute" (on purpose) rather than "avoidable": the report never claims
waste it cannot show. Operands are constant when they are Relay constants or graph parameters.
Each fact in full, and how tuples (``split``, ``concatenate``) are followed: docs/reports.md
("How a crossing's reason is computed").
"""
from __future__ import annotations

#: Ops that move data or keep a quantized value on its grid (unary in their first argument).
MOVE_OPS = frozenset({
    "layout_transform", "reshape", "transpose", "squeeze", "expand_dims", "nn.batch_flatten",
    "strided_slice", "nn.pad", "nn.max_pool1d", "nn.max_pool2d", "nn.max_pool3d",
    "nn.adaptive_max_pool2d", "nn.relu", "clip", "copy", "reverse", "tile", "repeat", "broadcast_to",
    "nn.space_to_depth", "nn.depth_to_space", "contrib_reverse_reshape", "nn.upsampling",
})
#: Float ops that put a value on an integer grid (quantization's rounding step).
_ROUNDING = frozenset({"round", "floor", "ceil", "trunc"})
#: Elementwise ops that are affine (or shift) in one operand when the others are constants.
AFFINE_OPS = frozenset({"add", "subtract", "multiply", "divide", "maximum", "minimum", "negative",
                        "right_shift", "left_shift", "fixed_point_multiply", "fixed_point_multiply_per_axis"})


def _dtype(expr) -> str:
    try:
        return str(expr.checked_type.dtype)
    except Exception:  # tuple-typed or untyped
        return ""


def is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def is_int(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def _bits(dtype: str) -> int:
    digits = "".join(c for c in dtype if c.isdigit())
    return int(digits) if digits else 0


class _Func:
    def __init__(self, func, const_params):
        from tvm import relay

        self.relay = relay
        self.params = list(func.params)
        #: (param, field or None) -> index in the graph node's flattened inputs
        self.flat: dict = {}
        for p in self.params:
            ty = _param_type(p)
            for j in (range(len(ty.fields)) if isinstance(ty, relay.TupleType) else [None]):
                self.flat[(p, j)] = len(self.flat)
        const_flat = set(const_params)
        self.const = {p for (p, j), i in self.flat.items() if j is None and i in const_flat}
        body = func.body
        self.body = body
        self.tuple_call_body = not isinstance(body, relay.Tuple) and isinstance(
            getattr(body, "checked_type", None), relay.TupleType)
        if isinstance(body, relay.Tuple):
            self.outputs = list(body.fields)
        elif self.tuple_call_body:  # e.g. a split ends the kernel: one output per part
            self.outputs = [relay.TupleGetItem(body, k) for k in range(len(body.checked_type.fields))]
        else:
            self.outputs = [body]
        self.users: dict = {}

        def visit(node):
            if isinstance(node, relay.Call):
                for a in node.args:
                    self.users.setdefault(a, []).append(node)
            elif isinstance(node, relay.Tuple):
                for a in node.fields:
                    self.users.setdefault(a, []).append(node)
            elif isinstance(node, relay.TupleGetItem):
                self.users.setdefault(node.tuple_value, []).append(node)

        relay.analysis.post_order_visit(func, visit)

    def _tuple_parts(self, t) -> list:
        """The fields of a tuple expression (a Tuple, or a tuple-typed parameter's items), else []."""
        if isinstance(t, self.relay.Tuple):
            return list(t.fields)
        ty = getattr(t, "checked_type", None)
        if isinstance(t, self.relay.Var) and isinstance(ty, self.relay.TupleType):
            return [self.relay.TupleGetItem(t, j) for j in range(len(ty.fields))]
        return []

    def is_const(self, e) -> bool:
        return isinstance(e, self.relay.Constant) or e in self.const

    def _op(self, e):
        if isinstance(e, self.relay.Call) and hasattr(e.op, "name"):
            return str(e.op.name)
        return None

    def _affine_arg(self, call):
        """The one non-constant argument of an affine call, or None."""
        live = [a for a in call.args if not self.is_const(a)]
        return live[0] if len(live) == 1 else None

    # -- backward: what an output holds --------------------------------------------------
    def _int_chain_8bit(self, e, depth=0) -> bool:
        while depth < 64:
            depth += 1
            dt = _dtype(e)
            if is_int(dt) and _bits(dt) <= 8:
                return True
            op = self._op(e)
            if op == "cast" or op in MOVE_OPS:
                if op == "clip" and _clip_levels(e) <= 256:
                    return True
                e = e.args[0]
            elif op in AFFINE_OPS:
                e = self._affine_arg(e)
                if e is None:
                    return False
            else:
                return False
        return False

    def output_kind(self, e, depth: int = 0) -> str:
        clip8 = False
        for _ in range(256):
            if isinstance(e, self.relay.Var):
                return "const" if e in self.const else f"param:{self.flat.get((e, None), -1)}"
            if isinstance(e, self.relay.Constant):
                return "const"
            if isinstance(e, self.relay.TupleGetItem):
                tup = e.tuple_value
                if isinstance(tup, self.relay.Var):  # a field of a tuple-typed parameter
                    return "const" if tup in self.const else f"param:{self.flat.get((tup, e.index), -1)}"
                if isinstance(tup, self.relay.Tuple):
                    e = tup.fields[e.index]
                    continue
                if self._op(tup) == "split":  # a split moves data: the part holds what its input holds
                    e = tup.args[0]
                    continue
                return "float"
            op = self._op(e)
            if op == "concatenate" and is_float(_dtype(e)) and depth < 8:
                parts = self._tuple_parts(e.args[0])
                kinds = {self.output_kind(p, depth + 1) for p in parts} if parts else {"float"}
                return "q8" if kinds == {"q8"} else "float"
            if op is None:
                return "float" if is_float(_dtype(e)) else "int"
            if not is_float(_dtype(e)):
                return "int"
            if op == "cast":
                src = e.args[0]
                if is_int(_dtype(src)):
                    return "q8" if self._int_chain_8bit(src) else "float"
                e = src
            elif op in _ROUNDING:
                return "q8" if clip8 else "float"
            elif op in MOVE_OPS:
                if op == "clip" and _clip_levels(e) <= 256:
                    clip8 = True
                e = e.args[0]
            elif op in AFFINE_OPS:
                e = self._affine_arg(e)
                if e is None:
                    return "float"
            else:
                return "float"
        return "float"

    # -- forward: what a reader does with an input -------------------------------------
    def input_use(self, var, field=None) -> str:
        if var in self.const:
            return "const"
        uses: set = set()
        if field is None:
            self._uses(var, uses, 0)
        else:  # field ``field`` of a tuple-typed parameter
            dt = str(var.checked_type.fields[field].dtype)
            for u in self.users.get(var, []):
                if isinstance(u, self.relay.TupleGetItem):
                    if u.index == field:
                        self._uses(u, uses, 1)
                elif self._op(u) == "concatenate":  # the whole tuple is moved
                    self._uses(u, uses, 1)
                else:
                    uses.add("float" if is_float(dt) else "int")
        return "|".join(sorted(uses)) if uses else "unused"

    def _moves(self, e, uses: set, depth: int) -> bool:
        """Follow data movement through tuples (concatenate, split); True when handled."""
        relay = self.relay
        if self.tuple_call_body and e.same_as(self.body):  # e.g. the kernel's final split
            uses.update(f"out:{k}" for k in range(len(self.outputs)))
            return True
        if isinstance(getattr(e, "checked_type", None), relay.TupleType):  # a split's result
            for u in self.users.get(e, []):
                if isinstance(u, relay.TupleGetItem):
                    self._uses(u, uses, depth + 1)
                else:
                    uses.add("float")
            return True
        return False

    def _uses(self, e, uses: set, depth: int) -> None:
        if depth > 64:
            uses.add("float" if is_float(_dtype(e)) else "int")
            return
        for k, out in enumerate(self.outputs):
            if out.same_as(e):
                uses.add(f"out:{k}")
        if self._moves(e, uses, depth):
            return
        dt = _dtype(e)
        for u in self.users.get(e, []):
            op = self._op(u)
            if isinstance(u, self.relay.Tuple):  # a concatenate's operands move; other tuples: compute
                cats = self.users.get(u, [])
                if cats and all(self._op(c) == "concatenate" for c in cats):
                    for c in cats:
                        self._uses(c, uses, depth + 1)
                else:
                    uses.add("float" if is_float(dt) else "int")
                continue
            if op == "split" and u.args[0].same_as(e):  # moves into the split's parts
                self._uses(u, uses, depth + 1)
                continue
            if op is None:  # TupleGetItem and others: treated as compute
                uses.add("float" if is_float(dt) else "int")
                continue
            to = _dtype(u)
            if is_float(dt):
                if op == "cast":
                    if is_int(to):
                        uses.add("quantize")
                    else:
                        self._uses(u, uses, depth + 1)
                elif op in _ROUNDING:
                    uses.add("quantize")
                elif op in MOVE_OPS and u.args[0].same_as(e):
                    self._uses(u, uses, depth + 1)
                elif op in AFFINE_OPS and self._affine_arg(u) is not None and self._affine_arg(u).same_as(e):
                    self._uses(u, uses, depth + 1)
                else:
                    uses.add("float")
            else:
                if op == "cast":
                    if is_float(to):  # a requantize computed in float arithmetic narrows in the end
                        sub: set = set()
                        self._uses(u, sub, depth + 1)
                        uses.add("narrow" if sub and sub <= {"quantize"} else "dequantize")
                    elif is_int(to) and _bits(to) <= 8:
                        uses.add("narrow")
                    else:
                        self._uses(u, uses, depth + 1)
                elif (op in MOVE_OPS and u.args[0].same_as(e)) or (
                        op in AFFINE_OPS and self._affine_arg(u) is not None and self._affine_arg(u).same_as(e)):
                    self._uses(u, uses, depth + 1)
                else:
                    uses.add("int")


def _clip_levels(call) -> float:
    try:
        return float(call.attrs.a_max) - float(call.attrs.a_min) + 1
    except Exception:
        return float("inf")


def _param_type(param):
    return getattr(param, "checked_type", None) or param.type_annotation


def analyse(func, const_inputs) -> tuple[tuple, tuple]:
    """``(input_uses, output_kinds)`` of one fused Relay function.

    ``const_inputs``: indices (in the graph node's flattened input list) of weights/constants.
    Tuple-typed parameters count once per field (the graph node's inputs are flattened).
    """
    f = _Func(func, const_inputs)
    return (tuple(f.input_use(p, j) for (p, j) in f.flat), tuple(f.output_kind(o) for o in f.outputs))
