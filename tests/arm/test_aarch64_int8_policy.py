"""tvm-ext's aarch64 int8 kernel policy (tvm_ext.arm.int8_conv), run under qemu: exact integer results.

The layers the policy moves off TVM's rules: convs and denses at NEON only (Cortex-A72), which TVM
widens to int16 and the policy multiplies as int8 (``smull`` + ``saddlp``), convs with fewer than
64 input channels, which TVM gives the NCHW spatial pack and the policy the NCHWc dot-product kernel,
and depthwise int8 convs, which TVM keeps NCHW and the policy makes NCHWc like their neighbours.
The oracle is numpy integer arithmetic with the input over the full uint8 range and the weights over
[-127, 127]; the uint8 -> int8 input shift of every class is part of what is checked.
"""
import numpy as np
import pytest

import tvm_ext
from tvm_ext.testing.aarch64 import TARGETS, run_on_session

from _cases import (conv_reference, dense_reference, pointwise_depthwise_reference, qnn_conv, qnn_dense,
                    qnn_pointwise_depthwise)


# Slow: 8 channels at NEON only and at +dotprod, 12 at +dotprod (the same kernels at other counts); the default tier
# runs each channel count once ([neoverse-v1-8], [cortex-a72-12]) and each class's few-channel kernel
@pytest.mark.parametrize("cpu, channels", [("cortex-a72", 64), pytest.param("cortex-a72", 8, marks=pytest.mark.slow),
                                           ("cortex-a72", 12), ("neoverse-n1", 3),
                                           pytest.param("neoverse-n1", 8, marks=pytest.mark.slow),
                                           pytest.param("neoverse-n1", 12, marks=pytest.mark.slow),
                                           ("neoverse-n1", 16), ("neoverse-v1", 8)])
def test_qnn_conv2d_exact_under_qemu(cpu, channels, arm_session, tmp_path):
    mod, x, w = qnn_conv(np.random.default_rng(channels), channels=channels)
    factory = tvm_ext.build(mod, target=TARGETS[cpu], kernels=True)
    (out,) = run_on_session(arm_session, factory, {"x": x}, tmp_path, f"conv_{cpu}_{channels}")
    np.testing.assert_array_equal(out, conv_reference(x, w), err_msg=f"{channels}-channel conv at {TARGETS[cpu]}")


@pytest.mark.parametrize("cpu, channels, strides", [
    ("cortex-a72", 16, (1, 1)),
    # 16 channels, stride 1 at +dotprod: [cortex-a72-16-strides0] runs that shape, [neoverse-n1-12-strides2] the
    # +dotprod depthwise conv, in the default tier
    pytest.param("neoverse-n1", 16, (1, 1), marks=pytest.mark.slow),
    ("neoverse-n1", 12, (2, 2)), ("neoverse-v1", 24, (2, 2))])
def test_qnn_depthwise_conv2d_exact_under_qemu(cpu, channels, strides, arm_session, tmp_path):
    """The policy's NCHWc depthwise int8 conv after a 1x1 conv (NCHW4c; NCHW8c at +i8mm)."""
    mod, x, w1, w2 = qnn_pointwise_depthwise(np.random.default_rng(channels), channels=channels, strides=strides)
    factory = tvm_ext.build(mod, target=TARGETS[cpu], kernels=True)
    assert any("depthwise_conv2d_NCHWc" in k.name for k in factory.kernel_report.kernels)
    (out,) = run_on_session(arm_session, factory, {"x": x}, tmp_path, f"depthwise_{cpu}_{channels}")
    np.testing.assert_array_equal(out, pointwise_depthwise_reference(x, w1, w2, strides),
                                  err_msg=f"{channels}-channel depthwise conv, strides {strides}, at {TARGETS[cpu]}")


def test_qnn_dense_exact_under_qemu_neon_only(arm_session, tmp_path):
    mod, x, w = qnn_dense(np.random.default_rng(3))
    factory = tvm_ext.build(mod, target=TARGETS["cortex-a72"], kernels=True)
    (out,) = run_on_session(arm_session, factory, {"x": x}, tmp_path, "dense_a72")
    np.testing.assert_array_equal(out, dense_reference(x, w), err_msg="qnn.dense at Cortex-A72")


@pytest.mark.parametrize("cpu", [
    # the float stem blocked NCHW4c at +dotprod, run; [neoverse-v1] runs a blocked float stem in the default tier,
    # and test_int8_conv.py::test_float_first_layer_is_blocked_like_the_int8_convs_after_it[neoverse-n1] checks
    # the +dotprod layout
    pytest.param("neoverse-n1", marks=pytest.mark.slow),
    "neoverse-v1"])
def test_float_first_layer_within_tolerance_under_qemu(cpu, arm_session, tmp_path):
    """The float first layer the policy blocks as NCHWc (TVM's x86 float conv): float64 numpy's result."""
    import tvm
    from tvm import relay

    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 3, 16, 16)).astype("float32")
    w = rng.standard_normal((16, 3, 3, 3)).astype("float32")
    var = relay.var("x", shape=x.shape, dtype="float32")
    mod = tvm.IRModule.from_expr(relay.Function([var], relay.nn.conv2d(var, relay.const(w), padding=(1, 1),
                                                                      channels=16, kernel_size=(3, 3))))
    factory = tvm_ext.build(mod, target=TARGETS[cpu], kernels=True)
    (out,) = run_on_session(arm_session, factory, {"x": x}, tmp_path, f"float_stem_{cpu}")
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = sum(np.einsum("nchw,oc->nohw", xp[:, :, ky:ky + 16, kx:kx + 16], w[:, :, ky, kx].astype(np.float64))
              for ky in range(3) for kx in range(3))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_one_pixel_rows_at_i8mm_exact_under_qemu(arm_session, tmp_path):
    """A conv whose output rows are one pixel wide (a squeeze-excite conv on a pooled 1x1 map) at +i8mm:
    the policy keeps the dot product for it (the matrix instruction pairs two pixels of a row)."""
    mod, x, w = qnn_conv(np.random.default_rng(1), channels=16, size=1)
    factory = tvm_ext.build(mod, target=TARGETS["neoverse-v1"], kernels=True)
    (out,) = run_on_session(arm_session, factory, {"x": x}, tmp_path, "conv_v1_one_pixel")
    np.testing.assert_array_equal(out, conv_reference(x, w), err_msg="1x1 map conv at Neoverse-V1")
