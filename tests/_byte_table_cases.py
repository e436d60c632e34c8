"""Cases shared by the byte-table lookup tests of both CPU back ends (tests/x86/test_byte_table.py,
tests/arm/test_aarch64_byte_table.py): every 8-bit value in turn, a random table (`random_table`), and a conv whose
epilogue holds a QDQ SiLU that ``TabulateEightBit`` makes a table lookup."""
import numpy as np
from tvm import relay

from tvm_ext.testing import infer


def values(dtype, shape):
    """``shape`` filled with the 8-bit values of ``dtype`` in turn, each at least once where it holds 256."""
    info = np.iinfo(dtype)
    n = int(np.prod(shape))
    return (np.arange(n) % 256 + info.min).astype(dtype).reshape(shape)


def random_table(dtype, seed=1):
    """256 random entries of ``dtype``."""
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max + 1, 256).astype(dtype)


def conv_silu(in_channels=16, channels=32, size=8, kernel=3, tail=True):
    """uint8 x int8 ``kernel`` x ``kernel`` conv (same padding), requantized, then a QDQ SiLU
    (``TabulateEightBit`` makes it a lookup in the conv's kernel), then (``tail``) a 1x1 conv back to
    ``in_channels``."""
    zp = 3
    x = relay.var("x", shape=(1, in_channels, size, size), dtype="uint8")
    rng = np.random.default_rng(0)
    w = relay.const(rng.integers(-100, 100, (channels, in_channels, kernel, kernel)).astype("int8"))
    c = relay.qnn.op.conv2d(x, w, relay.const(zp), relay.const(0), relay.const(0.1), relay.const(0.02),
                            kernel_size=(kernel, kernel), channels=channels, padding=(kernel // 2, kernel // 2))
    r = relay.qnn.op.requantize(c, relay.const(0.002), relay.const(0), relay.const(0.05), relay.const(zp),
                                out_dtype="uint8")
    d = relay.qnn.op.dequantize(r, relay.const(0.05), relay.const(zp))
    s = relay.qnn.op.quantize(relay.sigmoid(d), relay.const(1 / 256), relay.const(0), out_dtype="uint8")
    m = relay.multiply(d, relay.qnn.op.dequantize(s, relay.const(1 / 256), relay.const(0)))
    out = relay.qnn.op.quantize(m, relay.const(0.04), relay.const(zp), out_dtype="uint8")
    if tail:
        w2 = relay.const(rng.integers(-100, 100, (in_channels, channels, 1, 1)).astype("int8"))
        out = relay.qnn.op.conv2d(out, w2, relay.const(zp), relay.const(0), relay.const(0.04), relay.const(0.02),
                                  kernel_size=(1, 1), channels=in_channels)
    return infer(relay.Function([x], out))
