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

from _cases import conv_reference, dense_reference, qnn_conv, qnn_dense


def _build(mod, target):
    with tvm.transform.PassContext(opt_level=3):
        return relay.build(mod, target=target)


@pytest.mark.parametrize("cpu", [
    "cortex-a72", "neoverse-n1",
    # stock TVM's conv at +i8mm, its +dotprod NCHWc schedule (sdot); [neoverse-n1] runs it in the default tier
    pytest.param("neoverse-v1", marks=pytest.mark.slow)])
def test_qnn_conv2d_int32_exact_under_qemu(cpu, arm_session, tmp_path):
    mod, x, w = qnn_conv(np.random.default_rng(0))
    ref = conv_reference(x, w)
    assert np.abs(ref).max() > 2 ** 16  # the sums leave 16 bits: an int16 accumulator would wrap
    (out,) = run_on_session(arm_session, _build(mod, TARGETS[cpu]), {"x": x}, tmp_path, f"conv_{cpu}")
    assert out.dtype == np.int32 and out.shape == ref.shape
    np.testing.assert_array_equal(out, ref, err_msg=f"qnn.conv2d at {TARGETS[cpu]} under qemu")


@pytest.mark.parametrize("cpu", [
    # stock TVM's dense at NEON only and +dotprod; [neoverse-v1] runs a stock dense, and
    # test_qnn_conv2d_int32_exact_under_qemu stock builds at these classes, in the default tier
    pytest.param("cortex-a72", marks=pytest.mark.slow), pytest.param("neoverse-n1", marks=pytest.mark.slow),
    "neoverse-v1"])
def test_qnn_dense_int32_exact_under_qemu(cpu, arm_session, tmp_path):
    mod, x, w = qnn_dense(np.random.default_rng(1))
    ref = dense_reference(x, w)
    (out,) = run_on_session(arm_session, _build(mod, TARGETS[cpu]), {"x": x}, tmp_path, f"dense_{cpu}")
    assert out.dtype == np.int32 and out.shape == ref.shape
    np.testing.assert_array_equal(out, ref, err_msg=f"qnn.dense at {TARGETS[cpu]} under qemu")


def test_reference_catches_a_dropped_zero_point():
    """The oracle is not vacuous: the same conv with the input zero point ignored differs."""
    mod, x, w = qnn_conv(np.random.default_rng(0))
    ref = conv_reference(x, w)
    xs = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    wrong = sum(np.einsum("nchw,oc->nohw", xs[:, :, ky:ky + 8, kx:kx + 8], w[:, :, ky, kx].astype(np.int64))
                for ky in range(3) for kx in range(3))
    assert (wrong != ref).mean() > 0.9
