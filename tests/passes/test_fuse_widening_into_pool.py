"""Tests of tvm_ext.passes.fuse_widening_into_pool (the int32 tensor in front of the avgpool)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.passes._util import post_order
from tvm_ext.passes.fuse_widening_into_pool import FuseWideningIntoPool
from tvm_ext.testing import assert_same_outputs, assert_unchanged, check, infer

from _helpers import assert_unchanged_with_reason, assert_untyped_module_raises

LOGGER = "tvm_ext.passes.FuseWideningIntoPool"
W = np.random.default_rng(1).integers(-3, 4, (8, 8, 1, 1)).astype("int8")


def _requant(v, scale):
    # cast f32 -> multiply -> floor -> cast i32
    return relay.cast(relay.floor(relay.multiply(relay.cast(v, "float32"), relay.const(scale))), "int32")


def _post(v):
    # the pool's own requantize to uint8 (FuseOps fuses it into the pool)
    return relay.cast(relay.clip(_requant(v, 0.5), 0.0, 255.0), "uint8")


def before():
    """x -> conv -> requant -> clip(0, 255) -> requant -> global_avg_pool2d -> requant -> u8

    ::

        conv kernel: conv .. clip .. cast/multiply/floor/cast   (writes int32)
        pool kernel: global_avg_pool2d .. cast u8
    """
    x = relay.var("x", shape=(1, 8, 6, 6), dtype="int8")
    conv = relay.nn.conv2d(x, relay.const(W), kernel_size=(1, 1), channels=8, out_dtype="int32")
    n = relay.clip(_requant(conv, 0.05), 0.0, 255.0)
    return infer(_post(relay.nn.global_avg_pool2d(_requant(n, 3.0))))


def expected():
    """The pool group as one Primitive function called on cast(n, u8)."""
    x = relay.var("x", shape=(1, 8, 6, 6), dtype="int8")
    conv = relay.nn.conv2d(x, relay.const(W), kernel_size=(1, 1), channels=8, out_dtype="int32")
    n = relay.clip(_requant(conv, 0.05), 0.0, 255.0)
    p0 = relay.var("p0", shape=(1, 8, 6, 6), dtype="uint8")
    body = _post(relay.nn.global_avg_pool2d(_requant(relay.cast(p0, "int32"), 3.0)))
    fn = relay.Function([p0], body).with_attr("Primitive", tvm.tir.IntImm("int32", 1))
    return infer(relay.Call(fn, [relay.cast(n, "uint8")]))


def test_structure_and_idempotence():
    after = check(FuseWideningIntoPool(), before(), expected())
    assert_unchanged(FuseWideningIntoPool(), after)


def test_kernels_crossing_and_outputs():
    fb = tvm_ext.build(before())
    fa = tvm_ext.build(before(), passes=[FuseWideningIntoPool()])
    rb, ra = fb.kernel_report, fa.kernel_report
    assert rb.num_kernels == ra.num_kernels
    assert rb.num_anchor_kernels == ra.num_anchor_kernels
    # the conv kernel's int32 output (1x8x6x6) became uint8; any other int32 tensor is x86's
    # legalization of the toy conv (hosts whose int8 conv pads 8 channels to 16), the same in both
    size = 8 * 6 * 6
    assert ra.crossing.nbytes.get("int32", 0) == rb.crossing.nbytes["int32"] - 4 * size
    assert ra.crossing.nbytes["uint8"] == rb.crossing.nbytes.get("uint8", 0) + size
    pool = next(k for k in ra.kernels if k.anchor == "nn.global_avg_pool2d")
    assert pool.ops[0] == "cast"  # the pool kernel widens the uint8 value itself
    x = np.random.default_rng(0).integers(-128, 128, (1, 8, 6, 6)).astype("int8")
    out_b, out_a = assert_same_outputs(fb, fa, {"x": x})  # uint8: bit for bit
    assert out_b[0].std() > 0


def test_constants_lifted_like_fuse_ops():
    """A non-scalar constant in the chain becomes a parameter of the Primitive function."""
    x = relay.var("x", shape=(1, 8, 6, 6), dtype="int8")
    conv = relay.nn.conv2d(x, relay.const(W), kernel_size=(1, 1), channels=8, out_dtype="int32")
    n = relay.clip(_requant(conv, 0.05), 0.0, 255.0)
    zp = relay.const(np.full((1,), 3, "int32"))
    mod = infer(_post(relay.nn.global_avg_pool2d(_requant(relay.subtract(n, zp), 3.0))))
    after = FuseWideningIntoPool()(mod)
    call = after["main"].body
    assert isinstance(call.op, relay.Function) and len(call.op.params) == 2
    assert_same_outputs(tvm_ext.build(mod), tvm_ext.build(mod, passes=[FuseWideningIntoPool()]),
                        {"x": np.random.default_rng(3).integers(-128, 128, (1, 8, 6, 6)).astype("int8")})



@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_reads_the_8bit_logits(op):
    """dense -> requantize to uint8 -> dequantize -> softmax (a classifier's head): the dense kernel
    wrote the dequantized float32 logits; now it writes the uint8 levels and the softmax kernel
    dequantizes them. Same kernels, same values."""
    x = relay.var("x", shape=(1, 16), dtype="uint8")
    w = relay.const(np.random.default_rng(5).integers(-8, 9, (10, 16)).astype("int8"))
    acc = relay.nn.dense(x, w, out_dtype="int32")
    n = relay.clip(_requant(acc, 0.2), 0.0, 255.0)
    logits = relay.multiply(relay.cast(relay.subtract(n, relay.const(7)), "float32"), relay.const(0.05))
    mod = infer(getattr(relay.nn, op)(logits))
    after = FuseWideningIntoPool()(mod)
    assert isinstance(after["main"].body.op, relay.Function)  # the softmax group, Primitive
    fb, fa = tvm_ext.build(mod), tvm_ext.build(after)
    rb, ra = fb.kernel_report, fa.kernel_report
    assert ra.num_kernels == rb.num_kernels
    assert [c.reason for c in rb.float_crossings()] == ["dequantize_early"]
    assert ra.float_crossings() == [] and ra.crossing.nbytes["uint8"] == 10
    data = {"x": np.random.default_rng(6).integers(0, 256, (1, 16)).astype("uint8")}
    out_b, _ = assert_same_outputs(fb, fa, data, rtol=1e-6, atol=1e-7)
    assert out_b[0].std() > 0


# -- a global pool's group takes unary data movement up to an 8-bit tensor behind it ------------------------
DENSE_W = np.random.default_rng(4).integers(-5, 6, (3, 8)).astype("int8")
MOVES = {"reshape": lambda v: relay.reshape(v, (1, 8)), "batch_flatten": relay.nn.batch_flatten,
         "squeeze": lambda v: relay.squeeze(v, axis=[2, 3])}


def _widen(v):
    # cast i32 -> subtract zp -> cast f32 -> multiply by a power of two (sums exact in any order)
    return relay.multiply(relay.cast(relay.subtract(relay.cast(v, "int32"), relay.const(21)), "float32"),
                          relay.const(0.125))


def _quantize(v):
    # divide -> round -> add zp -> clip -> cast u8 (a QuantizeLinear in front of a QGemm)
    return relay.cast(relay.clip(relay.add(relay.round(relay.divide(v, relay.const(0.25))), relay.const(74.0)),
                                 0.0, 255.0), "uint8")


def _head(v):
    return relay.nn.dense(v, relay.const(DENSE_W), out_dtype="int32")


def flatten_before(move):
    """u8 x -> widen -> global_avg_pool2d -> move -> quantize -> dense (a classifier's head)

    ::

        stock: widen | pool | move .. quantize (reads the pool's float32) | dense
    """
    x = relay.var("x", shape=(1, 8, 5, 7), dtype="uint8")
    return infer(_head(_quantize(MOVES[move](relay.nn.global_avg_pool2d(_widen(x))))))


def flatten_expected(move):
    """The group runs from the pool's 8-bit input to the quantize behind the movement: its kernel writes u8."""
    x = relay.var("x", shape=(1, 8, 5, 7), dtype="uint8")
    p0 = relay.var("p0", shape=(1, 8, 5, 7), dtype="uint8")
    body = _quantize(MOVES[move](relay.nn.global_avg_pool2d(_widen(p0))))
    fn = relay.Function([p0], body).with_attr("Primitive", tvm.tir.IntImm("int32", 1))
    return infer(_head(relay.Call(fn, [x])))


@pytest.mark.parametrize("move", sorted(MOVES))
def test_global_pool_group_takes_movement_to_8bit(move):
    after = check(FuseWideningIntoPool(), flatten_before(move), flatten_expected(move))
    assert_unchanged(FuseWideningIntoPool(), after)


def test_global_pool_movement_kernels_crossing_and_outputs():
    mod = flatten_before("reshape")
    fb, fa = tvm_ext.build(mod, target="llvm"), tvm_ext.build(mod, target="llvm", passes=[FuseWideningIntoPool()])
    rb, ra = fb.kernel_report, fa.kernel_report
    assert [c.reason for c in rb.float_crossings()] == ["dequantize_early", "quantize_late"]
    assert (rb.num_kernels, ra.num_kernels) == (4, 2)  # the widening's and the quantize's kernels go
    assert ra.float_crossings() == [] and ra.crossing.nbytes == {"uint8": 8}
    x = np.random.default_rng(8).integers(0, 256, (1, 8, 5, 7)).astype("uint8")
    out_b, _ = assert_same_outputs(fb, fa, {"x": x})  # int32: bit for bit
    assert len(np.unique(out_b[0])) == 3


def test_movement_without_8bit_tensor_behind_stays_outside():
    """pool -> reshape -> float dense: no 8-bit tensor behind the reshape, so the group ends at the
    pool (FuseOps' end) and the reshape stays outside."""
    x = relay.var("x", shape=(1, 8, 5, 7), dtype="uint8")
    flat = relay.reshape(relay.nn.global_avg_pool2d(_widen(x)), (1, 8))
    mod = infer(relay.nn.dense(flat, relay.const(DENSE_W.astype("float32"))))
    after = FuseWideningIntoPool()(mod)
    reshape = after["main"].body.args[0]
    assert reshape.op.name == "reshape" and isinstance(reshape.args[0].op, relay.Function)
    assert reshape.args[0].op.body.op.name == "nn.global_avg_pool2d"


def test_windowed_pool_takes_no_movement():
    """A windowed pool's group ends where FuseOps ends it, whatever 8-bit tensor follows the movement."""
    x = relay.var("x", shape=(1, 8, 5, 7), dtype="uint8")
    q = _quantize(relay.reshape(relay.nn.avg_pool2d(_widen(x), (5, 7)), (1, 8)))
    after = FuseWideningIntoPool()(infer(_head(q)))
    chain = after["main"].body.args[0]
    while not isinstance(chain.op, relay.Function):
        assert chain.op.name != "nn.avg_pool2d"
        chain = chain.args[0]
    names = [n.op.name for n in post_order(chain.op.body) if isinstance(n, relay.Call)]
    assert "reshape" not in names and names[-1] == "nn.avg_pool2d"


# -- a global pool's group that ends on 8 bits takes the movement behind it ------------------------------
def pooled8_before(move):
    """u8 x -> widen -> global_avg_pool2d -> quantize to u8 -> move -> dense (a QDQ classifier's head
    once its requantizes are integer: the flatten moves the pool's 8-bit output)

    ::

        stock: widen | pool .. quantize | move (a kernel that only moves) | dense
    """
    x = relay.var("x", shape=(1, 8, 5, 7), dtype="uint8")
    return infer(_head(MOVES[move](_quantize(relay.nn.global_avg_pool2d(_widen(x))))))


def pooled8_expected(move):
    """The group runs from the pool's 8-bit input through the movement: no movement-only kernel."""
    x = relay.var("x", shape=(1, 8, 5, 7), dtype="uint8")
    p0 = relay.var("p0", shape=(1, 8, 5, 7), dtype="uint8")
    body = MOVES[move](_quantize(relay.nn.global_avg_pool2d(_widen(p0))))
    fn = relay.Function([p0], body).with_attr("Primitive", tvm.tir.IntImm("int32", 1))
    return infer(_head(relay.Call(fn, [x])))


@pytest.mark.parametrize("move", sorted(MOVES))
def test_global_pool_8bit_group_takes_movement(move):
    after = check(FuseWideningIntoPool(), pooled8_before(move), pooled8_expected(move))
    assert_unchanged(FuseWideningIntoPool(), after)


@pytest.mark.parametrize("target", ["llvm", "llvm -mcpu=x86-64-v3"])
def test_global_pool_8bit_movement_kernels_and_outputs(target):
    """The movement-only kernel goes (at x86 a launched one: layout_transform and flatten); same bytes
    of uint8 or fewer; the outputs (int32) bit for bit against the build without the pass."""
    mod = pooled8_before("batch_flatten")
    fb = tvm_ext.build(mod, target=target)
    fa = tvm_ext.build(mod, target=target, passes=[FuseWideningIntoPool()])
    rb, ra = fb.kernel_report, fa.kernel_report
    assert ra.num_kernels == 2 and rb.num_kernels == 4  # widen | pool | flatten | dense -> pool group | dense
    assert ra.crossing.nbytes == {"uint8": 8} and ra.float_crossings() == []
    x = np.random.default_rng(9).integers(0, 256, (1, 8, 5, 7)).astype("uint8")
    out_b, _ = assert_same_outputs(fb, fa, {"x": x})
    assert len(np.unique(out_b[0])) == 3


def test_global_pool_8bit_group_ends_at_the_last_8bit_tensor():
    """pool -> quantize -> reshape -> dequantize -> float dense: the group takes the reshape (8-bit) and
    ends there; the dequantize behind it stays outside (it would make the group write float32)."""
    x = relay.var("x", shape=(1, 8, 5, 7), dtype="uint8")
    flat = relay.reshape(_quantize(relay.nn.global_avg_pool2d(_widen(x))), (1, 8))
    mod = infer(relay.nn.dense(_widen(flat), relay.const(DENSE_W.astype("float32"))))
    after = FuseWideningIntoPool()(mod)
    dq = after["main"].body.args[0]
    while not isinstance(dq.op, relay.Function):
        assert dq.op.name not in ("reshape", "nn.global_avg_pool2d")
        dq = dq.args[0]
    assert dq.op.body.op.name == "reshape" and dq.checked_type.dtype == "uint8"
    assert_unchanged(FuseWideningIntoPool(), after)


# -- QNN ops not lowered yet (stage start): their scales must stay constants -------------------------------
SCALES = np.random.default_rng(2).uniform(0.01, 0.2, 8).astype("float32")


def _qnn_requantize(v):
    """per-channel qnn.requantize to uint8: its vector scale is no scalar, so in a Primitive function it
    would become a parameter, which QNN's canonicalization cannot read."""
    return relay.qnn.op.requantize(v, relay.const(SCALES), relay.const(0), relay.const(0.5), relay.const(128),
                                   axis=1, out_dtype="uint8")


def test_qnn_consumer_stays_outside_the_pool_function():
    """u8 x -> cast i32 -> avg_pool2d -> qnn.requantize: the pool reads x and widens it itself; the
    requantize stays after the call, and the module still builds (QNN lowers its constant scales)."""
    x = relay.var("x", shape=(1, 8, 6, 6), dtype="uint8")
    mod = infer(_qnn_requantize(relay.nn.avg_pool2d(relay.cast(x, "int32"), (3, 3), (2, 2))))
    p0 = relay.var("p0", shape=(1, 8, 6, 6), dtype="uint8")
    fn = relay.Function([p0], relay.nn.avg_pool2d(relay.cast(p0, "int32"), (3, 3), (2, 2)))
    fn = fn.with_attr("Primitive", tvm.tir.IntImm("int32", 1))
    want = infer(_qnn_requantize(relay.Call(fn, [x])))
    after = check(FuseWideningIntoPool(), mod, want)
    assert_unchanged(FuseWideningIntoPool(), after)
    data = {"x": np.random.default_rng(3).integers(0, 256, (1, 8, 6, 6)).astype("uint8")}
    out_b, _ = assert_same_outputs(mod, after, data)
    assert len(np.unique(out_b[0])) > 10


def test_qnn_op_in_the_input_chain_unchanged(caplog):
    """u8 x -> cast i32 -> qnn.requantize (to int32) -> global_avg_pool2d: the group would hold the
    requantize, so no rewrite."""
    x = relay.var("x", shape=(1, 8, 6, 6), dtype="uint8")
    r = relay.qnn.op.requantize(relay.cast(x, "int32"), relay.const(SCALES), relay.const(0), relay.const(0.5),
                                relay.const(0), axis=1, out_dtype="int32")
    mod = infer(relay.nn.global_avg_pool2d(r))
    assert_unchanged_with_reason(FuseWideningIntoPool(), mod, "qnn.requantize, not lowered yet", LOGGER, caplog)


# -- no match --------------------------------------------------------------------------------------
def test_pool_reading_8bit_value_directly_unchanged(caplog):
    x = relay.var("x", shape=(1, 8, 6, 6), dtype="uint8")
    mod = infer(relay.nn.avg_pool2d(relay.cast(relay.clip(relay.cast(x, "int32"), 0.0, 255.0), "uint8"), (2, 2)))
    assert_unchanged_with_reason(FuseWideningIntoPool(), mod, "input is the uint8 value already", LOGGER, caplog)


def test_no_narrow_point_unchanged(caplog):
    x = relay.var("x", shape=(1, 8, 6, 6), dtype="float32")
    mod = infer(relay.nn.global_avg_pool2d(relay.exp(x)))
    assert_unchanged_with_reason(FuseWideningIntoPool(), mod, "no 8-bit point", LOGGER, caplog)


def test_untyped_module_raises():
    x = relay.var("x", shape=(1, 8, 6, 6), dtype="float32")
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.nn.global_avg_pool2d(x)))
    assert_untyped_module_raises(FuseWideningIntoPool(), mod, "FuseWideningIntoPool")


def test_if_skipped(caplog):
    mod = before()
    c = relay.var("c", shape=(), dtype="bool")
    params = list(mod["main"].params)
    body = mod["main"].body
    f = infer(relay.Function(params + [c], relay.If(c, body, body)))
    assert_unchanged_with_reason(FuseWideningIntoPool(), f, "If", LOGGER, caplog)


def test_dynamic_shapes_skipped():
    x = relay.var("x", shape=(relay.Any(), 8, 6, 6), dtype="int32")
    n = relay.clip(x, 0.0, 255.0)
    mod = infer(relay.Function([x], relay.nn.global_avg_pool2d(_requant(n, 3.0))))
    assert_unchanged(FuseWideningIntoPool(), mod)


# -- the kernel it makes: tvm_ext.x86.int8_conv's pool schedule inlines the widening into the pool --
def _pool_with_prologue(op):
    from tvm import te, topi

    x = te.placeholder((1, 4, 3, 5, 8), "uint8", name="x")
    wide = te.compute(x.shape, lambda *i: x(*i).astype("int32") - 7, name="widen", tag="elemwise")
    scaled = te.compute(x.shape, lambda *i: wide(*i) * 3, name="scale", tag="elemwise")
    if op == "adaptive":
        out = topi.nn.adaptive_pool(scaled, (1, 1), "avg", layout="NCHW8c")
        sched = lambda: topi.x86.schedule_adaptive_pool([out])  # noqa: E731
    else:
        out = topi.nn.pool2d(scaled, (2, 2), (1, 1), (1, 1), (0, 0, 0, 0), "avg", layout="NCHW8c")
        sched = lambda: topi.x86.schedule_pool([out], "NCHW8c")  # noqa: E731
    return x, out, sched


@pytest.mark.parametrize("op", ["adaptive", "pool2d"])
def test_pool_kernel_inlines_its_widening_producers(op):
    """TVM's x86 pool schedules leave producer stages as serial loop nests with their own buffers
    (500 us instead of 65 us on PP-OCR's SE pools); inside tvm_ext's kernels() they are inlined,
    with the same results."""
    from tvm_ext.x86 import int8_conv as x86_int8

    x, out, sched = _pool_with_prologue(op)
    with tvm.target.Target("llvm"):
        tvm_ir = str(tvm.lower(sched(), [x, out]))
        with x86_int8.kernels():
            ext_sched = sched()
        ext_ir = str(tvm.lower(ext_sched, [x, out]))
    # TVM: a buffer and a serial loop nest over the whole input per producer stage
    assert "widen = T.allocate" in tvm_ir and "T.grid(4, 3, 5, 8)" in tvm_ir
    assert "widen" not in ext_ir and "T.grid(4, 3, 5, 8)" not in ext_ir  # inlined into the reduction
    data = np.random.default_rng(0).integers(0, 256, [int(d) for d in x.shape]).astype("uint8")
    res = []
    for s in (sched(), ext_sched):
        f = tvm.build(s, [x, out], "llvm")
        o = tvm.nd.empty([int(d) for d in out.shape], out.dtype)
        f(tvm.nd.array(data), o)
        res.append(o.numpy())
    np.testing.assert_array_equal(res[0], res[1])
