"""FoldChannelRepadIntoConv at the three aarch64 classes, run under qemu: exact integer results.

A squeeze-excite's pair of 1x1 int8 convs whose middle channel count the aarch64 block (8) does not divide:
int8 legalization computes the first conv for the next multiple of 8 output channels and slices them back,
and pads the second conv's input channels again. With the pass the second conv reads the first conv's padded
output (its weights are zero on those channels), so no slice/re-pad kernel stands between them. The
requantize between the convs has equal input and output scales (``acc + zp`` clipped to uint8), so numpy
computes the result exactly.

A whole squeeze-excite block (1x1 conv, global pool, the pair of 1x1 convs on the pooled map) checks that at
Neoverse-V1 the dot-product convs after the pool read the matrix-multiply conv's NCHW8c; its oracle is the
plain ``llvm`` build (exact integer arithmetic, no int8 SIMD), run on the host.
"""
import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.testing.aarch64 import TARGETS, run_on_session

from _cases import X_ZP

MID_ZP = 61  # the first conv's output zero point, the second conv's input zero point


def se_pair(rng, mid, channels=16, size=4):
    """uint8 x -> 1x1 conv to ``mid`` -> requantize at equal scales -> 1x1 conv to ``channels`` -> int32.
    Returns (module, x, w1, w2)."""
    x = rng.integers(X_ZP - 12, X_ZP + 13, (1, channels, size, size)).astype("uint8")
    w1 = rng.integers(-6, 7, (mid, channels, 1, 1)).astype("int8")  # keeps most sums inside uint8 after + zp
    w2 = rng.integers(-127, 128, (channels, mid, 1, 1)).astype("int8")
    var = relay.var("x", shape=x.shape, dtype="uint8")
    y = relay.qnn.op.conv2d(var, relay.const(w1), relay.const(X_ZP), relay.const(0), relay.const(0.02),
                            relay.const(0.01), kernel_size=(1, 1), channels=mid, out_dtype="int32")
    y = relay.qnn.op.requantize(y, relay.const(0.0002), relay.const(0), relay.const(0.0002), relay.const(MID_ZP),
                                out_dtype="uint8")
    y = relay.qnn.op.conv2d(y, relay.const(w2), relay.const(MID_ZP), relay.const(0), relay.const(0.0002),
                            relay.const(0.01), kernel_size=(1, 1), channels=channels, out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([var], y)), x, w1, w2


def se_pair_reference(x, w1, w2):
    acc = np.einsum("nchw,oc->nohw", x.astype(np.int64) - X_ZP, w1[:, :, 0, 0].astype(np.int64))
    y = np.clip(acc + MID_ZP, 0, 255)
    return np.einsum("nchw,oc->nohw", y - MID_ZP, w2[:, :, 0, 0].astype(np.int64)).astype(np.int32)


# Slow: the pair at +dotprod and +i8mm (12 middle channels, and 2 re-padded to 4), whose fold
# test_squeeze_excite_block_exact_under_qemu checks at those classes in the default tier (no slice or re-pad
# kernel between the convs, bit-exact): [neoverse-n1-12-True] and [neoverse-v1-2-False]
@pytest.mark.parametrize("cpu, mid", [("cortex-a72", 10), pytest.param("neoverse-n1", 12, marks=pytest.mark.slow),
                                      pytest.param("neoverse-n1", 2, marks=pytest.mark.slow),
                                      pytest.param("neoverse-v1", 12, marks=pytest.mark.slow)])
def test_se_pair_without_repad_kernel_exact_under_qemu(cpu, mid, arm_session, tmp_path):
    mod, x, w1, w2 = se_pair(np.random.default_rng(mid), mid)
    ref = se_pair_reference(x, w1, w2)
    acc = np.einsum("nchw,oc->nohw", x.astype(np.int64) - X_ZP, w1[:, :, 0, 0].astype(np.int64))
    assert np.mean((acc + MID_ZP >= 0) & (acc + MID_ZP <= 255)) > 0.5  # most middle values not clipped
    factory = tvm_ext.build(mod, target=TARGETS[cpu], passes=pipelines.int8())
    report = factory.kernel_report
    assert not [k.ops for k in report.kernels if "strided_slice" in k.ops or "nn.pad" in k.ops], report.table()
    (out,) = run_on_session(arm_session, factory, {"x": x}, tmp_path, f"se_pair_{cpu}_{mid}")
    np.testing.assert_array_equal(out, ref, err_msg=f"squeeze-excite pair ({mid} middle channels) at {TARGETS[cpu]}")


def squeeze_excite(rng, mid, channels=32, size=6, batch=2, per_channel=False):
    """uint8 x -> 1x1 conv -> global average pool (int32) -> 1x1 conv to ``mid`` -> 1x1 conv back to int32,
    the first two convs requantized to uint8: a squeeze-excite block's convs (at Neoverse-V1 the first takes
    the matrix multiply, the two on the pooled 1x1 map the dot product, reading its NCHW8c).
    ``per_channel``: the conv to ``mid`` is requantized per output channel (fixed_point_multiply_per_axis
    at aarch64), as with per-channel weight scales. Returns (module, x)."""
    x = rng.integers(0, 256, (batch, channels, size, size)).astype("uint8")

    def conv(y, cin, cout, zp_in):
        w = relay.const(rng.integers(-127, 128, (cout, cin, 1, 1)).astype("int8"))
        y = relay.qnn.op.conv2d(y, w, relay.const(zp_in), relay.const(0), relay.const(0.02), relay.const(0.01),
                                kernel_size=(1, 1), channels=cout, out_dtype="int32")
        return relay.nn.bias_add(y, relay.const(rng.integers(-2000, 2000, cout).astype("int32")))

    def requantize(y, scale, cout=None):
        in_scale = rng.uniform(0.0001, 0.0003, cout).astype("float32") if cout else 0.0002
        return relay.qnn.op.requantize(y, relay.const(in_scale), relay.const(0), relay.const(scale),
                                       relay.const(MID_ZP), axis=1, out_dtype="uint8")

    var = relay.var("x", shape=x.shape, dtype="uint8")
    y = requantize(conv(var, channels, channels, X_ZP), 0.1)
    y = relay.cast(relay.nn.global_avg_pool2d(relay.cast(y, "int32")), "uint8")
    y = conv(requantize(conv(y, channels, mid, MID_ZP), 0.01, mid if per_channel else None), mid, channels, MID_ZP)
    return tvm.IRModule.from_expr(relay.Function([var], y)), x


# CI runs Neoverse-V1 with 2 middle channels: the pooled map read as NCHW8c and the 2 channels padded to 8, the
# two paths the +i8mm policy adds; and Neoverse-N1 with 12 per-channel requantized (3 of 4 NCHW4c blocks kept);
# the other cases (20 s each under qemu) are slow
@pytest.mark.parametrize("cpu, mid, per_channel", [
    ("neoverse-v1", 2, False), pytest.param("neoverse-v1", 12, False, marks=pytest.mark.slow),
    pytest.param("neoverse-n1", 2, False, marks=pytest.mark.slow),
    pytest.param("cortex-a72", 12, False, marks=pytest.mark.slow),
    ("neoverse-n1", 12, True), pytest.param("neoverse-v1", 12, True, marks=pytest.mark.slow),
    pytest.param("cortex-a72", 10, True, marks=pytest.mark.slow)])
def test_squeeze_excite_block_exact_under_qemu(cpu, mid, per_channel, arm_session, tmp_path):
    """The squeeze-excite convs read one channel block (NCHW8c at V1, no layout change or slice/re-pad kernel
    between them) and compute what the plain ``llvm`` build (no int8 SIMD) computes, bit for bit."""
    from tvm.contrib import graph_executor

    mod, x = squeeze_excite(np.random.default_rng(mid), mid, per_channel=per_channel)
    with tvm.transform.PassContext(opt_level=3):
        host = graph_executor.GraphModule(relay.build(mod, target="llvm")["default"](tvm.cpu()))
    host.set_input("x", x)
    host.run()
    ref = host.get_output(0).numpy()
    assert len(np.unique(ref)) > ref.size // 2, ref.ravel()  # the middle channels are not clipped flat
    factory = tvm_ext.build(mod, target=TARGETS[cpu], passes=pipelines.int8())
    kernels = factory.kernel_report.kernels
    convs = [i for i, k in enumerate(kernels) if any("conv2d" in op for op in k.ops)]
    assert not [k.ops for k in kernels[convs[0]:convs[-1] + 1]
                if {"layout_transform", "strided_slice", "nn.pad"} & set(k.ops)], [k.ops for k in kernels]
    (out,) = run_on_session(arm_session, factory, {"x": x}, tmp_path, f"squeeze_excite_{cpu}_{mid}_{per_channel}")
    np.testing.assert_array_equal(out, ref, err_msg=f"squeeze-excite block ({mid} middle channels) at {TARGETS[cpu]}")
