"""QuantizeWeightsAsOnnxRuntime: float weights between a dequantize and a quantize, quantized as ONNX Runtime does.

Rewrites::

    # quantize(op(dequantize(x, sx, zx), W) [bias_add(., B)] [relu | clip]*, sy, zy)
    #   -> the same with W := dequantize(q, s, zp),   q, s, zp: ORT's int8 per-tensor parameters of W
    #                    B := f32(f32(int32(rne(B / f32(sx * s)))) * f32(sx * s))

Walked by hand: the path from the anchor to its quantize passes any number of one-reader calls.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``QuantizeWeightsAsOnnxRuntime``.
"""
from __future__ import annotations

import numpy as np

from tvm import relay

from ._registry import register_pass

from ._doc import factory_sections
from ._util import Reject, op_calls, op_name, pass_logger, substitution_pass

__all__ = ["QuantizeWeightsAsOnnxRuntime", "ort_int8_weight_parameters"]

PASS_NAME = "QuantizeWeightsAsOnnxRuntime"
_log = pass_logger(PASS_NAME)

#: ops ONNX Runtime's WeightBiasQuantization covers, as TVM's ONNX importer names them
WEIGHT_OPS = ("nn.conv1d", "nn.conv2d", "nn.conv3d", "nn.conv1d_transpose", "nn.conv2d_transpose",
              "nn.conv3d_transpose")
#: ops ORT allows between the anchor and its QuantizeLinear (``Relu``, ``Clip``)
_PASS_THROUGH = ("nn.relu", "clip")


def ort_int8_weight_parameters(w: np.ndarray):
    """``(q, scale, zero_point)``: ONNX Runtime's int8 per-tensor quantization of a float weight.

    ``GetQuantizationParameter<int8_t>`` then ``QuantizeLinear``, evaluated in float32 (docs/passes.md).
    """
    f32 = np.float32
    w = np.asarray(w, dtype="float32")
    lo = min(f32(w.min()), f32(0.0)) if w.size else f32(0.0)
    hi = max(f32(w.max()), f32(0.0)) if w.size else f32(0.0)
    scale = f32(1.0) if hi == lo else f32(f32(hi - lo) / f32(255.0))
    initial_zp = f32(f32(-128.0) - f32(lo / scale))
    zero_point = int(np.rint(min(max(initial_zp, f32(-128.0)), f32(127.0))))
    q = np.clip(np.rint((w / scale).astype("float32")) + zero_point, -128, 127).astype("int8")
    return q, float(scale), zero_point


def _ort_bias(b: np.ndarray, bias_scale: np.float32):
    """ORT's bias quantization: ``Round(B / bias_scale)`` to int32, then ``DequantizeLinear``."""
    r = np.rint((np.asarray(b, "float32") / bias_scale).astype("float32"))
    if not np.all(np.abs(r) < 2.0 ** 31):
        return None
    return (r.astype("int32").astype("float32") * bias_scale).astype("float32")


def _float_constant(expr) -> bool:
    return isinstance(expr, relay.Constant) and str(expr.data.dtype) == "float32"


def _scalar_constant(expr):
    if isinstance(expr, relay.Constant) and expr.data.numpy().size == 1:
        return expr.data.numpy().reshape(()).item()
    return None


def _path_to_quantize(anchor, users):
    """``(bias node or None, quantize)`` along ORT's branch-free path, else a Reject."""
    node, bias = anchor, None
    while True:
        readers = users.get(node, [])
        if len(readers) != 1:
            return Reject(f"{op_name(node)} output has {len(readers)} readers (ORT needs one path to a quantize)")
        reader, idx = readers[0]
        name = op_name(reader) if isinstance(reader, relay.Call) else None
        if name == "qnn.quantize" and idx == 0:
            return bias, reader
        if node is anchor and name == "nn.bias_add" and idx == 0:
            const = reader.args[1]
            if not (_float_constant(const) and len(const.data.shape) == 1):
                return Reject("nn.bias_add of a value that is not a 1-D float32 constant (ORT skips such a conv)")
            bias = reader
        elif name not in _PASS_THROUGH or idx != 0:
            return Reject(f"{name or type(reader).__name__} between {op_name(anchor)} and its quantize")
        node = reader


def _match(node, users):
    """The replacement ``{old: new}`` of one anchor (and its bias), or a Reject."""
    data, weight = node.args[0], node.args[1]
    if not (isinstance(data, relay.Call) and op_name(data) == "qnn.dequantize"):
        return Reject("data input is not a qnn.dequantize")
    sx = _scalar_constant(data.args[1])
    if sx is None:
        return Reject("data dequantize scale is not a scalar constant (ORT needs per-tensor)")
    if not _float_constant(weight):
        return Reject("weight is not a float32 constant (already quantized, or computed)")
    path = _path_to_quantize(node, users)
    if isinstance(path, Reject):
        return path
    bias, _ = path
    w = weight.data.numpy()
    if not np.all(np.isfinite(w)):
        return Reject("weight has non-finite values")
    q, scale, zp = ort_int8_weight_parameters(w)
    new_weight = relay.qnn.op.dequantize(relay.const(q, "int8"), relay.const(np.float32(scale), "float32"),
                                         relay.const(zp, "int32"))
    new_anchor = relay.Call(node.op, [data, new_weight, *node.args[2:]], node.attrs, node.type_args, node.span)
    subst = {node: new_anchor}
    if bias is not None:
        b = _ort_bias(bias.args[1].data.numpy(), np.float32(np.float32(sx) * np.float32(scale)))
        if b is None:
            return Reject("bias does not fit int32 at the scale input scale * weight scale")
        subst[bias] = relay.Call(bias.op, [node, relay.const(b, "float32")], bias.attrs, bias.type_args, bias.span)
    return subst


def _collect(nodes, users, body) -> dict:
    """Each float weight's dequantize (and bias), replaced by ONNX Runtime's int8 form."""
    subst: dict = {}
    for node in op_calls(nodes, WEIGHT_OPS):
        m = _match(node, users)
        if isinstance(m, Reject):
            _log.debug("%s.%s: not rewritten: %s", PASS_NAME, op_name(node), m)
            continue
        subst.update(m)
    if subst:
        n = sum(1 for k in subst if op_name(k) in WEIGHT_OPS)
        _log.info("%s: %d float weight(s) quantized to int8 as ONNX Runtime's WeightBiasQuantization does", PASS_NAME,
                  n)
    return subst


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def QuantizeWeightsAsOnnxRuntime():  # pylint: disable=invalid-name
    """Quantize float weights (and biases) of ops between a dequantize and a quantize as ONNX Runtime does.

    ONNX Runtime's graph optimizer (``WeightBiasQuantization``, every optimization level but
    ``ORT_DISABLE_ALL``) replaces the float32 weight of a ``Conv``/``ConvTranspose`` that
    reads a per-tensor ``DequantizeLinear`` and feeds a ``QuantizeLinear`` (through ``Relu``/``Clip``
    only, no branch) with its int8 per-tensor quantization, dequantized; a float bias is rounded to
    int32 at ``input scale * weight scale``. This pass does the same on the Relay graph (the weight
    becomes ``qnn.dequantize`` of int8 constants; see docs/passes.md), so TVM computes with the
    weights ONNX Runtime computes with. Changes outputs: part of
    ``tvm_ext.core.pipelines.int8(numerics="onnxruntime")``, not of the default pipeline.

    Run it at stage ``"start"``, after ``QDQToInteger``.

    Notes
    -----
    Ops whose data input is not a ``qnn.dequantize`` with a scalar constant scale, whose weight is
    not a float32 constant, or whose output branches or meets another op before its
    ``qnn.quantize``, and functions with ``If``/``Let``/``Match``/references/closures, are left
    unchanged; each reason is logged at DEBUG on ``tvm_ext.passes.QuantizeWeightsAsOnnxRuntime``.
    """
    return substitution_pass(PASS_NAME, _collect)
