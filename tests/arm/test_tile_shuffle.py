"""tvm_ext.arm.tile_shuffle: constant-index gathers from a local tile as shuffles of whole vectors.

The pass only moves data, so it is checked where it runs: a TE tile regrouped as the ``smmla`` conv
regroups its 2 x 2 blocks, built for this host's ``llvm`` and executed, against numpy indexing; the
lowered IR shows the shuffle (the test fails if the pass does nothing). The aarch64 back end adds it
at the class with the ``smmla`` conv only.
"""
import numpy as np
import pytest
import tvm
from tvm import te, tir

from tvm_ext.arm import tile_shuffle
from tvm_ext.arm.backend import AArch64
from tvm_ext.backend import BuildRequest

SHAPE = (3, 2, 4, 2, 2)  # rows, pixel pairs, channel pairs, pixel, channel


def _regroup(scope="local"):
    """``out[n, x, c] = 3 * A[n, x // 2, c // 2, x % 2, c % 2] + 1`` through a tile in ``scope``."""
    a = te.placeholder(SHAPE, "int32", name="A")
    tile = te.compute(SHAPE, lambda n, x2, c2, p, q: a[n, x2, c2, p, q] * 3 + 1, name="tile")
    out = te.compute((SHAPE[0], 4, 8), lambda n, x, c: tile[n, x // 2, c // 2, x % 2, c % 2], name="out")
    s = te.create_schedule(out.op)
    s[tile].set_scope(scope)
    n, x, c = s[out].op.axis
    s[out].unroll(x)
    s[out].vectorize(c)
    if scope == "local":
        s[tile].compute_at(s[out], n)
    return s, a, out


def _shuffles(mod) -> int:
    found = []
    tir.stmt_functor.post_order_visit(mod["main"].body,
                                      lambda e: found.append(e) if isinstance(e, tir.Shuffle) else None)
    return len(found)


def _reference(a):
    x, c = np.arange(4)[:, None], np.arange(8)[None, :]
    return (3 * a.astype(np.int64) + 1)[:, x // 2, c // 2, x % 2, c % 2]


def test_regrouped_tile_is_exact_on_the_host():
    s, a, out = _regroup()
    with tvm.transform.PassContext(config=tile_shuffle.lower_config()):
        mod = tvm.lower(s, [a, out])
        func = tvm.build(s, [a, out], "llvm")
    assert _shuffles(mod) == 4  # each gather: one shuffle of 4 aligned 4-lane loads
    x = np.random.default_rng(0).integers(-2**28, 2**28, SHAPE).astype("int32")
    y = tvm.nd.empty((SHAPE[0], 4, 8), "int32")
    func(tvm.nd.array(x), y)
    np.testing.assert_array_equal(y.numpy(), _reference(x))


def test_a_global_tile_is_left_alone():
    s, a, out = _regroup("global")
    with tvm.transform.PassContext(config=tile_shuffle.lower_config()):
        assert _shuffles(tvm.lower(s, [a, out])) == 0


def test_constant_lanes():
    ramp = tir.Ramp(0, 1, 8)
    two = tir.Broadcast(tir.const(2, "int32"), 8)
    pairs = tir.FloorDiv(ramp, two) * tir.Broadcast(4, 8)
    index = tir.Broadcast(tir.const(16, "int32"), 8) + pairs + tir.FloorMod(ramp, two)
    assert tile_shuffle.constant_lanes(index, 8) == [16, 17, 20, 21, 24, 25, 28, 29]
    assert tile_shuffle.constant_lanes(tir.Ramp(tir.Var("i", "int32"), 1, 8), 8) is None


@pytest.mark.parametrize("cpu, mattr, added", [("neoverse-v2", "+neon,+dotprod,+i8mm", True),
                                               ("neoverse-n1", "+neon,+dotprod", False)])
def test_the_aarch64_back_end_adds_it_with_the_smmla_conv(cpu, mattr, added):
    target = tvm.target.Target(f"llvm -mtriple=aarch64-linux-gnu -mcpu={cpu} -mattr={mattr}")
    plan = AArch64().plan(BuildRequest(target=target, mod=None, kernels=True, eight_bit=True))
    passes = (plan.configure({}) or {}).get("tir.add_lower_pass", [])
    assert any(p[1].info.name == tile_shuffle.PASS_NAME for p in passes) is added


def _gather_func(size: int):
    """A local buffer of ``size`` int32 read at lanes 0, 1, 4, 5."""
    a = tir.decl_buffer((size,), "int32", name="A")
    b = tir.decl_buffer((4,), "int32", name="B")
    tile = tir.decl_buffer((size,), "int32", name="tile", scope="local")
    i = tir.Var("i", "int32")
    ramp = tir.Ramp(0, 1, 4)
    two = tir.Broadcast(tir.const(2, "int32"), 4)
    index = tir.FloorDiv(ramp, two) * tir.Broadcast(4, 4) + tir.FloorMod(ramp, two)
    body = tir.SeqStmt([tir.For(i, 0, size, tir.ForKind.SERIAL, tir.BufferStore(tile, tir.BufferLoad(a, [i]), [i])),
                        tir.BufferStore(b, tir.BufferLoad(tile, [index]), [tir.Ramp(0, 1, 4)])])
    body = tir.Allocate(tile.data, "int32", [size], tir.const(True), tir.DeclBuffer(tile, body))
    return tir.PrimFunc([a, b], body, buffer_map={}).with_attr("global_symbol", "main")


@pytest.mark.parametrize("size, rewritten", [(8, True), (6, False)])
def test_only_whole_vectors_inside_the_buffer_are_read(size, rewritten):
    func = _gather_func(size)
    mod = tile_shuffle.LocalGatherAsShuffle()(tvm.IRModule({"main": func}))
    assert (_shuffles(mod) == 1) is rewritten
