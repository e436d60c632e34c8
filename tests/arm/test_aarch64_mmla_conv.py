"""tvm-ext's 8-bit matrix-multiply conv (tvm_ext.arm.mmla_conv) at +i8mm, run under qemu: exact integers.

The kernel pairs neighbouring output pixels and output channels, gathers strided columns, pads odd
widths and whole register tiles with extra columns that it drops, and keeps the accumulators in
registers: each of those has a shape here. The oracle is numpy int64 arithmetic, with inputs over
the full 8-bit range and weights over [-127, 127] (or [0, 255] for ``ummla``).
"""
import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.testing.aarch64 import TARGETS, run_on_session

from _cases import X_ZP, conv_nchw_exact

V1 = TARGETS["neoverse-v1"]

#: (input channels, output channels, size, kernel, stride, padding): stride 1 and 2, 1x1 and 3x3,
#: widths that are odd and that leave a partial register tile, more than one channel block, a 1x1
#: reduction stepping by 4 input blocks (128 channels) on a row of 5-pair tiles (28 wide: 14 pairs, 15 computed).
SHAPES = [pytest.param((16, 16, 9, 3, 1, 1), marks=pytest.mark.slow), (64, 32, 8, 1, 2, 0), (32, 64, 7, 3, 2, 1),
          pytest.param((8, 8, 5, 3, 1, 0), marks=pytest.mark.slow), (24, 16, 14, 1, 1, 0), (128, 16, 28, 1, 1, 0)]


def _qnn(rng, ci, co, size, k, stride, pad):
    x = rng.integers(0, 256, (1, ci, size, size)).astype("uint8")
    w = rng.integers(-127, 128, (co, ci, k, k)).astype("int8")
    w[0, 0, 0, 0], w[1, 0, 0, 0] = 127, -127
    var = relay.var("x", shape=x.shape, dtype="uint8")
    y = relay.qnn.op.conv2d(var, relay.const(w), relay.const(X_ZP), relay.const(0), relay.const(0.02),
                            relay.const(0.01), kernel_size=(k, k), channels=co, strides=(stride, stride),
                            padding=(pad, pad), out_dtype="int32")
    ref = conv_nchw_exact(x, w, X_ZP, (stride, stride), (pad, pad))
    return tvm.IRModule.from_expr(relay.Function([var], y)), x, ref


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)) if isinstance(s, tuple) else None)
def test_qnn_conv2d_exact_under_qemu(shape, arm_session, tmp_path):
    mod, x, ref = _qnn(np.random.default_rng(sum(shape)), *shape)
    factory = tvm_ext.build(mod, target=V1, kernels=True)
    (out,) = run_on_session(arm_session, factory, {"x": x}, tmp_path, "mmla_" + "x".join(map(str, shape)))
    np.testing.assert_array_equal(out, ref, err_msg=f"qnn.conv2d {shape} at {V1}")


def test_uint8_weights_take_ummla_and_are_exact_under_qemu(arm_session, tmp_path):
    rng = np.random.default_rng(11)
    x = rng.integers(0, 256, (1, 16, 6, 6)).astype("uint8")
    w = rng.integers(0, 256, (16, 16, 3, 3)).astype("uint8")
    var = relay.var("x", shape=x.shape, dtype="uint8")
    y = relay.nn.conv2d(var, relay.const(w), kernel_size=(3, 3), channels=16, padding=(1, 1), out_dtype="int32")
    factory = tvm_ext.build(tvm.IRModule.from_expr(relay.Function([var], y)), target=V1, kernels=True)
    assert "ummla" in factory.get_lib().get_source("asm")
    (out,) = run_on_session(arm_session, factory, {"x": x}, tmp_path, "ummla")
    np.testing.assert_array_equal(out, conv_nchw_exact(x, w, 0, (1, 1), (1, 1)))
