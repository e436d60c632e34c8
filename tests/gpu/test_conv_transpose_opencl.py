"""``DequantizeInConvTranspose`` at ``opencl``: the dequantize in front of a transposed conv, the conv and
the quantize after it in one kernel. TVM's GPU schedule (``topi/cuda/conv2d_transpose.py``) inlines
what follows the conv; the GPU back end's version (:mod:`tvm_ext.gpu.schedules`) also inlines the
dequantize into the dilated input it loads into shared memory. Built and run on PoCL against a plain
``llvm`` build of the graph without the pass (bit for bit: power-of-two scales and weights in quarters
make every float sum exact in any order). Running skips with the reason when the OpenCL set-up is
missing."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.gpu import exact_float, opencl
from tvm_ext.passes import DequantizeInConvTranspose
from _opencl_cases import device_or_skip, run_graph

RNG = np.random.default_rng(21)
W1 = (RNG.integers(-4, 5, (8, 8, 2, 2)) * 0.25).astype("float32")
W2 = (RNG.integers(-4, 5, (8, 1, 2, 2)) * 0.25).astype("float32")


@pytest.fixture(autouse=True, scope="module")
def _opencl_runtime():
    """Loaded before the builds when present, so that they hand back runnable modules (compile-only without)."""
    opencl.load_runtime()


def _dq(n, zp, scale):
    return relay.multiply(relay.cast(relay.subtract(relay.cast(n, "int32"), relay.const(zp)), "float32"),
                          relay.const(scale))


def _q(v, scale, zp):
    return relay.clip(relay.add(relay.round(relay.divide(v, relay.const(scale))), relay.const(float(zp))), 0.0, 255.0)


def _convt(v, w):
    return relay.nn.conv2d_transpose(v, relay.const(w), channels=w.shape[1], kernel_size=(2, 2), strides=(2, 2))


def db_head():
    """A DB head's upsampling as ONNX Runtime's QOperator graph leaves it::

        x(u8) -> dequantize -> conv2d_transpose -> quantize -> dequantize -> relu
              -> conv2d_transpose -> quantize -> cast u8
    """
    x = relay.var("x", shape=(1, 8, 6, 6), dtype="uint8")
    y1 = _q(_convt(_dq(x, 128, 0.0625), W1), 0.125, 120)
    y2 = _q(_convt(relay.nn.relu(_dq(relay.cast(y1, "int32"), 120, 0.125)), W2), 0.25, 100)
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.cast(y2, "uint8")))
    return mod, {"x": RNG.integers(0, 256, (1, 8, 6, 6)).astype("uint8")}


@pytest.mark.parametrize("how", ["by_hand", "int8_pipeline"])
def test_db_head_one_kernel_per_transposed_conv_at_opencl(how):
    mod, inputs = db_head()
    passes = [DequantizeInConvTranspose()] if how == "by_hand" else pipelines.int8()
    built = tvm_ext.build(mod, target="opencl", passes=passes)
    stock = tvm_ext.build(mod, target="opencl").kernel_report
    report = built.kernel_report
    assert [k.anchor for k in report.kernels] == ["nn.conv2d_transpose"] * 2
    assert report.num_kernels < stock.num_kernels
    assert report.float_crossings() == [] and stock.float_crossings() != []
    assert report.crossing.nbytes == {"uint8": 8 * 12 * 12}
    dev = device_or_skip()
    ref = run_graph(tvm_ext.build(mod, target="llvm"), tvm.cpu(), inputs)
    got = run_graph(built, dev, inputs)
    assert len(np.unique(ref[0])) > 20
    np.testing.assert_array_equal(got[0], ref[0])


def test_gpu_schedule_leaves_stock_transposed_convs_alone():
    """A transposed conv FuseOps makes by itself (nothing fused in front) gets TVM's schedule: the OpenCL
    source equals relay.build's."""
    x = relay.var("x", shape=(1, 8, 6, 6), dtype="float32")
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.nn.relu(_convt(x, W1))))

    def source(lib):
        return next(m.get_source() for m in opencl._walk(lib.lib) if m.type_key == "opencl")

    ours = tvm_ext.build(mod, target="opencl")
    # stock with the back end's float exactness (exact constants, the pragma), which every kernel gets
    with exact_float.fp_contract_off(), tvm.transform.PassContext(opt_level=3, config=exact_float.lower_config()):
        stock = relay.build(mod, target=tvm.target.Target("opencl", host="llvm"))
    assert source(ours) == source(stock)
