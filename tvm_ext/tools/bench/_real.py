"""Real zoo models in the benchmark: which variants ``--zoo real`` runs, what a real model is (kind,
format, setting) and its output quantization step, read from the ONNX graph."""
from __future__ import annotations

from typing import Optional

import numpy as np


def real_variants(settings: str = "u8s8") -> list:
    """The real-model variants ``tvm-ext bench --zoo real`` runs.

    Parameters
    ----------
    settings : {"u8s8", "all"}, optional
        ``"u8s8"``: U8S8 per-tensor QOperator and QDQ of every real model (default);
        ``"all"``: every format and quantization setting of :data:`tvm_ext.tools.zoo_real.SETTINGS`.

    Returns
    -------
    list of str
        Zoo names, model by model.
    """
    from .. import zoo_real

    if settings not in ("u8s8", "all"):
        raise ValueError(f"settings must be 'u8s8' or 'all', got {settings!r}")
    return [n for n in zoo_real.list_models()
            if zoo_real.variant(n).quantized and (settings == "all" or zoo_real.variant(n).setting.name == "u8s8")]


def real_variant(v: dict) -> Optional[dict]:
    """For a real zoo model: kind, format, setting and the output quantization step; else None."""
    from .. import zoo_real

    name = v.get("zoo_name")
    if not zoo_real.is_real_model(name):
        return None
    rv = zoo_real.variant(name)
    out = {"model": rv.model.name, "kind": rv.model.kind, "format": rv.fmt,
           "setting": rv.setting.name if rv.setting else None,
           "output": rv.model.output, "float_head": bool(rv.model.float_head)}
    out.update(_output_step(v["onnx_path"]))
    if rv.model.float_head:
        out["float_head_reason"] = rv.model.float_head_reason
    return out


def _output_step(onnx_path) -> dict:
    """Scale of the quantized tensor feeding the model's final DequantizeLinear (the output step).

    A QOperator model ends in ``QLinearX -> DequantizeLinear`` and a QDQ model in
    ``QuantizeLinear -> DequantizeLinear``: either way the graph output is the DequantizeLinear's,
    and its scale is one output step. An output computed in float (a detector's decoding head)
    has no step: ``output_step`` is None and ``step_note`` says so.
    """
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(onnx_path), load_external_data=False)
    out = m.graph.output[0].name
    producer = next((n for n in m.graph.node if out in n.output), None)
    if producer is None or producer.op_type != "DequantizeLinear":
        return {"output_step": None,
                "step_note": f"float output ({producer.op_type if producer else 'graph input'} computes it in float): "
                             "differences are absolute"}
    consts = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    consts.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in m.graph.node
                   if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"})
    scale = consts.get(producer.input[1])
    if scale is None or np.size(scale) != 1:
        return {"output_step": None, "step_note": "output DequantizeLinear scale is not a constant scalar"}
    return {"output_step": float(np.asarray(scale).ravel()[0]),
            "step_note": "scale of the final DequantizeLinear's input"}
