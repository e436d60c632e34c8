"""ONNX -> Relax import with the same shape handling and errors as :mod:`tvm_ext.core.frontend`.

Design note
-----------
Shapes and dtypes of the real inputs come from :func:`tvm_ext.core.frontend.input_info` (a symbolic
batch dim defaults to 1 with a warning; other dynamic dims need ``shape=``), then
``tvm.relax.frontend.onnx.from_onnx`` with the weights as constants (``keep_params_in_input=False``),
so ``FoldConstant`` and the pattern tables see them as Relay's frozen params are seen. Errors are
the Relay loader's: ``FileNotFoundError`` / ``ValueError("<path> is not an ONNX model: ...")``;
a graph the Relax frontend cannot import raises ``ValueError`` naming the frontend.
"""
from __future__ import annotations

__all__ = ["from_onnx"]


def from_onnx(model_or_path, shape=None):
    """Import an ONNX model into Relax (weights bound as constants).

    Parameters
    ----------
    model_or_path : str, os.PathLike or onnx.ModelProto
    shape : mapping of str to sequence of int, optional
        Input shapes overriding those declared in the graph.

    Returns
    -------
    tvm.IRModule
        A Relax module with ``main``.
    """
    import tvm
    from tvm.relax.frontend.onnx import from_onnx as _from_onnx

    from tvm_ext import _compat
    from tvm_ext.core.frontend import input_info, load_onnx

    model = load_onnx(model_or_path)
    info = input_info(model, shape)
    try:
        with _compat.onnx_mapping():
            return _from_onnx(model, shape_dict={k: list(s) for k, (s, _) in info.items()},
                              dtype_dict={k: d for k, (_, d) in info.items()}, keep_params_in_input=False)
    except (tvm.TVMError, KeyError, NotImplementedError, AttributeError) as err:
        raise ValueError(f"the Relax ONNX frontend cannot import this model: {str(err).splitlines()[-1]}") from err
