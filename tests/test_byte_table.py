"""``tvm_ext._byte_table``: which vector loads are byte-table lookups, and the rewrite's shape.

The index forms ``tvm_ext.table_lookup`` lowers to (uint8 and int8 data, with and without the clamps
TVM's simplifier leaves) are accepted with their offset; clamps that would change an index, other
offsets, wider sources and non-constant terms are refused with the reason. The pass, given a lookup
that reads the table through :func:`table_bytes`, rewrites a gather into it and nothing else: no
change on a function without a 256-entry byte table, a second run changes nothing. The back ends'
lookups are checked where they run: tests/x86/test_byte_table.py, tests/arm/test_aarch64_byte_table.py.
"""
import numpy as np
import pytest
import tvm
from tvm import te, tir

from tvm_ext import _byte_table as bt


def _vec(dtype, lanes=16):
    buf = tir.decl_buffer((64,), dtype, name="x")
    return tir.BufferLoad(buf, [tir.Ramp(tir.const(0, "int32"), tir.const(1, "int32"), lanes)])


def _b(v, lanes=16):
    return tir.Broadcast(tir.const(v, "int32"), lanes)


@pytest.mark.parametrize("dtype, offset, clamps", [
    ("uint8", 0, ()), ("uint8", 0, (("min", 255),)), ("int8", 128, (("min", 255), ("max", 0))),
    ("int8", 128, ()), ("uint8", 0, (("min", 300), ("max", -4))),
])
def test_accepted_index_forms(dtype, offset, clamps):
    x = _vec(dtype)
    e = tir.Cast("int32x16", x)
    if offset:
        e = e + _b(offset)
    for kind, c in clamps:
        e = tir.Min(e, _b(c)) if kind == "min" else tir.Max(e, _b(c))
    found = bt.byte_index(e)
    assert not isinstance(found, str), found
    assert found[0].same_as(x) and found[1] == offset


@pytest.mark.parametrize("make, why", [
    (lambda: tir.Min(tir.Cast("int32x16", _vec("uint8")), _b(200)), "clamp to 200"),
    (lambda: tir.Cast("int32x16", _vec("int8")), "spans [-128, 127]"),
    (lambda: tir.Cast("int32x16", _vec("uint8")) + _b(1), "spans [1, 256]"),
    (lambda: tir.Cast("int32x16", _vec("int16")), "not an 8-bit integer type"),
    (lambda: tir.Cast("int32x16", _vec("uint8")) + tir.Cast("int32x16", _vec("uint8")), "not a constant"),
    (lambda: _vec("int32"), "not a widened 8-bit value"),
    (lambda: tir.Cast("int8x16", _vec("uint8")), "not a widened 8-bit value"),
])
def test_refused_index_forms(make, why):
    found = bt.byte_index(make())
    assert isinstance(found, str) and why in found


def _lookup_func(dtype="uint8", table_size=256, lanes=16, table_dtype="uint8"):
    """A PrimFunc computing ``table[int32(x) + offset]`` over 64 elements, vectorised by ``lanes``."""
    x = te.placeholder((64,), dtype, name="x")
    t = te.placeholder((table_size,), table_dtype, name="t")
    off = 128 if dtype == "int8" else 0
    y = te.compute((64,), lambda i: t[x[i].astype("int32") + off], name="y")
    s = te.create_schedule(y.op)
    _, inner = s[y].split(y.op.axis[0], lanes)
    s[y].vectorize(inner)
    return tvm.lower(s, [x, t, y])


def _marker(table, idx):
    """A lookup standing for a back end's: the table's first 16 bytes plus the index (the shape only)."""
    return bt.table_bytes(table, 0, 16) + idx if str(table.dtype) == "uint8" else bt.table_bytes(table, 0, 16)


def _gathers(func):
    found = []
    tir.stmt_functor.post_order_visit(func.body, lambda n: found.append(n) if isinstance(n, tir.BufferLoad)
                                      and n.buffer.name == "t" and not isinstance(n.indices[0], tir.Ramp) else None)
    return found


def test_rewrites_the_gather_and_is_idempotent():
    mod = _lookup_func()
    assert _gathers(mod["main"])
    p = bt.ByteTableLookup("test.ByteTableLookup", _marker, 16)
    once = p(mod)
    assert not _gathers(once["main"])
    text = once["main"].script()
    assert "t[0:16]" in text, text
    tvm.ir.assert_structural_equal(p(once), once)


@pytest.mark.parametrize("lanes", [8, 32])
def test_slices_and_joins_other_lane_counts(lanes):
    """8 lanes: one slice padded to 16; 32 lanes: two slices joined."""
    once = bt.ByteTableLookup("test.ByteTableLookup", _marker, 16)(_lookup_func(lanes=lanes))
    assert not _gathers(once["main"])
    assert "T.Shuffle" in once["main"].script()


@pytest.mark.parametrize("kw", [{"table_size": 128}, {"lanes": 1}, {"table_dtype": "int32"}])
def test_unchanged_without_a_byte_table_gather(kw):
    mod = _lookup_func(**kw)
    out = bt.ByteTableLookup("test.ByteTableLookup", _marker, 16)(mod)
    tvm.ir.assert_structural_equal(out, mod)


@pytest.mark.parametrize("lanes, used", [(24, [16, 8]), (31, [16, 15]), (17, [16, 1])])
def test_slices_pad_with_zeros_and_join_back(lanes, used):
    """The slicing helpers by value: a vector of 24, 31 or 17 lanes as 16-lane slices (the last padded by 8,
    1 or 15 zeros) and back."""
    vals = np.arange(lanes, dtype="uint8") + 1
    x = te.placeholder((lanes,), "uint8", name="x")
    y = te.compute((lanes,), lambda i: x[i], name="y")
    s = te.create_schedule(y.op)
    s[y].vectorize(y.op.axis[0])
    func = tvm.lower(s, [x, y])["main"]

    def rebuild(load):
        if load.buffer.name != "x" or not isinstance(load.indices[0], tir.Ramp):
            return None
        pieces = bt.slices(load, lanes, 16)
        assert [n for _, n in pieces] == used
        return bt.joined(pieces, lanes)

    body = tir.stmt_functor.ir_transform(func.body, None, rebuild, ["tir.BufferLoad"])
    f = tvm.build(tvm.IRModule({"main": func.with_body(body)}), target="llvm")
    a, b = tvm.nd.array(vals), tvm.nd.empty((lanes,), "uint8")
    f(a, b)
    np.testing.assert_array_equal(b.numpy(), vals)


def _count_fences(func):
    found = []
    tir.stmt_functor.post_order_visit(func.body, lambda n: found.append(n) if isinstance(n, tir.Evaluate)
                                      and isinstance(n.value, tir.Call) and "fence" in str(n.value) else None)
    return len(found)


def _fence():
    return tir.Evaluate(tir.call_extern("int32", "fence"))


def test_fence_first_in_the_innermost_loop_of_the_lookups():
    """Rows of 64, vectorised by 16: the row loop holds the lookups' stores, so it gets the fence once;
    the outer loop over rows and a function without a lookup get none; a second run adds none."""
    x = te.placeholder((4, 64), "uint8", name="x")
    t = te.placeholder((256,), "uint8", name="t")
    y = te.compute((4, 64), lambda r, i: t[x[r, i].astype("int32")], name="y")
    s = te.create_schedule(y.op)
    s[y].vectorize(s[y].split(y.op.axis[1], 16)[1])
    mod = tvm.lower(s, [x, t, y])
    p = bt.ByteTableLookup("test.ByteTableLookup", _marker, 16, fence=_fence)
    once = p(mod)
    assert _count_fences(once["main"]) == 1
    loops = []
    tir.stmt_functor.post_order_visit(once["main"].body, lambda n: loops.append(n) if isinstance(n, tir.For) else None)
    inner = loops[0]  # post-order: the innermost loop first
    assert isinstance(inner.body, tir.SeqStmt) and _count_fences(tvm.tir.PrimFunc([], inner.body[0])) == 1
    assert _count_fences(tvm.tir.PrimFunc([], loops[-1].body)) == 1  # only the one inside
    tvm.ir.assert_structural_equal(p(once), once)
    plain = _lookup_func(table_size=128)
    tvm.ir.assert_structural_equal(p(plain), plain)
