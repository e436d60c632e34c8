"""tvm_ext.pipelines.int8 on the small zoo models: kernel floor, narrow boundaries, numerics."""
import numpy as np
import tvm
from tvm import relay

import tvm_ext
import tvm_ext.zoo
from tvm_ext import pipelines
from tvm_ext.testing import run_module

TARGET = tvm_ext.host_target()


def test_pipeline_shape_and_names():
    pipe = pipelines.int8()
    names = pipe.pass_names()
    assert names["start"] == ["UniformZeroPointsToScalar", "QDQToInteger", "NonNegativeConvInputToUint8",
                              "PadChannelsAtProducer"]
    assert names["before_fuse"][0] == "RemoveStopFusion" and "FoldPadIntoConv" in names["before_fuse"]
    assert set(pipe) == {"start", "before_fuse"}
    assert all(isinstance(p, tvm.transform.Pass) for stage in pipe.values() for p in stage)


def _build_both(name):
    m = tvm_ext.zoo.load(name, small=True)
    with tvm.transform.PassContext(opt_level=3):
        stock = relay.build(tvm_ext.copy_module(m.mod), target=TARGET, params=m.params)
    ext = tvm_ext.build(m.mod, TARGET, m.params, passes=pipelines.int8())
    xs = [np.random.default_rng(1000 + s).standard_normal(m.input_shape).astype("float32") for s in range(3)]
    outs = [(run_module(stock, {m.input_name: x})[0], run_module(ext, {m.input_name: x})[0]) for x in xs]
    return m, tvm_ext.KernelReport.from_factory(stock), ext.kernel_report, outs


def test_qoperator_floor_narrow_and_bit_exact():
    _, stock, ext, outs = _build_both("resnet50_int8_qoperator")
    assert ext.num_anchor_kernels == stock.num_anchor_kernels
    assert ext.num_kernels <= ext.num_anchor_kernels + 2 < stock.num_kernels
    assert set(ext.crossing.nbytes) <= {"uint8", "int8"}, ext.crossing.nbytes
    for a, b in outs:
        np.testing.assert_array_equal(a, b)


def test_qdq_floor_and_narrow():
    _, stock, ext, outs = _build_both("resnet50_int8_qdq")
    assert "float32" in stock.crossing.nbytes
    assert ext.num_kernels <= ext.num_anchor_kernels + 2
    assert set(ext.crossing.nbytes) <= {"uint8", "int8"}, ext.crossing.nbytes
    for a, b in outs:
        assert a.argmax() == b.argmax()


def test_relay_quantize_fewer_kernels_and_bytes():
    _, stock, ext, _ = _build_both("resnet50_int8_relay")
    assert ext.num_anchor_kernels == stock.num_anchor_kernels
    assert ext.num_kernels < stock.num_kernels / 2
    assert ext.crossing.total_bytes < stock.crossing.total_bytes / 2
    assert not [k for k in ext.kernels if sum(op.startswith(("nn.conv2d", "nn.contrib_conv2d", "nn.dense"))
                                               for op in k.ops) > 1], "two anchors in one kernel"
