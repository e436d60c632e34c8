"""Integer layers and their exact results (numpy, int64) for the aarch64 tier's tests."""
import numpy as np
import tvm
from tvm import relay

X_ZP = 77  # not 0 and not 128: a kernel that drops or mis-shifts it differs


def qnn_conv(rng, channels=64, size=8):
    """uint8 x int8 -> int32 3x3 conv, padding 1 (qnn pads with the input zero point).
    TVM 0.19's arm_cpu int8 conv strategies need at least 64 input channels (tvm_ext.arm.int8_conv lifts it)."""
    x = rng.integers(0, 256, (1, channels, size, size)).astype("uint8")
    w = rng.integers(-127, 128, (channels, channels, 3, 3)).astype("int8")
    w[0, 0] = 127
    w[1, 0] = -127  # both ends of the range present
    var = relay.var("x", shape=x.shape, dtype="uint8")
    y = relay.qnn.op.conv2d(var, relay.const(w), relay.const(X_ZP), relay.const(0), relay.const(0.02),
                            relay.const(0.01), kernel_size=(3, 3), channels=channels, padding=(1, 1),
                            out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([var], y)), x, w


def conv_reference(x, w):
    xs = np.pad(x.astype(np.int64) - X_ZP, ((0, 0), (0, 0), (1, 1), (1, 1)))  # padded zero point -> 0
    n, c, h, wd = x.shape
    out = np.zeros((n, w.shape[0], h, wd), np.int64)
    for ky in range(3):
        for kx in range(3):
            out += np.einsum("nchw,oc->nohw", xs[:, :, ky:ky + h, kx:kx + wd], w[:, :, ky, kx].astype(np.int64))
    return out.astype(np.int32)


def qnn_dense(rng, m=4, k=64, n=32):
    x = rng.integers(0, 256, (m, k)).astype("uint8")
    w = rng.integers(-127, 128, (n, k)).astype("int8")
    w[0, :2] = (127, -127)
    var = relay.var("x", shape=x.shape, dtype="uint8")
    y = relay.qnn.op.dense(var, relay.const(w), relay.const(X_ZP), relay.const(0), relay.const(0.02),
                           relay.const(0.01), units=n, out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([var], y)), x, w


def dense_reference(x, w):
    return ((x.astype(np.int64) - X_ZP) @ w.astype(np.int64).T).astype(np.int32)


def conv_nchw_exact(x, w, x_zero_point=0, strides=(1, 1), padding=(0, 0)):
    """Exact int64 NCHW conv of ``x - x_zero_point`` with OIHW ``w`` (padding with the zero point: 0 after)."""
    (sh, sw), (ph, pw) = strides, padding
    xs = np.pad(x.astype(np.int64) - x_zero_point, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    kh, kw = w.shape[2:]
    oh, ow = (xs.shape[2] - kh) // sh + 1, (xs.shape[3] - kw) // sw + 1
    out = np.zeros((x.shape[0], w.shape[0], oh, ow), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            window = xs[:, :, ky:ky + (oh - 1) * sh + 1:sh, kx:kx + (ow - 1) * sw + 1:sw]
            out += np.einsum("nchw,oc->nohw", window, w[:, :, ky, kx].astype(np.int64))
    return out
