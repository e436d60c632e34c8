"""Cases shared by the byte-table lookup tests of both CPU back ends (tests/x86/test_byte_table.py,
tests/x86/test_dword_table.py, tests/arm/test_aarch64_byte_table.py): every 8-bit value in turn, a random table
(`random_table`), the lookup alone as Relay (`lookup_module`) and as lowered TIR with and without a table
(`lowered_lookup`, `lowered_without_table`), numpy's lookup (`expected`), and a conv whose epilogue holds a QDQ
SiLU that ``TabulateEightBit`` makes a table lookup."""
import numpy as np
import tvm
from tvm import relay, te

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


def expected(table, x):
    """numpy's ``table[x]`` for 8-bit ``x``, int8 values indexed from -128."""
    return table[x.astype(np.int64) - np.iinfo(x.dtype).min]


def lookup_module(data_dtype, table, shape):
    """``tvm_ext.table_lookup(x, table)`` for an ``x`` of ``shape`` and ``data_dtype``, as a Relay module."""
    from tvm_ext.ops import register_ops, table_lookup

    register_ops()
    x = relay.var("x", shape=shape, dtype=data_dtype)
    return tvm.IRModule.from_expr(relay.Function([x], table_lookup(x, relay.const(table))))


def _lowered(compute, *tensors):
    y = te.compute((64,), compute, name="y")
    s = te.create_schedule(y.op)
    s[y].vectorize(s[y].split(y.op.axis[0], 16)[1])
    return tvm.lower(s, [*tensors, y])


def lowered_lookup():
    """A lowered TIR function gathering 64 bytes from a 256-entry uint8 table, in 16-lane vectors."""
    x = te.placeholder((64,), "uint8", name="x")
    t = te.placeholder((256,), "uint8", name="t")
    return _lowered(lambda i: t[x[i].astype("int32")], x, t)


def lowered_without_table():
    """A lowered TIR function of 16-lane vectors with no table: the passes leave it alone."""
    x = te.placeholder((64,), "uint8", name="x")
    return _lowered(lambda i: x[i] + x[63 - i], x)


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
