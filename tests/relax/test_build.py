"""tvm_ext.relax.build on a real model: the small zoo ResNet-50 through the Relax ONNX frontend."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_ext.relax as tr
from tvm_ext.tools import zoo
from tvm_ext.patterns import GENERIC


@pytest.mark.parametrize("tables", [False, True], ids=["stock", "generic"])
def test_small_resnet_matches_onnxruntime(tables):
    ort = pytest.importorskip("onnxruntime")
    path = zoo.onnx_path("resnet50_fp32", small=True)
    x = zoo.sample_input("resnet50_fp32", small=True)
    mod = tr.from_onnx(path)
    text = mod.script()
    passes = [tr.FuseByPattern(GENERIC)] if tables else []
    ex = tr.build(mod, passes=passes)
    assert mod.script() == text  # the caller's module is not modified
    rep = ex.kernel_report
    # one kernel per anchor: 17 conv, max pool, global average pool, dense
    assert rep.num_kernels == rep.num_anchor_kernels == 20
    if tables:
        assert passes[0].last_counts == {"generic.conv2d_bias": 4, "generic.conv2d_bias_add_relu": 4,
                                          "generic.conv2d_bias_relu": 9, "generic.dense_bias": 1}
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.nd.array(x)).numpy()
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
