"""Kernel names (``_naming``): each kernel carries the name the built module gives it, TVM 0.19's
naming replayed without compiling and checked against a real build."""
import json

import numpy as np
import pytest
from tvm import relay

import tvm_ext
from tvm_ext.core.explain import explain

from _explain_graphs import mod_of


def named_kernels():
    """Kernels whose names exercise TVM's naming: a reshape-only kernel (the graph executor's
    ``__nop``), two structurally equal kernels (one name), two of equal ops and other shapes
    (``_1``), and a name over 80 characters (truncated, with libstdc++'s hash)."""
    x, z, y = relay.var("x", shape=(2, 16)), relay.var("z", shape=(2, 16)), relay.var("y", shape=(4, 4))
    w = relay.const(np.ones((8, 16), "float32"))
    a = relay.reshape(relay.nn.dense(x, w), (16,))
    b = relay.tanh(relay.nn.dense(z, w))
    c = relay.tanh(relay.nn.dense(relay.sigmoid(x), w))
    d = relay.tanh(relay.nn.dense(y, relay.const(np.ones((8, 4), "float32"))))
    e = y
    for i in range(14):  # cheap element-wise ops: nested tanh/sigmoid take TVM's simplifier most of a minute
        e = relay.abs(e) if i % 2 else relay.negative(e)
    return mod_of(relay.Tuple([a, b, c, d, e]))


def test_kernel_names_are_the_built_modules():
    ex = explain(named_kernels(), mod_name="m1", compile=True, disabled_pass=["AlterOpLayout"])
    assert ex.verified is True, ex.verify_note
    built = [k.func_name for k in ex.kernel_report.kernels]
    assert [k.func_name for k in ex.kernels] == built  # names, count and order
    names = [k.name for k in ex.kernels]
    assert names.count("tvmgen_m1_fused_nn_dense_tanh") == 2 and "tvmgen_m1_fused_nn_dense_tanh_1" in names
    (nop,) = [k for k in ex.kernels if k.reshape_only]
    assert nop.name == "tvmgen_m1_fused_reshape" and nop.func_name == "__nop"
    (long,) = [k for k in ex.kernels if len(k.ops) == 14]
    assert len(long.name) > 80 and long.name.endswith("_") and long.name.startswith("tvmgen_m1_fused_negative_abs_")
    # the text, the JSON and the HTML page carry them
    d = json.loads(ex.to_json())
    assert [k["name"] for k in d["kernels"]] == names and [k["func_name"] for k in d["kernels"]] == built
    page, text = ex.to_html(), ex.table()
    assert all(n in page and n in text for n in names) and "tvmgen_m1_fused_reshape (graph executor: __nop)" in text


@pytest.mark.slow  # a small zoo ResNet built and replayed: minutes on 2 cores
def test_kernel_names_of_a_zoo_model_match_the_kernel_report():
    """ONNX Runtime's QOperator ResNet (small) at the host target: names (hash-truncated and _N ones
    included) and count equal the kernel report's, kernel for kernel."""
    m = tvm_ext.tools.zoo.load("resnet50_int8_qoperator", small=True)
    ex = explain(m.mod, params=m.params, compile=True)
    assert ex.verified is True, ex.verify_note
    report = ex.kernel_report
    assert ex.num_kernels == report.num_kernels
    assert [k.func_name for k in ex.kernels] == [k.func_name for k in report.kernels]
    assert all(sorted(a.ops) == sorted(b.ops) for a, b in zip(ex.kernels, report.kernels))
    names = {k.name for k in ex.kernels}
    assert any(n.endswith("_") for n in names) and any(n.rsplit("_", 1)[-1].isdigit() for n in names)
    assert ex.kernels[0].name.startswith("tvmgen_default_fused_") and "layout_transform" in ex.kernels[0].name
