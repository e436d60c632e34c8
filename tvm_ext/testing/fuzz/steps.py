"""The grammar's steps: one function per step kind, each adding values to the builder.

A step ``(kind, operand index, arguments...)`` of a :class:`~.grammar.Spec` calls
``STEPS[kind](builder, operand index, arguments...)``. Each step picks its operands with
``builder.pick`` (index modulo the values built so far), adapts their dtype with the builder's
adapters, and pushes what it made (``builder.push``) for later steps to pick; heads (dense,
elementwise, extra casts) become extra outputs of the graph instead. Random constants come from
``builder.rng`` in a fixed order, so a spec always builds the same graph.
"""
from __future__ import annotations

import numpy as np

__all__ = ["STEPS"]


def conv(g, i, oc, k, stride, pad, gmode, flavor, explicit_pad, bias):
    """conv2d, grouped / depthwise / strided / padded / explicitly padded, of one flavor: ``plain``
    (float, or int8 -> int32), ``qnn`` (``qnn.conv2d``) or ``qdq`` (dequantize -> conv -> quantize)."""
    v = g.pick(i)
    c, h, w = v.shape
    v = _conv_input(g, v, flavor)
    groups, oc = _groups(g.layout, c, oc, gmode)
    pad = min(pad, k // 2) if k > 1 else 0
    ho, wo = _conv_out(h, w, k, stride, pad)
    if ho < 1 or wo < 1:
        k, pad, ho, wo = 1, 0, (h - 1) // stride + 1, (w - 1) // stride + 1
    x = v.expr
    if explicit_pad != "none":
        x = _explicit_pad(g, x, v.dtype, flavor, explicit_pad)
        h, w = h + 2, w + 2
        ho, wo = _conv_out(h, w, k, stride, pad)
    if g.layout == "NCHW":
        wshape, klayout = (oc, c // groups, k, k), "OIHW"
    else:
        wshape, klayout = (k, k, c, oc), "HWIO"
    attrs = dict(kernel_size=(k, k), strides=(stride, stride), padding=(pad, pad), channels=oc, groups=groups,
                 data_layout=g.layout, kernel_layout=klayout)
    y, out, bias = _CONV_FLAVORS[flavor](g, x, v.dtype, wshape, attrs, bias)
    if bias:
        y = _bias(g, y, out, oc)
    g.push(y, out, (oc, ho, wo))


def _conv_input(g, v, flavor):
    """8-bit data for an int8 plain conv and for QNN / QDQ convs (float data quantized to uint8)."""
    if flavor == "plain" and v.dtype == "int32":
        v = g.to_8bit(v)
    if flavor in ("qnn", "qdq") and v.dtype not in ("int8", "uint8"):
        v = g.to_8bit(v, "uint8", "float") if v.dtype == "float32" else g.requant_qnn(v, "uint8")
    return v


def _groups(layout, c, oc, gmode):
    """(groups, output channels): gmode 1 is depthwise, 2 two groups (NCHW only)."""
    if layout == "NCHW":
        if gmode == 1:
            return c, c
        if gmode == 2 and c % 2 == 0:
            return 2, oc
    return 1, oc


def _conv_out(h, w, k, stride, pad):
    return (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1


def _explicit_pad(g, x, dtype, flavor, value):
    """nn.pad by one on the spatial axes with 0, the zero point (128 for uint8 QNN data) or 1."""
    relay = g.relay
    pw = [[0, 0], [0, 0], [0, 0], [0, 0]]
    for a in (2, 3) if g.layout == "NCHW" else (1, 2):
        pw[a] = [1, 1]
    zp = 128 if (flavor == "qnn" and dtype == "uint8") else 0
    val = {"zero": 0, "zp": zp, "one": 1}[value]
    return relay.nn.pad(x, pw, pad_value=relay.const(val, dtype))


def _plain_conv(g, x, dtype, wshape, attrs, bias):
    """float x float, or 8-bit x int8 -> int32."""
    relay = g.relay
    if dtype not in ("int8", "uint8"):
        wt = relay.const((g.rng.standard_normal(wshape) * 0.3).astype("float32"))
        return relay.nn.conv2d(x, wt, **attrs), "float32", bias
    wt = relay.const(g.int8_weights(wshape))
    return relay.nn.conv2d(x, wt, out_dtype="int32", **attrs), "int32", bias


def _qnn_conv(g, x, dtype, wshape, attrs, bias):
    """qnn.conv2d -> int32, per-tensor or per-channel weight scales."""
    relay = g.relay
    oc = attrs["channels"]
    wt = relay.const(g.int8_weights(wshape))
    zp = 128 if dtype == "uint8" else 0
    per_channel = bool(g.rng.integers(2))
    ks = (g.rng.uniform(0.01, 0.1, oc).astype("float32") if per_channel
          else np.float32(g.rng.uniform(0.01, 0.1)))
    y = relay.qnn.op.conv2d(x, wt, relay.const(zp, "int32"), relay.const(0, "int32"),
                            relay.const(np.float32(0.05)), relay.const(ks), out_dtype="int32", **attrs)
    return y, "int32", bias


def _qdq_conv(g, x, dtype, wshape, attrs, bias):
    """quantize([relu](conv(dequantize(x), dequantize(w)) [+ bias])) -> uint8 (the bias goes inside)."""
    relay = g.relay
    oc = attrs["channels"]
    wt = relay.const(g.int8_weights(wshape))
    zp = 128 if dtype == "uint8" else 0
    xd = relay.qnn.op.dequantize(x, relay.const(np.float32(0.05)), relay.const(zp, "int32"))
    wd = relay.qnn.op.dequantize(wt, relay.const(np.float32(0.02)), relay.const(0, "int32"))
    y = relay.nn.conv2d(xd, wd, **attrs)
    if bias:
        y = relay.nn.bias_add(y, relay.const(g.rng.standard_normal(oc).astype("float32") * 0.1), axis=g.caxis())
    if g.rng.integers(2):
        y = relay.nn.relu(y)
    y = relay.qnn.op.quantize(y, relay.const(np.float32(0.05)), relay.const(0, "int32"), out_dtype="uint8")
    return y, "uint8", False


_CONV_FLAVORS = {"plain": _plain_conv, "qnn": _qnn_conv, "qdq": _qdq_conv}


def _bias(g, y, dtype, oc):
    """bias_add of a per-channel constant: float, or int32 in [-50, 50]."""
    if dtype == "float32":
        b = g.rng.standard_normal(oc).astype("float32") * 0.1
    else:
        b = g.rng.integers(-50, 51, oc).astype("int32")
    return g.relay.nn.bias_add(y, g.relay.const(b), axis=g.caxis())


def requant(g, i, style, dtype, relu):
    """int32 (8-bit widened first) -> [relu] -> 8-bit: qnn.requantize, a rounding shift, or float scaling."""
    relay = g.relay
    v = g.pick(i)
    if v.dtype in ("int8", "uint8"):
        v = g.value(relay.cast(v.expr, "int32"), "int32", v.shape)
    if relu:
        v = g.value(relay.nn.relu(v.expr), v.dtype, v.shape)
    if style == "qnn" and v.dtype == "int32":
        out = g.requant_qnn(v, dtype)
    elif style == "shift" and v.dtype == "int32":
        out = g.to_8bit(v)
    else:
        out = g.requant_float(v, dtype)
    g.push(out.expr, out.dtype, out.shape)


def widen(g, i, to):
    """A widening cast (to int32 or float32) or a qnn.dequantize."""
    relay = g.relay
    v = g.pick(i)
    if to == "dequantize" and v.dtype in ("int8", "uint8"):
        zp = 128 if v.dtype == "uint8" else 0
        g.push(relay.qnn.op.dequantize(v.expr, relay.const(np.float32(0.05)), relay.const(zp, "int32")),
                  "float32", v.shape)
    elif to == "dequantize" or to == "float32":
        g.push(g.to_float(v).expr, "float32", v.shape)
    elif v.dtype == "float32":
        g.push(relay.cast(relay.clip(v.expr, -1000.0, 1000.0), "int32"), "int32", v.shape)
    else:
        g.push(relay.cast(v.expr, "int32"), "int32", v.shape)


def elementwise(g, i, kind):
    """relu, clip, sigmoid, hard-swish, round, right shift, or a per-channel add / multiply / maximum."""
    v = g.pick(i)
    g.push(g.ewise(v, kind), v.dtype, v.shape)


def parallel_cast(g, i, to, n, consumer):
    """Two or three identical casts of one value, each with its consumer (or returned as outputs)."""
    relay = g.relay
    v = g.pick(i)
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
            g.heads.append(g.value(b, to, v.shape, 4))
        g.push(branches[0], to, v.shape)
        return
    out = branches[0]
    for b in branches[1:]:
        out = relay.add(out, b)
    g.push(out, to, v.shape)


def join(g, i, j, kind):
    """Two values joined: add, multiply, maximum, concat or qnn.add (shapes and dtypes made to match)."""
    relay = g.relay
    a = g.pick(i)
    b = g.pick(j)
    if b.shape != a.shape or b is a:
        b = g.value(relay.nn.relu(a.expr), a.dtype, a.shape)
    if kind == "qnn_add":
        a8 = g.as_dtype(a, "uint8") if a.dtype != "int8" else a
        b8 = g.as_dtype(b, a8.dtype)
        zp = relay.const(0, "int32")
        y = relay.qnn.op.add(a8.expr, b8.expr, relay.const(np.float32(0.05)), zp, relay.const(np.float32(0.1)),
                             zp, relay.const(np.float32(0.1)), zp)
        g.push(y, a8.dtype, a.shape)
        return
    b = g.as_dtype(b, a.dtype)
    if kind == "concat":
        c, h, w = a.shape
        g.push(relay.concatenate([a.expr, b.expr], axis=g.caxis()), a.dtype, (2 * c, h, w))
        return
    op = {"add": relay.add, "multiply": relay.multiply, "maximum": relay.maximum}[kind]
    g.push(op(a.expr, b.expr), a.dtype, a.shape)


def qdq_add(g, i, j, scales="halves"):
    """quantize(dequantize(a) + dequantize(b)) in uint8. ``scales="halves"``: input scales 0.05 and 0.1,
    output 0.1, zero points 128 (exact halves); ``"calibrated"``: scales and zero points drawn as a
    calibration leaves them (no simple ratio). Calibrated scales, and two 8-bit tensors made from
    ``a`` as a residual block makes them (``j`` is not read): ``"conv_branch"``, ``a + conv(a)`` (a
    QDQ 1x1 conv back to ``a``'s channel count); ``"projection"``, ``conv1x1(a) + conv3x3(a)`` (the
    skip through a projection conv: neither operand is an elementwise function of an earlier 8-bit
    tensor, as ``a`` itself may be)."""
    import tvm

    relay = g.relay
    a = g.pick(i)
    if scales in _BRANCHES:
        a8, b8 = _BRANCHES[scales](g, g.as_dtype(a, "uint8"))
    else:
        b = g.pick(j)
        if b.shape != a.shape:
            b = a
        if scales == "calibrated" and tvm.ir.structural_equal(b.expr, a.expr):  # two tensors where the graph has them
            b = next((v for v in g.values if v.shape == a.shape and not tvm.ir.structural_equal(v.expr, a.expr)), a)
        a8, b8 = g.as_dtype(a, "uint8"), g.as_dtype(b, "uint8")
    if scales == "halves":
        sa, sb, sc, za, zb, zc = 0.05, 0.1, 0.1, 128, 128, 128
    else:
        sa, sb = (float(v) for v in g.rng.uniform(0.005, 0.1, 2))
        sc = float(g.rng.uniform(max(sa, sb), 2 * (sa + sb)))
        za, zb, zc = (int(v) for v in g.rng.integers(0, 256, 3))

    def dq(v, s, z):
        return relay.qnn.op.dequantize(v.expr, relay.const(np.float32(s)), relay.const(z, "int32"))

    y = relay.add(dq(a8, sa, za), dq(b8, sb, zb))
    g.push(relay.qnn.op.quantize(y, relay.const(np.float32(sc)), relay.const(zc, "int32"), out_dtype="uint8"),
           "uint8", a.shape)


def _qdq_conv_of(g, x8, k):
    """A QDQ ``k`` x ``k`` conv (padded to keep the shape) of the uint8 ``x8`` to its channel count,
    pushed as a value."""
    g.values.append(x8)
    conv(g, len(g.values) - 1, x8.shape[0], k, 1, k // 2, 0, "qdq", "none", False)
    return g.values[-1]


def _conv_branch(g, a8):
    """``(a, conv1x1(a))``"""
    return a8, _qdq_conv_of(g, a8, 1)


def _projection(g, a8):
    """``(conv1x1(a), conv3x3(a))``"""
    return _qdq_conv_of(g, a8, 1), _qdq_conv_of(g, a8, 3)


#: qdq_add's ``scales`` values that make both operands from the first: ``(a, b)``.
_BRANCHES = {"conv_branch": _conv_branch, "projection": _projection}


def pool(g, i, kind, k, stride, pad):
    """max, avg (with or without the padding counted), global avg or global max pooling."""
    relay = g.relay
    v = g.pick(i)
    c, h, w = v.shape
    if kind == "global_avg":
        if v.dtype in ("int8", "uint8"):
            v = g.value(relay.cast(v.expr, "int32"), "int32", v.shape)
        g.push(relay.nn.global_avg_pool2d(v.expr, layout=g.layout), v.dtype, (c, 1, 1))
        return
    if kind == "global_max":
        g.push(relay.nn.global_max_pool2d(v.expr, layout=g.layout), v.dtype, (c, 1, 1))
        return
    k = min(k, h, w)
    pad = min(pad, k // 2)
    ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    if kind == "max":
        y = relay.nn.max_pool2d(v.expr, (k, k), (stride, stride), padding=(pad, pad), layout=g.layout)
    else:
        if v.dtype in ("int8", "uint8"):
            v = g.value(relay.cast(v.expr, "int32"), "int32", v.shape)
        y = relay.nn.avg_pool2d(v.expr, (k, k), (stride, stride), padding=(pad, pad), layout=g.layout,
                                count_include_pad=kind == "avg_pad")
    g.push(y, v.dtype, (c, ho, wo))


def stop(g, i):
    """``annotation.stop_fusion``."""
    v = g.pick(i)
    g.push(g.relay.annotation.stop_fusion(v.expr), v.dtype, v.shape)


def pad(g, i, val):
    """nn.pad of the spatial axes by one, with 0 or 1."""
    relay = g.relay
    v = g.pick(i)
    c, h, w = v.shape
    pw = [[0, 0]] * 4
    for a in ((2, 3) if g.layout == "NCHW" else (1, 2)):
        pw[a] = [1, 1]
    y = relay.nn.pad(v.expr, pw, pad_value=relay.const(0 if val == "zero" else 1, v.dtype))
    g.push(y, v.dtype, (c, h + 2, w + 2))


def layout(g, i, kind):
    """A round trip through another layout (blocked NCHW2c with a relu inside, or NCHW <-> NHWC)."""
    relay = g.relay
    v = g.pick(i)
    c = v.shape[0]
    if kind == "blocked" and g.layout == "NCHW" and c % 2 == 0:
        y = relay.layout_transform(v.expr, "NCHW", "NCHW2c")
        y = relay.nn.relu(y)
        y = relay.layout_transform(y, "NCHW2c", "NCHW")
    else:
        other = "NHWC" if g.layout == "NCHW" else "NCHW"
        y = relay.layout_transform(relay.layout_transform(v.expr, g.layout, other), other, g.layout)
    g.push(y, v.dtype, v.shape)


def tuple_get_item(g, i, idx):
    """A tuple of the value and its relu, and one item of it."""
    relay = g.relay
    v = g.pick(i)
    t = relay.Tuple([v.expr, g.ewise(v, "relu")])
    g.push(relay.TupleGetItem(t, idx), v.dtype, v.shape)


def _flat(g, v):
    """global_avg_pool2d + batch_flatten: the 2-D input of a head (8-bit widened to int32)."""
    relay = g.relay
    c = v.shape[0]
    x = v.expr
    dt = v.dtype
    if dt in ("int8", "uint8"):
        x, dt = relay.cast(x, "int32"), "int32"
    x = relay.nn.global_avg_pool2d(x, layout=g.layout)
    return g.value(relay.nn.batch_flatten(x), dt, (c,), 2)


def dense_head(g, i, units, n, flavor, joiner):
    """One to three parallel dense / qnn.dense heads on the flattened value, added or returned."""
    relay = g.relay
    f = _flat(g, g.pick(i))
    k = f.shape[0]
    if f.dtype != "float32":
        if flavor == "qnn":
            f = g.requant_qnn(f, "int8")
        else:
            y = relay.right_shift(f.expr, relay.const(1, "int32"))
            f = g.value(relay.cast(relay.clip(y, -127, 127), "int8"), "int8", f.shape, 2)
    outs = []
    for _ in range(n):
        if f.dtype == "float32":
            wt = relay.const((g.rng.standard_normal((units, k)) * 0.3).astype("float32"))
            outs.append(relay.nn.dense(f.expr, wt, units=units))
        elif flavor == "qnn":
            wt = relay.const(g.int8_weights((units, k)))
            outs.append(relay.qnn.op.dense(f.expr, wt, relay.const(0, "int32"), relay.const(0, "int32"),
                                           relay.const(np.float32(0.05)), relay.const(np.float32(0.02)),
                                           units=units, out_dtype="int32"))
        else:
            wt = relay.const(g.int8_weights((units, k)))
            outs.append(relay.nn.dense(f.expr, wt, units=units, out_dtype="int32"))
    dt = "float32" if f.dtype == "float32" else "int32"
    if joiner == "add" and n > 1:
        y = outs[0]
        for o in outs[1:]:
            y = relay.add(y, o)
        g.heads.append(g.value(y, dt, (units,), 2))
    else:
        for o in outs:
            g.heads.append(g.value(relay.nn.relu(o), dt, (units,), 2))


def ewise_head(g, i, kind, n):
    """Two or three parallel adds / multiplies by constants on the flattened value, added up."""
    relay = g.relay
    f = _flat(g, g.pick(i))
    op = {"add": relay.add, "multiply": relay.multiply}[kind]
    outs = []
    for _j in range(n):
        c = relay.const((g.rng.integers(-3, 4, f.shape) if f.dtype != "float32"
                         else g.rng.standard_normal(f.shape)).astype(f.dtype).reshape(1, -1))
        outs.append(op(f.expr, c))
    y = outs[0]
    for o in outs[1:]:
        y = relay.add(y, o)
    g.heads.append(g.value(y, f.dtype, f.shape, 2))


#: kind -> step function for the general kinds of :data:`.grammar.STEP_KINDS` (:mod:`.motifs` adds the rest).
STEPS = {
    "conv": conv, "requant": requant, "widen": widen, "ewise": elementwise, "parallel_cast": parallel_cast,
    "join": join, "pool": pool, "stop": stop, "layout": layout, "tuple": tuple_get_item, "dense_head": dense_head,
    "ewise_head": ewise_head, "qdq_add": qdq_add, "pad": pad,
}
