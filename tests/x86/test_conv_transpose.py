"""Tests of tvm_ext.x86.conv_transpose (``conv_transpose_without_zeros``: stride-equals-kernel
transposed convs without zeros)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay, te

import tvm_ext
from tvm_ext.x86 import conv_transpose as x86_conv_transpose, int8_conv as x86_int8
from tvm_ext.core.report import KernelReport
from tvm_ext.x86.target import host_target
from tvm_ext.testing import run_module


def conv_t(dtype, ci, co, hw, k, stride, padding=0, epilogue=True):
    """x -> conv2d_transpose (IOHW weights) [-> requantize-like epilogue]."""
    acc = "float32" if dtype == "float32" else "int32"
    x = relay.var("x", shape=(1, ci, hw, hw), dtype=dtype)
    w = np.random.default_rng(0).integers(-100, 100, (ci, co, k, k)).astype(dtype)
    y = relay.nn.conv2d_transpose(x, relay.const(w), channels=co, kernel_size=(k, k), strides=(stride, stride),
                                  padding=(padding, padding), out_dtype=acc)
    if epilogue:
        y = relay.clip(relay.cast(relay.floor(relay.multiply(relay.cast(y, "float32"), relay.const(0.01))), "int32"),
                       0, 255)
    return tvm.IRModule.from_expr(relay.Function([x], y))


def _input(dtype, ci, hw, seed=1):
    rng = np.random.default_rng(seed)
    if dtype == "float32":
        return rng.standard_normal((1, ci, hw, hw)).astype(dtype)
    return rng.integers(-300, 300, (1, ci, hw, hw)).astype(dtype)


def _build_both(mod):
    tgt = host_target()
    with tvm.transform.PassContext(opt_level=3):
        stock = relay.build(mod, target=tgt)
    with x86_int8.kernels(), tvm.transform.PassContext(opt_level=3):
        ours = relay.build(mod, target=tgt)
    return stock, ours


@pytest.mark.parametrize("dtype, ci, co, hw, k, epilogue", [
    ("int16", 24, 8, 10, 2, True),     # PP-OCRv4 det's QDQ head after QNN lowering (int16 operands)
    ("int16", 24, 1, 20, 2, True),     # its last layer: one output channel
    ("float32", 12, 4, 10, 2, False),  # a float model's upsampling, no epilogue
    ("int16", 5, 3, 7, 3, False),      # 3x3 stride 3, odd sizes (vector tail)
])
def test_bit_identical_to_tvms_schedule(dtype, ci, co, hw, k, epilogue):
    mod = conv_t(dtype, ci, co, hw, k, stride=k, epilogue=epilogue)
    stock, ours = _build_both(mod)
    from tvm.contrib import graph_executor

    outs = []
    for fac in (stock, ours):
        m = graph_executor.GraphModule(fac["default"](tvm.cpu()))
        m.set_input("x", _input(dtype, ci, hw))
        m.run()
        outs.append(m.get_output(0).numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
    assert outs[0].std() > 0


def test_direct_compute_only_where_stride_equals_kernel():
    """Stride-equals-kernel: the direct compute (its tag); overlapping windows or padding: TVM's."""
    def compute(k, stride, padding):
        data = te.placeholder((1, 4, 6, 6), "int16")
        kernel = te.placeholder((4, 2, k, k), "int16")
        fn = x86_conv_transpose.conv2d_transpose_nchw(lambda *a: te.compute((1,), lambda i: 0, tag="tvm"))
        return fn(data, kernel, (stride, stride), (padding,) * 4, "int32", (0, 0)).op.tag

    assert compute(2, 2, 0) == x86_conv_transpose.TAG
    assert compute(3, 2, 0) == "tvm"  # overlapping windows
    assert compute(2, 2, 1) == "tvm"  # padding
    assert not x86_conv_transpose.stride_equals_kernel((4, 2, 2, 2), (2, 2), (0, 0, 0, 0), (1, 1))
    assert not x86_conv_transpose.stride_equals_kernel((4, 2, tvm.tir.Var("k", "int32"), 2), (2, 2), (0,) * 4,
                                                       (0, 0))


def test_overlapping_windows_unchanged_and_kernels_as_stock():
    """A 3x3 stride-2 padded transposed conv keeps TVM's compute (same results); tvm_ext.build
    makes as many kernels as relay.build for either kind."""
    for mod in (conv_t("int16", 6, 4, 8, 3, stride=2, padding=1), conv_t("int16", 6, 4, 8, 2, stride=2)):
        x = {"x": _input("int16", 6, 8)}
        ours = tvm_ext.build(mod)
        np.testing.assert_array_equal(run_module(mod, x)[0], _run_factory(ours, x))
        with tvm.transform.PassContext(opt_level=3):
            stock = relay.build(mod, target=host_target())
        assert ours.kernel_report.num_kernels == KernelReport.from_factory(stock).num_kernels


def _run_factory(fac, inputs):
    from tvm.contrib import graph_executor

    m = graph_executor.GraphModule(fac["default"](tvm.cpu()))
    for k, v in inputs.items():
        m.set_input(k, v)
    m.run()
    return m.get_output(0).numpy()
