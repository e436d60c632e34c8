"""A global pool's group that takes the flatten and the quantize behind it (``FuseWideningIntoPool``) at
``opencl``: TVM's GPU pool schedule inlines the movement and the quantize after the pool, the GPU back
end's schedules the widening in front of it. A group that already ends on 8 bits takes the flatten
behind it, so no reshape-only ``__nop`` kernel is left between the pool and the dense. Built and run
on PoCL against a plain ``llvm`` build of the graph without the pass (bit for bit: the widening's
power-of-two scale makes the pool's float sums exact in any order). With ``int8()`` (slow; compile
only): PP-OCR's classifier (QOperator), only uint8 crosses its kernels at ``opencl``, as at x86; the
small QDQ ResNet-50, at most stock's kernels. Running skips with the reason when the OpenCL set-up is
missing."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.gpu import opencl
from tvm_ext.passes import FuseWideningIntoPool
from _opencl_cases import device_or_skip, run_graph

W = np.random.default_rng(11).integers(-5, 6, (3, 16)).astype("int8")
MOVES = {"reshape": lambda v: relay.reshape(v, (1, 16)), "batch_flatten": relay.nn.batch_flatten,
         "squeeze": lambda v: relay.squeeze(v, axis=[2, 3])}


@pytest.fixture(autouse=True, scope="module")
def _opencl_runtime():
    """Loaded before the builds when present, so that they hand back runnable modules (compile-only without)."""
    opencl.load_runtime()


def _classifier_head(move, pool, quantize_first=False):
    """u8 x -> widen -> pool -> move -> quantize to u8 -> dense (QLinearGlobalAveragePool, Flatten,
    QuantizeLinear, QGemm as TVM lowers them); ``quantize_first``: the quantize before the move (a QDQ
    classifier's head once its requantizes are integer)."""
    x = relay.var("x", shape=(1, 16, 5, 7), dtype="uint8")
    wide = relay.multiply(relay.cast(relay.subtract(relay.cast(x, "int32"), relay.const(21)), "float32"),
                          relay.const(0.125))

    def quantize(v):
        return relay.cast(relay.clip(relay.add(relay.round(relay.divide(v, relay.const(0.25))), relay.const(74.0)),
                                     0.0, 255.0), "uint8")

    q = MOVES[move](quantize(pool(wide))) if quantize_first else quantize(MOVES[move](pool(wide)))
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.nn.dense(q, relay.const(W), out_dtype="int32")))
    seed = 14 if quantize_first else 12
    return mod, {"x": np.random.default_rng(seed).integers(0, 256, (1, 16, 5, 7)).astype("uint8")}


def _assert_equals_llvm(mod, built, inputs):
    """``built`` run on the OpenCL device equals a plain ``llvm`` build of ``mod`` (without the pass)."""
    dev = device_or_skip()
    ref = run_graph(tvm_ext.build(mod, target="llvm"), tvm.cpu(), inputs)
    got = run_graph(built, dev, inputs)
    assert len(np.unique(ref[0])) == 3
    np.testing.assert_array_equal(got[0], ref[0])


@pytest.mark.parametrize("move", sorted(MOVES))
@pytest.mark.parametrize("pool", ["global_avg_pool2d", "global_max_pool2d"])
def test_global_pool_group_with_movement_runs_at_opencl(move, pool):
    mod, inputs = _classifier_head(move, getattr(relay.nn, pool))
    built = tvm_ext.build(mod, target="opencl", passes=[FuseWideningIntoPool()])
    report = built.kernel_report
    assert report.num_kernels == 2  # the pool's group (widening, pool, movement, quantize) and the dense
    assert report.crossing.nbytes == {"uint8": 16} and report.float_crossings() == []
    _assert_equals_llvm(mod, built, inputs)


@pytest.mark.slow
def test_ppocr_cls_qoperator_only_uint8_crosses_at_opencl():
    """Full size (1x3x48x192): the global pool's group ends at the quantize behind the reshape, so the
    float32 pooled values (800 bytes) no longer cross; at most stock's 95 kernels."""
    from tvm_ext.tools import zoo

    try:
        m = zoo.load("ppocr_cls_v2_int8_qoperator")
    except Exception as exc:  # noqa: BLE001 - a missing cache / network names itself
        pytest.skip(f"ppocr_cls_v2_int8_qoperator not available: {exc}")
    report = tvm_ext.build(m.mod, target="opencl", params=m.params, passes=pipelines.int8()).kernel_report
    assert set(report.crossing.nbytes) == {"uint8"}, report.crossing
    assert report.float_crossings() == [] and report.int_crossings() == []
    assert report.num_launched_kernels <= 95


@pytest.mark.parametrize("move", sorted(MOVES))
def test_8bit_global_pool_group_with_movement_runs_at_opencl(move):
    mod, inputs = _classifier_head(move, relay.nn.global_avg_pool2d, quantize_first=True)
    stock = tvm_ext.build(mod, target="opencl").kernel_report
    built = tvm_ext.build(mod, target="opencl", passes=[FuseWideningIntoPool()])
    report = built.kernel_report
    assert not [k for k in report.kernels if k.func_name == "__nop"]
    assert report.num_kernels == 2 < stock.num_kernels  # the pool's group (through the movement), the dense
    assert report.crossing.nbytes == {"uint8": 16}
    _assert_equals_llvm(mod, built, inputs)


@pytest.mark.slow
def test_resnet50_qdq_small_at_most_stock_kernels_at_opencl():
    """The pool's group ends at the flatten: as many kernels as stock, none of them a ``__nop``."""
    from tvm_ext.tools import zoo

    m = zoo.load("resnet50_int8_qdq", small=True)
    stock = tvm_ext.build(m.mod, target="opencl", params=m.params).kernel_report
    report = tvm_ext.build(m.mod, target="opencl", params=m.params, passes=pipelines.int8()).kernel_report
    assert report.num_kernels <= stock.num_kernels, (report.num_kernels, stock.num_kernels)
    assert not [k for k in report.kernels if k.func_name == "__nop"]
    pool = next(k for k in report.kernels if k.anchor == "nn.global_avg_pool2d")
    assert pool.ops[-1] == "nn.batch_flatten" and pool.outputs[0][1] == "uint8"
