"""tvm-ext's NCHW4c convs in register tiles (tvm_ext.arm.dot_conv), run under qemu: exact integers, at
+dotprod (``sdot``) and NEON only (``smull`` + ``sadalp``), and at +i8mm for the convs that keep the dot
product there (4 input channels), which write the NCHW8c blocks of the matrix-multiply convs.

Each shape exercises a part of the kernel: rows padded to whole tiles (widths 4, 5, 9, 14), tiles of two
output rows (width 28: 7 groups, 1x1 and 3x3), strided columns gathered (stride 2, 1x1 and 3x3), output
channels that no tile of 4 blocks divides (20 -> 24 after legalization: 6 blocks), input channels padded
(3 -> 4, 12 -> 16), batch 1. The oracle is numpy
int64 arithmetic, inputs over the full 8-bit range, weights over [-127, 127]; the conv with a
requantize epilogue is checked against a plain ``llvm`` build (no int8 SIMD) run on this host.
"""
import re

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.testing.aarch64 import TARGETS, run_on_session

from _cases import X_ZP, conv_nchw_exact, plain_llvm_output

#: What the tiled kernel's loop has at each class: lane-indexed sdot/udot, or smull/umull with sadalp/uadalp.
_TILED = {"neoverse-n1": re.compile(r"^\s+[su]dot\s+v\d+\.4s, v\d+\.16b, v\d+\.4b\[[0-3]\]", re.M),
          "cortex-a72": re.compile(r"^\s+[su]adalp\s+v\d+\.4s, v\d+\.8h", re.M)}

#: (input channels, output channels, size, kernel, stride, padding) -> the class that runs it in the default tier:
#: a diagonal, each shape once and each tile form on half of them. The slow tier adds each shape at the other
#: class (the same rows, strides and paddings through the other instruction form) and the 64x64 conv (14 wide,
#: as in a ResNet stage) at both.
SHAPES = {(16, 16, 9, 3, 1, 1): "cortex-a72", (64, 32, 8, 1, 2, 0): "neoverse-n1", (32, 64, 7, 3, 2, 1): "cortex-a72",
          (12, 20, 6, 3, 1, 0): "cortex-a72", (24, 16, 14, 1, 1, 0): "neoverse-n1", (3, 16, 10, 3, 2, 1): "neoverse-n1",
          (16, 32, 28, 1, 1, 0): "cortex-a72", (12, 32, 28, 3, 1, 1): "neoverse-n1", (64, 64, 14, 3, 1, 1): None}


def _qnn(rng, ci, co, size, k, stride, pad, requantize=False):
    x = rng.integers(0, 256, (1, ci, size, size)).astype("uint8")
    w = rng.integers(-127, 128, (co, ci, k, k)).astype("int8")
    w[0, 0, 0, 0], w[1, 0, 0, 0] = 127, -127
    var = relay.var("x", shape=x.shape, dtype="uint8")
    y = relay.qnn.op.conv2d(var, relay.const(w), relay.const(X_ZP), relay.const(0), relay.const(0.02),
                            relay.const(0.01), kernel_size=(k, k), channels=co, strides=(stride, stride),
                            padding=(pad, pad), out_dtype="int32")
    if requantize:
        y = relay.nn.bias_add(y, relay.const(rng.integers(-3000, 3000, co).astype("int32")))
        y = relay.qnn.op.requantize(y, relay.const(0.0002), relay.const(0), relay.const(0.05), relay.const(9),
                                    out_dtype="uint8")
    ref = conv_nchw_exact(x, w, X_ZP, (stride, stride), (pad, pad))
    return tvm.IRModule.from_expr(relay.Function([var], y)), x, ref


def _build(mod, cpu):
    factory = tvm_ext.build(mod, target=TARGETS[cpu], kernels=True)
    assert _TILED[cpu].search(factory.get_lib().get_source("asm")), f"not the tiled kernel at {cpu}"
    return factory


@pytest.mark.parametrize("shape, cpu", [
    pytest.param(shape, cpu, id="x".join(map(str, shape)) + f"-{cpu}", marks=() if cpu == default else pytest.mark.slow)
    for shape, default in SHAPES.items() for cpu in _TILED])
def test_qnn_conv2d_exact_under_qemu(shape, cpu, arm_session, tmp_path):
    mod, x, ref = _qnn(np.random.default_rng(sum(shape)), *shape)
    name = f"tiles_{cpu}_" + "x".join(map(str, shape))
    (out,) = run_on_session(arm_session, _build(mod, cpu), {"x": x}, tmp_path, name)
    np.testing.assert_array_equal(out, ref, err_msg=f"qnn.conv2d {shape} at {TARGETS[cpu]}")


@pytest.mark.parametrize("cpu, instruction", [
    ("neoverse-n1", "udot"),
    # umull + uadalp on unsigned operands; [neoverse-n1-udot] runs uint8 operands, and
    # test_qnn_conv2d_exact_under_qemu the NEON-only tile, in the default tier
    pytest.param("cortex-a72", "uadalp", marks=pytest.mark.slow)])
def test_uint8_operands_are_exact_under_qemu(cpu, instruction, arm_session, tmp_path):
    rng = np.random.default_rng(11)
    x = rng.integers(0, 256, (1, 16, 6, 6)).astype("uint8")
    w = rng.integers(0, 256, (24, 16, 3, 3)).astype("uint8")
    var = relay.var("x", shape=x.shape, dtype="uint8")
    y = relay.nn.conv2d(var, relay.const(w), kernel_size=(3, 3), channels=24, padding=(1, 1), out_dtype="int32")
    factory = _build(tvm.IRModule.from_expr(relay.Function([var], y)), cpu)
    assert instruction in factory.get_lib().get_source("asm")
    (out,) = run_on_session(arm_session, factory, {"x": x}, tmp_path, f"uint8_{cpu}")
    np.testing.assert_array_equal(out, conv_nchw_exact(x, w, 0, (1, 1), (1, 1)))


@pytest.mark.parametrize("cpu", [
    "neoverse-n1",
    # the same epilogue after the NEON-only tile; [neoverse-n1] runs the fused epilogue in the default tier
    pytest.param("cortex-a72", marks=pytest.mark.slow)])
def test_requantize_epilogue_matches_plain_llvm_under_qemu(cpu, arm_session, tmp_path):
    """bias and requantize to uint8 fused into the tiled kernel: the plain llvm build's bytes."""
    mod, x, _ = _qnn(np.random.default_rng(5), 32, 32, 11, 3, 1, 1, requantize=True)
    (out,) = run_on_session(arm_session, _build(mod, cpu), {"x": x}, tmp_path, f"requantize_{cpu}")
    np.testing.assert_array_equal(out, plain_llvm_output(mod, {}, x))


#: Convs of 4 input channels (3 padded to 4) at +i8mm: NCHW4c data, NCHW8c output (one tile block of 8
#: channels is two of 4), a ResNet-like stem (7x7, stride 2) and output channels of 1 and 3 blocks.
#: Slow: the 3 channels padded to 4 (stride 2, two output blocks) and the 7x7 stem, which
#: test_i8mm_stem_requantize_matches_plain_llvm_under_qemu (3 channels, 7x7, stride 2) runs in the default tier.
V1_SHAPES = [pytest.param((3, 16, 10, 3, 2, 1), marks=pytest.mark.slow),
             pytest.param((3, 24, 23, 7, 2, 3), marks=pytest.mark.slow), (4, 8, 9, 3, 1, 1)]


@pytest.mark.parametrize("shape", V1_SHAPES, ids=lambda s: "x".join(map(str, s)) if isinstance(s, tuple) else None)
def test_i8mm_few_channel_conv_exact_under_qemu(shape, arm_session, tmp_path):
    mod, x, ref = _qnn(np.random.default_rng(sum(shape)), *shape)
    factory = tvm_ext.build(mod, target=TARGETS["neoverse-v1"], kernels=True)
    assert _TILED["neoverse-n1"].search(factory.get_lib().get_source("asm")), "not the tiled kernel at +i8mm"
    (out,) = run_on_session(arm_session, factory, {"x": x}, tmp_path, "tiles_v1_" + "x".join(map(str, shape)))
    np.testing.assert_array_equal(out, ref, err_msg=f"qnn.conv2d {shape} at {TARGETS['neoverse-v1']}")


def test_i8mm_stem_requantize_matches_plain_llvm_under_qemu(arm_session, tmp_path):
    """A stem-like conv (3 channels, 7x7, stride 2) with bias and requantize to uint8 at +i8mm."""
    mod, x, _ = _qnn(np.random.default_rng(6), 3, 16, 20, 7, 2, 3, requantize=True)
    factory = tvm_ext.build(mod, target=TARGETS["neoverse-v1"], kernels=True)
    (out,) = run_on_session(arm_session, factory, {"x": x}, tmp_path, "requantize_v1_stem")
    np.testing.assert_array_equal(out, plain_llvm_output(mod, {}, x))
