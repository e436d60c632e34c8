"""QuantizeWeightsAsOnnxRuntime: float weights between a dequantize and a quantize, quantized as ONNX Runtime does.

Design note
-----------
ONNX Runtime's basic graph optimizations (level 1, so every ``ORT_ENABLE_*`` but ``DISABLE_ALL``)
include ``WeightBiasQuantization``: a ``Conv``/``ConvTranspose``/``Gemm`` whose input is a
``DequantizeLinear`` with a per-tensor scale, whose output reaches a ``QuantizeLinear`` along a
path without branches (``Relu``/``Clip`` allowed), and whose weight is a float32 initializer gets
that weight quantized to int8 and dequantized again (and a float bias quantized to int32 at the
scale ``input scale * weight scale``). ONNX Runtime then computes with the dequantized weight
``w' = (q - zp) * s``, not with ``w``. TVM imports the float weight and computes with ``w``::

    # quantize(op(dequantize(x, sx, zx), W) [bias_add(., B)] [relu | clip]*, sy, zy)
    #   -> the same with W := dequantize(q, s, zp),   q, s, zp: ORT's int8 per-tensor parameters of W
    #                    B := f32(f32(int32(rne(B / f32(sx * s)))) * f32(sx * s))

ORT's parameters (``onnxruntime/core/util/qmath.h``, ``GetQuantizationParameter<int8_t>``), all in
float32: ``lo = min(min W, 0)``, ``hi = max(max W, 0)``, ``s = (hi - lo) / 255`` (1 when
``hi == lo``), ``zp = rne(clamp(-128 - lo / s, -128, 127))`` (asymmetric: PP-OCRv4 det's first
``ConvTranspose`` gets ``zp = -1``), ``q = saturate(rne(W / s) + zp)`` (``QuantizeLinear``,
folded by ORT's constant folding). On PP-OCRv4 det QOperator (1x24x80x80 -> 1x24x160x160) TVM's
float weights gave 11.4 % of that tensor's levels 1-2 off ORT's, which the detector's last
``ConvTranspose`` and ``QLinearSigmoid`` amplify to 60 output steps; with ``w'`` a float64
reference equals ORT on every level (``benchmarks/ort_layerwise.py``).

The weight becomes ``qnn.dequantize(q, s, zp)`` of int8 constants, as in ORT's graph: relay.build's
prefix lowers and folds it back into a float32 constant, ``f32(f32(q - zp) * s)``, which is ORT's
``DequantizeLinear``; and a second run finds no float weight (idempotent: re-quantizing ``w'``
could move ``s`` by one ulp). Anchors: ``nn.conv1d/2d/3d`` and ``nn.conv1d/2d/3d_transpose``
(ONNX ``Conv``/``ConvTranspose``); a bias is the ``nn.bias_add`` of a 1-D float32 constant right
after the anchor (a ``Conv`` whose bias is not a constant is skipped, as ORT skips it). ``Gemm``
is not handled: TVM imports it and ``MatMul`` (which ORT's rule does not cover) both as
``nn.dense``, and tells them apart only by the ops around it. Everything else is left alone
with the reason logged at DEBUG on ``tvm_ext.passes.QuantizeWeightsAsOnnxRuntime``: a dequantized
weight (ORT would then quantize only a float bias: not done here), a data input that is not a
per-tensor ``qnn.dequantize``, a branch or another op before the ``qnn.quantize``.

Scope of the match. ORT applies the rule on the ONNX graph; this pass applies it to what TVM's
ONNX importer makes of it, so ops the importer inserts (``auto_pad``'s ``nn.pad``) make it
reject. What ORT does next with the quantized weight differs by op: ``ConvTranspose`` (and a
``Conv`` with bias followed by ``Relu``) stays a float kernel, which the float TVM op with ``w'``
matches; a plain ``Conv`` is then fused into ``QLinearConv``
(integer accumulation, one float requantization), which the float op matches except where the
two roundings of a level differ (near halfway values).

Measured against onnxruntime 1.32 (CPU execution provider); a release without
``WeightBiasQuantization`` computes with ``w``, as TVM does without this pass.

Hand-matched rather than a dataflow pattern: the rule needs "one consumer at every step" (ORT's
``IsNoBranchPathToQuantizeLinear``), which the pattern language does not express.
Run it at stage ``start`` after ``QDQToInteger`` (whose FQ2I would otherwise turn the float op with
a dequantized weight into an integer QNN op): ``pipelines.int8(numerics="onnxruntime")`` does.

Walked by hand, not with ``tvm.relay.dataflow_pattern``: the path from the anchor to its quantize
passes through any number of pass-through calls, each with one reader, which a fixed pattern cannot
express.
"""
from __future__ import annotations

import numpy as np

from tvm import relay

from tvm_ext.core.registry import register_pass

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

    ``GetQuantizationParameter<int8_t>`` then ``QuantizeLinear``, evaluated in float32 (module note).
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
def QuantizeWeightsAsOnnxRuntime():  # pylint: disable=invalid-name
    """Quantize float weights (and biases) of ops between a dequantize and a quantize as ONNX Runtime does.

    ONNX Runtime's graph optimizer (``WeightBiasQuantization``, every optimization level but
    ``ORT_DISABLE_ALL``) replaces the float32 weight of a ``Conv``/``ConvTranspose`` that
    reads a per-tensor ``DequantizeLinear`` and feeds a ``QuantizeLinear`` (through ``Relu``/``Clip``
    only, no branch) with its int8 per-tensor quantization, dequantized; a float bias is rounded to
    int32 at ``input scale * weight scale``. This pass does the same on the Relay graph (the weight
    becomes ``qnn.dequantize`` of int8 constants; see the module note), so TVM computes with the
    weights ONNX Runtime computes with. Changes outputs: part of
    ``tvm_ext.core.pipelines.int8(numerics="onnxruntime")``, not of the default pipeline.

    Run it at stage ``"start"``, after ``QDQToInteger``.

    Returns
    -------
    tvm.transform.Pass
        A Relay function pass named ``"QuantizeWeightsAsOnnxRuntime"`` (opt_level 1).

    Raises
    ------
    tvm_ext.passes._util.UntypedModuleError
        When run on a module that was not type-inferred.

    Notes
    -----
    Ops whose data input is not a ``qnn.dequantize`` with a scalar constant scale, whose weight is
    not a float32 constant, or whose output branches or meets another op before its
    ``qnn.quantize``, and functions with ``If``/``Let``/``Match``/references/closures, are left
    unchanged; each reason is logged at DEBUG on ``tvm_ext.passes.QuantizeWeightsAsOnnxRuntime``.
    """
    return substitution_pass(PASS_NAME, _collect)
