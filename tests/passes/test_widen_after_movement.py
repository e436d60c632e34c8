"""Tests of tvm_ext.passes.widen_after_movement (dequantized float inputs of data movement: a detector head)."""
from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.passes.fuse_widening_into_pool import FuseWideningIntoPool
from tvm_ext.passes.widen_after_movement import WidenAfterMovement
from tvm_ext.testing import assert_same_outputs, assert_unchanged, check, infer

from _helpers import assert_unchanged_with_reason, assert_untyped_module_raises

LOGGER = "tvm_ext.passes.WidenAfterMovement"
rng = np.random.default_rng(11)


def _dq(v, zp, scale):
    # DequantizeLinear as Relay lowers it: (cast(v, i32) - zp) * s
    return relay.multiply(relay.cast(relay.subtract(relay.cast(v, "int32"), relay.const(zp)), "float32"),
                          relay.const(scale))


def _u8(name, shape):
    return relay.var(name, shape=shape, dtype="uint8")


# -- rules, one at a time: before / expected -------------------------------------------------------
def test_unary_movement_structure_and_idempotence():
    """reshape(dq(n)) -> dq(reshape(n)): scalar constants stay as they are."""
    n = _u8("n", (1, 6, 4, 4))

    def graph(moved):
        if moved:
            return infer(relay.nn.relu(_dq(relay.reshape(n, (1, 6, 16)), 3, np.float32(0.5))))
        return infer(relay.nn.relu(relay.reshape(_dq(n, 3, np.float32(0.5)), (1, 6, 16))))

    after = check(WidenAfterMovement(), graph(False), graph(True))
    assert_unchanged(WidenAfterMovement(), after)


def test_per_channel_constant_moves_with_the_data():
    """transpose(n * c) -> transpose(n) * c' (c per channel: (6, 1, 1) -> (1, 1, 6) after NCHW->NHWC)."""
    n = _u8("n", (1, 6, 4, 4))
    c = rng.uniform(0.1, 1.0, (6, 1, 1)).astype("float32")
    before = infer(relay.transpose(relay.multiply(relay.cast(n, "float32"), relay.const(c)), (0, 2, 3, 1)))
    expected = infer(relay.multiply(relay.cast(relay.transpose(n, (0, 2, 3, 1)), "float32"),
                                    relay.const(c.reshape(1, 1, 1, 6))))
    check(WidenAfterMovement(), before, expected)


def test_concatenate_merges_the_parts_chains():
    """concat(dq(a, zp 3, s 0.5), dq(b, zp 7, s 0.25), axis=1): one chain on concat(a, b) whose
    constants vary along the concatenated axis only."""
    a, b = _u8("a", (1, 2, 3, 3)), _u8("b", (1, 4, 3, 3))
    before = infer(relay.concatenate([_dq(a, 3, np.float32(0.5)), _dq(b, 7, np.float32(0.25))], axis=1))
    zp = np.array([3] * 2 + [7] * 4, "int32").reshape(1, 6, 1, 1)
    s = np.array([0.5] * 2 + [0.25] * 4, "float32").reshape(1, 6, 1, 1)
    cat = relay.concatenate([a, b], axis=1)
    expected = infer(relay.multiply(relay.cast(relay.subtract(relay.cast(cat, "int32"), relay.const(zp)), "float32"),
                                    relay.const(s)))
    after = check(WidenAfterMovement(), before, expected)
    assert_unchanged(WidenAfterMovement(), after)


def test_split_gives_each_field_its_part():
    """split(n * c)[i] -> split(n)[i] * c_i, c varying along the split axis."""
    n = _u8("n", (1, 6, 2, 2))
    c = rng.uniform(0.1, 1.0, (1, 6, 1, 1)).astype("float32")
    parts = relay.split(relay.multiply(relay.cast(n, "float32"), relay.const(c)), [2], axis=1)
    before = infer(relay.Tuple([relay.exp(parts[0]), relay.sigmoid(parts[1])]))
    sp = relay.split(n, [2], axis=1)
    expected = infer(relay.Tuple([relay.exp(relay.multiply(relay.cast(sp[0], "float32"), relay.const(c[:, :2]))),
                                  relay.sigmoid(relay.multiply(relay.cast(sp[1], "float32"), relay.const(c[:, 2:])))]))
    check(WidenAfterMovement(), before, expected)


def test_clip_form_moves_as_8_bits():
    """n = clip(round(x) + zp, 0, 255) in float: the movement reads cast(n, u8), which is cast back."""
    x = relay.var("x", shape=(1, 4, 3, 3), dtype="float32")
    q = relay.clip(relay.add(relay.round(relay.multiply(x, relay.const(8.0))), relay.const(5.0)), 0.0, 255.0)
    before = infer(relay.exp(relay.reshape(relay.multiply(relay.subtract(q, relay.const(5.0)), relay.const(0.125)),
                                           (1, 36))))
    moved = relay.cast(relay.reshape(relay.cast(q, "uint8"), (1, 36)), "float32")
    expected = infer(relay.exp(relay.multiply(relay.subtract(moved, relay.const(5.0)), relay.const(0.125))))
    check(WidenAfterMovement(), before, expected)


# -- a link of the chain also read by a pool ---------------------------------------------------------
def _shared_with_pool(moved):
    """the widening's first link, cast(n, i32), also read by a global average pool

    ::

        n(u8) -> cast i32 -+-> subtract 128 -> cast f32 -> layout_transform NCHW2c -> relu
                           +-> global_avg_pool2d

    moved: the layout_transform reads n, the chain to relu is a copy; the pool keeps its cast.
    """
    n = _u8("n", (1, 4, 3, 3))
    wide = relay.cast(n, "int32")
    if moved:
        blocked = relay.layout_transform(n, "NCHW", "NCHW2c")
        dq = relay.cast(relay.subtract(relay.cast(blocked, "int32"), relay.const(128)), "float32")
        head = relay.nn.relu(dq)
    else:
        dq = relay.cast(relay.subtract(wide, relay.const(128)), "float32")
        head = relay.nn.relu(relay.layout_transform(dq, "NCHW", "NCHW2c"))
    return infer(head, relay.nn.global_avg_pool2d(wide))


def test_link_shared_with_a_pool_structure():
    after = check(WidenAfterMovement(), _shared_with_pool(False), _shared_with_pool(True))
    assert_unchanged(WidenAfterMovement(), after)


def test_link_shared_with_a_pool_bit_exact():
    before = _shared_with_pool(False)
    stock, ours = tvm_ext.build(before), tvm_ext.build(before, passes=[WidenAfterMovement(), FuseWideningIntoPool()])
    assert ours.kernel_report.num_kernels <= stock.kernel_report.num_kernels
    data = {"n": rng.integers(0, 256, (1, 4, 3, 3)).astype("uint8")}
    out, _ = assert_same_outputs(stock, ours, data, rtol=0, atol=0)
    assert out[0].std() > 0 and out[1].std() > 0


def test_link_shared_with_a_pool_moved_before_the_readers_widen():
    """WidenInEachReader (after this pass) gives the pool a copy of the cast; had the movement
    waited for that, a second run of the three passes would move it: one run does everything."""
    from tvm_ext.passes.widen_in_each_reader import WidenInEachReader

    seq = tvm.transform.Sequential([WidenAfterMovement(), WidenInEachReader(), FuseWideningIntoPool()])
    with tvm.transform.PassContext(opt_level=3):
        once = seq(_shared_with_pool(False))
    assert_unchanged(seq, once)
    blocked = []
    relay.analysis.post_order_visit(once["main"], lambda e: isinstance(e, relay.Call) and isinstance(
        e.op, tvm.ir.Op) and e.op.name == "layout_transform" and blocked.append(e.args[0].checked_type.dtype))
    assert blocked == ["uint8"]


# -- a detector head: concat -> split -> reshape -> transpose -> softmax / sigmoid ----------------
def _head():
    """YOLOv8's head in small: three scales' uint8 outputs (82 = 64 box + 18 class channels in the
    real model; here 8 = 4 + 4), each with its own (scale, zero point), concatenated along the anchors."""
    ins = [_u8(f"scale{i}", (1, 8, m)) for i, m in enumerate((16, 4, 1))]
    deq = [_dq(v, zp, np.float32(s)) for v, zp, s in zip(ins, (141, 120, 97), (0.097, 0.082, 0.070))]
    cat = relay.concatenate(deq, axis=2)  # (1, 8, 21)
    box, cls = relay.split(cat, [4], axis=1)
    dfl = relay.nn.softmax(relay.transpose(relay.reshape(box, (1, 2, 2, 21)), (0, 2, 1, 3)), axis=1)
    return infer(relay.Tuple([dfl, relay.sigmoid(cls)])), ins


def test_head_kernels_crossing_and_outputs():
    """Same kernels; the concatenation's kernel wrote the dequantized float32 box and class
    channels (dequantize_early), now it moves uint8, and no avoidable float32 crossing is left."""
    mod, ins = _head()
    passes = [WidenAfterMovement(), FuseWideningIntoPool()]
    fb, fa = tvm_ext.build(mod), tvm_ext.build(mod, passes=passes)
    rb, ra = fb.kernel_report, fa.kernel_report
    assert ra.num_kernels <= rb.num_kernels
    assert "dequantize_early" in {c.reason for c in rb.float_crossings()}
    assert [c.reason for c in ra.float_crossings() if not c.on_purpose] == []
    assert ra.crossing.total_bytes < rb.crossing.total_bytes
    data = {v.name_hint: rng.integers(0, 256, [int(d) for d in v.type_annotation.shape]).astype("uint8") for v in ins}
    out_b, _ = assert_same_outputs(fb, fa, data, rtol=1e-6, atol=1e-7)
    assert out_b[0].std() > 0 and out_b[1].std() > 0


def test_head_structure_and_idempotence():
    """After the pass every movement reads uint8 and each float reader reads its own dequantize."""
    mod, _ = _head()
    after = WidenAfterMovement()(mod)
    movements = []

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op) and node.op.name in (
                "concatenate", "split", "reshape", "transpose"):
            movements.append(node)

    relay.analysis.post_order_visit(after["main"], visit)
    assert len(movements) == 4
    for m in movements:
        arg = m.args[0]
        dtypes = ([f.checked_type.dtype for f in arg.fields] if isinstance(arg, relay.Tuple)
                  else [arg.checked_type.dtype])
        assert set(dtypes) == {"uint8"}, m.op.name
    assert_unchanged(WidenAfterMovement(), after)


def test_sequence_longer_than_max_rounds_moves_at_once(caplog):
    """MAX_ROUNDS + 4 movements in a row: one run moves the widening past all of them (a second run
    finds nothing), and the outputs are exact."""
    from tvm_ext.passes.widen_after_movement import MAX_ROUNDS

    n = _u8("n", (1, 4, 6))
    v = _dq(n, 3, np.float32(0.5))
    for i in range(MAX_ROUNDS + 4):
        v = relay.transpose(v, (0, 2, 1)) if i % 2 else relay.reshape(v, (1, 6, 4) if i % 4 == 0 else (1, 4, 6))
    mod = infer(relay.exp(v))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        after = WidenAfterMovement()(mod)
    assert "still rewriting" not in caplog.text
    moved = []
    relay.analysis.post_order_visit(after["main"], lambda e: isinstance(e, relay.Call) and isinstance(
        e.op, tvm.ir.Op) and e.op.name in ("reshape", "transpose") and moved.append(e.args[0].checked_type.dtype))
    assert moved == ["uint8"] * (MAX_ROUNDS + 4)
    assert_unchanged(WidenAfterMovement(), after)
    data = {"n": rng.integers(0, 256, (1, 4, 6)).astype("uint8")}
    assert_same_outputs(tvm_ext.build(mod), tvm_ext.build(after), data, rtol=0, atol=0)


def test_runs_in_sequential():
    mod, _ = _head()
    seq = tvm.transform.Sequential([WidenAfterMovement(), relay.transform.InferType()])
    with tvm.transform.PassContext(opt_level=3):
        tvm.ir.assert_structural_equal(seq(mod), WidenAfterMovement()(mod))


def test_caller_module_not_mutated():
    mod, _ = _head()
    snapshot = mod.astext()
    WidenAfterMovement()(mod)
    assert mod.astext() == snapshot


# -- no match --------------------------------------------------------------------------------------
def _assert_rejected(mod, reason, caplog):
    assert_unchanged_with_reason(WidenAfterMovement(), mod, reason, LOGGER, caplog)


def test_movement_of_8bit_value_unchanged(caplog):
    n = _u8("n", (1, 6, 4))
    _assert_rejected(infer(relay.cast(relay.reshape(n, (1, 24)), "float32")), "moves the uint8 value already", caplog)


def test_float_value_unchanged(caplog):
    x = relay.var("x", shape=(1, 6, 4), dtype="float32")
    _assert_rejected(infer(relay.reshape(relay.exp(x), (1, 24))), "no 8-bit value behind", caplog)


def test_link_with_other_readers_unchanged(caplog):
    n = _u8("n", (1, 6, 4))
    wide = relay.cast(n, "float32")
    scaled = relay.multiply(wide, relay.const(0.5))
    _assert_rejected(infer(relay.Tuple([relay.reshape(scaled, (1, 24)), wide])), "other readers", caplog)


def test_link_shared_with_a_conv_unchanged(caplog):
    """A convolution takes no elementwise producer: the shared link stays a kernel writing float32,
    and a copy of the chain for the movement would add one."""
    n = _u8("n", (1, 4, 3, 3))
    wide = relay.cast(n, "float32")
    w = relay.const(rng.standard_normal((4, 4, 1, 1)).astype("float32"))
    moved = relay.reshape(relay.multiply(wide, relay.const(0.5)), (1, 36))
    mod = infer(moved, relay.nn.conv2d(wide, w, channels=4, kernel_size=(1, 1)))
    _assert_rejected(mod, "nn.conv2d reads it and would not fuse the widening", caplog)


def test_concatenate_of_different_chains_unchanged(caplog):
    a, b = _u8("a", (1, 2, 3)), _u8("b", (1, 2, 3))
    mod = infer(relay.concatenate([_dq(a, 3, np.float32(0.5)),
                                   relay.multiply(relay.cast(b, "float32"), relay.const(0.5))], axis=1))
    _assert_rejected(mod, "chains differ", caplog)


def test_concatenate_of_different_8bit_dtypes_unchanged(caplog):
    a, b = _u8("a", (1, 2, 3)), relay.var("b", shape=(1, 2, 3), dtype="int8")
    mod = infer(relay.concatenate([_dq(a, 3, np.float32(0.5)), _dq(b, 3, np.float32(0.5))], axis=1))
    _assert_rejected(mod, "differ in dtype or form", caplog)


def test_split_used_as_a_tuple_unchanged(caplog):
    n = _u8("n", (1, 6, 2))
    sp = relay.split(relay.cast(n, "float32"), 2, axis=1)
    _assert_rejected(infer(relay.concatenate(sp.astuple(), axis=2)), "used other than through its fields", caplog)


def test_broadcasting_link_unchanged(caplog):
    n = _u8("n", (1, 1, 4))
    wide = relay.add(relay.cast(n, "float32"), relay.const(np.zeros((1, 3, 4), "float32")))
    _assert_rejected(infer(relay.reshape(wide, (12,))), "broadcasts the value", caplog)


# -- bad input ---------------------------------------------------------------------------------------
def test_untyped_module_raises():
    n = _u8("n", (1, 6, 4))
    mod = tvm.IRModule.from_expr(relay.Function([n], relay.reshape(relay.cast(n, "float32"), (24,))))
    assert_untyped_module_raises(WidenAfterMovement(), mod, "WidenAfterMovement")


def test_if_skipped(caplog):
    mod, ins = _head()
    c = relay.var("c", shape=(), dtype="bool")
    body = mod["main"].body
    f = infer(relay.Function(list(mod["main"].params) + [c], relay.If(c, body, body)))
    _assert_rejected(f, "If", caplog)


def test_dynamic_shapes_skipped():
    n = relay.var("n", shape=(relay.Any(), 6), dtype="uint8")
    mod = infer(relay.Function([n], relay.reshape(relay.cast(n, "float32"), (-1,))))
    assert_unchanged(WidenAfterMovement(), mod)
