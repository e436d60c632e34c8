"""Environment and library compatibility set-up that must run before TVM is used.

Design note
-----------
* ``TOPHUB_LOCATION=NONE`` keeps TVM from trying to download AutoTVM tophub
  logs (there is no network); ``setdefault`` lets a user override it.
* TVM 0.19's ONNX frontends (``tvm.relay.frontend.onnx`` and
  ``tvm.relax.frontend.onnx``) do ``from onnx.mapping import
  TENSOR_TYPE_TO_NP_TYPE`` and ``tvm.contrib.target.onnx`` uses
  ``onnx.mapping.NP_TYPE_TO_TENSOR_TYPE``.  ``onnx.mapping`` was deprecated in
  onnx 1.13 and removed later (it is gone in 1.23), so ``from_onnx`` fails with
  an ``ImportError`` on any graph.  :func:`install_onnx_mapping_shim` registers
  a small replacement module built from the public ``onnx.helper`` dtype
  functions.  It is idempotent and does nothing when onnx still ships
  ``onnx.mapping`` or when onnx is not installed.
* TVM 0.19's ``relay.backend.te_compiler.get_shape`` calls ``tvm.support.libinfo()`` once per
  dimension of every lowered call's output type; each call converts the ~100-entry build-info
  map into a fresh dict over the FFI (milliseconds). On small graphs this was 25 % of a
  ``relay.build`` (profiled on the fuzzer's graphs). :func:`install_libinfo_cache` makes the
  name ``libinfo`` inside ``te_compiler`` return a copy of a dict read once (the build info of a
  loaded ``libtvm`` cannot change). ``tvm.support.libinfo`` itself is untouched. Called by
  :mod:`tvm_ext.build` on import; idempotent.
"""
from __future__ import annotations

import importlib
import logging
import os
import sys
import types

os.environ.setdefault("TOPHUB_LOCATION", "NONE")

logger = logging.getLogger(__name__)

_SHIM_MARKER = "__tvm_ext_shim__"


def _build_mapping_module(onnx_mod: types.ModuleType) -> types.ModuleType:
    """Build a stand-in for the removed ``onnx.mapping`` module."""
    import numpy as np
    from onnx import helper

    tensor_to_np: dict[int, np.dtype] = {}
    tensor_to_storage: dict[int, int] = {}
    storage_to_field: dict[int, str] = {}
    for ttype in helper.get_all_tensor_dtypes():
        try:
            tensor_to_np[int(ttype)] = np.dtype(helper.tensor_dtype_to_np_dtype(ttype))
        except Exception:  # pragma: no cover - exotic types without a numpy dtype
            continue
        try:
            storage = int(helper.tensor_dtype_to_storage_tensor_dtype(ttype))
            tensor_to_storage[int(ttype)] = storage
            storage_to_field.setdefault(storage, helper.tensor_dtype_to_field(ttype))
        except Exception:  # pragma: no cover
            pass

    # Inverse map, as the old module did: one canonical tensor type per numpy dtype.
    np_to_tensor: dict[np.dtype, int] = {}
    for ttype, npdt in tensor_to_np.items():
        if npdt in np_to_tensor:
            continue
        try:
            np_to_tensor[npdt] = int(helper.np_dtype_to_tensor_dtype(npdt))
        except Exception:  # pragma: no cover
            np_to_tensor[npdt] = ttype

    mod = types.ModuleType(
        "onnx.mapping",
        "Compatibility stand-in for the removed onnx.mapping (installed by tvm_ext._compat).",
    )
    mod.TENSOR_TYPE_TO_NP_TYPE = tensor_to_np
    mod.NP_TYPE_TO_TENSOR_TYPE = np_to_tensor
    mod.TENSOR_TYPE_TO_STORAGE_TENSOR_TYPE = tensor_to_storage
    mod.STORAGE_TENSOR_TYPE_TO_FIELD = storage_to_field
    setattr(mod, _SHIM_MARKER, True)
    return mod


def install_onnx_mapping_shim() -> bool:
    """Make ``import onnx.mapping`` work on onnx versions that removed it.

    Installs a module exposing ``TENSOR_TYPE_TO_NP_TYPE``,
    ``NP_TYPE_TO_TENSOR_TYPE``, ``TENSOR_TYPE_TO_STORAGE_TENSOR_TYPE`` and
    ``STORAGE_TENSOR_TYPE_TO_FIELD`` (what TVM 0.19 uses) as
    ``sys.modules["onnx.mapping"]`` and as the ``onnx.mapping`` attribute.

    Returns
    -------
    bool
        True if the shim is (now or already) installed, False if nothing was
        needed (real ``onnx.mapping`` present) or onnx is not installed.
    """
    try:
        import onnx
    except ImportError:
        return False
    existing = sys.modules.get("onnx.mapping") or getattr(onnx, "mapping", None)
    if existing is not None:
        return bool(getattr(existing, _SHIM_MARKER, False))
    try:
        importlib.import_module("onnx.mapping")
        return False  # the real module exists
    except ImportError:
        pass
    mod = _build_mapping_module(onnx)
    sys.modules["onnx.mapping"] = mod
    onnx.mapping = mod  # type: ignore[attr-defined]
    logger.debug("installed onnx.mapping compatibility shim (onnx %s)", onnx.__version__)
    return True


def install_libinfo_cache() -> bool:
    """Let TVM's ``te_compiler`` read ``libinfo()`` once per process (see the design note).

    Returns
    -------
    bool
        True when the cached function is (now or already) installed, False when TVM is not
        importable or ``te_compiler`` has no ``libinfo`` name to replace.
    """
    try:
        from tvm.relay.backend import te_compiler
    except ImportError:
        return False
    current = getattr(te_compiler, "libinfo", None)
    if current is None:
        return False
    if getattr(current, _SHIM_MARKER, False):
        return True
    info = dict(current())

    def libinfo() -> dict:
        return dict(info)

    setattr(libinfo, _SHIM_MARKER, True)
    libinfo.__doc__ = current.__doc__
    te_compiler.libinfo = libinfo
    return True


install_onnx_mapping_shim()
