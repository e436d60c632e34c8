"""``tile_chains``: on AVX-512 VNNI a 3x3/7x7 int8 conv whose row tile has fewer independent accumulators
than ``vpdpbusd``'s latency x throughput (:attr:`KernelPolicy.dot_chains`) is computed per tile of several
output-channel blocks.

The choice per shape; the compiled loop's accumulators and llvm-mca's share at Cascade Lake (compiled
only); on a host with AVX-512 VNNI, executed in a child process against numpy's integer convolution
(int32 out) and a plain ``llvm`` build (requantized to uint8).
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from tvm_ext.x86 import int8_policy, tile_rules

from ._int8_cases import needs_vnni


@pytest.mark.parametrize("pixels,groups,oc_chunks,expected", [
    (7, 1, 32, 2),    # a 7-pixel row tile: 14 accumulators with 2 blocks
    (14, 1, 16, 1),   # 14 already
    (7, 1, 3, 3),     # 2 does not divide 3 blocks: 3 (21 accumulators)
    (5, 1, 8, 2),     # 10 with 2
    (3, 1, 8, 4),     # 12 with 4 (3 x 4 + 3 kernel vectors <= 28)
    (7, 1, 1, 1),     # one block: nothing to add
    (7, 1, 7, 1),     # 7 blocks: no divisor up to 4 but 1
    (1, 1, 16, 4),    # one pixel: as many as fit the policy's 4, still under 10
])
def test_tile_chains_choice(pixels, groups, oc_chunks, expected):
    got = tile_rules.tile_chains(pixels, groups, oc_chunks, chains=10, max_chunks=4, accumulators=28)
    assert got == expected
    assert oc_chunks % got == 0
    assert pixels * groups * got + (got - 1) * groups <= 28


def test_only_vnni_asks_for_chains():
    assert int8_policy.policy("llvm -mcpu=cascadelake").dot_chains == 10
    assert int8_policy.policy("llvm -mcpu=znver4").dot_chains == 10
    assert int8_policy.policy("llvm -mcpu=x86-64-v3").dot_chains == 0
    assert int8_policy.policy("llvm -mcpu=x86-64-v4").dot_chains == 0


def _conv(k, cin, cout, size, stride, epilogue, seed=0):
    """uint8 x int8 conv (padding k // 2), full-range weights (-128 included); int32 out, or requantized."""
    import tvm
    from tvm import relay

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


@pytest.mark.parametrize("cin,cout,size,stride", [(128, 128, 28, 1), (512, 512, 7, 1), (256, 256, 28, 2)],
                         ids=["28x28", "7x7", "stride2"])
def test_chained_tile_at_cascadelake(cin, cout, size, stride):
    """Compiled for Cascade Lake (not run), as ``benchmarks/kernel_mca.py`` builds them (with the shipped
    records): ResNet-50's 3x3 convs whose tuned row tile is 7 pixels have >= 10 accumulators in their
    hot loop and >= 85% of llvm-mca's vpdpbusd peak (7 accumulators and 70% with one block per tile)."""
    from tvm_ext.tools import mca

    try:
        mca.llvm_mca_path()
    except mca.McaError as err:
        pytest.skip(str(err))
    (kernel,) = mca.analyze(mca.single_conv(mca.ConvShape(cin, cout, size, 3, stride)), cpu="cascadelake").kernels
    assert kernel.hot.accumulators >= 10, kernel.hot.text
    assert kernel.share >= 0.85, (kernel.share, kernel.mca.bound)


#: (k, in, out channels, size, stride, epilogue): 7-wide rows (2 blocks; 3 blocks for 48 channels), a
#: stride-2 7-wide output, 5-pixel rows of a 5x5 kernel, and a 13-wide row that needs none
_CASES = ((3, 64, 64, 7, 1, False), (3, 32, 48, 7, 1, True), (3, 32, 64, 14, 2, False), (5, 16, 32, 5, 1, True),
          (3, 64, 32, 13, 1, False))

_CHILD = r"""
import sys, numpy as np, tvm, tvm_ext
from tvm import relay
sys.path.insert(0, sys.argv[1])
from x86.test_tile_chains import _CASES, _conv
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
for i, (k, cin, cout, size, stride, epilogue) in enumerate(_CASES):
    mod, w = _conv(k, cin, cout, size, stride, epilogue)
    x = np.random.default_rng(i).integers(0, 256, (1, cin, size, size)).astype("uint8")
    x.reshape(-1)[::7] = 255
    lib = tvm_ext.build(mod, target=host_target(allow_vnni=True), passes=pipelines.int8())
    funcs = _asm.parse(lib.get_lib().get_source("asm"))
    hot = [_asm.hot_loop(n, funcs, f) for n, f in _asm.kernels(funcs).items()]
    outs[f"acc-{i}"] = np.array(max(h.accumulators for h in hot if h))
    outs[f"got-{i}"] = run(lib, x)
    with tvm.transform.PassContext(opt_level=3):
        outs[f"llvm-{i}"] = run(relay.build(mod, target="llvm"), x)
    outs[f"x-{i}"], outs[f"w-{i}"] = x, w
np.savez(sys.argv[2], **outs)
print("OK")
"""


def _conv_exact(x, w, stride, pad):
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


@needs_vnni
def test_chained_tiles_are_exact(tmp_path):
    """Executed on this host's AVX-512 VNNI (child process): int32 outputs equal numpy's integer
    convolution, requantized ones a plain ``llvm`` build's; every case's loop holds >= 10 accumulators
    (the 13-wide one without extra blocks)."""
    out = tmp_path / "outs.npz"
    r = subprocess.run([sys.executable, "-c", _CHILD, os.path.dirname(os.path.dirname(__file__)), str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
    outs = np.load(out)
    for i, (k, _cin, _cout, _size, stride, epilogue) in enumerate(_CASES):
        got = outs[f"got-{i}"]
        np.testing.assert_array_equal(got, outs[f"llvm-{i}"], err_msg=str(_CASES[i]))
        if not epilogue:
            np.testing.assert_array_equal(got, _conv_exact(outs[f"x-{i}"], outs[f"w-{i}"], stride, k // 2))
        assert int(outs[f"acc-{i}"]) >= 10, (_CASES[i], int(outs[f"acc-{i}"]))
