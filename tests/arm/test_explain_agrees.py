"""At aarch64 targets, ``explain`` and ``report`` describe the module the build actually makes.

Compiled only (no aarch64 code runs here). The built module's graph JSON is the ground truth: its
``tvm_op`` nodes are the kernels, and a kernel output read by another kernel is a crossing tensor.
``KernelReport`` (what ``tvm-ext report`` prints) is read off that JSON; ``tvm_ext.explain`` replays
FuseOps without generating code. Both must give the JSON's kernels, names and crossing bytes per dtype,
with and without tvm-ext's int8 pipeline (which enters the ARM kernel policy at these targets).
"""
import collections
import json

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.target import codegen

import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.testing.aarch64 import TARGETS

pytestmark = pytest.mark.skipif("aarch64" not in list(codegen.llvm_get_targets()),
                                reason="this TVM's LLVM has no AArch64 back end")


def _qconv(x, rng, channels_in, channels_out, in_zp):
    """qnn.conv2d (uint8 x int8, 3x3) + bias + requantize to uint8: one quantized layer."""
    w = relay.const(rng.integers(-127, 128, (channels_out, channels_in, 3, 3)).astype("int8"))
    y = relay.qnn.op.conv2d(x, w, relay.const(in_zp), relay.const(0), relay.const(0.02), relay.const(0.01),
                            kernel_size=(3, 3), channels=channels_out, padding=(1, 1), out_dtype="int32")
    y = relay.nn.bias_add(y, relay.const(rng.integers(-1000, 1000, channels_out).astype("int32")))
    return relay.qnn.op.requantize(y, relay.const(0.0002), relay.const(0), relay.const(0.05), relay.const(3),
                                   out_dtype="uint8")


def small_quantized_net():
    """A quantized stem and a residual block, the shapes the ARM policy handles::

        x f32 (1,3,32,32) -> quantize u8 -> conv 3->16 (stem: channels padded to 4)
            -> conv 16->16 -> conv 16->16 -> add(stem out) -> dequantize f32
    """
    rng = np.random.default_rng(0)
    x = relay.var("x", shape=(1, 3, 32, 32), dtype="float32")
    q = relay.qnn.op.quantize(x, relay.const(0.02), relay.const(3), out_dtype="uint8")
    stem = _qconv(q, rng, 3, 16, 3)
    y = _qconv(_qconv(stem, rng, 16, 16, 3), rng, 16, 16, 3)
    s = relay.qnn.op.add(y, stem, relay.const(0.05), relay.const(3), relay.const(0.05), relay.const(3),
                         relay.const(0.05), relay.const(3))
    out = relay.qnn.op.dequantize(s, relay.const(0.05), relay.const(3))
    return tvm.IRModule.from_expr(relay.Function([x], out))


def _graph_json_truth(factory):
    """(kernel func names in graph order, crossing bytes per dtype) read straight off the graph JSON."""
    graph = json.loads(factory.get_graph_json())
    nodes, row_ptr = graph["nodes"], graph["node_row_ptr"]
    shapes, dtypes = graph["attrs"]["shape"][1], graph["attrs"]["dltype"][1]
    read = {(src, idx) for n in nodes if n["op"] == "tvm_op" for src, idx, *_ in n["inputs"]}
    names, crossing = [], collections.Counter()
    for nid, node in enumerate(nodes):
        if node["op"] != "tvm_op":
            continue
        names.append(node["attrs"]["func_name"])
        for i in range(row_ptr[nid + 1] - row_ptr[nid]):
            if (nid, i) in read:
                e = row_ptr[nid] + i
                crossing[dtypes[e]] += int(np.prod(shapes[e])) * tvm.DataType(dtypes[e]).bits // 8
    return names, dict(crossing)


def _check_agree(mod, target, params, passes):
    factory = tvm_ext.build(mod, target=target, params=params, passes=passes)
    names, crossing = _graph_json_truth(factory)
    report = factory.kernel_report
    ex = tvm_ext.explain(mod, target, params, passes=passes)
    assert ex.verified is True, ex.verify_note
    assert report.num_kernels == ex.num_kernels == len(names)
    assert [k.func_name for k in report.kernels] == [k.func_name for k in ex.kernels] == names
    explained = collections.Counter()
    for b in ex.boundaries:
        explained[b.dtype] += b.nbytes
    assert dict(report.crossing.nbytes) == dict(explained) == crossing
    return report


# Slow: stock TVM at NEON only (its int16 legalization) and the int8 pipeline at the other classes;
# [neoverse-v1-int8] checks explain and report against the built module in the default tier
@pytest.mark.parametrize("cpu, pipeline", [("neoverse-v1", "int8"),
                                           pytest.param("cortex-a72", "none", marks=pytest.mark.slow),
                                           pytest.param("cortex-a72", "int8", marks=pytest.mark.slow),
                                           pytest.param("neoverse-n1", "int8", marks=pytest.mark.slow)])
def test_small_quantized_net_agrees_with_the_built_module(cpu, pipeline):
    """tvm-ext's int8 pipeline at each class, and stock TVM at NEON only (its int16 legalization)."""
    passes = pipelines.int8() if pipeline == "int8" else ()
    report = _check_agree(small_quantized_net(), TARGETS[cpu], {}, passes)
    if pipeline == "int8":  # the ARM policy's 8-bit path: nothing wider than 8 bits between the int8 kernels
        assert set(report.crossing.nbytes) <= {"int8", "uint8"}, report.crossing.nbytes


@pytest.mark.slow  # a small zoo ResNet built and replayed per target: one to three minutes each on 2 cores
@pytest.mark.parametrize("cpu", sorted(TARGETS))
def test_small_zoo_resnet_agrees_with_the_built_module(cpu):
    """ONNX Runtime's QOperator ResNet (small) with the int8 pipeline: the kernels explain and report
    give are the built module's, and only 8-bit tensors cross."""
    m = tvm_ext.tools.zoo.load("resnet50_int8_qoperator", small=True)
    report = _check_agree(m.mod, TARGETS[cpu], m.params, pipelines.int8())
    assert set(report.crossing.nbytes) <= {"int8", "uint8"}, report.crossing.nbytes
