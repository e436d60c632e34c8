"""The peers tvm-ext is compared with: which ONNX Runtime (host or AVX-512 masked) and whether OpenVINO
also runs capped at tvm-ext's instruction set, and the OpenVINO engines themselves."""
from __future__ import annotations

import logging
from typing import Optional

from ._measure import Engine

logger = logging.getLogger(__name__)


def _openvino_engines(path, input_name, threads, cap: Optional[str], pipelines: dict) -> list:
    """OpenVINO at the host's ISA (this process) and, with ``cap``, capped at it (a child process).

    Writes what each one is (kernels chosen, the cap) or why it did not run into ``pipelines``.
    """
    from ..openvino_peer import ChildOpenVINO, InProcessOpenVINO, OpenVINOError

    try:
        host = InProcessOpenVINO(path, input_name, threads)
    except OpenVINOError as err:
        pipelines["openvino"] = {"skipped": str(err)}
        if cap:
            pipelines["openvino_isa"] = {"skipped": str(err), "onednn_max_cpu_isa": cap}
        return []
    pipelines["openvino"] = {"conv_primitives": host.conv_primitives}
    engines = [Engine("openvino", host.run)]
    if cap:
        try:
            child = ChildOpenVINO(path, input_name, threads, cap)
        except OpenVINOError as err:
            pipelines["openvino_isa"] = {"error": str(err), "onednn_max_cpu_isa": cap}
            return engines
        pipelines["openvino_isa"] = {"onednn_max_cpu_isa": cap, "conv_primitives": child.conv_primitives}
        if child.conv_primitives == host.conv_primitives:
            logger.warning("OpenVINO under ONEDNN_MAX_CPU_ISA=%s chose the same convolution kernels as without "
                           "it (%s): the cap had no effect", cap, child.conv_primitives)
        engines.append(Engine("openvino_isa", child.run, timer=child.time, close=child.close, pid=child.pid))
    return engines


def openvino_peer(ext_target) -> dict:
    """Whether the benchmark also runs OpenVINO capped at tvm-ext's instruction set, and why.

    Returns ``{"cap", "note"}``: ``cap`` is the ``ONEDNN_MAX_CPU_ISA`` value
    (:func:`tvm_ext.tools.openvino_peer.onednn_isa_cap` of tvm-ext's ISA class and the host's
    features) or None.
    """
    from ...x86 import isa
    from ..openvino_peer import host_level, onednn_isa_cap

    ext_isa, feats = isa.isa_class(ext_target), isa.host_features()
    cap = onednn_isa_cap(ext_isa, feats)
    if cap:
        note = (f"host's int8 level {host_level(feats)} is above tvm-ext's {ext_isa}: OpenVINO also runs "
                f"with ONEDNN_MAX_CPU_ISA={cap}, in a child process")
    else:
        note = (f"host's int8 level {host_level(feats)}, tvm-ext's {ext_isa}: OpenVINO at the host's ISA "
                "is the same-ISA peer")
    return {"cap": cap, "note": note}


def ort_peer(ext_target, ort_isa: str = "auto") -> dict:
    """Which ONNX Runtime the benchmark compares with, for tvm-ext's target.

    ``"host"``: the installed one, whose kernels follow the host's CPUID. ``"auto"``: the same,
    except when the target is AVX2 class and the host has AVX-512: then a copy whose AVX-512
    dispatch is masked (:func:`tvm_ext.tools.ort_isa.masked_package`), run in a child process, so that
    both sides run AVX2 code. Returns ``{"isa", "package", "exact", "note"}`` for the results'
    environment; when masking is impossible here, the installed ORT with the reason in ``note``.
    ``exact`` is true where tvm-ext's int8 convs take the exact path of an ISA without VNNI
    (:data:`tvm_ext.x86.pair_pack.SATURATING_CLASSES`): ONNX Runtime is then also timed on its own exact
    int8 path (``session.x64quantprecision``), the peer that computes what tvm-ext computes.
    """
    from ...x86 import isa
    from ...x86.pair_pack import SATURATING_CLASSES
    from ..ort_isa import ORT_ISA_CHOICES, OrtIsaError, masked_package

    if ort_isa not in ORT_ISA_CHOICES:
        raise ValueError(f"ort_isa must be one of {ORT_ISA_CHOICES}, not {ort_isa!r}")
    exact = isa.isa_class(ext_target) in SATURATING_CLASSES
    also = ("; also timed on its exact int8 path (session.x64quantprecision), as tvm-ext's convs are exact "
            "without VNNI" if exact else "")
    host = {"isa": "host", "package": None, "exact": exact,
            "note": "ONNX Runtime's kernels follow the host's CPUID" + also}
    if ort_isa == "host" or isa.isa_class(ext_target) != "avx2" or "avx512f" not in isa.host_features():
        return host
    try:
        pkg = masked_package()
    except OrtIsaError as err:
        logger.warning("ONNX Runtime will run its AVX-512 kernels against AVX2 TVM code: %s", err)
        return {**host, "note": f"{host['note']}; AVX-512 could not be masked: {err}"}
    return {"isa": "avx2", "package": str(pkg), "exact": exact,
            "note": "AVX-512 dispatch masked (xgetbv reports no AVX-512 state; probe: int16-saturating "
                    "vpmaddubsw kernels), run in a child process: tvm_ext.tools.ort_isa" + also}
