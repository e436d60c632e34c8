"""The zoo's cache directory and its cache of Relay imports.

TVM's ONNX importer constant-folds after every node, compiling each folded expression with LLVM:
importing a quantized model takes seconds, reading its Relay JSON a tenth of that. So
:func:`import_onnx` stores what the importer made (``tvm.ir.save_json`` and
``relay.save_param_dict``) under ``<cache>/relay``, keyed by the ONNX file's bytes, the input
shapes and the source of both importers (TVM's ``relay/frontend/onnx.py`` and
:mod:`tvm_ext.core.frontend`): a changed model, TVM or importer imports again. Files are written
to a temporary name and renamed into place (docs/real-models.md, "The built-in zoo").
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Optional, Union

from .._atomic import write_bytes_atomic

logger = logging.getLogger("tvm_ext.tools.zoo")

__all__ = ["cache_dir", "import_onnx"]


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


#: Bumped when what :func:`import_onnx` stores changes.
_IMPORT_CACHE_VERSION = 1


def _file_digest(path: Union[str, os.PathLike]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _import_key(path: Path, shape: Optional[dict]) -> str:
    import tvm
    import tvm.relay.frontend.onnx as tvm_onnx

    from ..core import frontend

    payload = {
        "version": _IMPORT_CACHE_VERSION,
        "model": _file_digest(path),
        "shape": {k: list(v) for k, v in (shape or {}).items()},
        "tvm": tvm.__version__,
        "importers": [_file_digest(tvm_onnx.__file__), _file_digest(frontend.__file__)],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def import_onnx(path: Path, cache: Optional[Union[str, os.PathLike]] = None, shape: Optional[dict] = None):
    """``from_onnx(path)``, or the Relay JSON of an earlier import of the same bytes (module note)."""
    import tvm
    from tvm import relay

    from ..core.frontend import from_onnx

    d = cache_dir(cache) / "relay"
    stem = d / f"{path.stem}-{_import_key(path, shape)}"
    js, pr = stem.with_suffix(".json"), stem.with_suffix(".params")
    if js.is_file() and pr.is_file():
        logger.debug("zoo: Relay import cache hit: %s", js)
        return tvm.ir.load_json(js.read_text()), dict(relay.load_param_dict(pr.read_bytes()))
    t0 = time.perf_counter()
    mod, params = from_onnx(path, shape=shape)
    logger.info("zoo: imported %s into Relay in %.1fs (cached in %s)", path.name, time.perf_counter() - t0, d)
    d.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(pr, relay.save_param_dict(params))  # params first: the JSON's presence means complete
    write_bytes_atomic(js, tvm.ir.save_json(mod).encode())
    return mod, params
