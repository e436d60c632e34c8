"""The grammar's motifs: steps that build the exact chains particular passes look for.

Random steps (:mod:`.steps`) rarely assemble a pass's whole pattern; each motif builds one, with
its variations as arguments, so that the fuzzer reaches the pass. :data:`STEPS` is the whole table:
the general steps, then the motifs.
"""
from __future__ import annotations

import numpy as np

from .steps import STEPS as GENERAL_STEPS
from .steps import conv, pool

__all__ = ["STEPS"]


def pool_quant(g, i, dtype, relu):
    """float -> max_pool -> [relu] -> multiply(c >= 0) -> round -> clip -> cast 8-bit"""
    relay = g.relay
    v = g.to_float(g.pick(i))
    g.values.append(v)
    pool(g, len(g.values) - 1, "max", 2, 2, 0)
    p = g.values[-1]
    if relu:
        p = g.value(relay.nn.relu(p.expr), p.dtype, p.shape)
    q = g.requant_float(p, dtype)
    g.push(q.expr, q.dtype, q.shape)


def nonneg_conv(g, i, k, stop):
    """int -> relu -> add -> right_shift -> clip(-127, 127) -> cast i8 -> [stop_fusion] -> conv2d"""
    relay = g.relay
    v = g.pick(i)
    x = v.expr if v.dtype == "int32" else relay.cast(relay.clip(v.expr, -1000.0, 1000.0) if v.dtype == "float32"
                                                     else v.expr, "int32")
    y = relay.right_shift(relay.add(relay.nn.relu(x), relay.const(4, "int32")), relay.const(3, "int32"))
    y = relay.cast(relay.clip(y, -127, 127), "int8")
    if stop:
        y = relay.annotation.stop_fusion(y)
    g.values.append(g.value(y, "int8", v.shape))
    conv(g, len(g.values) - 1, 8, k, 1, 1, 0, "plain", "none", False)


#: The steps of :func:`stepwise_chain`: name -> the float op on the dequantized value ``d``.
_CHAIN_STEPS = {
    "multiply_c": lambda relay, d: relay.multiply(d, relay.const(0.7)),
    "add_c": lambda relay, d: relay.add(d, relay.const(3.0)),
    "clip": lambda relay, d: relay.clip(d, 0.0, 6.0),
    "square": lambda relay, d: relay.multiply(d, d),
    "divide_c": lambda relay, d: relay.divide(d, relay.const(6.0)),
    "sigmoid": lambda relay, d: relay.sigmoid(d),
}


def stepwise_chain(g, i, steps, sigmoid):
    """8-bit -> ``steps`` x (dequantize -> multiply, add, clip, square or [sigmoid] -> quantize) -> 8-bit: one
    value's elementwise chain, as exporters write a quantized hard-swish step by step (each step requantized)"""
    relay = g.relay
    v = g.to_8bit(g.pick(i), str(g.rng.choice(["int8", "uint8"])), "float")
    x = v.expr
    lo, hi = (0.0, 255.0) if v.dtype == "uint8" else (-128.0, 127.0)
    for n in range(steps):
        zp = int(g.rng.integers(-8, 9)) if v.dtype == "int8" else int(g.rng.integers(0, 17))
        d = relay.multiply(relay.cast(relay.subtract(relay.cast(x, "int32"), relay.const(zp)), "float32"),
                           relay.const(float(g.rng.choice([0.02, 0.05, 0.1]))))
        op = "sigmoid" if sigmoid and n == steps - 1 else str(g.rng.choice([k for k in _CHAIN_STEPS if k != "sigmoid"]))
        y = relay.round(relay.divide(_CHAIN_STEPS[op](relay, d), relay.const(float(g.rng.choice([0.02, 0.04, 0.08])))))
        x = relay.cast(relay.clip(relay.add(y, relay.const(float(zp))), lo, hi), v.dtype)
    g.push(x, v.dtype, v.shape)


def sliced_conv(g, i, oc, chain):
    """qnn.conv2d 1x1 to ``oc`` channels, a count no int8 channel block divides (legalization pads the conv's
    output channels and slices them back) -> qnn.requantize (per tensor or per channel) -> uint8
    [-> qnn.conv2d 1x1 back to the input's channel count, reading the sliced channels]"""
    c = g.pick(i).shape[0]
    conv(g, i, oc, 1, 1, 0, 0, "qnn", "none", False)
    y = g.requant_qnn(g.values[-1], "uint8")
    g.push(y.expr, y.dtype, y.shape)
    if chain:
        conv(g, len(g.values) - 1, c, 1, 1, 0, 0, "qnn", "none", False)


def paired_convs(g, i, oc, k, between, out=0):
    """qnn.conv2d 1x1 to ``oc`` channels -> qnn.requantize -> uint8 [-> max pool 3x3 / 1] -> qnn.conv2d ``k`` x ``k``
    back to the input's channel count (or to ``out`` channels) [and, NCHW, a classifier head on the uint8 tensor:
    global average pool in int32 -> uint8 -> batch_flatten -> qnn.dense], trained-like weights: the channels
    between int8 convs, which x86 builds without VNNI renumber so that the reader's vpmaddubsw pairs cannot
    saturate. ``oc`` over 16 with ``out`` 24 reaches AVX-512 VNNI's 24-channel output blocks (``vnni_24_lanes``)."""
    relay, c = g.relay, g.pick(i).shape[0]
    g.trained = True  # the convs' and the dense's weights only
    conv(g, i, oc, 1, 1, 0, 0, "qnn", "none", True)
    y = g.requant_qnn(g.values[-1], "uint8")
    if between == "max":
        y = g.value(relay.nn.max_pool2d(y.expr, (3, 3), (1, 1), padding=(1, 1), layout=g.layout), y.dtype, y.shape)
    if between == "head" and g.layout == "NCHW":
        f = relay.nn.global_avg_pool2d(relay.cast(y.expr, "int32"))
        f = relay.nn.batch_flatten(relay.cast(relay.clip(f, 0, 255), "uint8"))
        zero = relay.const(0)
        d = relay.qnn.op.dense(f, relay.const(g.int8_weights((8, oc))), zero, zero, relay.const(np.float32(0.05)),
                               relay.const(np.float32(0.02)), units=8, out_dtype="int32")
        g.heads.append(g.value(d, "int32", (8,), 2))
    g.push(y.expr, y.dtype, y.shape)
    conv(g, len(g.values) - 1, out or max(c, 2), k, 1, k // 2, 0, "qnn", "none", False)
    g.trained = False


def mobile_block(g, i, channels, k, stride):
    """qnn.conv2d 1x1 to ``channels`` -> qnn.requantize -> uint8 -> depthwise qnn.conv2d ``k`` x ``k`` / ``stride``
    (NCHW; NHWC: a plain ``k`` x ``k`` conv) -> qnn.requantize -> uint8, as MobileNet-like models (PP-OCR) write
    them: uint8 x int8 depthwise convs over 8- and 16-channel blocks, which AVX-512 VNNI's tap forms compute
    (tvm_ext.x86.depthwise_taps)"""
    conv(g, i, channels, 1, 1, 0, 0, "qnn", "none", True)
    y = g.requant_qnn(g.values[-1], "uint8")
    g.push(y.expr, y.dtype, y.shape)
    conv(g, len(g.values) - 1, channels, k, stride, k // 2, 1, "qnn", "none", False)
    y = g.requant_qnn(g.values[-1], "uint8")
    g.push(y.expr, y.dtype, y.shape)


#: kind -> step function, every kind of :data:`.grammar.STEP_KINDS`.
STEPS = {
    **GENERAL_STEPS,
    "pool_quant": pool_quant, "nonneg_conv": nonneg_conv, "stepwise_chain": stepwise_chain,
    "sliced_conv": sliced_conv, "paired_convs": paired_convs, "mobile_block": mobile_block,
}
