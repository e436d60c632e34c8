"""tvm_ext.arm.depthwise_dot: 8-bit NCHWc depthwise convs as a dot over 4 adjacent taps.

Compiled for aarch64 anywhere (which kernel each class gets, and why not), executed under qemu
against numpy int64 arithmetic: 3x3 and 5x5, strides 1, 2 and (2, 1), asymmetric padding, odd widths,
channel blocks 4 and 8, int8 extremes (-128 data and weights), ``udot`` and ``usdot`` operands.
"""
import logging
import re

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.target import codegen

import tvm_ext
from tvm_ext.arm import depthwise_dot
from tvm_ext.testing.aarch64 import TARGETS, run_on_session

needs_aarch64 = pytest.mark.skipif("aarch64" not in list(codegen.llvm_get_targets()),
                                   reason="this TVM's LLVM has no AArch64 back end")

#: A whole-vector dot (not the lane-indexed form of the NCHWc convs) and a byte permutation.
_DOT = re.compile(r"^\s+(?:[su]|us)dot\s+v\d+\.4s, v\d+\.16b, v\d+\.16b$", re.M)
_TBL = re.compile(r"^\s+tbl\s+v\d+\.16b", re.M)
_RANGE = {"int8": (-128, 128), "uint8": (0, 256)}


def _case(rng, channels, height, width, k, strides, padding, block, dtype="int8", wdtype="int8"):
    """layout_transform -> contrib_depthwise_conv2d_nchwc -> layout_transform, and its exact result.
    ``padding``: (top, left, bottom, right)."""
    x = rng.integers(*_RANGE[dtype], (1, channels, height, width)).astype(dtype)
    w = rng.integers(*_RANGE[wdtype], (channels, 1, k, k)).astype(wdtype)
    x[0, 0], w[0] = _RANGE[dtype][0], _RANGE[wdtype][0]  # a channel of -128 x -128 (0 x 0 for uint8)
    x[0, 1, :, ::2], w[1, 0, :, -1] = _RANGE[dtype][1] - 1, _RANGE[wdtype][0]  # the last tap of a group
    blocked = w.reshape(channels // block, block, 1, k, k).transpose(0, 2, 3, 4, 1)[:, :, :, :, None, :]
    var = relay.var("x", shape=x.shape, dtype=dtype)
    y = relay.layout_transform(var, "NCHW", f"NCHW{block}c")
    y = relay.nn.contrib_depthwise_conv2d_nchwc(
        y, relay.const(np.ascontiguousarray(blocked)), strides=strides, padding=padding, channels=channels,
        groups=channels, kernel_size=(k, k), data_layout=f"NCHW{block}c", kernel_layout=f"OIHW1i{block}o",
        out_layout=f"NCHW{block}c", out_dtype="int32")
    y = relay.layout_transform(y, f"NCHW{block}c", "NCHW")
    top, left, bottom, right = padding
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    (sh, sw) = strides
    oh, ow = (xp.shape[2] - k) // sh + 1, (xp.shape[3] - k) // sw + 1
    ref = np.zeros((1, channels, oh, ow), np.int64)
    for ky in range(k):
        for kx in range(k):
            window = xp[:, :, ky:ky + (oh - 1) * sh + 1:sh, kx:kx + (ow - 1) * sw + 1:sw]
            ref += window * w[None, :, 0, ky, kx, None, None].astype(np.int64)
    return tvm.IRModule.from_expr(relay.Function([var], y)), x, ref


def _depthwise_asm(factory) -> str:
    """The assembly of the depthwise kernel's functions (its compute function and parallel lambdas)."""
    asm, out, keep = factory.get_lib().get_source("asm"), [], False
    for line in asm.splitlines():
        m = re.match(r"^\s*\.type\s+([.\w$]+),\s*@function", line)
        if m:
            name = m.group(1)
            keep = "depthwise" in name if name.startswith("tvmgen_") else keep and name.startswith(".L__tvm_parallel")
        if keep:
            out.append(line)
    return "\n".join(out)


def test_tile_rows_divide_the_output_and_fit_the_registers():
    assert depthwise_dot.tile_rows(12, 3, 4) == 6 and depthwise_dot.tile_rows(9, 3, 4) == 3
    assert depthwise_dot.tile_rows(7, 3, 4) == 7 and depthwise_dot.tile_rows(11, 5, 8) == 1
    assert depthwise_dot.tile_rows(24, 5, 8) == 6  # 2 x (6 + 5 + 3) = 28 registers


@pytest.mark.parametrize("args, why", [
    (((1, 2, 8, 8, 16), (2, 1, 3, 3, 1, 16), "int8", "int8", "int32", (1, 1), True), "not NCHW4c or NCHW8c"),
    (((1, 2, 8, 8, 4), (2, 2, 3, 3, 1, 4), "int8", "int8", "int32", (1, 1), True), "channel multiplier 1"),
    (((1, 2, 8, 8, 4), (2, 1, 3, 3, 1, 4), "int8", "int8", "int32", (2, 2), True), "dilation"),
    (((1, 2, 8, 8, 4), (2, 1, 3, 3, 1, 4), "int8", "uint8", "int32", (1, 1), True), "no dot instruction"),
    (((1, 2, 8, 8, 4), (2, 1, 3, 3, 1, 4), "uint8", "int8", "int32", (1, 1), False), "needs usdot"),
    (((1, 2, 8, 8, 4), (2, 1, 3, 3, 1, 4), "int8", "int8", "int32", (1, 1), False), ""),
])
def test_check_names_why(args, why):
    got = depthwise_dot.check(*args)
    assert (why in got and got) if why else got == ""


@needs_aarch64
@pytest.mark.parametrize("cpu, block, k", [("neoverse-n1", 4, 3), ("neoverse-v1", 8, 5)])
def test_dot_kernel_permutes_rows_once_per_tile(cpu, block, k):
    """9 output rows in tiles of 3: 5 (3x3) or 7 (5x5) input rows loaded and permuted per pixel, one
    tbl per 4 channels each, feeding 9 or 15 dots per 4 channels and 4-tap group."""
    mod, _, _ = _case(np.random.default_rng(0), 16, 9, 11, k, (1, 1), (k // 2,) * 4, block)
    asm = _depthwise_asm(tvm_ext.build(mod, target=TARGETS[cpu], kernels=True))
    groups, quads = block // 4, -(-k // 4)
    assert len(_DOT.findall(asm)) == 3 * k * groups * quads, asm
    assert len(_TBL.findall(asm)) == (2 + k) * groups * quads, asm
    assert not re.search(r"^\s+smull2?\s+v", asm, re.M)  # no widening multiply per tap


@needs_aarch64
@pytest.mark.parametrize("cpu, dilation, dtypes, why", [
    ("cortex-a72", 1, ("int8", "int8"), "aarch64_neon policy keeps"),
    ("neoverse-n1", 2, ("int8", "int8"), "dilation (2, 2)"),
    ("neoverse-n1", 1, ("uint8", "int8"), "needs usdot"),
])
def test_other_convs_keep_tvms_compute_and_say_why(cpu, dilation, dtypes, why, caplog):
    x = relay.var("x", shape=(1, 8, 6, 6), dtype=dtypes[0])
    y = relay.layout_transform(x, "NCHW", "NCHW4c")
    y = relay.nn.contrib_depthwise_conv2d_nchwc(
        y, relay.const(np.ones((2, 1, 3, 3, 1, 4), dtypes[1])), padding=(1, 1), dilation=(dilation, dilation),
        channels=8, groups=8, kernel_size=(3, 3), data_layout="NCHW4c", kernel_layout="OIHW1i4o",
        out_layout="NCHW4c", out_dtype="int32")
    with caplog.at_level(logging.DEBUG, logger="tvm_ext.arm.int8_conv"):
        factory = tvm_ext.build(tvm.IRModule.from_expr(relay.Function([x], y)), target=TARGETS[cpu], kernels=True)
    assert not _DOT.search(_depthwise_asm(factory))
    assert any("keeps TVM's compute" in r.getMessage() and why in r.getMessage() for r in caplog.records), caplog.text


#: (cpu, channels, height, width, k, strides, padding (top, left, bottom, right), block, data, weights)
CASES = [
    ("neoverse-n1", 8, 7, 21, 3, (1, 1), (1, 1, 1, 1), 4, "int8", "int8"),  # 3 segments of 7 pixels
    ("neoverse-n1", 16, 9, 13, 3, (2, 2), (0, 1, 1, 0), 8, "int8", "int8"),
    ("neoverse-v1", 16, 10, 9, 5, (2, 1), (2, 1, 1, 2), 8, "int8", "int8"),
    ("neoverse-n1", 8, 5, 7, 5, (1, 1), (2, 2, 2, 2), 4, "uint8", "uint8"),
    ("neoverse-v1", 8, 6, 9, 3, (1, 2), (1, 0, 0, 1), 4, "uint8", "int8"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "_".join(map(str, c)).replace(" ", "").replace(",", "x"))
def test_depthwise_dot_exact_under_qemu(case, arm_session, tmp_path):
    cpu, *shape = case
    mod, x, ref = _case(np.random.default_rng(sum(shape[:4])), *shape)
    factory = tvm_ext.build(mod, target=TARGETS[cpu], kernels=True)
    assert _DOT.search(_depthwise_asm(factory)), f"not the dot kernel at {cpu}"
    (out,) = run_on_session(arm_session, factory, {"x": x}, tmp_path, "depthwise_dot_" + str(CASES.index(case)))
    np.testing.assert_array_equal(out, ref, err_msg=f"{case}")


@pytest.mark.parametrize("kw, macs", [(3, 9 * 12 + 8), (5, 9 * 10 + 8), (4, 9 * 16 + 8)])
def test_mca_credits_a_depthwise_dot_with_the_taps_that_carry_a_weight(kw, macs):
    """9 sdot of 16 products and 2 smull .4h (8 products, counted whole): a 3x3's dots carry 12 weights,
    a 5x5's 10 (two groups of 4 taps, 3 of them zero)."""
    from tvm_ext.tools.mca import _asm

    hot = _asm.HotLoop("k", "f", (), {"sdot .4s": 9, "smull .4h": 2}, 9 * 16 + 8)
    assert _asm.depthwise_taps(hot, kw).macs == macs
