"""Builders and runners shared by the tests of tvm_ext.x86's int8 kernels (int8_conv, int8_policy,
int8_schedules) and of its tuned records."""

import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_ext.x86 import int8_policy
from tvm_ext.x86.isa import runs_on_host
from tvm_ext.x86.target import host_target

HOST_VNNI = int8_policy.vnni_ready(host_target(allow_vnni=True))
needs_vnni = pytest.mark.skipif(not HOST_VNNI, reason="host CPU has no AVX-512 VNNI")


def _conv_epilogue(k, channels=64, size=14, seed=0, epilogue=True):
    """uint8 x int8 conv with a requantize-like float epilogue; weights span the full int8 range."""
    rng = np.random.default_rng(seed)
    x = relay.var("x", shape=(1, channels, size, size), dtype="uint8")
    w = relay.const(rng.integers(-128, 128, (channels, channels, k, k)).astype("int8"))
    y = relay.nn.conv2d(x, w, padding=k // 2, channels=channels, kernel_size=k, out_dtype="int32")
    if not epilogue:
        return tvm.IRModule.from_expr(relay.Function([x], y))
    y = relay.add(y, relay.const(rng.integers(-1000, 1000, (channels, 1, 1)).astype("int32")))
    y = relay.cast(y, "float32") * relay.const((rng.random((channels, 1, 1)) * 1e-3).astype("float32"))
    y = relay.cast(relay.clip(relay.cast(relay.floor(y + relay.const(0.5)), "int32"), 0, 255), "uint8")
    return tvm.IRModule.from_expr(relay.Function([x], y))


def _run(lib, x):
    from tvm.contrib import graph_executor

    m = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    m.set_input("x", x)
    m.run()
    return m.get_output(0).numpy()


#: One target per int8 instruction-set class without VNNI (executed only where the host can).
NON_VNNI_TARGETS = {
    "avx2": "llvm -mcpu=x86-64-v3",
    "avx512": "llvm -mcpu=x86-64-v4",
}


def _runnable(target):
    return pytest.param(target, marks=pytest.mark.skipif(
        not runs_on_host(target), reason=f"host lacks instructions of '{target}'"))


def _requantize(y, channels, rng):
    y = relay.cast(y, "float32") * relay.const((rng.random((channels, 1, 1)) * 1e-3).astype("float32"))
    return relay.cast(relay.clip(relay.cast(relay.floor(y + relay.const(0.5)), "int32"), 0, 255), "uint8")


def _conv_depthwise_conv(channels=32, size=14, dtype="uint8", seed=0):
    """1x1 conv -> 3x3 depthwise conv -> 1x1 conv on 8-bit data (a mobile net's block), or float."""
    rng = np.random.default_rng(seed)
    x = relay.var("x", shape=(1, channels, size, size), dtype=dtype)
    wdtype, acc = ("int8", "int32") if dtype == "uint8" else ("float32", "float32")

    def weight(shape):
        return relay.const(rng.integers(-128, 128, shape).astype(wdtype))

    def settle(y):
        return _requantize(y, channels, rng) if dtype == "uint8" else relay.nn.relu(y)

    y = settle(relay.nn.conv2d(x, weight((channels, channels, 1, 1)), channels=channels, kernel_size=1,
                               out_dtype=acc))
    y = settle(relay.nn.conv2d(y, weight((channels, 1, 3, 3)), channels=channels, kernel_size=3, padding=1,
                               groups=channels, out_dtype=acc))
    y = relay.nn.conv2d(y, weight((channels, channels, 1, 1)), channels=channels, kernel_size=1, out_dtype=acc)
    return tvm.IRModule.from_expr(relay.Function([x], y))


def _kernel_names(factory):
    import json

    nodes = json.loads(factory.get_graph_json())["nodes"]
    return [n["attrs"]["func_name"] for n in nodes if n["op"] == "tvm_op"]


def _narrow_blocks_graph(seed=0, size=8):
    """The 24-channel tensors of PP-OCRv4 det's neck, in 8 bits: an int8 conv 32 -> 24 (3x3; x86
    pads its output channels to 32), a float SE block (global pool, one-pixel 24 -> 8 -> 24 convs,
    sigmoid gate), an int8 conv reading the gated 24 channels, a float conv 32 -> 24 and an int8
    conv reading its 24 channels."""
    rng = np.random.default_rng(seed)
    x = relay.var("x", shape=(1, 32, size, size), dtype="uint8")

    def conv(y, cin, cout, dtype, k=1):
        w = rng.integers(-128, 128, (cout, cin, k, k)).astype(dtype)
        if dtype == "float32":
            w = w * np.float32(1e-2)
        return relay.nn.conv2d(y, relay.const(w), channels=cout, kernel_size=k, padding=k // 2,
                               out_dtype="int32" if dtype == "int8" else "float32")

    def dequantize(y):
        return relay.cast(y, "float32") * relay.const(np.float32(0.05))

    def quantize(y):
        return relay.cast(relay.clip(relay.round(y), 0, 255), "uint8")

    a = dequantize(_requantize(conv(x, 32, 24, "int8", k=3), 24, rng))
    gate = relay.nn.relu(conv(relay.nn.global_avg_pool2d(a), 24, 8, "float32"))
    gate = relay.sigmoid(conv(gate, 8, 24, "float32"))
    b = _requantize(conv(quantize(a * gate * relay.const(np.float32(20.0))), 24, 32, "int8"), 32, rng)
    c = quantize(conv(dequantize(b), 32, 24, "float32"))
    return tvm.IRModule.from_expr(relay.Function([x], conv(c, 24, 32, "int8")))


def _layout_kernels(names):
    return [n for n in names if "layout_transform" in n or "strided_slice" in n]


def conv_case(k, cin, cout, size, stride, epilogue, seed=0):
    """``(module, weights)``: a uint8 x int8 conv (padding k // 2), full-range weights (-128 included); int32
    out, or with bias and a requantize to uint8."""
    rng = np.random.default_rng(seed)
    x = relay.var("x", shape=(1, cin, size, size), dtype="uint8")
    w = rng.integers(-128, 128, (cout, cin, k, k)).astype("int8")
    w.reshape(-1)[::9] = -128
    y = relay.qnn.op.conv2d(x, relay.const(w), relay.const(0), relay.const(0), relay.const(0.02), relay.const(0.01),
                            kernel_size=(k, k), channels=cout, padding=(k // 2, k // 2), strides=(stride, stride),
                            out_dtype="int32")
    if epilogue:
        y = relay.nn.bias_add(y, relay.const(rng.integers(-1000, 1000, (cout,)).astype("int32")))
        y = relay.qnn.op.requantize(y, relay.const(0.0002), relay.const(0), relay.const(0.05), relay.const(5),
                                    out_dtype="uint8")
    return tvm.IRModule.from_expr(relay.Function([x], y)), w


def conv_exact(x, w, stride, pad):
    """numpy's int64 convolution of ``x`` (NCHW) by ``w`` (OIHW)."""
    xs = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oc, _, k, _ = w.shape
    out = (xs.shape[2] - k) // stride + 1
    span = stride * (out - 1) + 1
    y = np.zeros((1, oc, out, out), np.int64)
    for kh in range(k):
        for kw in range(k):
            y[0] += np.einsum("oi,ihw->ohw", w[:, :, kh, kw].astype(np.int64),
                              xs[0, :, kh:kh + span:stride, kw:kw + span:stride])
    return y


_CONV_CASES_CHILD = r"""
import json, sys, numpy as np, tvm, tvm_ext
from tvm import relay
sys.path.insert(0, sys.argv[1])
from x86._int8_cases import conv_case
from tvm_ext.core import pipelines
from tvm_ext.tools.mca import _asm
from tvm_ext.x86.target import host_target
from tvm.contrib import graph_executor

def run(lib, x):
    m = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    m.set_input("x", x)
    m.run()
    return m.get_output(0).numpy()

outs = {}
for i, (k, cin, cout, size, stride, epilogue) in enumerate(json.loads(sys.argv[3])):
    mod, w = conv_case(k, cin, cout, size, stride, epilogue)
    x = np.random.default_rng(i).integers(0, 256, (1, cin, size, size)).astype("uint8")
    x.reshape(-1)[::7] = 255
    lib = tvm_ext.build(mod, target=host_target(allow_vnni=True), passes=pipelines.int8())
    funcs = _asm.parse(lib.get_lib().get_source("asm"))
    hot = max((h for h in (_asm.hot_loop(n, funcs, f) for n, f in _asm.kernels(funcs).items()) if h),
              key=lambda h: h.macs)
    outs[f"acc-{i}"] = np.array(hot.accumulators)
    outs[f"bcast-{i}"] = np.array(sum(b.startswith("vpbroadcastd") for b in hot.body) / sum(hot.dots.values()))
    outs[f"got-{i}"] = run(lib, x)
    with tvm.transform.PassContext(opt_level=3):
        outs[f"llvm-{i}"] = run(relay.build(mod, target="llvm"), x)
    outs[f"x-{i}"], outs[f"w-{i}"] = x, w
np.savez(sys.argv[2], **outs)
print("OK")
"""


def run_conv_cases(cases, out_path):
    """Build :func:`conv_case` of each ``(k, in, out channels, size, stride, epilogue)`` for this host
    (AVX-512 VNNI kept) with ``pipelines.int8()`` and run it, in a child process; returns its outputs
    (``got-i``), a plain ``llvm`` build's (``llvm-i``), the inputs (``x-i``, ``w-i``) and the hot loop's
    accumulators (``acc-i``) and broadcasts per dot product (``bcast-i``). Asserts that every output equals
    the plain build's, and numpy's integer convolution where it is int32 (no epilogue)."""
    import json
    import os
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _CONV_CASES_CHILD, os.path.dirname(os.path.dirname(__file__)),
                        str(out_path), json.dumps(cases)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
    outs = np.load(out_path)
    for i, (k, _cin, _cout, _size, stride, epilogue) in enumerate(cases):
        got = outs[f"got-{i}"]
        np.testing.assert_array_equal(got, outs[f"llvm-{i}"], err_msg=str(cases[i]))
        if not epilogue:
            np.testing.assert_array_equal(got, conv_exact(outs[f"x-{i}"], outs[f"w-{i}"], stride, k // 2))
    return outs


def fallback_config(wrapper, target, wkl):
    """``(tile_ow, unroll_kw)`` that ``wrapper`` (an int8 conv fallback wrapper of
    :mod:`tvm_ext.x86.int8_conv`) writes on ``target`` over a fallback setting TVM's knobs: 16-channel
    blocks, ``tile_ow`` the largest divisor of the output width up to 31, ``kw`` rolled. ``wkl`` needs
    the conv workload's width, padl, padr, kernel_w, stride_w, dilation_w and out_filter."""
    from tvm.autotvm.task.space import FallbackConfigEntity, OtherOptionEntity, SplitEntity

    def tvms(cfg, wkl, int32_lanes, num_int8_elements):
        out_w = (wkl.width + wkl.padl + wkl.padr - ((wkl.kernel_w - 1) * wkl.dilation_w + 1)) // wkl.stride_w + 1
        cfg["tile_oc"] = SplitEntity([-1, 16])
        cfg["tile_ow"] = SplitEntity([-1, max(d for d in range(1, 32) if out_w % d == 0)])
        cfg["unroll_kw"] = OtherOptionEntity(False)

    cfg = FallbackConfigEntity()
    with tvm.target.Target(target):
        wrapper(tvms)(cfg, wkl, 16, 4)
    return cfg["tile_ow"].size[-1], cfg["unroll_kw"].val
