"""KernelReport arithmetic on graphs whose kernels and crossing bytes are computed by hand."""
import json

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.core.report import KernelReport, anchor_of, dtype_bytes

TARGET = tvm_ext.host_target()


def two_anchor_graph():
    """Three kernels, by hand::

        x f32(1,16) -> [K0 dense] -> f32(1,32) ---------------- crossing: float32, 128 B
                    -> [K1 softmax, multiply, cast i8] -> i8(1,32) crossing: int8, 32 B
                    -> [K2 sum(axis=1)] -> i8(1,)                 graph output, 1 B
    """
    x = relay.var("x", shape=(1, 16))
    w1 = relay.const(np.ones((32, 16), "float32"))
    d1 = relay.nn.dense(x, w1)
    s = relay.cast(relay.multiply(relay.nn.softmax(d1), relay.const(100.0)), "int8")
    d2 = relay.sum(s, axis=1)
    return tvm.IRModule.from_expr(relay.Function([x], d2))


@pytest.mark.parametrize("opt_level", [2, 3])
def test_bytes_by_dtype_by_hand(opt_level):
    fac = tvm_ext.build(two_anchor_graph(), TARGET, opt_level=opt_level)
    rep = fac.kernel_report
    graph = json.loads(fac.get_graph_json())
    assert rep.num_kernels == sum(n["op"] == "tvm_op" for n in graph["nodes"])
    # opt_level 3 may add weight layout_transforms, but they are folded into constants
    assert rep.num_kernels == 3
    assert rep.num_anchor_kernels == 3
    anchors = [k.anchor for k in rep.kernels]
    assert anchors[1] == "nn.softmax" and "dense" in anchors[0] and anchors[2] == "sum"
    assert rep.crossing.count == {"float32": 1, "int8": 1}
    assert rep.crossing.nbytes == {"float32": 32 * 4, "int8": 32}
    assert rep.crossing.total_bytes == 160
    assert rep.inputs.nbytes == {"float32": 64}
    assert rep.outputs.nbytes == {"int8": 1}
    d = rep.to_dict()
    assert d["num_kernels"] == 3 and d["crossing"]["bytes"] == {"float32": 128, "int8": 32}
    assert json.loads(json.dumps(d)) == d
    table = rep.table()
    assert "3 kernels (3 with an anchor)" in table and "nn.softmax" in table


def test_tensor_read_twice_counts_once():
    """One kernel output read by two kernels crosses once."""
    x = relay.var("x", shape=(1, 64))
    d = relay.nn.dense(x, relay.const(np.ones((64, 64), "float32")))
    a = relay.nn.softmax(d)
    b = relay.nn.dense(d, relay.const(np.ones((4, 64), "float32")))
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.Tuple([a, b])))
    rep = tvm_ext.build(mod, TARGET).kernel_report
    assert rep.num_kernels == 3
    assert rep.crossing.count == {"float32": 1}
    assert rep.crossing.nbytes == {"float32": 256}
    assert rep.outputs.count == {"float32": 2}


def test_elementwise_only_kernel_has_no_anchor():
    x = relay.var("x", shape=(4, 4), dtype="int32")
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.cast(relay.add(x, relay.const(1)), "int8")))
    rep = tvm_ext.build(mod, TARGET).kernel_report
    assert rep.num_kernels == 1 and rep.num_anchor_kernels == 0
    assert rep.kernels[0].ops == ("add", "cast") and rep.kernels[0].anchor is None
    assert rep.crossing.total_count == 0


def test_from_graph_json_without_metadata():
    fac = tvm_ext.build(two_anchor_graph(), TARGET)
    rep = KernelReport.from_graph_json(fac.get_graph_json())
    assert rep.num_kernels == 3
    assert rep.crossing.total_bytes == 160


def test_helpers():
    assert dtype_bytes("int8") == 1 and dtype_bytes("float32") == 4 and dtype_bytes("bool") == 1
    assert dtype_bytes("int4") == 1 and dtype_bytes("float16") == 2 and dtype_bytes("int8x4") == 4
    assert anchor_of(["cast", "nn.conv2d", "add"]) == "nn.conv2d"
    assert anchor_of(["cast", "add", "nn.relu"]) is None
    assert anchor_of(["nn.max_pool2d"]) == "nn.max_pool2d"
