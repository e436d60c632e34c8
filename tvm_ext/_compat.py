"""Compatibility settings TVM 0.19 needs, applied only while tvm-ext's own work runs, then undone.

* :func:`onnx_mapping`: TVM 0.19's ONNX frontends import ``onnx.mapping``, which onnx removed (gone
  in 1.23); while entered, a stand-in built from ``onnx.helper`` is ``sys.modules["onnx.mapping"]``.
  :func:`install_onnx_mapping_shim` installs it for the rest of the process: a user's choice, for
  code that calls ``tvm.relay.frontend.from_onnx`` directly.
* :func:`no_tophub_download`: while entered, ``TOPHUB_LOCATION`` is ``NONE`` unless the user set it,
  so ``relay.build`` never tries to download AutoTVM's TopHub logs.
* :func:`te_compiler_libinfo_cached`: while entered, ``te_compiler``'s ``libinfo`` returns a dict
  read once (TVM 0.19 converts the ~100-entry build-info map over the FFI once per output dimension
  of every lowered call: 25 % of a small graph's ``relay.build``). ``tvm.support.libinfo`` is untouched.

Nothing here runs on import.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import types

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


@contextlib.contextmanager
def onnx_mapping():
    """Enter to let TVM's ONNX frontends import ``onnx.mapping`` (see the module note); a shim this
    installed is removed on exit, one the user installed stays."""
    had = "onnx.mapping" in sys.modules
    installed = install_onnx_mapping_shim() and not had
    try:
        yield
    finally:
        if installed:
            import onnx

            sys.modules.pop("onnx.mapping", None)
            if getattr(getattr(onnx, "mapping", None), _SHIM_MARKER, False):
                del onnx.mapping


@contextlib.contextmanager
def no_tophub_download():
    """Enter to keep ``relay.build`` from downloading TopHub logs (``TOPHUB_LOCATION=NONE`` unless set)."""
    if "TOPHUB_LOCATION" in os.environ:
        yield
        return
    os.environ["TOPHUB_LOCATION"] = "NONE"
    try:
        yield
    finally:
        os.environ.pop("TOPHUB_LOCATION", None)


@contextlib.contextmanager
def te_compiler_libinfo_cached():
    """Enter to let TVM's ``te_compiler`` read ``libinfo()`` once (see the module note)."""
    try:
        from tvm.relay.backend import te_compiler
    except ImportError:
        yield
        return
    current = getattr(te_compiler, "libinfo", None)
    if current is None or getattr(current, _SHIM_MARKER, False):
        yield
        return
    info = dict(current())

    def libinfo() -> dict:
        return dict(info)

    setattr(libinfo, _SHIM_MARKER, True)
    te_compiler.libinfo = libinfo
    try:
        yield
    finally:
        te_compiler.libinfo = current
