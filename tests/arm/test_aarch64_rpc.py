"""Integer graphs built for aarch64 and run under qemu-user through TVM RPC are exact.

The oracle is numpy integer arithmetic: ``qnn.conv2d`` and ``qnn.dense`` with int32 outputs are
sums of ``(x - x_zero_point) * w`` in exact integers. Inputs span the full uint8 range and weights
the full symmetric int8 range [-127, 127], so a kernel that saturates a 16-bit intermediate
(a pairwise multiply-add of two u8 x s8 products can reach 2 * 255 * 127 = 64770) or loses the
input zero point differs. Targets: NEON only (Cortex-A72), +dotprod (Neoverse-N1), +i8mm
(Neoverse-V1); qemu-aarch64 emulates all of them (its default CPU is ``max``).
"""
import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_ext.testing.aarch64 import TARGETS, run_on_session

X_ZP = 77  # not 0 and not 128: a kernel that drops or mis-shifts it differs


def _qnn_conv(rng, channels=64, size=8):
    """uint8 x int8 -> int32 3x3 conv, padding 1 (qnn pads with the input zero point).
    64 input channels: TVM 0.19's arm_cpu int8 conv strategies need at least that many."""
    x = rng.integers(0, 256, (1, channels, size, size)).astype("uint8")
    w = rng.integers(-127, 128, (channels, channels, 3, 3)).astype("int8")
    w[0, 0] = 127
    w[1, 0] = -127  # both ends of the range present
    var = relay.var("x", shape=x.shape, dtype="uint8")
    y = relay.qnn.op.conv2d(var, relay.const(w), relay.const(X_ZP), relay.const(0), relay.const(0.02),
                            relay.const(0.01), kernel_size=(3, 3), channels=channels, padding=(1, 1),
                            out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([var], y)), x, w


def _conv_reference(x, w):
    xs = np.pad(x.astype(np.int64) - X_ZP, ((0, 0), (0, 0), (1, 1), (1, 1)))  # padded zero point -> 0
    n, c, h, wd = x.shape
    out = np.zeros((n, w.shape[0], h, wd), np.int64)
    for ky in range(3):
        for kx in range(3):
            out += np.einsum("nchw,oc->nohw", xs[:, :, ky:ky + h, kx:kx + wd], w[:, :, ky, kx].astype(np.int64))
    return out.astype(np.int32)


def _qnn_dense(rng, m=4, k=64, n=32):
    x = rng.integers(0, 256, (m, k)).astype("uint8")
    w = rng.integers(-127, 128, (n, k)).astype("int8")
    w[0, :2] = (127, -127)
    var = relay.var("x", shape=x.shape, dtype="uint8")
    y = relay.qnn.op.dense(var, relay.const(w), relay.const(X_ZP), relay.const(0), relay.const(0.02),
                           relay.const(0.01), units=n, out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([var], y)), x, w


def _dense_reference(x, w):
    return ((x.astype(np.int64) - X_ZP) @ w.astype(np.int64).T).astype(np.int32)


def _build(mod, target):
    with tvm.transform.PassContext(opt_level=3):
        return relay.build(mod, target=target)


@pytest.mark.parametrize("cpu", ["cortex-a72", "neoverse-n1", "neoverse-v1"])
def test_qnn_conv2d_int32_exact_under_qemu(cpu, arm_session, tmp_path):
    mod, x, w = _qnn_conv(np.random.default_rng(0))
    ref = _conv_reference(x, w)
    assert np.abs(ref).max() > 2 ** 16  # the sums leave 16 bits: an int16 accumulator would wrap
    (out,) = run_on_session(arm_session, _build(mod, TARGETS[cpu]), {"x": x}, tmp_path, f"conv_{cpu}")
    assert out.dtype == np.int32 and out.shape == ref.shape
    np.testing.assert_array_equal(out, ref, err_msg=f"qnn.conv2d at {TARGETS[cpu]} under qemu")


@pytest.mark.parametrize("cpu", ["cortex-a72", "neoverse-n1", "neoverse-v1"])
def test_qnn_dense_int32_exact_under_qemu(cpu, arm_session, tmp_path):
    mod, x, w = _qnn_dense(np.random.default_rng(1))
    ref = _dense_reference(x, w)
    (out,) = run_on_session(arm_session, _build(mod, TARGETS[cpu]), {"x": x}, tmp_path, f"dense_{cpu}")
    assert out.dtype == np.int32 and out.shape == ref.shape
    np.testing.assert_array_equal(out, ref, err_msg=f"qnn.dense at {TARGETS[cpu]} under qemu")


def test_reference_catches_a_dropped_zero_point():
    """The oracle is not vacuous: the same conv with the input zero point ignored differs."""
    mod, x, w = _qnn_conv(np.random.default_rng(0))
    ref = _conv_reference(x, w)
    xs = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    wrong = sum(np.einsum("nchw,oc->nohw", xs[:, :, ky:ky + 8, kx:kx + 8], w[:, :, ky, kx].astype(np.int64))
                for ky in range(3) for kx in range(3))
    assert (wrong != ref).mean() > 0.9
