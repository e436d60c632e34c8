"""The quantized variants of the real models (:mod:`tvm_ext.tools.zoo_real`), made and cached.

The fp32 models are fetched by :mod:`tvm_ext.tools.zoo_real`; each int8 variant is that model
through :func:`tvm_ext.tools.zoo_models.quantize_onnx` (ONNX Runtime's ``quant_pre_process`` first,
calibration on synthetic images shaped and normalised like the model's real inputs), cached under
``<cache>/real`` with a key of the variant's settings and the onnx, onnxruntime and numpy versions.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np
import onnx

from . import zoo_real
from ._zoo_cache import cache_dir as cache_dir_of
from .zoo_models import _onnxruntime, quantize_onnx

logger = logging.getLogger("tvm_ext.tools.zoo")

__all__ = ["no_small", "real_config", "real_onnx_path"]

#: Calibration of the real models: synthetic images shaped and normalised like their inputs.
_REAL_CALIB = dict(num_images=8, seed=1234)


def no_small(name: str, small: bool) -> None:
    if small:
        raise ValueError(f"{name!r} is a real model: there is no small variant")


def real_config(name: str, small: bool = False) -> dict:
    no_small(name, small)
    v = zoo_real.variant(name)
    cfg = dataclasses.asdict(v.model)
    cfg.update(format=v.fmt, setting=v.setting.name if v.setting else None,
               image_size=v.model.input_shape[-1], input_shape=tuple(v.model.input_shape))
    if v.quantized:
        cfg["calibration"] = dict(_REAL_CALIB, inputs="tvm_ext.tools.zoo_real.images", preprocess="quant_pre_process")
        cfg.update(v.setting.quantize_kwargs())
    return cfg


def _real_cache(cache_dir=None) -> Path:
    d = cache_dir_of(cache_dir) / "real"
    d.mkdir(parents=True, exist_ok=True)
    return d


def real_onnx_path(name: str, small: bool, cache_dir) -> Path:
    """fp32: fetched (zoo_real.fp32_path); int8: that, through quantize_onnx, cached."""
    no_small(name, small)
    v = zoo_real.variant(name)
    d = _real_cache(cache_dir)
    fp32 = zoo_real.fp32_path(v.model, d)
    if not v.quantized:
        return fp32
    onnxruntime = _onnxruntime()
    key = hashlib.sha256(json.dumps({
        "zoo_real": zoo_real.ZOO_REAL_VERSION, "cfg": real_config(name), "onnx": onnx.__version__,
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
