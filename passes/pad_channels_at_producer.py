"""PadChannelsAtProducer: an int8 conv's input channels padded by the float conv that writes them.

Rewrites::

    # qnn.conv2d(quantize(g(conv2d(x, W))), V)              C = channels of W, C % 4 != 0
    #   -> qnn.conv2d(quantize(g'(conv2d'(x, [W; 0]))), [V | 0])   C' = C rounded up to 4
    #
    #   g : elementwise chain with g(0) == 0 -- bias_add / add / subtract by per-channel or
    #       scalar constants (padded with 0), multiply / divide (padded with 1), relu, clip
    #       around 0, leaky_relu, negative, abs, tanh
    #   the new channels hold conv 0 -> g 0.0 -> quantize zp_x; V's new input rows are 0, so in
    #   QNN's expansion sum((x - zp_x) * (w - zp_w)) each new channel adds (zp_x - zp_x) * ... = 0

    # qnn.conv2d(requantize(bias_add(qnn.conv2d(x, W), b)), V)    C % 4 != 0, or x86 pads C
    #                                                              (C % 16 != 0 and no narrower
    #                                                              output block divides it)
    #   -> qnn.conv2d(requantize'(bias_add(qnn.conv2d'(x, [W; zp_w]), [b; 0])), [V | 0])
    #      C' = C rounded up to 16; per-channel weight scales / zero points and requantize input
    #      scales padded with 1 / 0; the new accumulators are 0 and requantize to the output zero
    #      point, the readers' input zero point (or the readers' weight zero point is 0): exact

Walked by hand: the chain back to the producer has any length and every reader must be such a conv.
Runs to a fixed point: a conv that is a padded producer's reader and one itself takes two rounds.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``PadChannelsAtProducer``.
"""
from __future__ import annotations

import numpy as np

import tvm
from tvm import relay

from ._registry import register_pass

from ._doc import factory_sections
from ._util import (Check, Reject, consumers, dataflow_nodes, fixed_point, function_pass, op_calls, op_name,
                    pass_logger, rebuild, static_shape, static_tensor_type, with_body)

__all__ = ["PadChannelsAtProducer", "MULTIPLE"]

PASS_NAME = "PadChannelsAtProducer"
RULE = f"{PASS_NAME}.pad"
RULE_INT8 = f"{PASS_NAME}.pad_int8"
_log = pass_logger(PASS_NAME)

#: x86's int8 conv input-channel vector length (``conv2d_alter_int8_common(..., 4, 16)``).
MULTIPLE = 4
#: ... and its output-channel vector length: an int8 producer is padded to it, so that neither its
#: output is sliced back nor its readers' input padded.
INT8_MULTIPLE = 16
#: An int8 producer is padded only while its readers' extra work stays below this many
#: multiply-accumulates (the work the slice + pad kernel it removes is worth, about).
MAX_EXTRA_MACS = 1 << 20

#: binary chain op -> value the new channels of its constant operand take (keeps 0 at 0).
_BINARY_PAD = {"nn.bias_add": 0.0, "add": 0.0, "subtract": 0.0, "multiply": 1.0, "divide": 1.0}
#: unary chain ops with f(0) == 0 (``clip`` is checked for 0 in its range).
_UNARY = ("nn.relu", "nn.leaky_relu", "negative", "abs", "tanh", "clip")


def _pad_axis(arr: np.ndarray, axis: int, new: int, value) -> np.ndarray:
    width = [(0, 0)] * arr.ndim
    width[axis] = (0, new - arr.shape[axis])
    return np.pad(arr, width, constant_values=np.asarray(value).astype(arr.dtype))


def _const_like(arr: np.ndarray, like):
    return relay.const(arr, dtype=str(like.data.dtype))


def _is_nchw_conv(call, attrs_kernel="OIHW") -> Check:
    a = call.attrs
    if int(a.groups) != 1:
        return Reject(f"{op_name(call)} has groups={int(a.groups)}")
    if a.data_layout != "NCHW" or a.kernel_layout != attrs_kernel or a.out_layout not in ("", "NCHW"):
        return Reject(f"{op_name(call)} layouts {a.data_layout}/{a.kernel_layout}/{a.out_layout or a.data_layout}, "
                      f"not NCHW/{attrs_kernel}")
    return True


def _channel_const(const, channels: int, op: str, axis_attr=None):
    """The constant operand as an array broadcast over NCHW channels, or a Reject."""
    if not isinstance(const, relay.Constant):
        return Reject(f"{op} operand is a {type(const).__name__}, not a constant")
    arr = const.data.numpy()
    if arr.size == 1:
        return "scalar"
    if op == "nn.bias_add":
        if axis_attr != 1 or arr.shape != (channels,):
            return Reject(f"bias_add on axis {axis_attr} with a {arr.shape} bias")
        return 0
    if arr.shape == (channels, 1, 1):
        return 0
    if arr.shape == (1, channels, 1, 1):
        return 1
    return Reject(f"{op} constant of shape {arr.shape} is not per channel (C, 1, 1) / (1, C, 1, 1)")


def _scalar(expr):
    if isinstance(expr, relay.Constant) and expr.data.numpy().size == 1:
        return expr.data.numpy().reshape(-1)[0].item()
    return None


def _pad_vector(expr, channels: int, new: int, fill):
    """A scalar constant as is; a (C,) constant padded with ``fill``; else None."""
    if not isinstance(expr, relay.Constant):
        return None
    arr = expr.data.numpy()
    if arr.size == 1:
        return expr
    if arr.shape != (channels,):
        return None
    return _const_like(_pad_axis(arr, 0, new, fill), expr)


def _padded_dequantize(expr, channels: int, new: int, what: str):
    """``qnn.dequantize(q, scale, zp)`` of a constant whose axis 0 holds the channels, with ``new -
    channels`` more entries that dequantize to exactly 0 (``q`` padded with the zero point; per-channel
    scales / zero points padded with 1 / 0); or a Reject."""
    q, scale, zp = expr.args[0], expr.args[1], expr.args[2]
    if not all(isinstance(p, relay.Constant) for p in (q, scale, zp)):
        return Reject(f"{what} dequantize of non-constants")
    if q.data.numpy().shape[:1] != (channels,):
        return Reject(f"dequantized {what} of shape {q.data.numpy().shape}")
    sizes = [p.data.numpy().size for p in (scale, zp)]
    if any(n not in (1, channels) for n in sizes) or (int(expr.attrs.axis) != 0 and max(sizes) > 1):
        return Reject(f"{what} dequantize parameters are neither per tensor nor per channel on axis 0")
    zp_arr = zp.data.numpy()
    fill = zp_arr.reshape(-1)[0] if zp_arr.size == 1 else 0
    args = [_const_like(_pad_axis(q.data.numpy(), 0, new, fill), q),
            _pad_vector(scale, channels, new, 1.0), _pad_vector(zp, channels, new, 0)]
    return relay.Call(expr.op, args, expr.attrs, expr.type_args, expr.span)


def _bias_operand(expr, channels: int, new: int, pad_value):
    """Padded bias-like operand: a constant (padded by the caller), or qnn.dequantize(constant, scale,
    zp) (QDQ bias)."""
    if isinstance(expr, relay.Constant):
        return expr
    if op_name(expr) != "qnn.dequantize":
        return Reject(f"bias is a {op_name(expr) or type(expr).__name__}, not a (dequantized) constant")
    if pad_value != 0.0:
        return Reject("a dequantized constant is only padded where the chain adds it")
    return _padded_dequantize(expr, channels, new, "bias")


def _padded_weight(w, channels: int, new: int):
    """The float conv's weight with ``new - channels`` zero output channels, or a Reject."""
    if isinstance(w, relay.Constant):
        return _const_like(_pad_axis(w.data.numpy(), 0, new, 0), w)
    if op_name(w) == "qnn.dequantize":
        return _padded_dequantize(w, channels, new, "weight")
    return Reject(f"float conv weight is a {op_name(w) or type(w).__name__}, not a (dequantized) constant")


def _int8_readers(q, users):
    """The (qnn.conv2d, 0) readers of ``q`` when every reader is a groups=1 NCHW/OIHW int8 conv with a
    constant weight reading it as data; else a Reject."""
    readers = users.get(q, [])
    if not readers:
        return Reject("quantized value is the function's output")
    for reader, index in readers:
        if op_name(reader) != "qnn.conv2d" or index != 0:
            return Reject(f"quantized value is read by {op_name(reader) or type(reader).__name__} (argument {index})")
        ok = _is_nchw_conv(reader)
        if not ok:
            return ok
        if not isinstance(reader.args[1], relay.Constant):
            return Reject("qnn.conv2d weight is not a constant")
    return readers


def _match(q, users):
    """(readers, chain [quantize input .. first op after conv], conv) for a matching quantize, or a Reject."""
    for p in q.args[1:3]:
        if not isinstance(p, relay.Constant) or p.data.numpy().size != 1:
            return Reject("quantize scale / zero point not scalar constants")
    static = static_tensor_type(q)
    if not static:
        return static
    shape = static_shape(q)
    if len(shape) != 4:
        return Reject(f"quantized value of rank {len(shape)}")
    channels = shape[1]
    if channels % MULTIPLE == 0:
        return Reject(f"{channels} channels: already a multiple of {MULTIPLE}")
    readers = _int8_readers(q, users)
    if isinstance(readers, Reject):
        return readers
    chain = []
    node = q.args[0]
    while True:
        name = op_name(node)
        if name == "nn.conv2d":
            break
        if name is None:
            return Reject(f"chain reaches a {type(node).__name__}, not a conv")
        if len(users.get(node, [])) != 1:
            return Reject(f"{name} in the chain has {len(users.get(node, []))} readers")
        if name in _UNARY:
            if name == "clip" and not float(node.attrs.a_min) <= 0.0 <= float(node.attrs.a_max):
                return Reject(f"clip to [{node.attrs.a_min}, {node.attrs.a_max}] does not keep 0")
        elif name in _BINARY_PAD:
            if name == "nn.bias_add":
                if int(node.attrs.axis) != 1:
                    return Reject(f"bias_add on axis {int(node.attrs.axis)}")
            else:
                k = 1 if not isinstance(node.args[0], relay.Constant) else 0
                if k == 0 and name in ("subtract", "divide"):
                    return Reject(f"{name} with the constant first (c - x / c / x) does not keep 0")
                ok = _channel_const(node.args[k], channels, name)
                if isinstance(ok, Reject):
                    return ok
        else:
            return Reject(f"{name} in the chain is not in the chain table")
        chain.append(node)
        if name in _UNARY or name == "nn.bias_add" or not isinstance(node.args[0], relay.Constant):
            node = node.args[0]
        else:
            node = node.args[1]
    conv = node
    if len(users.get(conv, [])) != 1:
        return Reject(f"float conv output has {len(users.get(conv, []))} readers")
    if conv.checked_type.dtype != "float32" or len(conv.args) != 2:
        return Reject(f"producer conv computes {conv.checked_type.dtype}")
    ok = _is_nchw_conv(conv)
    if not ok:
        return ok
    return readers, chain, conv


def _rewrite_one(q, readers, chain, conv):
    channels = static_shape(q)[1]
    new = -(-channels // MULTIPLE) * MULTIPLE
    weight = _padded_weight(conv.args[1], channels, new)
    if isinstance(weight, Reject):
        return weight
    attrs = {k: conv.attrs[k] for k in conv.attrs.keys()}
    attrs["channels"] = new
    value = relay.nn.conv2d(conv.args[0], weight, **attrs)
    for node in reversed(chain):
        name = op_name(node)
        if name in _UNARY:
            value = relay.Call(node.op, [value], node.attrs, node.type_args, node.span)
            continue
        if name == "nn.bias_add":
            operand = _bias_operand(node.args[1], channels, new, _BINARY_PAD[name])
            if isinstance(operand, Reject):
                return operand
            if isinstance(operand, relay.Constant):
                operand = _const_like(_pad_axis(operand.data.numpy(), 0, new, _BINARY_PAD[name]), operand)
            value = relay.Call(node.op, [value, operand], node.attrs, node.type_args, node.span)
            continue
        k = 1 if not isinstance(node.args[0], relay.Constant) else 0
        const = node.args[k]
        axis = _channel_const(const, channels, name)
        if axis != "scalar":
            const = _const_like(_pad_axis(const.data.numpy(), axis, new, _BINARY_PAD[name]), const)
        args = [value, const] if k == 1 else [const, value]
        value = relay.Call(node.op, args, node.attrs, node.type_args, node.span)
    new_q = relay.Call(q.op, [value] + list(q.args[1:]), q.attrs, q.type_args, q.span)
    subst = {q: new_q}
    for reader, _ in readers:
        w = reader.args[1]
        padded = _const_like(_pad_axis(w.data.numpy(), 1, new, 0), w)
        subst[reader] = relay.Call(reader.op, [q, padded] + list(reader.args[2:]), reader.attrs,
                                   reader.type_args, reader.span)
    _log.info("%s: %d -> %d channels written by the float conv for %d int8 conv(s)", RULE, channels, new, len(readers))
    return subst


def _match_int8(r, users):
    """(readers, bias_add or None, conv) for an int8 producer ``r = requantize([bias_add](qnn.conv2d))``,
    or a Reject."""
    static = static_tensor_type(r)
    if not static:
        return static
    shape = static_shape(r)
    if len(shape) != 4 or str(r.checked_type.dtype) not in ("uint8", "int8"):
        return Reject(f"requantize to {r.checked_type.dtype} of rank {len(shape)}")
    channels = shape[1]
    new = _int8_written(channels)
    if channels % MULTIPLE == 0 and new == channels:
        return Reject(f"{channels} channels: already a multiple of {MULTIPLE}, and x86 writes them unpadded")
    if int(r.attrs.axis) != 1 or _scalar(r.args[2]) != 0 or _scalar(r.args[3]) is None or _scalar(r.args[4]) is None:
        return Reject("requantize is not per channel 1 with input zero point 0 and scalar output parameters")
    readers = _int8_readers(r, users)
    if isinstance(readers, Reject):
        return readers
    extra = 0
    for reader, _ in readers:
        static = static_tensor_type(reader)
        if not static:
            return Reject(f"int8 reader: {static}")
        oshape = static_shape(reader)
        kh, kw = (int(d) for d in reader.args[1].checked_type.shape[2:4])
        extra += (new - -(-channels // MULTIPLE) * MULTIPLE) * oshape[1] * oshape[2] * oshape[3] * kh * kw
        zp_w = reader.args[3].data.numpy() if isinstance(reader.args[3], relay.Constant) else None
        if zp_w is None or (zp_w.any() and _scalar(reader.args[2]) != _scalar(r.args[4])):
            return Reject("int8 reader with a non-zero weight zero point reads with another input zero point")
    if extra > MAX_EXTRA_MACS:
        return Reject(f"{channels} -> {new} channels would add {extra} multiply-accumulates to the readers "
                      f"(limit {MAX_EXTRA_MACS}: more than the kernel saved)")
    node, bias = r.args[0], None
    if len(users.get(node, [])) != 1:
        return Reject("accumulator has other readers")
    if op_name(node) == "nn.bias_add":
        bias, node = node, node.args[0]
        if int(bias.attrs.axis) != 1 or not isinstance(bias.args[1], relay.Constant) or len(users.get(node, [])) != 1:
            return Reject("bias_add is not a per-channel constant on axis 1 with one reader")
    if op_name(node) != "qnn.conv2d":
        return Reject(f"requantize reads {op_name(node) or type(node).__name__}, not a qnn.conv2d")
    ok = _is_nchw_conv(node)
    if not ok:
        return ok
    if not isinstance(node.args[1], relay.Constant) or not all(isinstance(a, relay.Constant) for a in node.args[2:6]):
        return Reject("producer qnn.conv2d has non-constant weight or quantization parameters")
    return readers, bias, node


def _int8_written(channels: int) -> int:
    """Channels x86 writes for an int8 conv with ``channels`` outputs on the current target
    (:func:`tvm_ext.x86.int8_conv.int8_out_channels`: padded to 16 unless a policy block divides them)."""
    from tvm_ext.x86.int8_conv import int8_out_channels

    return int8_out_channels(channels, tvm.target.Target.current(allow_none=True))


def _rewrite_int8(r, readers, bias, conv):
    channels = static_shape(r)[1]
    new = -(-channels // INT8_MULTIPLE) * INT8_MULTIPLE
    w, in_zp, k_zp, in_scale, k_scale = conv.args[1:6]
    zp = k_zp.data.numpy()
    # new rows equal the weight zero point: (w - zp_w) is 0, so the accumulator is 0
    w_new = _const_like(_pad_axis(w.data.numpy(), 0, new, zp.reshape(-1)[0] if zp.size == 1 else 0), w)
    k_zp_new, k_scale_new = _pad_vector(k_zp, channels, new, 0), _pad_vector(k_scale, channels, new, 1.0)
    rq_scale = _pad_vector(r.args[1], channels, new, 1.0)
    if None in (k_zp_new, k_scale_new, rq_scale):
        return Reject("quantization parameters are neither scalar nor per output channel")
    attrs = {k: conv.attrs[k] for k in conv.attrs.keys()}
    attrs["channels"] = new
    value = relay.qnn.op.conv2d(conv.args[0], w_new, in_zp, k_zp_new, in_scale, k_scale_new, **attrs)
    if bias is not None:
        b = bias.args[1]
        value = relay.Call(bias.op, [value, _const_like(_pad_axis(b.data.numpy(), 0, new, 0), b)], bias.attrs,
                           bias.type_args, bias.span)
    # requantize(0) = output zero point: what the readers' new (zero) weight rows meet
    new_r = relay.Call(r.op, [value, rq_scale, *r.args[2:]], r.attrs, r.type_args, r.span)
    subst = {r: new_r}
    for reader, _ in readers:
        wr = reader.args[1]
        subst[reader] = relay.Call(reader.op, [r, _const_like(_pad_axis(wr.data.numpy(), 1, new, 0), wr),
                                               *reader.args[2:]], reader.attrs, reader.type_args, reader.span)
    _log.info("%s: %d -> %d channels written by the int8 conv for %d int8 conv(s)", RULE_INT8, channels, new,
              len(readers))
    return subst


def _sweep(func):
    """One round: every producer that matches and shares no conv with another match of the round.

    A conv between two padded producers is both a reader (its weight gains input channels) and a
    producer (it gains output channels); each rule rebuilds it from the original, so the second
    rewrite waits for the next round, which sees the first one's result."""
    nodes = dataflow_nodes(func, PASS_NAME)
    if nodes is None:
        return func
    users = consumers(nodes)
    subst: dict = {}
    claimed: set = set()  # calls a substitution of this round rewrites or rebuilds from
    for node in nodes:
        name = op_name(node)
        if name == "qnn.requantize":
            rule, found = RULE_INT8, _match_int8(node, users)
            done = found if isinstance(found, Reject) else _rewrite_int8(node, *found)
        elif name == "qnn.quantize":
            rule, found = RULE, _match(node, users)
            done = found if isinstance(found, Reject) else _rewrite_one(node, *found)
        else:
            continue
        if isinstance(done, Reject):
            _log.debug("%s: %s not rewritten: %s", rule, name, done)
            continue
        touched = set(done) | {found[-1]}
        if touched & claimed:
            _log.debug("%s: %s waits for the next round: its conv is rewritten by another match", rule, name)
            continue
        claimed |= touched
        subst.update(done)
    if not subst:
        return func
    return with_body(func, rebuild(func.body, subst))


def _rewrite(func):
    from tvm_ext.x86.isa import isa_class

    tgt = tvm.target.Target.current(allow_none=True)
    if tgt is not None and isa_class(tgt) == "other":
        _log.debug("skipped: target %s is not x86 (the channel padding is x86's int8 legalization)", tgt)
        return func
    nodes = dataflow_nodes(func, PASS_NAME)
    if nodes is None:
        return func
    # a padded producer writes a multiple of its vector length and never matches again: each round
    # but the last pads at least one of the quantize / requantize calls
    rounds = 1 + len(op_calls(nodes, ("qnn.quantize", "qnn.requantize")))
    return fixed_point(func, _sweep, PASS_NAME, rounds)


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def PadChannelsAtProducer():  # pylint: disable=invalid-name
    """Let the float conv that writes an int8 conv's input pad its channels to a multiple of 4.

    ``qnn.conv2d(qnn.quantize(bias_add(conv2d(x, W), b)), V)`` with ``C`` channels, ``C % 4 != 0``,
    becomes the same graph with ``W`` and ``b`` given zero output channels up to ``C' = 4 *
    ceil(C / 4)`` and ``V`` zero input channels: the new channels quantize to the input zero point
    and meet zero weights, so every output bit is unchanged, and x86's int8 legalization adds no
    ``nn.pad`` kernel. See its design note (docs/passes.md) for the chain ops accepted between the conv and
    the quantize. Likewise an int8 producer ``requantize(bias_add(qnn.conv2d(...)))`` read by int8
    convs gets ``16 * ceil(C / 16)`` output channels (x86 slices nothing back and pads nothing),
    where the readers' extra work stays below :data:`MAX_EXTRA_MACS`.

    Run it at stage ``"start"`` of :func:`tvm_ext.build`, after ``QDQToInteger``.

    Notes
    -----
    Skipped (every function) when the current target is not x86; without a target in scope it
    runs. Each rejected quantize is logged at DEBUG with the reason.
    """
    return function_pass(PASS_NAME, _rewrite)
