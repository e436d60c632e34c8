"""ONNX -> Relay import with input-shape inference and clear errors.

Design note
-----------
``tvm.relay.frontend.from_onnx`` wants every graph input's static shape in a
``shape`` dict and otherwise silently creates ``relay.Any`` dims, which later
fail deep inside ``relay.build``.  :func:`from_onnx` reads the shapes from the
model's graph inputs (skipping inputs that are really initializers, as older
exporters list weights as inputs), lets the caller override any of them, and
fails early with a one-line ``ValueError`` naming the input and the ``shape=``
argument to pass.  A symbolic *batch* dim (leading dim with a ``dim_param``
such as ``"N"``) is defaulted to 1 with a logged warning, which is what one
wants for latency-oriented compilation.

Loading errors are normalised so a CLI can print ``str(exc)``:
``FileNotFoundError`` for a missing path, ``ValueError("<path> is not an ONNX
model: ...")`` for anything that does not parse as an ONNX ``ModelProto``.
:func:`from_onnx` runs TVM's importer with the ``onnx.mapping`` stand-in TVM 0.19 needs
with recent onnx, removed again after (:func:`tvm_ext._compat.onnx_mapping`).
"""
from __future__ import annotations

import logging
import warnings
import os
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import onnx

from .. import _compat

logger = logging.getLogger(__name__)

__all__ = ["load_onnx", "input_info", "from_onnx"]

ModelLike = Union[str, os.PathLike, onnx.ModelProto]
_ShapeDict = Mapping[str, Sequence[int]]


def load_onnx(model_or_path: ModelLike) -> onnx.ModelProto:
    """Load an ONNX model from a path (or pass a ``ModelProto`` through).

    Parameters
    ----------
    model_or_path : str, os.PathLike or onnx.ModelProto
        File to load, or an already loaded model.

    Returns
    -------
    onnx.ModelProto

    Raises
    ------
    FileNotFoundError
        If the path does not exist (or is a directory).
    ValueError
        If the file is not a parseable ONNX model; the message starts with
        ``"<path> is not an ONNX model: "``.
    TypeError
        If ``model_or_path`` is of an unsupported type.
    """
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path
    if not isinstance(model_or_path, (str, os.PathLike)):
        raise TypeError(
            f"expected a path or onnx.ModelProto, got {type(model_or_path).__name__}"
        )
    path = Path(model_or_path)
    if not path.is_file():
        raise FileNotFoundError(f"ONNX model not found: {path}")
    try:
        # load_external_data=False first: a broken file should fail on the
        # protobuf, not on an unrelated missing external-data file.
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # DecodeError, RuntimeError, UnicodeDecodeError...
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{path} is not an ONNX model: {reason}") from None
    # Protobuf happily parses many byte strings (e.g. empty files) into an
    # empty message; a real model has an IR version and a graph with nodes.
    if model.ir_version == 0 or len(model.graph.node) == 0:
        raise ValueError(
            f"{path} is not an ONNX model: no ir_version or empty graph "
            f"({path.stat().st_size} bytes)"
        )
    if any(
        t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer
    ):
        onnx.load_external_data_for_model(model, str(path.parent))
    return model


def _graph_inputs(model: onnx.ModelProto):
    init_names = {t.name for t in model.graph.initializer}
    init_names.update(t.name for t in model.graph.sparse_initializer)
    return [vi for vi in model.graph.input if vi.name not in init_names]


def _raw_dims(vi: onnx.ValueInfoProto):
    """List of dims: int, str (symbolic) or None (unknown); None if no shape at all."""
    ttype = vi.type.tensor_type
    if not ttype.HasField("shape"):
        return None
    dims = []
    for d in ttype.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return dims


def _np_dtype_name(elem_type: int) -> str:
    if elem_type == onnx.TensorProto.BFLOAT16:
        return "bfloat16"
    return str(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def input_info(
    model: ModelLike,
    shape: Optional[_ShapeDict] = None,
    *,
    default_batch: Optional[int] = 1,
) -> dict[str, tuple[tuple[int, ...], str]]:
    """Static shapes and dtypes of a model's real (non-initializer) inputs.

    Parameters
    ----------
    model : str, os.PathLike or onnx.ModelProto
        The model or a path to it.
    shape : mapping of str to sequence of int, optional
        Shapes that override (or complete) the ones declared in the graph.
    default_batch : int or None, optional
        Value used for a symbolic leading (batch) dim, with a logged warning.
        ``None`` treats a symbolic batch dim like any other dynamic dim.

    Returns
    -------
    dict
        ``{input_name: (shape_tuple, dtype_str)}`` in graph order.

    Raises
    ------
    ValueError
        If an input has a dynamic/unknown dim (other than a defaulted batch
        dim) and no override in ``shape``; or ``shape`` names an unknown input.
    """
    model = load_onnx(model)
    shape = dict(shape or {})
    inputs = _graph_inputs(model)
    names = [vi.name for vi in inputs]
    unknown = sorted(set(shape) - set(names))
    if unknown:
        raise ValueError(f"shape= names unknown input(s) {unknown}; model inputs are {names}")
    info: dict[str, tuple[tuple[int, ...], str]] = {}
    for vi in inputs:
        dtype = _np_dtype_name(vi.type.tensor_type.elem_type)
        if vi.name in shape:
            info[vi.name] = (tuple(int(d) for d in shape[vi.name]), dtype)
            continue
        dims = _raw_dims(vi)
        if dims is None:
            raise ValueError(
                f"input {vi.name!r} has no shape in the model; "
                f"pass shape={{{vi.name!r}: (...)}}"
            )
        resolved = []
        for i, d in enumerate(dims):
            if isinstance(d, int):
                resolved.append(d)
            elif i == 0 and isinstance(d, str) and default_batch is not None and len(dims) > 1:
                logger.warning(
                    "input %r: symbolic batch dim %r set to %d "
                    "(override: shape= in Python, --shape on the command line)",
                    vi.name, d, default_batch,
                )
                resolved.append(int(default_batch))
            else:
                shown = ["?" if x is None else x for x in dims]
                raise ValueError(
                    f"input {vi.name!r} has dynamic dim {i} ({'?' if d is None else repr(d)}) "
                    f"in shape {shown}; pass shape={{{vi.name!r}: (...)}} with static dims"
                )
        info[vi.name] = (tuple(resolved), dtype)
    return info


def from_onnx(
    model_or_path: ModelLike,
    shape: Optional[_ShapeDict] = None,
    dtype: Union[None, str, Mapping[str, str]] = None,
    freeze_params: bool = True,
):
    """Import an ONNX model into Relay.

    Parameters
    ----------
    model_or_path : str, os.PathLike or onnx.ModelProto
        The model or a path to an ``.onnx`` file.
    shape : mapping of str to sequence of int, optional
        Input shapes overriding those declared in the graph; required for
        inputs with dynamic dims (other than a leading batch dim, which
        defaults to 1 with a warning).
    dtype : str or mapping of str to str, optional
        Input dtype(s); defaults to the element types declared in the graph.
    freeze_params : bool, optional
        Passed to ``relay.frontend.from_onnx``: bake initializers into the
        graph as constants (enables constant folding of shape computations).

    Returns
    -------
    mod : tvm.IRModule
        The Relay module (type-inferred).
    params : dict of str to tvm.nd.NDArray
        Remaining parameters (empty for most models when ``freeze_params``).

    Raises
    ------
    FileNotFoundError, ValueError
        See :func:`load_onnx` and :func:`input_info`.
    """
    import tvm
    from tvm import relay

    model = load_onnx(model_or_path)
    _check_opset(model)
    info = input_info(model, shape)
    shapes = {name: s for name, (s, _) in info.items()}
    if dtype is None:
        dtypes: Union[str, dict[str, str]] = {name: dt for name, (_, dt) in info.items()}
    elif isinstance(dtype, str):
        dtypes = {name: dtype for name in info}
    else:
        dtypes = {name: dt for name, (_, dt) in info.items()}
        dtypes.update(dtype)
    logger.info("relay.frontend.from_onnx: inputs %s", {k: (shapes[k], dtypes[k]) for k in shapes})
    try:
        with _compat.onnx_mapping(), warnings.catch_warnings(record=True) as caught:  # checker complaints: logged
            warnings.simplefilter("always")
            mod, params = relay.frontend.from_onnx(
                model, shape=shapes, dtype=dtypes, freeze_params=freeze_params
            )
        for w in caught:
            logger.info("relay.frontend.from_onnx: %s", str(w.message).strip().splitlines()[0])
    except tvm.error.OpError as err:  # unsupported op, bad or missing attribute
        raise ValueError(f"TVM's ONNX importer cannot import this model: {_last_line(err)}") from None
    return mod, params


def _last_line(err) -> str:
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else type(err).__name__


def _check_opset(model: onnx.ModelProto) -> None:
    """ValueError for an opset of the default ONNX domain that onnx itself does not define.

    TVM's importer picks, per op, the newest converter not newer than the model's opset; for an
    opset beyond every known one that silently applies older semantics.
    """
    known = onnx.defs.onnx_opset_version()
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx") and not 1 <= imp.version <= known:
            raise ValueError(
                f"the model declares ONNX opset {imp.version}; the installed onnx {onnx.__version__} knows "
                f"opsets 1..{known} (TVM 0.19 would import it with older op semantics)"
            )
