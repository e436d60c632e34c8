"""tvm_ext.x86.block_vectors: injective ops and global pools over a 24-channel block (``block_vector_lanes``) in
8-lane vectors, not TVM's 16 with a tail; other blocks keep TVM's vectors. Compiled at AVX2 and AVX-512 VNNI,
executed at the host's class against a plain ``llvm`` build (no change may alter a value)."""
import re

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.contrib import graph_executor

from tvm_ext.x86 import int8_conv as x86_int8
from tvm_ext.x86.block_vectors import vector_lanes
from tvm_ext.x86.isa import runs_on_host


@pytest.mark.parametrize("block,expected", [(24, 8), (40, 8), (56, 8), (16, None), (8, None), (12, None),
                                            (32, None), (20, None), (4, None)])
def test_vector_lanes(block, expected):
    assert vector_lanes(block) == expected


def _graph(block, channels=48, pool=False):
    """uint8 NCHW[block]c -> int32, minus a zero point, fixed-point multiply, plus a constant (a requantize as
    the int8 pipeline leaves it), then optionally a global average pool."""
    x = relay.var("x", shape=(1, channels // block, 20, 20, block), dtype="uint8")
    y = relay.fixed_point_multiply(relay.cast(x, "int32") - relay.const(3), 1395864371, -3) + relay.const(5)
    if pool:
        y = relay.nn.global_avg_pool2d(y, layout=f"NCHW{block}c")
    return tvm.IRModule.from_expr(relay.Function([x], y))


def _build(mod, target, ours=True):
    with x86_int8.kernels(schedule=ours), tvm.transform.PassContext(opt_level=3):
        return relay.build(mod, target=target)


def _run(lib, x):
    m = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    m.set_input("x", x)
    m.run()
    return m.get_output(0).numpy()


@pytest.mark.parametrize("target", ["llvm -mcpu=x86-64-v3", "llvm -mcpu=x86-64-v4 -mattr=+avx512vnni"])
@pytest.mark.parametrize("pool", [False, True])
def test_block_of_24_takes_whole_vectors(target, pool):
    """Compiled: over a block of 24, TVM's injective schedule gathers bytes one at a time at AVX-512 (``vpinsrb``);
    with the change no byte insertions or gathers are left at either class (the pool's division by the window
    stays TVM's scalar loop), and a block of 16 compiles as TVM's."""
    stock = _build(_graph(24, pool=pool), target, ours=False).get_lib().get_source("asm")
    ours = _build(_graph(24, pool=pool), target).get_lib().get_source("asm")
    # byte insertions and gathers: the sum's or the elementwise op's loads taken one lane at a time
    gathers = r"\b(vpinsrb|vpgatherdd)\b"
    if not pool and "avx512" in target:
        assert re.search(gathers, stock), "TVM's split by 16 gathers over a block of 24"
    assert not re.search(gathers, ours)
    same16 = [_build(_graph(16, pool=pool), target, ours=o).get_lib().get_source("asm") for o in (False, True)]
    if not pool:  # the pool's own vectorizer (global_pool_channel_vector) changes the 16 block's pool too
        assert same16[0] == same16[1]


@pytest.mark.parametrize("pool", [False, True])
@pytest.mark.parametrize("block", [24, 8])
def test_values_unchanged(block, pool):
    """Executed at the host's class (AVX2 code runs on every supported host): equal to a plain ``llvm`` build."""
    target = "llvm -mcpu=x86-64-v3"
    if not runs_on_host(target):
        pytest.skip("host lacks AVX2")
    mod = _graph(block, pool=pool)
    x = np.random.default_rng(block).integers(0, 256, (1, 48 // block, 20, 20, block)).astype("uint8")
    with tvm.transform.PassContext(opt_level=3):
        want = _run(relay.build(mod, target="llvm"), x)
    np.testing.assert_array_equal(_run(_build(mod, target), x), want)
