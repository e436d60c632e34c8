"""Full-size zoo models built with ``pipelines.int8()`` at ``opencl`` and run on an OpenCL device
(PoCL, set up by ``make gpu-env``), against a plain ``llvm`` build (generic x86-64, no int8 SIMD)
of the same graph: the module the pipeline handed to ``relay.build`` at ``opencl``
(``lib.tvm_ext_module``), built without passes. Same seeded input. The float arithmetic the
``int8()`` graphs keep inside kernels (the input's quantize, the residual adds, the classifier's
hard-swish) is computed as TIR states it at both (:mod:`tvm_ext.gpu.exact_float`), so the integer
graphs' outputs are equal bit for bit. Slow (each build takes minutes); skips with the reason when the
set-up is missing. Measured: docs/gpu.md, "Measured"."""
from __future__ import annotations

import numpy as np
import pytest
import tvm

import tvm_ext
from tvm_ext.core import pipelines
from _opencl_cases import device_or_skip, run_graph

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def device():
    return device_or_skip()


def _both(name):
    """(llvm outputs, opencl outputs) of the full-size zoo model ``name`` built with ``int8()`` at
    ``opencl``. ``int8()`` at ``llvm`` makes another graph (the x86 family's ``QDQToInteger`` keeps
    the convs that x86 would pad in float), so the reference builds the graph handed over at ``opencl``."""
    from tvm_ext.tools import zoo

    m = zoo.load(name)
    inputs = {m.input_name: zoo.sample_input(m, seed=0)}
    built = tvm_ext.build(m.mod, target="opencl", params=m.params, passes=pipelines.int8())
    got = run_graph(built, tvm.opencl(0), inputs)
    ref = run_graph(tvm_ext.build(built.tvm_ext_module, target="llvm"), tvm.cpu(), inputs)
    assert len(got) == len(ref) and all(g.shape == r.shape and g.dtype == r.dtype for g, r in zip(got, ref))
    return ref, got


@pytest.mark.parametrize("name", ["resnet50_int8_qdq", "resnet50_int8_qoperator"])
def test_full_size_int8_resnet_logits_equal_llvm(device, name):
    (ref,), (got,) = _both(name)
    assert len(np.unique(ref)) > 1, "the reference output is constant"
    np.testing.assert_array_equal(got, ref)


def test_full_size_relay_quantized_resnet_within_tolerance(device):
    """relay.quantize's ResNet-50 keeps float residual adds and ends in a float softmax."""
    (ref,), (got,) = _both("resnet50_int8_relay")
    assert len(np.unique(ref)) > 1
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_full_size_ppocr_classifier_equal_llvm(device):
    """PP-OCR's text-direction classifier (QDQ): two probabilities, quantized to 8 bits. Its graph
    also computes in float inside kernels (the residual adds, the hard-swish and squeeze-excite
    chains)."""
    (ref,), (got,) = _both("ppocr_cls_v2_int8_qdq")
    assert len(np.unique(ref)) > 1
    np.testing.assert_array_equal(got, ref)


def test_full_size_yolov8n_qdq_within_tolerance(device):
    """YOLOv8n (QDQ) at 320x320: its C2f shortcut adds join the convs' kernels at ``opencl`` (the GPU-only
    ``AnchoredArgumentFirst``). Its head computes in float (the DFL softmax and box decoding, the class
    sigmoid), whose ``exp`` the OpenCL compiler and LLVM round differently in the last bit (a few
    percent of the class scores are one float32 step apart): boxes and class scores compare within a
    float tolerance."""
    (ref,), (got,) = _both("yolov8n_int8_qdq")
    assert len(np.unique(ref)) > 100, "the reference output is nearly constant"
    np.testing.assert_allclose(got[:, 4:], ref[:, 4:], rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(got[:, :4], ref[:, :4], rtol=1e-5, atol=1e-4)
