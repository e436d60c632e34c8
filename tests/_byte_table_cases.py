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


def conv_silu(dtype="uint8"):
    """uint8 x int8 3x3 conv, requantized, then a QDQ SiLU (``TabulateEightBit`` makes it a lookup in the
    conv's kernel), then a 1x1 conv."""
    zp = 3
    x = relay.var("x", shape=(1, 16, 8, 8), dtype=dtype)
    rng = np.random.default_rng(0)
    w = relay.const(rng.integers(-100, 100, (32, 16, 3, 3)).astype("int8"))
    c = relay.qnn.op.conv2d(x, w, relay.const(zp), relay.const(0), relay.const(0.1), relay.const(0.02),
                            kernel_size=(3, 3), channels=32, padding=(1, 1))
    r = relay.qnn.op.requantize(c, relay.const(0.002), relay.const(0), relay.const(0.05), relay.const(zp),
                                out_dtype=dtype)
    d = relay.qnn.op.dequantize(r, relay.const(0.05), relay.const(zp))
    s = relay.qnn.op.quantize(relay.sigmoid(d), relay.const(1 / 256), relay.const(0), out_dtype=dtype)
    m = relay.multiply(d, relay.qnn.op.dequantize(s, relay.const(1 / 256), relay.const(0)))
    q = relay.qnn.op.quantize(m, relay.const(0.04), relay.const(zp), out_dtype=dtype)
    w2 = relay.const(rng.integers(-100, 100, (16, 32, 1, 1)).astype("int8"))
    out = relay.qnn.op.conv2d(q, w2, relay.const(zp), relay.const(0), relay.const(0.04), relay.const(0.02),
                              kernel_size=(1, 1), channels=16)
    return infer(relay.Function([x], out))
