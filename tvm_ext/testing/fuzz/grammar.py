"""The fuzzer's grammar: a graph as data (:class:`Spec`) and the hypothesis strategy that draws it.

A spec is a seed, a layout, an input, a list of steps and a variant. Each step is a tuple
``(kind, operand index, arguments...)``; :mod:`.builder` and :mod:`.steps` turn it into Relay.
Specs pickle and serialise to JSON, so they cross process boundaries, shrink and are stored with
the failing module. :func:`generate` draws a reproducible list of specs for a seed.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["Spec", "STEP_KINDS", "VARIANTS", "graph_specs", "generate"]

VARIANTS = ("static", "dynamic", "if", "let", "closure")


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
    "dense_head", "ewise_head", "qdq_add", "pad", "pool_quant", "nonneg_conv", "sliced_conv", "stepwise_chain",
    "paired_convs", "mobile_block",
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
        # halves: the output scale twice the inputs' (exact halves); calibrated: scales of no simple ratio;
        # projection / conv_branch: calibrated, a residual block's two 8-bit tensors, conv(a) + conv(a) / a + conv(a)
        st.tuples(st.just("qdq_add"), small, small,
                  st.sampled_from(["halves", "projection", "conv_branch", "calibrated"])),
        st.tuples(st.just("pad"), small, st.sampled_from(["zero", "one"])),
        # motifs: the exact chains NarrowBeforeMaxPool, NonNegativeConvInputToUint8 and (channel counts no
        # int8 channel block divides) EpilogueBeforeChannelSlice and FoldChannelRepadIntoConv look for
        st.tuples(st.just("pool_quant"), small, st.sampled_from(["int8", "uint8"]), st.booleans()),
        st.tuples(st.just("nonneg_conv"), small, st.sampled_from([1, 3]), st.booleans()),
        st.tuples(st.just("sliced_conv"), small, st.sampled_from([3, 6, 12]), st.booleans()),
        # a chain of one 8-bit value, each step requantized (TabulateEightBit: long chains, sigmoid)
        st.tuples(st.just("stepwise_chain"), small, st.integers(1, 6), st.booleans()),
        # int8 convs with trained-like weights, the channels between them, a classifier head (OrderChannelsInSafePairs)
        st.tuples(st.just("paired_convs"), small, st.sampled_from([8, 16, 24, 40]), st.sampled_from([1, 3]),
                  st.sampled_from(["none", "max", "head"]), st.sampled_from([0, 24])),
        # a 1x1 conv and a uint8 depthwise conv over 8- to 32-channel blocks (AVX-512 VNNI's depthwise tap forms)
        st.tuples(st.just("mobile_block"), small, st.sampled_from([8, 16, 24, 32]), st.sampled_from([3, 5]),
                  st.integers(1, 2)),
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
