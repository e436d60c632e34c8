"""PP-OCR's text detector (det v4, QDQ, full size) built with ``pipelines.int8()`` at ``opencl`` and
run on an OpenCL device (PoCL, ``make gpu-env``), against a plain ``llvm`` build (generic x86-64, no
int8 SIMD) of the module the pipeline handed to ``relay.build`` at ``opencl``
(``lib.tvm_ext_module``), on the same seeded synthetic image (seed 3: text-like rectangles the
detector finds; seeds 0-2 give an all-zero map). Slow (two detector builds, then PoCL
compiling every kernel); skips with the reason when the set-up or the cached model is missing.
Measured: docs/gpu.md, "Measured"."""
from __future__ import annotations

import numpy as np
import pytest
import tvm

import tvm_ext
from tvm_ext.core import pipelines
from _opencl_cases import device_or_skip, run_graph

pytestmark = pytest.mark.slow


def test_full_size_ppocr_detector_equal_llvm():
    """The probability map (the DB head's sigmoid, 8-bit levels dequantized) bit for bit."""
    from tvm_ext.tools import zoo

    dev = device_or_skip()
    try:
        m = zoo.load("ppocr_det_v4_int8_qdq")
    except Exception as exc:  # noqa: BLE001 - a missing cache / network names itself
        pytest.skip(f"ppocr_det_v4_int8_qdq not available: {exc}")
    inputs = {m.input_name: zoo.sample_input(m, seed=3)}
    built = tvm_ext.build(m.mod, target="opencl", params=m.params, passes=pipelines.int8())
    got = run_graph(built, dev, inputs)
    ref = run_graph(tvm_ext.build(built.tvm_ext_module, target="llvm"), tvm.cpu(), inputs)
    assert [(r.shape, r.dtype) for r in ref] == [(g.shape, g.dtype) for g in got]
    assert len(np.unique(ref[0])) > 5 and (ref[0] > 0).mean() > 0.01, "the reference map is (nearly) constant"
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)
