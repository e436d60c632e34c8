"""FoldChannelRepadIntoConv at the three aarch64 classes, run under qemu: exact integer results.

A squeeze-excite's pair of 1x1 int8 convs whose middle channel count the aarch64 block (8) does not divide:
int8 legalization computes the first conv for the next multiple of 8 output channels and slices them back,
and pads the second conv's input channels again. With the pass the second conv reads the first conv's padded
output (its weights are zero on those channels), so no slice/re-pad kernel stands between them. The
requantize between the convs has equal input and output scales (``acc + zp`` clipped to uint8), so numpy
computes the result exactly.
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


@pytest.mark.parametrize("cpu, mid", [("cortex-a72", 10), ("neoverse-n1", 12), ("neoverse-n1", 2),
                                      ("neoverse-v1", 12)])
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
