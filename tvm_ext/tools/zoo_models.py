"""How the zoo's models are made: a seeded ResNet-50 written with ``onnx.helper``, ONNX Runtime's
static quantization of an fp32 ONNX model, and ``relay.quantize`` of TVM's ResNet.

The catalogue, the cache and loading are :mod:`tvm_ext.tools.zoo` (its design note says what each
model is and why its statistics are measured while it is written).
"""
from __future__ import annotations

import logging
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .._atomic import atomic_target

logger = logging.getLogger(__name__)

__all__ = ["resnet50_onnx", "quantize_onnx", "relay_resnet_int8", "ZOO_VERSION", "OPSET", "INPUT_NAME", "OUTPUT_NAME"]


#: Bump when the generated models change, to invalidate caches.
ZOO_VERSION = "1"
OPSET = 13
INPUT_NAME = "data"
OUTPUT_NAME = "logits"


def _onnxruntime():
    """ONNX Runtime, which quantizes the zoo's int8 models; a clear error where it is not installed."""
    try:
        import onnxruntime
    except ImportError:
        from ..errors import UsageError

        raise UsageError("the zoo's int8 models are quantized with ONNX Runtime, which is not installed: "
                         "pip install 'tvm-ext[zoo]'") from None
    return onnxruntime


# --------------------------------------------------------------------------- #
# numpy reference ops (used only to measure activation statistics)
# --------------------------------------------------------------------------- #
def _np_conv(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """NCHW conv via im2col (no bias); float32."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    if pad:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    if kh == 1 and kw == 1:
        cols = x[:, :, ::stride, ::stride]
        ho, wo = cols.shape[2:]
        cols = cols.transpose(0, 2, 3, 1).reshape(n * ho * wo, c)
    else:
        win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))
        win = win[:, :, ::stride, ::stride]  # n, c, ho, wo, kh, kw
        ho, wo = win.shape[2:4]
        cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(n * ho * wo, c * kh * kw)
    y = cols @ w.reshape(o, -1).T
    return y.reshape(n, ho, wo, o).transpose(0, 3, 1, 2)


def _np_maxpool(x: np.ndarray, k: int, stride: int, pad: int) -> np.ndarray:
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-np.inf)
    win = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))
    return win[:, :, ::stride, ::stride].max(axis=(4, 5))


# --------------------------------------------------------------------------- #
# fp32 ResNet-50 (onnx.helper)
# --------------------------------------------------------------------------- #
class _Builder:
    """Emits ONNX nodes while tracking a numpy forward pass for BN folding."""

    def __init__(self, rng: np.random.Generator, x: np.ndarray):
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.x = x  # numpy activations of the current tensor

    def init(self, name: str, arr: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr, np.float32), name))
        return name

    def conv(self, name, inp, xval, out_ch, k, stride, relu, gamma_scale=1.0):
        """Conv with folded BN (+ optional Relu). Returns (tensor name, numpy value)."""
        in_ch = xval.shape[1]
        fan_in = in_ch * k * k
        w = self.rng.standard_normal((out_ch, in_ch, k, k)).astype(np.float32)
        w *= np.float32(np.sqrt(2.0 / fan_in))
        pad = k // 2
        y = _np_conv(xval, w, stride, pad)
        mean = y.mean(axis=(0, 2, 3), dtype=np.float64)
        std = y.std(axis=(0, 2, 3), dtype=np.float64) + 1e-5
        gamma = self.rng.uniform(0.6, 1.0, out_ch) * gamma_scale
        beta = self.rng.normal(0.0, 0.1, out_ch) * gamma_scale
        scale = (gamma / std).astype(np.float32)
        w_f = w * scale[:, None, None, None]
        b_f = (beta - mean * gamma / std).astype(np.float32)
        yv = y * scale[None, :, None, None] + b_f[None, :, None, None]
        self.nodes.append(
            helper.make_node(
                "Conv",
                [inp, self.init(f"{name}.weight", w_f), self.init(f"{name}.bias", b_f)],
                [f"{name}.out"],
                name=name,
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[pad] * 4,
                dilations=[1, 1],
                group=1,
            )
        )
        out = f"{name}.out"
        if relu:
            self.nodes.append(helper.make_node("Relu", [out], [f"{name}.relu"], name=f"{name}.relu"))
            out, yv = f"{name}.relu", np.maximum(yv, 0)
        return out, yv


def resnet50_onnx(
    *,
    blocks: Sequence[int] = (3, 4, 6, 3),
    image_size: int = 224,
    base_width: int = 64,
    num_classes: int = 1000,
    seed: int = 0,
    stats_batch: int = 4,
) -> onnx.ModelProto:
    """Build a seeded fp32 ResNet-50 (v1.5) ONNX model with BatchNorm folded.

    Torchvision layout: 7x7/2 stem conv (pad 3) + Relu, 3x3/2 max-pool
    (pad 1), four stages of bottleneck blocks (1x1 -> 3x3 -> 1x1 with 4x
    expansion), **stride on the 3x3 conv** (torchvision's "v1.5"; the original
    v1 paper puts it on the first 1x1), projection shortcut (1x1 conv + folded
    BN, same stride) on the first block of every stage, GlobalAveragePool,
    Flatten, Gemm.  With the defaults this is exactly ResNet-50's
    25.56 M parameters (BN folded into conv biases).

    Weights are He-normal from ``np.random.default_rng(seed)``; the folded BN
    uses per-channel statistics measured on ``stats_batch`` seeded N(0, 1)
    images (so activations stay O(1)) and seeded gamma/beta; see the module
    note.

    Parameters
    ----------
    blocks : sequence of 4 int, optional
        Bottleneck blocks per stage; ``(3, 4, 6, 3)`` is ResNet-50.
    image_size : int, optional
        Input height and width S (input is ``"data"``, float32 ``(1, 3, S, S)``).
    base_width : int, optional
        Width of the first stage (64 for ResNet-50); stages use
        ``base_width * (1, 2, 4, 8)`` and output 4x that.
    num_classes : int, optional
        Size of the ``"logits"`` output ``(1, num_classes)``.
    seed : int, optional
        Seed for all weights and statistics images.
    stats_batch : int, optional
        Number of images used to measure activation statistics.

    Returns
    -------
    onnx.ModelProto
        Checked opset-13 model; identical bytes for identical arguments.
    """
    if len(blocks) != 4 or min(blocks) < 1:
        raise ValueError(f"blocks must be 4 positive ints, got {blocks!r}")
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    stats_rng = np.random.default_rng([seed, 1])
    x = stats_rng.standard_normal((stats_batch, 3, image_size, image_size)).astype(np.float32)
    b = _Builder(rng, x)

    cur, xv = b.conv("conv1", INPUT_NAME, x, base_width, 7, 2, relu=True)
    b.nodes.append(
        helper.make_node("MaxPool", [cur], ["maxpool.out"], name="maxpool",
                         kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    )
    cur, xv = "maxpool.out", _np_maxpool(xv, 3, 2, 1)

    for si, nblocks in enumerate(blocks):
        width = base_width * (2**si)
        out_ch = width * 4
        for bi in range(nblocks):
            stride = 2 if (bi == 0 and si > 0) else 1
            p = f"layer{si + 1}.{bi}"
            h, hv = b.conv(f"{p}.conv1", cur, xv, width, 1, 1, relu=True)
            h, hv = b.conv(f"{p}.conv2", h, hv, width, 3, stride, relu=True)
            h, hv = b.conv(f"{p}.conv3", h, hv, out_ch, 1, 1, relu=False, gamma_scale=0.35)
            if bi == 0:
                sc, scv = b.conv(f"{p}.downsample", cur, xv, out_ch, 1, stride, relu=False)
            else:
                sc, scv = cur, xv
            b.nodes.append(helper.make_node("Add", [h, sc], [f"{p}.add"], name=f"{p}.add"))
            b.nodes.append(helper.make_node("Relu", [f"{p}.add"], [f"{p}.out"], name=f"{p}.relu"))
            cur, xv = f"{p}.out", np.maximum(hv + scv, 0)
            logger.debug("%s: activation mean %.3f std %.3f", p, xv.mean(), xv.std())

    b.nodes.append(helper.make_node("GlobalAveragePool", [cur], ["avgpool.out"], name="avgpool"))
    b.nodes.append(helper.make_node("Flatten", ["avgpool.out"], ["flatten.out"], name="flatten", axis=1))
    feat = xv.mean(axis=(2, 3))
    fc_in = feat.shape[1]
    w = rng.standard_normal((num_classes, fc_in)).astype(np.float32) / np.float32(np.sqrt(fc_in))
    bias = rng.normal(0.0, 0.1, num_classes).astype(np.float32)
    # Scale so logits vary by ~2 across classes (softmax is neither flat nor one-hot).
    logits = feat @ w.T
    w *= np.float32(2.0 / (logits.std(axis=1).mean() + 1e-6))
    b.nodes.append(
        helper.make_node("Gemm", ["flatten.out", b.init("fc.weight", w), b.init("fc.bias", bias)],
                         [OUTPUT_NAME], name="fc", transB=1)
    )

    graph = helper.make_graph(
        b.nodes,
        "resnet50_v1_5_folded_bn",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [1, 3, image_size, image_size])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [1, num_classes])],
        initializer=b.inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="tvm_ext.tools.zoo",
        producer_version=ZOO_VERSION,
        doc_string=(
            f"Synthetic ResNet-50 v1.5 (torchvision layout, BN folded), blocks={tuple(blocks)}, "
            f"image_size={image_size}, base_width={base_width}, num_classes={num_classes}, seed={seed}"
        ),
    )
    model.ir_version = 8  # opset 13 era; loadable by every onnxruntime >= 1.10
    onnx.checker.check_model(model)
    n_params = sum(int(np.prod(t.dims)) for t in b.inits)
    logger.info(
        "built fp32 ResNet-50 %s S=%d width=%d: %d nodes, %.2f M params in %.1fs",
        tuple(blocks), image_size, base_width, len(b.nodes), n_params / 1e6,
        time.perf_counter() - t0,
    )
    return model


# --------------------------------------------------------------------------- #
# ONNX Runtime static quantization
# --------------------------------------------------------------------------- #
def _calibration_reader(input_name, shape, num_images, seed, calibration=None):
    from onnxruntime.quantization import CalibrationDataReader

    class _Reader(CalibrationDataReader):
        def __init__(self):
            if calibration is not None:
                self._data = [{input_name: np.asarray(x, np.float32)} for x in calibration]
            else:
                rng = np.random.default_rng(seed)
                self._data = [
                    {input_name: rng.standard_normal(shape).astype(np.float32)} for _ in range(num_images)
                ]
            self._it = iter(self._data)

        def get_next(self):
            return next(self._it, None)

        def rewind(self):
            self._it = iter(self._data)

    return _Reader()


_QTYPES = {"uint8": "QUInt8", "int8": "QInt8"}


def _downstream_nodes(model: onnx.ModelProto, tensors: Sequence[str]) -> list:
    """Names of the nodes that read ``tensors`` or anything computed from them (ValueError if unknown)."""
    known = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}
    missing = [t for t in tensors if t not in known]
    if missing:
        raise ValueError(f"quantize_onnx: float_after names tensors the model does not have: {missing}")
    live, names = set(tensors), []
    for n in model.graph.node:  # ONNX graphs are topologically sorted
        if any(i in live for i in n.input):
            if not n.name:
                raise ValueError(f"quantize_onnx: float_after reaches an unnamed {n.op_type} node")
            names.append(n.name)
            live.update(n.output)
    return names


def _check_loads_in_ort(path, name) -> None:
    import onnxruntime as ort

    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise RuntimeError(f"quantize_onnx: ONNX Runtime cannot load the quantized {name}: {reason}") from None


def quantize_onnx(
    fp32_path: Union[str, os.PathLike],
    out_path: Union[str, os.PathLike],
    fmt: str = "qoperator",
    *,
    num_images: int = 8,
    seed: int = 1234,
    activation_type: str = "uint8",
    weight_type: str = "int8",
    per_channel: bool = False,
    calibration: Optional[Sequence[np.ndarray]] = None,
    preprocess: bool = False,
    float_after: Sequence[str] = (),
) -> Path:
    """Statically quantize an fp32 ONNX model with ONNX Runtime.

    MinMax calibration on ``num_images`` seeded N(0, 1) images (or the given ``calibration``
    inputs); by default uint8 activations (asymmetric), int8 weights (symmetric, per-tensor):
    ORT's "U8S8". ``activation_type="int8"`` is ORT's S8S8 (int8 activations, still
    asymmetric), ``per_channel=True`` gives per-output-channel weight scales.

    Parameters
    ----------
    fp32_path : path-like
        The fp32 model (single input).
    out_path : path-like
        Where to write the quantized model (written atomically).
    fmt : {"qoperator", "qdq"}
        ``QuantFormat.QOperator`` (QLinearConv, QLinearAdd, QGemm, ...) or
        ``QuantFormat.QDQ`` (QuantizeLinear/DequantizeLinear around fp32 ops).
    num_images, seed : int, optional
        Calibration set size and seed (ignored when ``calibration`` is given).
    activation_type, weight_type : {"uint8", "int8"}, optional
        ORT's ``QuantType.QUInt8`` / ``QuantType.QInt8``.
    per_channel : bool, optional
        Per-channel weight quantization.
    calibration : sequence of numpy.ndarray, optional
        Calibration inputs (each the model's input shape) instead of seeded N(0, 1).
    preprocess : bool, optional
        Run ORT's ``quant_pre_process`` first (ORT's recommended step: graph optimisation
        such as constant folding of shape computations and BatchNormalization folding, and
        ONNX shape inference; symbolic shape inference is skipped, the input shape must be
        static).
    float_after : sequence of str, optional
        Tensor names: every node downstream of them stays float (ORT's ``nodes_to_exclude``),
        e.g. a detector's box-decoding head.

    Returns
    -------
    pathlib.Path
        ``out_path``.
    """
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    formats = {"qoperator": QuantFormat.QOperator, "qdq": QuantFormat.QDQ}
    if fmt not in formats:
        raise ValueError(f"fmt must be one of {sorted(formats)}, got {fmt!r}")
    for what, t in (("activation_type", activation_type), ("weight_type", weight_type)):
        if t not in _QTYPES:
            raise ValueError(f"{what} must be one of {sorted(_QTYPES)}, got {t!r}")
    from ..core.frontend import input_info

    (name, (shape, _dtype)), = input_info(str(fp32_path)).items()
    reader = _calibration_reader(name, shape, num_images, seed, calibration)
    out_path = Path(out_path)
    t0 = time.perf_counter()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".quantize-", dir=out_path.parent) as work, \
            atomic_target(out_path) as tmp:
        src = str(fp32_path)
        opset = max((o.version for o in onnx.load(src, load_external_data=False).opset_import
                     if o.domain in ("", "ai.onnx")), default=0)
        if fmt == "qdq" and per_channel and opset < 13:
            # DequantizeLinear's axis (per-channel) exists from opset 13; ORT's quantizer writes it
            # without upgrading the model, and the result does not load
            from onnx import version_converter

            logger.info("quantize_onnx: per-channel QDQ needs opset 13; converting %s from opset %d",
                        Path(src).name, opset)
            src13 = Path(work) / "opset13.onnx"
            onnx.save(version_converter.convert_version(onnx.load(src), 13), str(src13))
            src = str(src13)
        if preprocess:
            from onnxruntime.quantization.shape_inference import quant_pre_process

            pre = str(Path(work) / "preprocessed.onnx")
            quant_pre_process(src, pre, skip_symbolic_shape=True)
            src = pre
        exclude = _downstream_nodes(onnx.load(src, load_external_data=False), float_after) if float_after else []
        quantize_static(
            src,
            str(tmp),
            reader,
            quant_format=formats[fmt],
            per_channel=per_channel,
            reduce_range=False,
            activation_type=getattr(QuantType, _QTYPES[activation_type]),
            weight_type=getattr(QuantType, _QTYPES[weight_type]),
            nodes_to_exclude=exclude,
        )
        _check_loads_in_ort(tmp, out_path.name)  # before the file is moved into place
    logger.info("quantized %s -> %s (%s, a=%s w=%s%s) in %.1fs", Path(fp32_path).name, out_path.name, fmt,
                activation_type, weight_type, ", per-channel" if per_channel else "", time.perf_counter() - t0)
    return out_path


# --------------------------------------------------------------------------- #
# relay.quantize ResNet
# --------------------------------------------------------------------------- #
def relay_resnet_int8(
    *, num_layers: int = 50, image_size: int = 224, num_classes: int = 1000,
    global_scale: float = 8.0,
):
    """``relay.testing`` ResNet quantized with ``relay.quantize``.

    ``tvm.relay.testing.resnet.get_workload`` (seeded Xavier weights, BN
    with identity statistics) quantized under
    ``relay.quantize.qconfig(calibrate_mode="global_scale",
    global_scale=global_scale, skip_conv_layers=[0])`` - the first conv stays
    fp32, everything else becomes int8 conv/dense with int32 accumulation.
    The small zoo variant is ``num_layers=18, image_size=64, num_classes=100``.

    Parameters
    ----------
    num_layers : int, optional
        18, 34, 50, 101, 152 (>= 50 uses bottleneck blocks).
    image_size : int, optional
        Input is ``"data"`` float32 ``(1, 3, S, S)``.
    num_classes : int, optional
        Output size.
    global_scale : float, optional
        Global activation scale used by the ``global_scale`` calibration.

    Returns
    -------
    mod : tvm.IRModule
        Quantized module; weights are bound as constants.
    params : dict
        Empty (everything is bound by ``relay.quantize.quantize``).
    """
    from tvm import relay
    from tvm.relay import testing

    t0 = time.perf_counter()
    mod, params = testing.resnet.get_workload(
        num_layers=num_layers, batch_size=1, num_classes=num_classes,
        image_shape=(3, image_size, image_size),
    )
    with relay.quantize.qconfig(
        calibrate_mode="global_scale", global_scale=global_scale, skip_conv_layers=[0]
    ), warnings.catch_warnings():
        # TVM 0.19's _calibrate.py uses np.math (deprecated in numpy 1.25, gone in 2.0)
        warnings.filterwarnings("ignore", message=".*np.math.*", category=DeprecationWarning)
        qmod = relay.quantize.quantize(mod, params)
    logger.info("relay.quantize ResNet-%d S=%d in %.1fs", num_layers, image_size,
                time.perf_counter() - t0)
    return qmod, {}
