"""The fuzzer's builder: a :class:`~.grammar.Spec` made into a type-inferred Relay module.

:func:`build_graph` is deterministic: weights come from ``numpy`` generators seeded by the spec.
:class:`_Builder` holds what the steps share: the values built so far (an operand index picks one
modulo their number), the layout, the random streams, and the dtype adapters that make any value
fit what a step needs (an int32 value feeding a conv is requantized first, a float value feeding
a QNN op is quantized, ...), so every step list builds a well-typed graph. The steps themselves,
one function per kind, are in :mod:`.steps` and :mod:`.motifs`; the control-flow variants (``If``, ``Let``, a
closure) are inserted here, after the middle step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .grammar import Spec
from .motifs import STEPS

__all__ = ["build_graph", "GeneratorError", "last_line", "short_error"]


class GeneratorError(ValueError):
    """The grammar produced an ill-typed graph (a fuzzer bug, not a pass bug)."""


def last_line(err) -> str:
    """The last non-empty line of an error's text (TVM puts the message after its traceback)."""
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else type(err).__name__


def short_error(err) -> str:
    """:func:`last_line`, at most 300 characters (what failures and skips quote)."""
    return last_line(err)[:300]


@dataclass
class _V:
    expr: object
    dtype: str
    shape: tuple  # logical (C, H, W) for 4-D activations; (K,) for 2-D heads
    rank: int = 4


class _Builder:
    """State and dtype adapters shared by the steps; :meth:`build` assembles the module."""

    def __init__(self, spec: Spec):
        from tvm import relay

        self.relay = relay
        self.spec = spec
        self.layout = spec.layout
        self.values: list[_V] = []
        self.heads: list[_V] = []
        self.lets: list = []  # (var, value) bindings, outermost first
        self.rng = np.random.default_rng(spec.seed)
        # a second stream decides the range of each int8 weight tensor, so that the graphs' other
        # values stay what the same spec has always built
        self.weight_rng = np.random.default_rng([spec.seed, 1])
        self.params: list = []
        self.trained = False  # int8_weights draws trained-like weights (a step sets it for its convs)

    def int8_weights(self, shape) -> np.ndarray:
        """int8 weights: small ([-8, 8]) or, for every other tensor on average, the full int8 range,
        where TVM's vpmaddubsw pair sums saturate without VNNI. While :attr:`trained` is set:
        bell-shaped, the largest at 127, as a symmetric quantizer leaves trained weights (few pairs
        saturate, and a channel order in which none does usually exists)."""
        if self.trained:
            bell = self.rng.standard_normal(shape)
            return np.round(bell * (127 / max(float(np.abs(bell).max()), 1e-6))).astype("int8")
        small = self.rng.integers(-8, 9, shape).astype("int8")
        if self.weight_rng.integers(2):
            return self.weight_rng.integers(-128, 128, shape).astype("int8")
        return small

    # -- shapes ----------------------------------------------------------------------------------
    def full_shape(self, c, h, w, batch=1):
        return (batch, c, h, w) if self.layout == "NCHW" else (batch, h, w, c)

    def caxis(self) -> int:
        return 1 if self.layout == "NCHW" else 3

    def chan_const(self, values):
        """A per-channel constant broadcasting against a 4-D activation."""
        c = len(values)
        shape = (c, 1, 1) if self.layout == "NCHW" else (c,)
        return self.relay.const(np.asarray(values).reshape(shape))

    def pick(self, i) -> _V:
        return self.values[i % len(self.values)]

    def push(self, expr, dtype, shape) -> _V:
        v = _V(expr, dtype, tuple(shape))
        self.values.append(v)
        return v

    # -- dtype adapters --------------------------------------------------------------------------
    def to_8bit(self, v: _V, dtype="int8", style="shift") -> _V:
        relay = self.relay
        if v.dtype in ("int8", "uint8"):
            return v
        if v.dtype == "float32" or style == "float":
            return self.requant_float(v, dtype)
        if v.dtype == "int32" and style == "qnn":
            return self.requant_qnn(v, dtype)
        x = v.expr if v.dtype == "int32" else relay.cast(v.expr, "int32")
        y = relay.right_shift(relay.add(x, relay.const(4, "int32")), relay.const(3, "int32"))
        y = relay.cast(relay.clip(y, -127, 127), "int8")
        return _V(y, "int8", v.shape)

    def requant_float(self, v: _V, dtype) -> _V:
        relay = self.relay
        x = v.expr if v.dtype == "float32" else relay.cast(v.expr, "float32")
        scale = float(self.rng.choice([0.05, 0.25, 0.5, 2.0]))
        y = relay.multiply(x, relay.const(scale, "float32"))
        y = relay.round(y) if self.rng.integers(2) else relay.floor(y)
        lo, hi = (0.0, 255.0) if dtype == "uint8" else (-128.0, 127.0)
        return _V(relay.cast(relay.clip(y, lo, hi), dtype), dtype, v.shape)

    def requant_qnn(self, v: _V, dtype) -> _V:
        relay = self.relay
        x = v
        if x.dtype != "int32":
            x = _V(relay.cast(x.expr, "int32"), "int32", x.shape)
        c = x.shape[0]
        if x.rank == 4 and self.rng.integers(2):
            in_scale = relay.const(self.rng.uniform(0.01, 0.2, c).astype("float32"))
            axis = self.caxis()
        else:
            in_scale = relay.const(np.float32(self.rng.uniform(0.01, 0.2)))
            axis = -1 if x.rank == 4 else 1
        zp_out = 0 if dtype == "int8" else int(self.rng.choice([0, 128]))
        y = relay.qnn.op.requantize(x.expr, in_scale, relay.const(0, "int32"), relay.const(np.float32(0.5)),
                                    relay.const(zp_out, "int32"), axis=axis if x.rank == 4 else -1,
                                    out_dtype=dtype)
        return _V(y, dtype, x.shape, x.rank)

    def to_float(self, v: _V) -> _V:
        relay = self.relay
        if v.dtype == "float32":
            return v
        return _V(relay.multiply(relay.cast(v.expr, "float32"), relay.const(0.125, "float32")), "float32", v.shape,
                  v.rank)

    def as_dtype(self, v: _V, dtype) -> _V:
        relay = self.relay
        if v.dtype == dtype:
            return v
        if dtype == "float32":
            return self.to_float(v)
        if dtype in ("int8", "uint8"):
            if v.dtype == "float32":
                return self.requant_float(v, dtype)
            lo, hi = (0, 127) if v.dtype in ("int8", "uint8") else ((0, 255) if dtype == "uint8" else (-128, 127))
            return _V(relay.cast(relay.clip(v.expr, lo, hi), dtype), dtype, v.shape, v.rank)
        return _V(relay.cast(v.expr, dtype), dtype, v.shape, v.rank)

    def value(self, expr, dtype, shape, rank: int = 4) -> _V:
        """A value that is not (yet) one of the operands steps pick from."""
        return _V(expr, dtype, tuple(shape), rank)

    def ewise(self, v: _V, kind):
        relay = self.relay
        x, dt, c = v.expr, v.dtype, v.shape[0]
        is_f = dt.startswith("float")
        if kind == "relu":
            return relay.nn.relu(x)
        if kind == "clip":
            return relay.clip(x, 0.0, 6.0) if is_f else relay.clip(x, -20, 100)
        if kind in ("sigmoid", "hard_swish", "round") and not is_f:
            kind = "max_c"
        if kind == "sigmoid":
            return relay.sigmoid(x)
        if kind == "hard_swish":
            return relay.divide(relay.multiply(x, relay.clip(relay.add(x, relay.const(3.0)), 0.0, 6.0)),
                                relay.const(6.0))
        if kind == "round":
            return relay.round(x)
        if kind == "right_shift" and dt in ("int32", "int8", "uint8"):
            return relay.right_shift(x, relay.const(1, dt))
        if kind == "add_c":
            vals = self.rng.integers(-3, 4, c) if not is_f else self.rng.standard_normal(c) * 0.5
            return relay.add(x, self.chan_const(vals.astype(dt)) if v.rank == 4 else relay.const(vals.astype(dt)))
        if kind == "mul_c":
            vals = self.rng.integers(0, 3, c) if not is_f else self.rng.uniform(-1, 2, c)
            return relay.multiply(x, self.chan_const(vals.astype(dt)) if v.rank == 4 else relay.const(vals.astype(dt)))
        return relay.maximum(x, relay.const(np.asarray(1 if not is_f else 0.5, dt)))

    # -- the module ------------------------------------------------------------------------------
    def step(self, s):
        STEPS[s[0]](self, *s[1:])

    def build(self):
        import tvm

        relay = self.relay
        spec = self.spec
        dynamic = spec.variant == "dynamic"
        shape = self.full_shape(spec.channels, spec.height, spec.width, relay.Any() if dynamic else 1)
        x = relay.var("x", shape=shape, dtype=spec.in_dtype)
        self.params.append(x)
        self.push(x, spec.in_dtype, (spec.channels, spec.height, spec.width))
        ctrl_at = len(spec.steps) // 2
        for n, s in enumerate(spec.steps):
            self.step(s)
            if n == ctrl_at and spec.variant in ("if", "let", "closure"):
                self._control(spec.variant)
        if not spec.steps and spec.variant in ("if", "let", "closure"):
            self._control(spec.variant)
        outs = [self.values[-1]]
        if spec.extra_output >= 0 and len(self.values) > 2:
            extra = self.values[1 + spec.extra_output % (len(self.values) - 1)]
            if extra is not outs[0]:
                outs.append(extra)
        outs += self.heads
        body = outs[0].expr if len(outs) == 1 else relay.Tuple([o.expr for o in outs])
        for var, val in reversed(self.lets):
            body = relay.Let(var, val, body)
        func = relay.Function(relay.analysis.free_vars(body), body)
        return relay.transform.InferType()(tvm.IRModule.from_expr(func))

    def _control(self, variant):
        relay = self.relay
        v = self.values[-1]
        ty = relay.TensorType(self.full_shape(*v.shape), v.dtype)
        if variant == "if":
            cond = relay.var("cond", shape=(), dtype="bool")
            self.push(relay.If(cond, v.expr, self.ewise(v, "relu")), v.dtype, v.shape)
        elif variant == "let":
            lv = relay.var("bound", type_annotation=ty)
            self.lets.append((lv, v.expr))
            self.push(lv, v.dtype, v.shape)
        else:  # closure: a local function called once
            p = relay.var("p", type_annotation=ty)
            fn = relay.Function([p], self.ewise(_V(p, v.dtype, v.shape), "relu"))
            self.push(relay.Call(fn, [v.expr]), v.dtype, v.shape)


def build_graph(spec: Spec):
    """The type-inferred ``tvm.IRModule`` of ``spec`` (deterministic).

    Raises
    ------
    GeneratorError
        The builder made a graph that does not type-check (a bug of the grammar, counted apart).
    """
    import tvm

    try:
        return _Builder(spec).build()
    except tvm.TVMError as err:
        raise GeneratorError(f"spec does not type-check: {last_line(err)}") from None
