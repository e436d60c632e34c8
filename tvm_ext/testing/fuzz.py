"""Differential fuzzing of tvm-ext's passes, ``pipelines.int8()`` and ``tvm_ext.build``.

Design note
-----------
*Graphs are data.* :func:`graph_specs` is a ``hypothesis`` strategy drawing a :class:`Spec`: a
seed, a layout (NCHW / NHWC), an input, a list of steps and a variant. :func:`build_graph` turns a
spec into a type-inferred Relay module, deterministically (weights come from ``numpy`` generators
seeded by the spec). Every step list builds a well-typed graph: a step picks its operands by index
modulo the values built so far and adapts them (an int32 value feeding a conv is requantized
first, a float value feeding a QNN op is quantized, ...). Specs pickle and serialise to JSON, so
they cross process boundaries, shrink (by hypothesis in :func:`check_spec`-based tests, by
:func:`shrink` in the batch runner) and are stored with the failing module.

The grammar covers what the passes rewrite and what quantized CNNs contain: conv2d (grouped,
depthwise, strided, padded, explicitly padded), ``qnn.conv2d`` with per-tensor / per-channel
scales, QDQ convolutions and adds (dequantize -> float op -> quantize), dense / ``qnn.dense``
heads with parallel branches, requantization (float, relay.quantize shift, ``qnn.requantize``),
widening and narrowing casts, parallel identical casts, joins (add, multiply, maximum, concat,
``qnn.add``), pad, max / avg / global pools, clip / relu / sigmoid / hard-swish,
``annotation.stop_fusion``, tuples and ``TupleGetItem``, layout transforms. Variants: ``static``
(most), ``dynamic`` (batch ``?``), ``if`` / ``let`` / ``closure`` (constructs passes must skip).

*The oracle* (:func:`check_graph`), per registered pass (:data:`PASSES`), per stage (``start``:
the module as given; ``before_fuse``: after relay.build's prefix, as ``tvm_ext.build`` hands it to
passes), plus ``pipelines.int8()`` and ``tvm_ext.build`` itself:

* no exception, except a ``ValueError``/``TypeError`` naming the pass on a graph it must refuse;
* the caller's module is unchanged (``astext`` before/after);
* the output type-checks, every function is well formed, ``main`` has no free variables;
* running the pass again changes nothing (every tvm-ext pass documents idempotence);
* a graph with ``If``/``Let``/closures comes back unchanged;
* if the pass changed a static graph: ``tvm_ext.build`` with the pass at that stage, run on
  :data:`NUM_INPUTS` seeded inputs, equals ``tvm_ext.build`` without passes: integer outputs bit
  for bit, float outputs within :data:`FLOAT_RTOL`/:data:`FLOAT_ATOL` (relative to the output's
  magnitude); integer outputs of graphs that compute in float (a quantize after a float conv)
  within one step, since a last-bit float difference may flip one rounding. ``QDQToInteger``
  replaces float by integer arithmetic by design: its outputs (and the pipeline's, when it
  rewrote) may differ by :data:`QDQ_STEPS` quantization steps;
* ``tvm_ext.build`` without passes computes an integer graph exactly: bit for bit what
  ``relay.build`` at plain ``llvm`` gives (no SIMD dot product, so exact integer arithmetic; half
  of the int8 weight tensors span the full int8 range, where ``vpmaddubsw`` pair sums saturate).
  Stock ``relay.build`` at the target is compared too and only counted. A graph that computes in
  float is compared with stock ``relay.build`` within the float tolerance.

*Targets.* ``check_graph(..., target=)`` (``--target``, ``make fuzz TARGET=...``) applies the
passes, relay.build's prefix and every build at that target (default: the host CPU), so one
campaign covers one instruction set (``llvm -mcpu=x86-64-v3`` for AVX2, an AVX-512 VNNI CPU for
the 512-bit layouts and kernels). Code for a target this host cannot execute
(:func:`tvm_ext.x86.isa.runs_on_host`) is compiled, never run: structure, idempotence and build
errors are still checked, output comparisons are skipped and the table says why.

*Crash safety.* :func:`run` sends specs to worker processes (``multiprocessing`` spawn); a worker
that dies (segfault, LLVM abort) or hangs is reported as a crash of that spec and replaced; the
run goes on. Failing specs are shrunk (:func:`shrink`, each candidate again in a child) and
written to ``<out>/<id>.json`` (spec, failure, Relay text of the module) for
:func:`load_failure` / regression tests. ``python -m tvm_ext.testing.fuzz`` (``make fuzz``)
prints the table of :meth:`Summary.table`.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "Spec",
    "graph_specs",
    "build_graph",
    "check_graph",
    "check_spec",
    "run",
    "shrink",
    "Summary",
    "load_failure",
    "PASSES",
    "main",
]

#: Seeded inputs every built graph is run on.
NUM_INPUTS = 3
#: Float outputs: |a - b| <= FLOAT_ATOL * max(1, max|ref|) + FLOAT_RTOL * |ref|.
FLOAT_RTOL = 1e-4
FLOAT_ATOL = 1e-4
#: QDQToInteger (approximate by design): integer outputs within this many steps.
QDQ_STEPS = 2
#: ``tvm_ext.build`` vs plain ``relay.build`` is compared on one graph in this many (spec seed).
BUILD_CHECK_EVERY = 8
#: Seconds a worker may spend on one graph before it is killed and reported as a hang.
GRAPH_TIMEOUT = 300

VARIANTS = ("static", "dynamic", "if", "let", "closure")


# ------------------------------------------------------------------------------------------------
# the passes under test
# ------------------------------------------------------------------------------------------------
def _make_passes():
    """label -> (factory of a fresh pass, stages it is tried at)."""
    from tvm_ext import passes as P

    both = ("start", "before_fuse")
    return {
        "CombineParallelCast": (lambda: P.CombineParallelCast(), both),
        "CombineParallelOpBatch(nn.dense)": (lambda: P.CombineParallelOpBatch("nn.dense", "nn.batch_matmul", 2), both),
        "CombineParallelOpBatch(add)": (lambda: P.CombineParallelOpBatch("add", "add", 2), both),
        "CombineParallelOpBatch(multiply)": (lambda: P.CombineParallelOpBatch("multiply", "multiply", 2), both),
        "EpilogueBeforeChannelSlice": (lambda: P.EpilogueBeforeChannelSlice(), ("before_fuse",)),
        "FoldPadIntoConv": (lambda: P.FoldPadIntoConv(), both),
        "FoldZeroPointPadIntoConv": (lambda: P.FoldZeroPointPadIntoConv(), both),
        "FuseByPattern(generic)": (lambda: P.FuseByPattern("generic"), ("before_fuse",)),
        "FuseByPattern(qnn)": (lambda: P.FuseByPattern("qnn"), both),
        "FuseWideningIntoPool": (lambda: P.FuseWideningIntoPool(), both),
        "HoistUint8Shift": (lambda: P.HoistUint8Shift(), ("before_fuse",)),  # x86 legalization's shift
        "NarrowBeforeMaxPool": (lambda: P.NarrowBeforeMaxPool(), both),
        "NarrowKernelBoundaries": (lambda: P.NarrowKernelBoundaries(), both),
        "NonNegativeConvInputToUint8": (lambda: P.NonNegativeConvInputToUint8(), ("start",)),
        "QDQToInteger": (lambda: P.QDQToInteger(), ("start",)),
        "RemoveStopFusion": (lambda: P.RemoveStopFusion(), both),
        "TabulateEightBit": (lambda: P.TabulateEightBit(), ("before_fuse",)),
        "UniformZeroPointsToScalar": (lambda: P.UniformZeroPointsToScalar(), ("start",)),
        "WidenAfterMovement": (lambda: P.WidenAfterMovement(), both),
        "WidenInEachReader": (lambda: P.WidenInEachReader(), ("before_fuse",)),
    }


#: Labels of the passes the oracle runs (registry names, with arguments where a pass needs them).
PASSES = (
    "CombineParallelCast",
    "CombineParallelOpBatch(nn.dense)",
    "CombineParallelOpBatch(add)",
    "CombineParallelOpBatch(multiply)",
    "EpilogueBeforeChannelSlice",
    "FoldPadIntoConv",
    "FoldZeroPointPadIntoConv",
    "FuseByPattern(generic)",
    "FuseByPattern(qnn)",
    "FuseWideningIntoPool",
    "HoistUint8Shift",
    "NarrowBeforeMaxPool",
    "NarrowKernelBoundaries",
    "NonNegativeConvInputToUint8",
    "QDQToInteger",
    "RemoveStopFusion",
    "TabulateEightBit",
    "UniformZeroPointsToScalar",
    "WidenAfterMovement",
    "WidenInEachReader",
)


# ------------------------------------------------------------------------------------------------
# specs and the grammar
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    """A graph as data: ``build_graph(spec)`` makes the Relay module."""

    seed: int = 0
    layout: str = "NCHW"
    in_dtype: str = "int8"
    channels: int = 4
    height: int = 4
    width: int = 4
    steps: tuple = ()
    variant: str = "static"
    extra_output: int = -1  # index of a value returned too (-1: none)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["steps"] = [list(s) for s in self.steps]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Spec":
        d = dict(d)
        d["steps"] = tuple(tuple(s) for s in d.get("steps", ()))
        return cls(**d)


STEP_KINDS = (
    "conv", "requant", "widen", "ewise", "parallel_cast", "join", "pool", "stop", "layout", "tuple",
    "dense_head", "ewise_head", "qdq_add", "pad", "pool_quant", "nonneg_conv",
)


def graph_specs(max_steps: int = 6, variants=VARIANTS):
    """A hypothesis strategy of :class:`Spec`\\ s (small shapes: each TVM build takes < ~1 s)."""
    from hypothesis import strategies as st

    small = st.integers(0, 7)
    step = st.one_of(
        st.tuples(st.just("conv"), small, st.sampled_from([4, 8]), st.sampled_from([1, 3]), st.integers(1, 2),
                  st.integers(0, 1), st.integers(0, 2), st.sampled_from(["plain", "qnn", "qdq"]),
                  st.sampled_from(["none", "zero", "zp", "one"]), st.booleans()),
        st.tuples(st.just("requant"), small, st.sampled_from(["float", "shift", "qnn"]),
                  st.sampled_from(["int8", "uint8"]), st.booleans()),
        st.tuples(st.just("widen"), small, st.sampled_from(["int32", "float32", "dequantize"])),
        st.tuples(st.just("ewise"), small, st.sampled_from(["relu", "clip", "sigmoid", "hard_swish", "add_c",
                                                             "mul_c", "max_c", "round", "right_shift"])),
        st.tuples(st.just("parallel_cast"), small, st.sampled_from(["int8", "uint8", "int32", "float32", "int16"]),
                  st.integers(2, 3), st.sampled_from(["same", "relu", "add_c", "none"])),
        st.tuples(st.just("join"), small, small, st.sampled_from(["add", "multiply", "maximum", "concat", "qnn_add"])),
        st.tuples(st.just("pool"), small, st.sampled_from(["max", "avg", "avg_pad", "global_avg", "global_max"]),
                  st.sampled_from([2, 3]), st.integers(1, 2), st.integers(0, 1)),
        st.tuples(st.just("stop"), small),
        st.tuples(st.just("layout"), small, st.sampled_from(["blocked", "transpose"])),
        st.tuples(st.just("tuple"), small, st.integers(0, 1)),
        st.tuples(st.just("dense_head"), small, st.sampled_from([4, 8, 16]), st.integers(1, 3),
                  st.sampled_from(["plain", "qnn"]), st.sampled_from(["add", "tuple"])),
        st.tuples(st.just("ewise_head"), small, st.sampled_from(["add", "multiply"]), st.integers(2, 3)),
        st.tuples(st.just("qdq_add"), small, small),
        st.tuples(st.just("pad"), small, st.sampled_from(["zero", "one"])),
        # motifs: the exact chains NarrowBeforeMaxPool and NonNegativeConvInputToUint8 look for
        st.tuples(st.just("pool_quant"), small, st.sampled_from(["int8", "uint8"]), st.booleans()),
        st.tuples(st.just("nonneg_conv"), small, st.sampled_from([1, 3]), st.booleans()),
    )
    variant = st.sampled_from(list(variants)) if len(variants) > 1 else st.just(variants[0])
    if len(variants) > 1:
        # about one graph in eight is dynamic / If / Let / closure (passes must skip those)
        variant = st.one_of(st.just("static"), st.just("static"), st.just("static"), st.just("static"),
                            st.just("static"), st.just("static"), st.just("static"), variant)
    return st.builds(
        Spec,
        seed=st.integers(0, 2**16),
        layout=st.sampled_from(["NCHW", "NHWC"]),
        in_dtype=st.sampled_from(["int8", "uint8", "float32"]),
        channels=st.sampled_from([2, 4, 8]),
        height=st.integers(2, 6),
        width=st.integers(2, 6),
        steps=st.lists(step, min_size=1, max_size=max_steps).map(tuple),
        variant=variant,
        extra_output=st.integers(-1, 3),
    )


# ------------------------------------------------------------------------------------------------
# the builder
# ------------------------------------------------------------------------------------------------
@dataclass
class _V:
    expr: object
    dtype: str
    shape: tuple  # logical (C, H, W) for 4-D activations; (K,) for 2-D heads
    rank: int = 4


class _Builder:
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

    def int8_weights(self, shape) -> np.ndarray:
        """int8 weights: small ([-8, 8]) or, for every other tensor on average, the full int8 range,
        where TVM's vpmaddubsw pair sums saturate without VNNI."""
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

    # -- steps -----------------------------------------------------------------------------------
    def step(self, s):
        getattr(self, "s_" + s[0])(*s[1:])

    def s_conv(self, i, oc, k, stride, pad, gmode, flavor, explicit_pad, bias):
        relay = self.relay
        v = self.pick(i)
        c, h, w = v.shape
        if flavor == "plain" and v.dtype == "int32":
            v = self.to_8bit(v)
        if flavor in ("qnn", "qdq") and v.dtype not in ("int8", "uint8"):
            v = self.to_8bit(v, "uint8", "float") if v.dtype == "float32" else self.requant_qnn(v, "uint8")
        groups = 1
        if self.layout == "NCHW":
            if gmode == 1:
                groups, oc = c, c
            elif gmode == 2 and c % 2 == 0:
                groups = 2
        pad = min(pad, k // 2) if k > 1 else 0
        ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        if ho < 1 or wo < 1:
            k, pad, ho, wo = 1, 0, (h - 1) // stride + 1, (w - 1) // stride + 1
        x = v.expr
        int_data = v.dtype in ("int8", "uint8")
        if explicit_pad != "none":
            pw = [[0, 0], [0, 0], [0, 0], [0, 0]]
            sp = (2, 3) if self.layout == "NCHW" else (1, 2)
            for a in sp:
                pw[a] = [1, 1]
            zp = 128 if (flavor == "qnn" and v.dtype == "uint8") else 0
            val = {"zero": 0, "zp": zp, "one": 1}[explicit_pad]
            x = relay.nn.pad(x, pw, pad_value=relay.const(val, v.dtype))
            h, w = h + 2, w + 2
            ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        if self.layout == "NCHW":
            wshape, klayout = (oc, c // groups, k, k), "OIHW"
        else:
            wshape, klayout = (k, k, c, oc), "HWIO"
        attrs = dict(kernel_size=(k, k), strides=(stride, stride), padding=(pad, pad), channels=oc, groups=groups,
                     data_layout=self.layout, kernel_layout=klayout)
        if flavor == "plain" and not int_data:
            wt = relay.const((self.rng.standard_normal(wshape) * 0.3).astype("float32"))
            y = relay.nn.conv2d(x, wt, **attrs)
            out = "float32"
        elif flavor == "plain":
            wt = relay.const(self.int8_weights(wshape))
            y = relay.nn.conv2d(x, wt, out_dtype="int32", **attrs)
            out = "int32"
        elif flavor == "qnn":
            wt = relay.const(self.int8_weights(wshape))
            zp = 128 if v.dtype == "uint8" else 0
            per_channel = bool(self.rng.integers(2))
            ks = (self.rng.uniform(0.01, 0.1, oc).astype("float32") if per_channel
                  else np.float32(self.rng.uniform(0.01, 0.1)))
            y = relay.qnn.op.conv2d(x, wt, relay.const(zp, "int32"), relay.const(0, "int32"),
                                    relay.const(np.float32(0.05)), relay.const(ks), out_dtype="int32", **attrs)
            out = "int32"
        else:  # qdq: quantize(conv(dequantize(x), dequantize(w)))
            wt = relay.const(self.int8_weights(wshape))
            zp = 128 if v.dtype == "uint8" else 0
            xd = relay.qnn.op.dequantize(x, relay.const(np.float32(0.05)), relay.const(zp, "int32"))
            wd = relay.qnn.op.dequantize(wt, relay.const(np.float32(0.02)), relay.const(0, "int32"))
            y = relay.nn.conv2d(xd, wd, **attrs)
            if bias:
                y = relay.nn.bias_add(y, relay.const(self.rng.standard_normal(oc).astype("float32") * 0.1),
                                      axis=self.caxis())
                bias = False
            if self.rng.integers(2):
                y = relay.nn.relu(y)
            y = relay.qnn.op.quantize(y, relay.const(np.float32(0.05)), relay.const(0, "int32"),
                                      out_dtype="uint8")
            out = "uint8"
        if bias:
            if out == "float32":
                b = self.rng.standard_normal(oc).astype("float32") * 0.1
            else:
                b = self.rng.integers(-50, 51, oc).astype("int32")
            y = relay.nn.bias_add(y, relay.const(b), axis=self.caxis())
        self.push(y, out, (oc, ho, wo))

    def s_requant(self, i, style, dtype, relu):
        relay = self.relay
        v = self.pick(i)
        if v.dtype in ("int8", "uint8"):
            v = _V(relay.cast(v.expr, "int32"), "int32", v.shape)
        if relu:
            v = _V(relay.nn.relu(v.expr), v.dtype, v.shape)
        if style == "qnn" and v.dtype == "int32":
            out = self.requant_qnn(v, dtype)
        elif style == "shift" and v.dtype == "int32":
            out = self.to_8bit(v)
        else:
            out = self.requant_float(v, dtype)
        self.push(out.expr, out.dtype, out.shape)

    def s_widen(self, i, to):
        relay = self.relay
        v = self.pick(i)
        if to == "dequantize" and v.dtype in ("int8", "uint8"):
            zp = 128 if v.dtype == "uint8" else 0
            self.push(relay.qnn.op.dequantize(v.expr, relay.const(np.float32(0.05)), relay.const(zp, "int32")),
                      "float32", v.shape)
        elif to == "dequantize" or to == "float32":
            self.push(self.to_float(v).expr, "float32", v.shape)
        elif v.dtype == "float32":
            self.push(relay.cast(relay.clip(v.expr, -1000.0, 1000.0), "int32"), "int32", v.shape)
        else:
            self.push(relay.cast(v.expr, "int32"), "int32", v.shape)

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

    def s_ewise(self, i, kind):
        v = self.pick(i)
        self.push(self.ewise(v, kind), v.dtype, v.shape)

    def s_parallel_cast(self, i, to, n, consumer):
        relay = self.relay
        v = self.pick(i)
        src = v.expr
        if v.dtype == "float32" and to != "float32":
            src = relay.clip(src, -100.0, 100.0)
        branches = []
        for j in range(n):
            b = relay.cast(src, to)
            if consumer == "relu":
                b = relay.nn.relu(b)
            elif consumer == "add_c":
                b = relay.add(b, relay.const(np.asarray(j + 1, to)))
            branches.append(b)
        if consumer == "none":
            for b in branches[1:]:
                self.heads.append(_V(b, to, v.shape, 4))
            self.push(branches[0], to, v.shape)
            return
        out = branches[0]
        for b in branches[1:]:
            out = relay.add(out, b)
        self.push(out, to, v.shape)

    def s_join(self, i, j, kind):
        relay = self.relay
        a = self.pick(i)
        b = self.pick(j)
        if b.shape != a.shape or b is a:
            b = _V(relay.nn.relu(a.expr), a.dtype, a.shape)
        if kind == "qnn_add":
            a8 = self.as_dtype(a, "uint8") if a.dtype != "int8" else a
            b8 = self.as_dtype(b, a8.dtype)
            zp = relay.const(0, "int32")
            y = relay.qnn.op.add(a8.expr, b8.expr, relay.const(np.float32(0.05)), zp, relay.const(np.float32(0.1)),
                                 zp, relay.const(np.float32(0.1)), zp)
            self.push(y, a8.dtype, a.shape)
            return
        b = self.as_dtype(b, a.dtype)
        if kind == "concat":
            c, h, w = a.shape
            self.push(relay.concatenate([a.expr, b.expr], axis=self.caxis()), a.dtype, (2 * c, h, w))
            return
        op = {"add": relay.add, "multiply": relay.multiply, "maximum": relay.maximum}[kind]
        self.push(op(a.expr, b.expr), a.dtype, a.shape)

    def s_qdq_add(self, i, j):
        relay = self.relay
        a = self.pick(i)
        b = self.pick(j)
        if b.shape != a.shape:
            b = a
        a8, b8 = self.as_dtype(a, "uint8"), self.as_dtype(b, "uint8")
        s, zp = relay.const(np.float32(0.05)), relay.const(128, "int32")
        y = relay.add(relay.qnn.op.dequantize(a8.expr, s, zp), relay.qnn.op.dequantize(b8.expr, relay.const(
            np.float32(0.1)), zp))
        self.push(relay.qnn.op.quantize(y, relay.const(np.float32(0.1)), zp, out_dtype="uint8"), "uint8", a.shape)

    def s_pool(self, i, kind, k, stride, pad):
        relay = self.relay
        v = self.pick(i)
        c, h, w = v.shape
        if kind == "global_avg":
            if v.dtype in ("int8", "uint8"):
                v = _V(relay.cast(v.expr, "int32"), "int32", v.shape)
            self.push(relay.nn.global_avg_pool2d(v.expr, layout=self.layout), v.dtype, (c, 1, 1))
            return
        if kind == "global_max":
            self.push(relay.nn.global_max_pool2d(v.expr, layout=self.layout), v.dtype, (c, 1, 1))
            return
        k = min(k, h, w)
        pad = min(pad, k // 2)
        ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        if kind == "max":
            y = relay.nn.max_pool2d(v.expr, (k, k), (stride, stride), padding=(pad, pad), layout=self.layout)
        else:
            if v.dtype in ("int8", "uint8"):
                v = _V(relay.cast(v.expr, "int32"), "int32", v.shape)
            y = relay.nn.avg_pool2d(v.expr, (k, k), (stride, stride), padding=(pad, pad), layout=self.layout,
                                    count_include_pad=kind == "avg_pad")
        self.push(y, v.dtype, (c, ho, wo))

    def s_pool_quant(self, i, dtype, relu):
        """float -> max_pool -> [relu] -> multiply(c >= 0) -> round -> clip -> cast 8-bit"""
        relay = self.relay
        v = self.to_float(self.pick(i))
        self.values.append(v)
        self.s_pool(len(self.values) - 1, "max", 2, 2, 0)
        p = self.values[-1]
        if relu:
            p = _V(relay.nn.relu(p.expr), p.dtype, p.shape)
        q = self.requant_float(p, dtype)
        self.push(q.expr, q.dtype, q.shape)

    def s_nonneg_conv(self, i, k, stop):
        """int -> relu -> add -> right_shift -> clip(-127, 127) -> cast i8 -> [stop_fusion] -> conv2d"""
        relay = self.relay
        v = self.pick(i)
        x = v.expr if v.dtype == "int32" else relay.cast(relay.clip(v.expr, -1000.0, 1000.0) if v.dtype == "float32"
                                                         else v.expr, "int32")
        y = relay.right_shift(relay.add(relay.nn.relu(x), relay.const(4, "int32")), relay.const(3, "int32"))
        y = relay.cast(relay.clip(y, -127, 127), "int8")
        if stop:
            y = relay.annotation.stop_fusion(y)
        self.values.append(_V(y, "int8", v.shape))
        self.s_conv(len(self.values) - 1, 8, k, 1, 1, 0, "plain", "none", False)

    def s_stop(self, i):
        v = self.pick(i)
        self.push(self.relay.annotation.stop_fusion(v.expr), v.dtype, v.shape)

    def s_pad(self, i, val):
        relay = self.relay
        v = self.pick(i)
        c, h, w = v.shape
        pw = [[0, 0]] * 4
        for a in ((2, 3) if self.layout == "NCHW" else (1, 2)):
            pw[a] = [1, 1]
        y = relay.nn.pad(v.expr, pw, pad_value=relay.const(0 if val == "zero" else 1, v.dtype))
        self.push(y, v.dtype, (c, h + 2, w + 2))

    def s_layout(self, i, kind):
        relay = self.relay
        v = self.pick(i)
        c = v.shape[0]
        if kind == "blocked" and self.layout == "NCHW" and c % 2 == 0:
            y = relay.layout_transform(v.expr, "NCHW", "NCHW2c")
            y = relay.nn.relu(y)
            y = relay.layout_transform(y, "NCHW2c", "NCHW")
        else:
            other = "NHWC" if self.layout == "NCHW" else "NCHW"
            y = relay.layout_transform(relay.layout_transform(v.expr, self.layout, other), other, self.layout)
        self.push(y, v.dtype, v.shape)

    def s_tuple(self, i, idx):
        relay = self.relay
        v = self.pick(i)
        t = relay.Tuple([v.expr, self.ewise(v, "relu")])
        self.push(relay.TupleGetItem(t, idx), v.dtype, v.shape)

    def _flat(self, v: _V) -> _V:
        relay = self.relay
        c = v.shape[0]
        x = v.expr
        dt = v.dtype
        if dt in ("int8", "uint8"):
            x, dt = relay.cast(x, "int32"), "int32"
        x = relay.nn.global_avg_pool2d(x, layout=self.layout)
        return _V(relay.nn.batch_flatten(x), dt, (c,), 2)

    def s_dense_head(self, i, units, n, flavor, joiner):
        relay = self.relay
        f = self._flat(self.pick(i))
        k = f.shape[0]
        if f.dtype != "float32":
            if flavor == "qnn":
                f = self.requant_qnn(f, "int8")
            else:
                y = relay.right_shift(f.expr, relay.const(1, "int32"))
                f = _V(relay.cast(relay.clip(y, -127, 127), "int8"), "int8", f.shape, 2)
        outs = []
        for _ in range(n):
            if f.dtype == "float32":
                wt = relay.const((self.rng.standard_normal((units, k)) * 0.3).astype("float32"))
                outs.append(relay.nn.dense(f.expr, wt, units=units))
            elif flavor == "qnn":
                wt = relay.const(self.int8_weights((units, k)))
                outs.append(relay.qnn.op.dense(f.expr, wt, relay.const(0, "int32"), relay.const(0, "int32"),
                                               relay.const(np.float32(0.05)), relay.const(np.float32(0.02)),
                                               units=units, out_dtype="int32"))
            else:
                wt = relay.const(self.int8_weights((units, k)))
                outs.append(relay.nn.dense(f.expr, wt, units=units, out_dtype="int32"))
        dt = "float32" if f.dtype == "float32" else "int32"
        if joiner == "add" and n > 1:
            y = outs[0]
            for o in outs[1:]:
                y = relay.add(y, o)
            self.heads.append(_V(y, dt, (units,), 2))
        else:
            for o in outs:
                self.heads.append(_V(relay.nn.relu(o), dt, (units,), 2))

    def s_ewise_head(self, i, kind, n):
        relay = self.relay
        f = self._flat(self.pick(i))
        op = {"add": relay.add, "multiply": relay.multiply}[kind]
        outs = []
        for _j in range(n):
            c = relay.const((self.rng.integers(-3, 4, f.shape) if f.dtype != "float32"
                             else self.rng.standard_normal(f.shape)).astype(f.dtype).reshape(1, -1))
            outs.append(op(f.expr, c))
        y = outs[0]
        for o in outs[1:]:
            y = relay.add(y, o)
        self.heads.append(_V(y, f.dtype, f.shape, 2))

    # -- the module ------------------------------------------------------------------------------
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
        raise GeneratorError(f"spec does not type-check: {_last_line(err)}") from None


class GeneratorError(ValueError):
    """The grammar produced an ill-typed graph (a fuzzer bug, not a pass bug)."""


# ------------------------------------------------------------------------------------------------
# the oracle
# ------------------------------------------------------------------------------------------------
@dataclass
class Failure:
    """One oracle violation."""

    subject: str  # pass label, "int8()" or "build"
    stage: str  # "start" / "before_fuse" / "build"
    kind: str  # exception, mutated, ill_formed, not_idempotent, rewrote_control, mismatch, crash, hang
    message: str

    def signature(self) -> tuple:
        return (self.subject, self.stage, self.kind)


@dataclass
class GraphResult:
    """What the oracle saw on one graph."""

    variant: str = "static"
    rewrites: dict = field(default_factory=dict)  # "label@stage" -> 1
    builds: int = 0
    compared: int = 0
    failures: list = field(default_factory=list)
    skips: list = field(default_factory=list)  # reasons
    seconds: float = 0.0
    stock_inexact: bool = False  # stock relay.build at the target differs from exact integer arithmetic


def _last_line(err) -> str:
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else type(err).__name__


def _is_float_graph(mod) -> bool:
    from tvm import relay

    found = []

    def visit(node):
        if isinstance(node, (relay.Call, relay.Var, relay.Constant)):
            ty = node.checked_type
            if isinstance(ty, relay.TensorType) and str(ty.dtype).startswith("float"):
                found.append(True)

    relay.analysis.post_order_visit(mod["main"], visit)
    return bool(found)


def _output_steps(mod) -> list:
    """Per graph output (tuples flattened as the graph executor returns them): the quantization step
    of a float output that is a ``qnn.dequantize`` with a constant scalar scale, else None.

    A dequantized output holds 8-bit levels: one level of difference (which the oracle allows
    ``QDQToInteger`` for integer outputs) shows there as one step of the scale.
    """
    from tvm import relay

    from ..passes._util import constant_scalar, op_name

    def leaves(expr):
        if isinstance(expr, relay.Tuple):
            return [leaf for f in expr.fields for leaf in leaves(f)]
        return [expr]

    steps = []
    for out in leaves(mod["main"].body):
        dequantized = isinstance(out, relay.Call) and op_name(out) == "qnn.dequantize"
        scale = constant_scalar(out.args[1]) if dequantized else None
        steps.append(abs(float(scale)) if scale is not None else None)
    return steps


def _well_formed(mod) -> str | None:
    """None, or what is wrong with ``mod`` (type errors, malformed functions, free vars)."""
    import tvm
    from tvm import relay

    try:
        typed = relay.transform.InferType()(mod)
    except tvm.TVMError as err:
        return f"does not type-check: {_last_line(err)}"
    for gv in typed.get_global_vars():
        func = typed[gv]
        if isinstance(func, relay.Function):
            if not relay.analysis.well_formed(func):
                return f"{gv.name_hint} is not well formed"
            if gv.name_hint == "main" and relay.analysis.free_vars(func):
                return "free variables in main"
    return None


def _same(a, b) -> bool:
    import tvm

    return tvm.ir.structural_equal(a["main"], b["main"], map_free_vars=True)


def _targets(target=None):
    """``(what tvm_ext.build compiles for, what a plain relay.build compiles for)`` at ``target``
    (None: the host CPU)."""
    import tvm

    from tvm_ext.x86.target import build_target, host_target, safe_target

    tgt = build_target(target, None)
    return tvm.target.Target(tgt, host=tgt), host_target() if target is None else safe_target(target)


def compiled_only_reason(target) -> str | None:
    """None when code compiled for ``target`` runs on this host, else why outputs are not compared
    (the oracle then compiles every build and executes none)."""
    from tvm_ext.x86.isa import missing_on_host, runs_on_host

    tgt, _ = _targets(target)
    if runs_on_host(tgt):
        return None
    missing = missing_on_host(tgt) if tgt.kind.name == "llvm" else [tgt.kind.name]
    return f"outputs not compared, compiled only (the target needs {','.join(missing)}, which this host lacks)"


def _prefixed(mod, tgt):
    """The module ``tvm_ext.build`` hands to ``before_fuse`` passes (relay.build's prefix applied),
    and the names of the prefix passes that ran."""
    from tvm_ext.x86 import tuning, int8_conv as x86_int8
    from tvm_ext.core.build import _run_prefix, copy_module

    with x86_int8.kernels(), tuning.apply(tgt):
        return _run_prefix(copy_module(mod), tgt, 3)


def _build_prefixed(pre, tgt, prefix_names):
    """What ``tvm_ext.build`` does after its prefix and ``before_fuse`` passes: relay.build with the
    prefix's passes disabled, inside the same kernel and tuning contexts. The oracle uses it to
    build modules whose prefix it already ran (the prefix is deterministic), instead of running
    the prefix again for every pass."""
    import tvm
    from tvm import relay

    from tvm_ext.x86 import tuning, int8_conv as x86_int8
    from tvm_ext.core.build import copy_module

    with x86_int8.kernels(), tuning.apply(tgt), tvm.transform.PassContext(
            opt_level=3, disabled_pass=list(prefix_names)):
        return relay.build(copy_module(pre), target=tgt)


def _run_factory(factory, inputs_list):
    import tvm
    from tvm.contrib import graph_executor

    gm = graph_executor.GraphModule(factory["default"](tvm.cpu()))
    outs = []
    for inputs in inputs_list:
        for k, v in inputs.items():
            gm.set_input(k, v)
        gm.run()
        outs.append([gm.get_output(i).numpy() for i in range(gm.get_num_outputs())])
    return outs


def _inputs(mod) -> list:
    from tvm_ext.testing import random_inputs

    return [random_inputs(mod, seed=s) for s in range(NUM_INPUTS)]


def compare_outputs(ref, got, float_graph: bool, int_steps: int = 0, output_steps=None) -> str | None:
    """None when ``got`` matches ``ref`` under the oracle's tolerance, else what differs.

    ``output_steps`` (:func:`_output_steps`): for a dequantized float output, ``int_steps`` levels
    of its scale are allowed as well.
    """
    for n, (ra, ga) in enumerate(zip(ref, got)):
        if len(ra) != len(ga):
            return f"input {n}: {len(ra)} outputs vs {len(ga)}"
        steps = output_steps if output_steps is not None and len(output_steps) == len(ra) else [None] * len(ra)
        for i, (r, g) in enumerate(zip(ra, ga)):
            if r.dtype != g.dtype or r.shape != g.shape:
                return f"input {n} output {i}: {r.dtype}{r.shape} vs {g.dtype}{g.shape}"
            if np.issubdtype(r.dtype, np.integer) or r.dtype == bool:
                allowed = max(int_steps, 1 if float_graph else 0)
                diff = np.abs(r.astype(np.int64) - g.astype(np.int64))
                if diff.max(initial=0) > allowed:
                    return (f"input {n} output {i} ({r.dtype}): {int((diff > allowed).sum())} of {r.size} elements "
                            f"differ by more than {allowed} (max {int(diff.max())})")
            else:
                finite = np.isfinite(r) & np.isfinite(g)
                if not np.array_equal(np.isfinite(r), np.isfinite(g)) or not np.array_equal(r[~finite], g[~finite]):
                    if not np.array_equal(np.isnan(r), np.isnan(g)):
                        return f"input {n} output {i}: non-finite values differ"
                scale = max(1.0, float(np.abs(r[finite]).max(initial=0)))
                err = np.abs(r[finite] - g[finite])
                tol = FLOAT_ATOL * scale + FLOAT_RTOL * np.abs(r[finite])
                if int_steps and steps[i] is not None:  # a dequantized output: int_steps levels
                    tol = tol + int_steps * steps[i] * (1 + FLOAT_RTOL)
                if (err > tol).any():
                    return f"input {n} output {i} (float): max abs diff {float(err.max()):.3g} (scale {scale:.3g})"
    return None


def check_graph(mod, *, variant: str = "static", numeric: bool = True, build_check: bool = True,
                passes=PASSES, stages=("start", "before_fuse"), pipeline: bool = True,
                target: str | None = None) -> GraphResult:
    """Run the oracle on one type-inferred module (in this process: may crash with TVM).

    Parameters
    ----------
    mod : tvm.IRModule
        Typed module (never modified).
    variant : str
        ``"static"``; ``"dynamic"`` (not built: graph executor needs static shapes);
        ``"if"``/``"let"``/``"closure"`` (passes must return it unchanged).
    numeric : bool
        Build and run every rewrite (else structure only).
    build_check : bool
        Also compare ``tvm_ext.build`` without passes with plain ``relay.build``.
    target : str, optional
        The target passes, prefix and builds are for (default: the host CPU, as
        ``tvm_ext.build``). One whose code this host cannot execute
        (:func:`tvm_ext.x86.isa.runs_on_host`) is compiled only: every build is made, none is run,
        and the graph's skips say that its outputs were not compared.
    """
    import tvm

    import tvm_ext
    from tvm_ext.core import tvm_bugs
    from tvm_ext.core.pipelines import int8

    t0 = time.time()
    variant = _actual_variant(mod, variant)
    res = GraphResult(variant=variant)
    factories = _make_passes()
    text0 = mod.astext()
    control = variant in ("if", "let", "closure", "control")
    runnable = numeric and variant == "static"  # built (and run, when the target runs here)
    float_graph = _is_float_graph(mod)
    out_steps = _output_steps(mod)
    tgt, masked = _targets(target)
    not_run = compiled_only_reason(target) if runnable else None
    if not_run:
        res.skips.append(not_run)
    cache: dict = {}
    built: dict = {}  # (stage, structural hash) -> [(module, outputs)]
    pre, prefix_names = None, []

    def reference():
        """Outputs of ``tvm_ext.build(mod)`` (from the prefixed module when there is one)."""
        if "ref" not in cache:
            cache["inputs"] = _inputs(mod)
            res.builds += 1
            if pre is not None:
                tvm_bugs.check_module(mod, tgt)  # what tvm_ext.build checks before its prefix
                factory = _build_prefixed(pre, tgt, prefix_names)
            else:
                factory = tvm_ext.build(mod, target=target)
            cache["ref"] = None if not_run else _run_factory(factory, cache["inputs"])
        return cache["ref"]

    def outputs_of(stage, rewritten, build):
        """Outputs of a build of ``rewritten`` (the module after the pass at ``stage``); graphs
        that several passes rewrite to the same module are built once."""
        key = (stage, tvm.ir.structural_hash(rewritten))
        for other, outs in built.get(key, ()):
            if tvm.ir.structural_equal(other, rewritten):
                return outs
        res.builds += 1
        factory = build()
        outs = None if not_run else _run_factory(factory, cache["inputs"])
        built.setdefault(key, []).append((rewritten, outs))
        return outs

    def compare(subject, stage, passes_arg, at, steps=0, rewritten=None):
        try:
            ref = reference()
        except tvm_bugs.UnsupportedByTVM as err:  # tvm-ext refuses a known TVM bug: the oracle cannot run
            res.skips.append(f"reference refused (known TVM 0.19 bug, tvm_ext.core.tvm_bugs): {_short(err)}")
            return
        except Exception as err:  # noqa: BLE001  (the unrewritten graph itself does not build)
            res.skips.append(f"reference does not build: {_short(err)}")
            return
        try:
            if rewritten is None:  # the whole pipeline: through tvm_ext.build's own stages
                res.builds += 1
                factory = tvm_ext.build(mod, passes=passes_arg, at=at, target=target)
                got = None if not_run else _run_factory(factory, cache["inputs"])
            elif at == "before_fuse":
                got = outputs_of(at, rewritten, lambda: _build_prefixed(rewritten, tgt, prefix_names))
            else:  # tvm_ext.build(mod, passes, at="start") == the prefix and relay.build on the output
                got = outputs_of(at, rewritten, lambda: tvm_ext.build(rewritten, at="start", target=target))
        except Exception as err:  # noqa: BLE001
            res.failures.append(Failure(subject, stage, "build_error", _short(err)))
            return
        if not_run:
            return
        res.compared += 1
        why = compare_outputs(ref, got, float_graph, steps, out_steps)
        if why:
            res.failures.append(Failure(subject, stage, "mismatch", why))

    def structural(subject, stage, make, base):
        """Apply ``make()`` to ``base``; returns the output when it changed, else None."""
        text = base.astext() if base is not mod else text0
        p = make()
        try:
            with tgt, tvm.transform.PassContext(opt_level=3):
                out = p(base)
        except Exception as err:  # noqa: BLE001
            msg = _short(err)
            name = subject.split("(")[0]
            if variant != "static" and isinstance(err, (ValueError, TypeError)) and name in str(err):
                res.skips.append(f"{subject} refused {variant}: {msg}")
            else:
                res.failures.append(Failure(subject, stage, "exception", f"{type(err).__name__}: {msg}"))
            return None
        if base.astext() != text:
            res.failures.append(Failure(subject, stage, "mutated", "the input module was modified"))
        bad = _well_formed(out)
        if bad:
            res.failures.append(Failure(subject, stage, "ill_formed", bad))
            return None
        changed = not _same(out, base)
        if changed and control:
            res.failures.append(Failure(subject, stage, "rewrote_control", f"rewrote a function with {variant}"))
        try:
            with tgt, tvm.transform.PassContext(opt_level=3):
                again = make()(out)
            if not _same(again, out):
                res.failures.append(Failure(subject, stage, "not_idempotent", "a second run changed the module"))
        except Exception as err:  # noqa: BLE001
            res.failures.append(Failure(subject, stage, "exception",
                                        f"second run: {type(err).__name__}: {_short(err)}"))
        return out if changed else None

    if "before_fuse" in stages and variant == "static":
        try:
            pre, prefix_names = _prefixed(mod, tgt)
        except Exception as err:  # noqa: BLE001
            res.skips.append(f"relay.build prefix fails: {_short(err)}")
    elif "before_fuse" in stages:
        res.skips.append(f"before_fuse stage not tried ({variant})")
    for label in passes:
        make, where = factories[label]
        for stage in stages:
            if stage not in where:
                continue
            base = mod if stage == "start" else pre
            if base is None:
                continue
            out = structural(label, stage, make, base)
            if out is None:
                continue
            res.rewrites[f"{label}@{stage}"] = 1
            if runnable:
                compare(label, stage, [make()], stage, QDQ_STEPS if label == "QDQToInteger" else 0, rewritten=out)
            elif variant == "dynamic":
                res.skips.append("rewrite of a dynamic graph not run (graph executor)")
    if pipeline:
        pl = int8()
        changed = False
        out = structural("int8()", "start", lambda: pl.start, mod)
        changed |= out is not None
        qdq = out is not None and any(k.startswith("QDQToInteger") for k in res.rewrites)
        if pre is not None:
            out2 = structural("int8()", "before_fuse", lambda: pl.before_fuse, pre)
            changed |= out2 is not None
        if changed:
            res.rewrites["int8()"] = 1
            if runnable and out is None:  # start stage unchanged: the build is that of out2 (deduplicated)
                compare("int8()", "build", pl, "before_fuse", QDQ_STEPS if qdq else 0, rewritten=out2)
            elif runnable:
                compare("int8()", "build", pl, "before_fuse", QDQ_STEPS if qdq else 0)
    if build_check and runnable:
        try:
            ref = reference()
        except tvm_bugs.UnsupportedByTVM as err:
            res.skips.append(f"reference refused (known TVM 0.19 bug, tvm_ext.core.tvm_bugs): {_short(err)}")
        except Exception as err:  # noqa: BLE001
            res.skips.append(f"reference does not build: {_short(err)}")
        else:
            _check_build(res, mod, ref, cache["inputs"], float_graph, masked, not_run)
    res.seconds = time.time() - t0
    return res


def _check_build(res, mod, ref, inputs, float_graph: bool, masked, not_run):
    """``tvm_ext.build(mod)``'s outputs ``ref`` against the independent reference.

    An integer graph's reference is exact integer arithmetic: ``relay.build`` at plain ``llvm``,
    whose int8 ops use no SIMD dot product (no ``vpmaddubsw``), bit for bit. Stock ``relay.build``
    at the target is compared with it too, and only counted (``stock_inexact``): without VNNI its
    pair sums saturate. A graph that computes in float is compared with stock ``relay.build`` at
    the target within the float tolerance (a generic build rounds float differently: no FMA).
    """
    import tvm
    from tvm import relay

    def build_and_run(target):
        with tvm.transform.PassContext(opt_level=3):
            factory = relay.build(mod, target=target)
        res.builds += 1
        return None if not_run else _run_factory(factory, inputs)

    if float_graph:
        try:
            stock = build_and_run(masked)
        except Exception as err:  # noqa: BLE001
            res.skips.append(f"relay.build fails: {_short(err)}")
            return
        if stock is not None:
            res.compared += 1
            why = compare_outputs(ref, stock, float_graph)
            if why:
                res.failures.append(Failure("build", "build", "mismatch", f"tvm_ext.build vs relay.build: {why}"))
        return
    try:
        exact = build_and_run("llvm")
    except Exception as err:  # noqa: BLE001
        res.skips.append(f"generic llvm build fails: {_short(err)}")
        return
    if exact is None:
        return
    res.compared += 1
    why = compare_outputs(exact, ref, float_graph=False)
    if why:
        res.failures.append(Failure("build", "build", "inexact",
                                    f"tvm_ext.build vs exact integer arithmetic (generic llvm): {why}"))
    try:
        stock = build_and_run(masked)
    except Exception as err:  # noqa: BLE001
        res.skips.append(f"relay.build fails: {_short(err)}")
        return
    res.stock_inexact = compare_outputs(exact, stock, float_graph=False) is not None


def _actual_variant(mod, variant: str) -> str:
    """What ``main`` really contains (a spec's If/Let/closure may be dead code, left out of the graph)."""
    import tvm
    from tvm import relay

    from tvm_ext.passes._util import unsupported_construct

    main = mod["main"]
    if not unsupported_construct(main):
        return variant if variant in ("if", "let", "closure") else "control"
    for p in main.params:
        ty = p.checked_type
        if isinstance(ty, relay.TensorType) and not all(isinstance(d, tvm.tir.IntImm) for d in ty.shape):
            return "dynamic"
    return "static"


def _short(err) -> str:
    return _last_line(err)[:300]


def check_spec(spec: Spec, **kw) -> GraphResult:
    """Build ``spec`` and run :func:`check_graph` on it (in this process)."""
    try:
        mod = build_graph(spec)
    except GeneratorError as err:
        r = GraphResult(variant=spec.variant)
        r.skips.append(f"generator: {err}")
        return r
    kw = dict(kw)
    if kw.get("build_check", True) and spec.seed % BUILD_CHECK_EVERY:
        kw["build_check"] = False  # tvm_ext.build vs relay.build: one graph in BUILD_CHECK_EVERY
    return check_graph(mod, variant=spec.variant, **kw)


# ------------------------------------------------------------------------------------------------
# child processes
# ------------------------------------------------------------------------------------------------
def _worker_main(conn, kw):  # pragma: no cover  (runs in the child)
    os.environ.setdefault("TOPHUB_LOCATION", "NONE")
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("autotvm").setLevel(logging.ERROR)
    logging.getLogger("te_compiler").setLevel(logging.ERROR)
    import tvm_ext  # noqa: F401

    kw = dict(kw)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        key, spec_json = job
        if kw.get("selftest_abort_seed") == spec_json.get("seed"):
            os.abort()  # lets the tests check that a dying worker is reported, not fatal
        try:
            res = check_spec(Spec.from_json(spec_json), **{k: v for k, v in kw.items() if not k.startswith("selftest")})
        except Exception as err:  # noqa: BLE001  (an oracle bug: reported, not fatal)
            res = GraphResult(variant=spec_json.get("variant", "static"))
            res.failures.append(Failure("oracle", "-", "oracle_error",
                                        f"{type(err).__name__}: {_short(err)} | {traceback.format_exc()[-600:]}"))
        conn.send((key, dataclasses.asdict(res)))


class _Worker:
    def __init__(self, kw):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, kw), daemon=True)
        self.proc.start()
        child.close()
        self.job = None
        self.started = 0.0

    def send(self, key, spec: Spec):
        self.job = (key, spec)
        self.started = time.time()
        self.conn.send((key, spec.to_json()))

    def stop(self):
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def _from_dict(d: dict) -> GraphResult:
    d = dict(d)
    d["failures"] = [Failure(**f) for f in d["failures"]]
    return GraphResult(**d)


def run_specs(specs, *, workers: int = 2, kw=None, progress=None, timeout: float = GRAPH_TIMEOUT):
    """Check ``specs`` in ``workers`` child processes; yields ``(index, spec, GraphResult)``.

    A child that dies (segfault, abort) or exceeds ``timeout`` seconds on a graph yields a
    ``crash`` / ``hang`` failure for that graph and is replaced; the other graphs go on.
    """
    from multiprocessing.connection import wait

    kw = kw or {}
    specs = list(specs)
    todo = list(range(len(specs)))[::-1]
    pool = [_Worker(kw) for _ in range(max(1, min(workers, len(specs))))]
    try:
        for w in pool:
            if todo:
                i = todo.pop()
                w.send(i, specs[i])
        while any(w.job for w in pool):
            busy = [w for w in pool if w.job]
            ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout=5)
            for w in busy:
                done = None
                if w.conn in ready or w.conn.poll():
                    try:
                        key, d = w.conn.recv()
                        done = (key, _from_dict(d))
                    except (EOFError, OSError):
                        done = None
                if done is None and (not w.proc.is_alive() or time.time() - w.started > timeout):
                    key, spec = w.job
                    hang = w.proc.is_alive()
                    if hang:
                        w.proc.kill()
                    w.proc.join()
                    res = GraphResult(variant=spec.variant)
                    kind = "hang" if hang else "crash"
                    res.failures.append(Failure("process", "-", kind,
                                                f"worker {'hung' if hang else 'died'} (exit code {w.proc.exitcode})"))
                    done = (key, res)
                    idx = pool.index(w)
                    pool[idx] = w = _Worker(kw)
                if done is not None:
                    key, res = done
                    w.job = None
                    yield key, specs[key], res
                    if progress:
                        progress()
                    if todo:
                        i = todo.pop()
                        w.send(i, specs[i])
    finally:
        for w in pool:
            w.stop()


def check_spec_isolated(spec: Spec, kw=None, timeout: float = GRAPH_TIMEOUT) -> GraphResult:
    """:func:`check_spec` in a child process (a crash becomes a ``crash`` failure)."""
    for _, _, res in run_specs([spec], workers=1, kw=kw, timeout=timeout):
        return res
    raise RuntimeError("no result")


# ------------------------------------------------------------------------------------------------
# shrinking and failure files
# ------------------------------------------------------------------------------------------------
def _candidates(spec: Spec):
    steps = list(spec.steps)
    if spec.variant != "static":
        yield dataclasses.replace(spec, variant="static")
    if spec.extra_output != -1:
        yield dataclasses.replace(spec, extra_output=-1)
    for i in range(len(steps) - 1, -1, -1):  # drop one step
        yield dataclasses.replace(spec, steps=tuple(steps[:i] + steps[i + 1:]))
    for i in range(len(steps)):  # re-point operands at the input / previous value
        s = list(steps[i])
        if len(s) > 1 and isinstance(s[1], int) and s[1] != 0:
            for new in (0, i):
                if new != s[1]:
                    t = s.copy()
                    t[1] = new
                    yield dataclasses.replace(spec, steps=tuple(steps[:i] + [tuple(t)] + steps[i + 1:]))
    for name, small in (("channels", 2), ("height", 2), ("width", 2), ("seed", 0), ("layout", "NCHW")):
        if getattr(spec, name) != small:
            yield dataclasses.replace(spec, **{name: small})


def shrink(spec: Spec, still_fails, budget: int = 80) -> Spec:
    """Greedy delta debugging over :class:`Spec`: the smallest spec for which ``still_fails`` holds.

    ``still_fails(spec) -> bool`` is evaluated at most ``budget`` times (run it in a child process
    when the failure is a crash). Steps are dropped, operands re-pointed, shapes and the seed made
    small, until no candidate fails.
    """
    best = spec
    tries = 0
    improved = True
    while improved and tries < budget:
        improved = False
        for cand in _candidates(best):
            if tries >= budget:
                break
            tries += 1
            if still_fails(cand):
                best = cand
                improved = True
                break
    return best


def write_failure(out_dir, name: str, spec: Spec, failure: Failure, original: Spec | None = None,
                  target: str | None = None) -> Path:
    """Write ``<out_dir>/<name>.json``: the spec, the failure, the module's Relay text and the
    target the oracle compiled for (None: the host CPU)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        text = build_graph(spec).astext()
    except Exception as err:  # noqa: BLE001
        text = f"(does not build: {err})"
    doc = {
        "failure": dataclasses.asdict(failure),
        "spec": spec.to_json(),
        "original_spec": original.to_json() if original else None,
        "target": target,
        "relay": text,
    }
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def load_failure(path):
    """``(spec, module, failure dict)`` of a file written by the fuzzer (for regression tests); the
    failure dict's ``"target"`` is the target it was found at (None: the host CPU)."""
    doc = json.loads(Path(path).read_text())
    spec = Spec.from_json(doc["spec"])
    return spec, build_graph(spec), {**doc["failure"], "target": doc.get("target")}


# ------------------------------------------------------------------------------------------------
# the batch run and its table
# ------------------------------------------------------------------------------------------------
@dataclass
class Summary:
    """Totals of a fuzzing run."""

    graphs: int = 0
    variants: dict = field(default_factory=dict)
    rewrites: dict = field(default_factory=dict)
    builds: int = 0
    compared: int = 0
    failures: dict = field(default_factory=dict)  # signature -> count
    examples: dict = field(default_factory=dict)  # signature -> (spec, Failure)
    skips: dict = field(default_factory=dict)
    seconds: float = 0.0
    files: list = field(default_factory=list)
    stock_inexact: int = 0  # graphs where stock relay.build at the target misses exact integer arithmetic
    target: str = ""  # what the graphs were compiled for ("" : the host CPU)

    def add(self, spec: Spec, res: GraphResult):
        self.graphs += 1
        self.variants[res.variant] = self.variants.get(res.variant, 0) + 1
        for k in res.rewrites:
            self.rewrites[k] = self.rewrites.get(k, 0) + 1
        self.builds += res.builds
        self.compared += res.compared
        self.stock_inexact += int(res.stock_inexact)
        for f in res.failures:
            sig = f.signature()
            self.failures[sig] = self.failures.get(sig, 0) + 1
            self.examples.setdefault(sig, (spec, f))
        for s in set(_skip_key(r) for r in res.skips):
            self.skips[s] = self.skips.get(s, 0) + 1

    def table(self) -> str:
        rate = self.graphs / self.seconds if self.seconds else 0.0
        lines = [
            f"target: {self.target or 'host CPU'}",
            f"graphs tried: {self.graphs} in {self.seconds:.0f} s ({rate:.2f} graphs/s); "
            + "variants: " + ", ".join(f"{k} {v}" for k, v in sorted(self.variants.items())),
            f"TVM builds: {self.builds}; output comparisons: {self.compared} (x {NUM_INPUTS} inputs)",
            f"integer graphs where stock relay.build at the target differs from exact integer arithmetic: "
            f"{self.stock_inexact} (tvm_ext.build must not: failure kind 'inexact')",
            "",
            "| pass | stage | graphs rewritten |",
            "|---|---|---|",
        ]
        for label in PASSES:
            for stage in ("start", "before_fuse"):
                n = self.rewrites.get(f"{label}@{stage}")
                if n is not None:
                    lines.append(f"| {label} | {stage} | {n} |")
        lines.append(f"| int8() pipeline | both | {self.rewrites.get('int8()', 0)} |")
        lines += ["", "| failures (subject, stage, kind) | graphs |", "|---|---|"]
        if not self.failures:
            lines.append("| none (0 mismatches, 0 crashes) | 0 |")
        for sig, n in sorted(self.failures.items()):
            lines.append(f"| {' / '.join(sig)} | {n} |")
        lines += ["", "| skipped (reason) | graphs |", "|---|---|"]
        for reason, n in sorted(self.skips.items(), key=lambda kv: -kv[1]):
            lines.append(f"| {reason} | {n} |")
        if self.files:
            lines += ["", "failing graphs (shrunk):"] + [f"  {p}" for p in self.files]
        return "\n".join(lines)


def _skip_key(reason: str) -> str:
    """Group skip reasons (drop the variable tail after the first colon, keep the pass name)."""
    head = reason.split(":", 1)[0]
    return head[:120]


def _bad_target(target: str) -> str | None:
    """None for a target the oracle can compile for, else why not."""
    import tvm

    from tvm_ext.core import tvm_bugs

    try:
        tgt = tvm.target.Target(target)
        tvm_bugs.check_target(target)
    except Exception as err:  # noqa: BLE001  (TVMError, ValueError of tvm_bugs)
        return _short(err)
    if tgt.kind.name != "llvm":
        return f"a {tgt.kind.name} target (the oracle builds in its own process: CPU (llvm) targets only)"
    return None


def generate(n: int, seed: int = 0, max_steps: int = 6, variants=VARIANTS) -> list:
    """``n`` specs drawn by hypothesis from :func:`graph_specs`, reproducibly for a seed."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    out: list = []

    @hseed(seed)
    @settings(max_examples=n, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(graph_specs(max_steps=max_steps, variants=variants))
    def collect(spec):
        if len(out) < n:
            out.append(spec)

    while len(out) < n:  # hypothesis may stop early when it thinks the space is explored
        before = len(out)
        collect()
        if len(out) == before:
            break
        seed += 1
        collect = hseed(seed)(collect)
    return out[:n]


def run(n: int = 10000, seed: int = 0, workers: int = 2, out_dir="fuzz-failures", max_steps: int = 6,
        shrink_failures: bool = True, kw=None, progress: bool = True) -> Summary:
    """Generate ``n`` graphs, check them in child processes, shrink and write the failures.

    ``kw`` goes to :func:`check_graph` (``target``: what every graph is compiled for)."""
    t0 = time.time()
    specs = generate(n, seed, max_steps)
    summary = Summary(target=str((kw or {}).get("target") or ""))
    done = [0]
    last = [0.0]

    def tick():
        done[0] += 1
        if progress and (time.time() - last[0] > 2 or done[0] == len(specs)):
            last[0] = time.time()
            el = time.time() - t0
            eta = el / done[0] * (len(specs) - done[0])
            bar = "#" * int(30 * done[0] / len(specs))
            nfail = sum(summary.failures.values())
            sys.stderr.write(f"\rfuzz [{bar:<30}] {done[0]}/{len(specs)} {el:.0f}s eta {eta:.0f}s failures {nfail} ")
            sys.stderr.flush()

    for _, spec, res in run_specs(specs, workers=workers, kw=kw, progress=tick):
        summary.add(spec, res)
        for f in res.failures:
            logger.warning("graph failed: %s %s %s: %s", f.subject, f.stage, f.kind, f.message)
    if progress:
        sys.stderr.write("\n")
    for n_sig, (sig, (spec, failure)) in enumerate(sorted(summary.examples.items())):
        small = spec
        if shrink_failures:
            def still(cand, sig=sig):
                r = check_spec_isolated(cand, kw)
                return any(f.signature() == sig for f in r.failures)
            small = shrink(spec, still)
        name = "_".join(x.replace("(", "_").replace(")", "").replace(".", "_") for x in sig) + f"_{n_sig}"
        summary.files.append(str(write_failure(out_dir, name, small, failure, spec, (kw or {}).get("target"))))
    summary.seconds = time.time() - t0
    return summary


def main(argv=None) -> int:
    """``python -m tvm_ext.testing.fuzz [-n N] [--seed S] [--workers W] [--out DIR] [--target T]``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tvm_ext.testing.fuzz", description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=10000, help="graphs to try (default 10000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2, help="child processes (default 2)")
    ap.add_argument("--out", default="fuzz-failures", help="folder for shrunk failing graphs")
    ap.add_argument("--max-steps", type=int, default=6)
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("--no-build-check", action="store_true",
                    help="skip checking tvm_ext.build against exact integer arithmetic (integer graphs) or "
                         "relay.build (float graphs)")
    ap.add_argument("--target", default=None,
                    help='TVM target the passes, prefix and builds are for (default: the host CPU), e.g. '
                         '"llvm -mcpu=x86-64-v3"; code this host cannot execute is compiled, not run')
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    if args.target:
        bad = _bad_target(args.target)
        if bad:
            ap.error(f"--target {args.target!r}: {bad}")
        why = compiled_only_reason(args.target)
        if why:
            sys.stderr.write(f"--target {args.target}: {why}\n")
    kw = {"build_check": not args.no_build_check, "target": args.target}
    summary = run(args.n, args.seed, args.workers, args.out, args.max_steps, not args.no_shrink, kw)
    print(summary.table())
    return 1 if summary.failures else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
