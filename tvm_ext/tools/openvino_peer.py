"""OpenVINO as a peer engine of ``tvm-ext bench``: at the host's instruction set, and restricted to tvm-ext's.

Design note
-----------
OpenVINO's CPU plugin (oneDNN inside) picks its kernels from the host's CPUID. On a host that has
more than the instruction set tvm-ext's code uses (AMX next to AVX-512 VNNI, or AVX-512 next to an
AVX2 build), "tvm-ext versus OpenVINO" then mixes two gaps: the kernels' and the instruction set's.
oneDNN caps its dispatch with the environment variable ``ONEDNN_MAX_CPU_ISA``, read once when the
library loads; so the restricted OpenVINO runs in a child process (:class:`ChildOpenVINO`) whose
environment has it, and the benchmark shows both numbers.

* :func:`onednn_isa_cap` decides: the cap for tvm-ext's ISA class when the host's ISA is above it,
  else None (nothing to separate). Pure: it takes the class and the host's feature set.
* :func:`compile_model` and :func:`conv_primitives` are self-contained (their source and :data:`CPU_CONFIG`
  also run in the child): same thread count as the other engines, one stream, latency hint, float32 layers.
* :func:`why_not` turns OpenVINO's refusal of a model into one short line for the table. QOperator
  models carry ONNX Runtime's ``com.microsoft`` contrib ops. OpenVINO 2026.4 has no conversion for
  some (``QGemm``, ``QLinearGlobalAveragePool``: the zoo's ResNet-50) and converts others, but its
  ``QLinearAdd`` of two convolutions' outputs is off by 7 (an output range of about 8) where ONNX
  Runtime is within 0.8 of float32 (``tests/test_openvino_peer.py`` keeps the case). So a model
  with contrib ops is not run, and the line says which OpenVINO cannot convert, or that its
  conversions are not trusted.
* :func:`conv_primitives` counts the kernels OpenVINO chose for its convolutions (``jit_avx2_I8``,
  ``brgconv_avx512_amx_I8``, ...): the evidence that a cap took effect; :func:`node_times` times each
  convolution with OpenVINO's performance counters (``benchmarks/layers_vs_peers.py``).
"""
from __future__ import annotations

import inspect
import logging
import os
import re
from typing import Optional

import numpy as np

from ._child import PipeChild

logger = logging.getLogger(__name__)

__all__ = ["ONEDNN_ISA", "CPU_CONFIG",
           "onednn_isa_cap", "host_level", "compile_model", "conv_primitives", "why_not", "contrib_ops",
           "InProcessOpenVINO", "ChildOpenVINO", "OpenVINOError", "node_times"]

#: tvm-ext's int8 ISA class (:data:`tvm_ext.x86.isa.ISA_CLASSES`) -> the ``ONEDNN_MAX_CPU_ISA`` value
#: whose int8 kernels use the same instructions. ``avx2`` is plain AVX2: tvm-ext masks AVX-VNNI.
#: ``amx`` (and ``other``) have no entry: OpenVINO at the host's ISA is already the same-ISA peer.
ONEDNN_ISA = {
    "sse": "SSE41",
    "avx2": "AVX2",
    "avx512": "AVX512_CORE",
    "avx512_vnni": "AVX512_CORE_VNNI",
}

#: Int8 levels, lowest first: an ISA class of tvm-ext, or what a host's oneDNN dispatches to.
_LEVELS = ("other", "sse", "avx2", "avx2_vnni", "avx512", "avx512_vnni", "amx")


class OpenVINOError(RuntimeError):
    """OpenVINO could not run a model (the message says why)."""


def host_level(features) -> str:
    """The int8 level oneDNN dispatches to on a host with these LLVM feature names (one of ``_LEVELS``)."""
    f = set(features)
    if {"avx512f", "avx512bw"} <= f:
        if "avx512vnni" in f:
            return "amx" if {"amx-tile", "amx-int8"} <= f else "avx512_vnni"
        return "avx512"
    if "avx2" in f:
        return "avx2_vnni" if "avxvnni" in f else "avx2"
    if "sse4.1" in f:
        return "sse"
    return "other"


def onednn_isa_cap(ext_isa: str, features) -> Optional[str]:
    """``ONEDNN_MAX_CPU_ISA`` for OpenVINO at tvm-ext's instruction set, or None when none is needed.

    Parameters
    ----------
    ext_isa : str
        tvm-ext's int8 ISA class (:func:`tvm_ext.x86.isa.isa_class` of its target).
    features : iterable of str
        The host's LLVM feature names (:func:`tvm_ext.x86.isa.host_features`).

    Returns
    -------
    str or None
        The cap when the host's int8 level is above ``ext_isa`` (an AMX host and an AVX-512 VNNI
        build; an AVX-512 or AVX-VNNI host and an AVX2 build); None when they are the same level,
        when tvm-ext uses AMX, or when ``ext_isa`` has no oneDNN equivalent.
    """
    if ext_isa not in ONEDNN_ISA:
        return None
    if _LEVELS.index(host_level(features)) <= _LEVELS.index(ext_isa):
        return None
    return ONEDNN_ISA[ext_isa]


# --- self-contained: this source also runs in ChildOpenVINO's child process ------------------------
#: OpenVINO's CPU settings for every timing: one stream, latency hint, and float layers in float32. On a
#: CPU with bfloat16 instructions (AMX, AVX512-BF16) OpenVINO's default precision for float layers is
#: bfloat16: the float parts of an int8 model (dequantize, heads) would be computed in another arithmetic
#: than every other engine's, and under ``ONEDNN_MAX_CPU_ISA`` below those instructions (AVX2,
#: AVX512_CORE) OpenVINO 2026.4 fails to compile the model ("object is not initialized").
CPU_CONFIG = {"NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}


def compile_model(ov, path, threads):
    """OpenVINO's compiled model on CPU (``ov`` is the imported openvino module): ``threads`` inference
    threads and :data:`CPU_CONFIG`."""
    core = ov.Core()
    return core.compile_model(core.read_model(str(path)), "CPU", {"INFERENCE_NUM_THREADS": int(threads), **CPU_CONFIG})


def conv_primitives(compiled):
    """``{kernel name: count}`` of the compiled model's convolutions (its runtime model's layers)."""
    counts = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if "layerType" in info and info["layerType"].astype(str) == "Convolution":
            kind = info["primitiveType"].astype(str) if "primitiveType" in info else "?"
            counts[kind] = counts.get(kind, 0) + 1
    return counts


_SETUP = r"""
def setup(cfg):
    import numpy as np
    import openvino as ov
    compiled = compile_model(ov, cfg["path"], cfg["threads"])
    req = compiled.create_infer_request()
    name = cfg["input"]

    def run(x):
        req.infer({name: x})
        return np.array(req.get_output_tensor(0).data, copy=True)

    return {"file": ov.__file__, "conv_primitives": conv_primitives(compiled),
            "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA")}, run
"""


# --- engines ------------------------------------------------------------------------------------
_NO_RULE = re.compile(r"No conversion rule found for operations:\s*(.+)")


def why_not(err: Exception) -> str:
    """One line saying why OpenVINO cannot run a model, from the exception it raised.

    OpenVINO's frontend lists the operators it has no conversion for (a QOperator model's
    ``com.microsoft.QGemm``, ...); that list is the reason. Otherwise, the first line that names an error.
    """
    text = str(err)
    m = _NO_RULE.search(text)
    if m:
        ops = m.group(1).strip().rstrip(".")
        contrib = " (ONNX Runtime contrib ops)" if "com.microsoft." in ops else ""
        return f"not run: OpenVINO has no conversion for {ops}{contrib}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    named = [ln for ln in lines if "rror" in ln or "failed" in ln.lower()]
    return f"not run: OpenVINO failed on the model: {((named or lines or [type(err).__name__])[0])[:200]}"


def contrib_ops(path) -> list:
    """The model's operators from domains other than ONNX's own (``com.microsoft.QGemm``, ...), sorted."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    return sorted({f"{n.domain}.{n.op_type}" for n in m.graph.node if n.domain not in ("", "ai.onnx")})


def _refuse_contrib(ov, path) -> None:
    """Raise :class:`OpenVINOError` when the model has contrib ops (see the module note)."""
    contrib = contrib_ops(path)
    if not contrib:
        return
    try:
        ov.Core().read_model(str(path))  # conversion happens here: it names the ops it cannot convert
    except Exception as err:
        raise OpenVINOError(why_not(err)) from None
    names = ", ".join(c.rsplit(".", 1)[1] for c in contrib)
    raise OpenVINOError(f"not run: ONNX Runtime contrib ops ({names}); OpenVINO converts them, but its "
                        "conversions are not trusted (a QLinearAdd of two convolutions came out wrong)")


class InProcessOpenVINO:
    """OpenVINO in this process, at the host's instruction set. Raises :class:`OpenVINOError` with
    :func:`why_not`'s line when OpenVINO is missing or cannot read or compile the model."""

    def __init__(self, path, input_name: str, threads: int):
        try:
            import openvino as ov
        except ImportError:
            raise OpenVINOError("not run: OpenVINO is not installed (pip install 'tvm-ext[bench]')") from None
        _refuse_contrib(ov, path)
        try:
            compiled = compile_model(ov, path, threads)
        except Exception as err:
            raise OpenVINOError(why_not(err)) from None
        self._req = compiled.create_infer_request()
        self._input = input_name
        self.conv_primitives = conv_primitives(compiled)
        self.pid = None

    def run(self, x):
        self._req.infer({self._input: x})
        return np.array(self._req.get_output_tensor(0).data, copy=True)


class ChildOpenVINO(PipeChild):
    """OpenVINO in a child process whose oneDNN is capped at ``isa`` (``ONEDNN_MAX_CPU_ISA``).

    ``run(x)``, ``time(x, n)`` (measured in the child), ``pid``, ``conv_primitives`` (the kernels
    the capped OpenVINO chose: check them, a cap oneDNN does not know is ignored). Raises
    :class:`OpenVINOError` when the child cannot load the model.
    """

    def __init__(self, path, input_name: str, threads: int, isa: str):
        env = dict(os.environ, ONEDNN_MAX_CPU_ISA=isa)
        prelude = (f"import os\nCPU_CONFIG = {CPU_CONFIG!r}\n" + inspect.getsource(compile_model)
                   + inspect.getsource(conv_primitives) + _SETUP)
        super().__init__(prelude, {"path": str(path), "input": input_name, "threads": int(threads)},
                         env=env, error=OpenVINOError, what=f"OpenVINO @ {isa}")
        self.isa = isa
        self.conv_primitives = self.info["conv_primitives"]


def node_times(path, threads, conv_names, runs=40, stat=None):
    """``({ONNX conv node: median ms}, {ONNX conv node: OpenVINO kernel}, None)`` from OpenVINO's
    performance counters (first 5 runs dropped), or ``(None, None, reason)`` where OpenVINO does not
    run the model: not installed, ONNX Runtime contrib ops (``tvm-ext bench`` does not trust their
    conversion either), or a conversion error.

    A kernel of OpenVINO's runtime model lists the ONNX nodes it computes (``originalLayersNames``:
    the conv, its requantize, ..., by node name or by output name); its time goes to the conv among them.
    """
    import collections

    try:
        import openvino as ov
    except ImportError:
        return None, None, "not run: OpenVINO is not installed (pip install 'tvm-ext[bench]')"
    contrib = contrib_ops(path)
    if contrib:
        return None, None, f"not run: ONNX Runtime contrib ops ({', '.join(c.rsplit('.', 1)[1] for c in contrib)})"
    try:
        core = ov.Core()
        compiled = core.compile_model(core.read_model(str(path)), "CPU", {
            "INFERENCE_NUM_THREADS": int(threads), **CPU_CONFIG, "PERF_COUNT": True})
    except Exception as err:  # noqa: BLE001 (OpenVINO raises plain RuntimeErrors; why_not reads them)
        return None, None, why_not(err)
    import onnx

    # OpenVINO names a layer after its ONNX node, or after the node's output where it renamed it
    alias = {}
    for n in onnx.load(str(path), load_external_data=False).graph.node:
        if n.name in conv_names:
            alias[n.name] = alias[n.output[0]] = n.name
    owner, kernel = {}, {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if "originalLayersNames" not in info:
            continue
        convs = [alias[n] for n in info["originalLayersNames"].astype(str).split(",") if n in alias]
        if convs:
            owner[op.get_friendly_name()] = convs[0]
            kernel[convs[0]] = info["primitiveType"].astype(str) if "primitiveType" in info else "?"
    req = compiled.create_infer_request()
    inp = compiled.input(0)
    x = np.random.default_rng(0).uniform(-1, 1, [d if d > 0 else 1 for d in inp.get_partial_shape().get_min_shape()])
    per = collections.defaultdict(list)
    for i in range(runs):
        req.infer({0: x.astype(np.float32)})
        if i < 5:
            continue
        for e in req.get_profiling_info():
            if e.node_name in owner:
                per[owner[e.node_name]].append(e.real_time.total_seconds() * 1e3)
    return {n: float((stat or np.median)(v)) for n, v in per.items()}, kernel, None
