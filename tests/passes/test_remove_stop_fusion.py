"""Tests of tvm_ext.passes.remove_stop_fusion (relay.quantize's fusion barriers)."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
import tvm_ext.tools.zoo
from tvm_ext.passes.remove_stop_fusion import RemoveStopFusion
from tvm_ext.core.report import op_pattern
from tvm_ext.testing import assert_same_outputs, assert_unchanged, check, infer

from _helpers import assert_if_and_let_skipped, assert_unchanged_with_reason, assert_untyped_module_raises

LOGGER = "tvm_ext.passes.RemoveStopFusion"
RNG = np.random.default_rng(6)
W1 = RNG.integers(-3, 4, (16, 16, 3, 3)).astype("int8")
W2 = RNG.integers(-3, 4, (16, 16, 3, 3)).astype("int8")
W3 = RNG.integers(-3, 4, (16, 16, 1, 1)).astype("int8")
SCALE = RNG.integers(1, 4, (16, 1, 1)).astype("int32")
BIAS = RNG.integers(-50, 50, (16, 1, 1)).astype("int32")
stop = relay.annotation.stop_fusion



def _conv(x, w):
    k = w.shape[2]
    return relay.nn.conv2d(x, relay.const(w), padding=(k // 2, k // 2), channels=16, kernel_size=(k, k),
                           out_dtype="int32")


def _requant(x, shift=4):
    # relay.quantize's realize: add(round) -> right_shift -> clip -> cast i8
    y = relay.right_shift(relay.add(x, relay.const(1 << (shift - 1))), relay.const(shift))
    return relay.cast(relay.clip(y, -127, 127), "int8")


def _bn_relu(x8):
    y = relay.add(relay.multiply(relay.cast(x8, "int32"), relay.const(SCALE)), relay.const(BIAS))
    return _requant(relay.nn.relu(y), 2)


# -- the relay.quantize chain ----------------------------------------------------------------------
def chain(barriers=True):
    """conv -> requant -> i8 |stop| -> cast i32 -> BN -> relu -> requant -> i8 |stop| -> conv

    ::

        x -> conv(W1) -> requant -> [stop] -> bn_relu_requant -> [stop] -> conv(W2) -> requant
    """
    s = stop if barriers else (lambda e: e)
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="int8")
    a = s(_requant(_conv(x, W1)))
    b = s(_bn_relu(a))
    return infer(_requant(_conv(b, W2)))


def test_chain_barriers_removed():
    check(RemoveStopFusion(), chain(), chain(barriers=False))


def test_chain_two_kernels_int8_crossing_bit_exact():
    before = tvm_ext.build(chain())
    after = tvm_ext.build(chain(), passes=[RemoveStopFusion()])
    rep = after.kernel_report
    # x86 legalization adds a shift (+ pad) kernel per conv: 6 kernels -> 5 (BN joins conv 1)
    assert rep.num_kernels == before.kernel_report.num_kernels - 1
    assert rep.num_anchor_kernels == 2
    assert not {"int32", "float32"} & set(rep.crossing.count)
    inputs = {"x": RNG.integers(-128, 128, (1, 16, 8, 8)).astype("int8")}
    assert_same_outputs(before, after, inputs)


# -- residual join: only one anchor can absorb the add -------------------------------------------------
def residual(first_kept=False):
    """two conv branches joined by add; FuseOps fuses only one of them into the add

    ::

        x -> conv(W1) -> requant -> [stop] -> cast i32 -+-> add -> clip -> cast i8
        x -> conv(W3) -> requant -> [stop] -> cast i32 -+
    """
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="int8")
    a = _requant(_conv(x, W1))
    b = _requant(_conv(x, W3))
    a = stop(a) if first_kept else a
    b = b if first_kept else stop(b)
    s = relay.add(relay.cast(a, "int32"), relay.cast(b, "int32"))
    return infer(relay.cast(relay.clip(s, -127, 127), "int8"))


def test_residual_join_claimed_once(caplog):
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="int8")
    both = relay.add(relay.cast(stop(_requant(_conv(x, W1))), "int32"),
                     relay.cast(stop(_requant(_conv(x, W3))), "int32"))
    before = infer(relay.cast(relay.clip(both, -127, 127), "int8"))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        after = RemoveStopFusion()(before)
    assert "would cross instead" in caplog.text
    stops = []
    relay.analysis.post_order_visit(after["main"], lambda n: stops.append(n) if isinstance(n, relay.Call)
                                    and getattr(n.op, "name", "") == "annotation.stop_fusion" else None)
    assert len(stops) == 1 and stops[0].checked_type.dtype == "int8"
    stock, ours = tvm_ext.build(before), tvm_ext.build(after)
    rep = ours.kernel_report  # the add joins one conv's kernel; the other writes int8
    joined = [k for k in rep.kernels if k.anchor and k.ops.count("clip") == 2]
    assert len(joined) == 1 and rep.num_anchor_kernels == 2
    assert rep.num_kernels <= stock.kernel_report.num_kernels
    assert not {"int32", "float32"} & set(rep.crossing.count)
    assert_same_outputs(stock, ours, {"x": RNG.integers(-128, 128, (1, 16, 8, 8)).astype("int8")})


def barrier_behind_barrier(order, expected=False):
    """residual join; one branch has a second barrier after its widening cast

    ::

        x -> conv(W1) -> requant -> [stop c] -> cast i32 -> [stop b] -+-> add -> clip -> cast i8
        x -> conv(W3) -> requant -> [stop a] -> cast i32 --------------+

    ``order`` 1 makes the add read the first branch first (its barriers are decided after ``a``).
    Expected (order 1): ``a`` and ``b`` removed, ``c`` kept: conv(W3)'s kernel takes the add and
    conv(W1)'s writes int8.
    """
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="int8")
    if expected:
        first = relay.cast(stop(_requant(_conv(x, W1))), "int32")
        second = relay.cast(_requant(_conv(x, W3)), "int32")
    else:
        first = stop(relay.cast(stop(_requant(_conv(x, W1))), "int32"))
        second = relay.cast(stop(_requant(_conv(x, W3))), "int32")
    s = relay.add(first, second) if order else relay.add(second, first)
    return infer(relay.cast(relay.clip(s, -127, 127), "int8"))


def test_barrier_behind_a_removed_barrier_keeps_the_narrow_crossing():
    """``b`` is removed (and ``a`` takes the add) before ``c`` is decided: ``c``'s chain ends at
    the cast, whose consumer is ``b``, which goes away: the cast fuses into the add's kernel, so
    ``c`` stays and int8 crosses, not the int32 cast."""
    after = check(RemoveStopFusion(), barrier_behind_barrier(1), barrier_behind_barrier(1, expected=True))
    assert_unchanged(RemoveStopFusion(), after)
    stock = tvm_ext.build(barrier_behind_barrier(1))
    ours = tvm_ext.build(barrier_behind_barrier(1), passes=[RemoveStopFusion()])
    assert ours.kernel_report.num_kernels == stock.kernel_report.num_kernels - 1
    assert "int32" in stock.kernel_report.crossing.count
    assert not {"int32", "float32"} & set(ours.kernel_report.crossing.count)
    assert_same_outputs(stock, ours, {"x": RNG.integers(-128, 128, (1, 16, 8, 8)).astype("int8")})


def test_barrier_behind_a_removed_barrier_other_order():
    """Decided the other way round (``b`` first): ``b``'s chain claims the add for the anchor behind
    ``c``, and ``c``'s chain, which goes through ``b``, may pass it (its own claim): ``b`` and ``c``
    go, ``a`` stays. One run decides all; the kernels are as narrow."""
    once = RemoveStopFusion()(barrier_behind_barrier(0))
    assert_unchanged(RemoveStopFusion(), once)
    stops = []
    relay.analysis.post_order_visit(once["main"], lambda n: stops.append(n) if isinstance(n, relay.Call)
                                    and getattr(n.op, "name", "") == "annotation.stop_fusion" else None)
    assert len(stops) == 1
    ours = tvm_ext.build(once).kernel_report
    assert not {"int32", "float32"} & set(ours.crossing.count)


# -- move: the barrier goes after the narrowest value ------------------------------------------------
def move_before():
    """int8 |stop| -> cast i32 -> add -> cast i8 -> cast i32 -> reshape (injective)"""
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="int8")
    a = stop(_requant(_conv(x, W1)))
    m = relay.cast(relay.add(relay.cast(a, "int32"), relay.const(3)), "int8")
    return infer(relay.reshape(relay.cast(m, "int32"), (1, 1024)))


def move_expected():
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="int8")
    a = _requant(_conv(x, W1))
    m = relay.cast(relay.add(relay.cast(a, "int32"), relay.const(3)), "int8")
    return infer(relay.reshape(relay.cast(stop(m), "int32"), (1, 1024)))


def test_barrier_moved_after_narrowest():
    check(RemoveStopFusion(), move_before(), move_expected())
    before = tvm_ext.build(move_before())
    after = tvm_ext.build(move_before(), passes=[RemoveStopFusion()])
    assert after.kernel_report.num_kernels == before.kernel_report.num_kernels
    assert "int32" not in after.kernel_report.crossing.count
    assert_same_outputs(before, after, {"x": RNG.integers(-128, 128, (1, 16, 8, 8)).astype("int8")})


def test_removed_when_the_wide_value_crosses_anyway():
    """int8 |stop| -> cast i32 -> global_avg_pool2d: pooling takes no fused producer."""
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="int8")
    pool = lambda a: relay.nn.global_avg_pool2d(relay.cast(a, "int32"))  # noqa: E731
    a = _requant(_conv(x, W1))
    check(RemoveStopFusion(), infer(pool(stop(a))), infer(pool(a)))
    rep = tvm_ext.build(infer(pool(a))).kernel_report
    stock = tvm_ext.build(infer(pool(stop(a)))).kernel_report
    assert rep.num_kernels == stock.num_kernels - 1


# -- barriers on the graph input: no anchor behind them, none competes for the join -----------------
def input_barriers(barriers=True, nested=False):
    """the uint8 input read by two branches, each behind its own barrier (two with ``nested``),
    joined by an add

    ::

        x(u8) -> [stop] -> cast i32 -> relu -> multiply 2 -+-> add
        x(u8) -> [stop] -> cast i32 -> relu ---------------+
    """
    s = (lambda e: stop(stop(e)) if nested else stop(e)) if barriers else (lambda e: e)
    x = relay.var("x", shape=(1, 4, 3, 3), dtype="uint8")
    a = relay.multiply(relay.nn.relu(relay.cast(s(x), "int32")), relay.const(2))
    b = relay.nn.relu(relay.cast(s(x), "int32"))
    return infer(relay.add(a, b))


def test_input_barriers_both_removed_in_one_run():
    """The second branch's barrier is decided first; its chain passes the add. A parameter brings no
    anchor, so that chain claims no join and the first branch's chain passes the add too: both
    barriers go in one run (a second run finds nothing)."""
    after = check(RemoveStopFusion(), input_barriers(), input_barriers(barriers=False))
    assert_unchanged(RemoveStopFusion(), after)


def test_nested_input_barriers_all_removed_in_one_run():
    """stop(stop(x)) per branch: the outer barrier is decided while the inner one is undecided;
    behind it is the parameter, no anchor, so the outer chain claims no join either."""
    after = check(RemoveStopFusion(), input_barriers(nested=True), input_barriers(barriers=False))
    assert_unchanged(RemoveStopFusion(), after)


def test_input_barriers_removed_bit_exact():
    before = input_barriers()
    stock = tvm_ext.build(before)
    ours = tvm_ext.build(before, passes=[RemoveStopFusion()])
    assert ours.kernel_report.num_kernels <= stock.kernel_report.num_kernels
    x = RNG.integers(0, 256, (1, 4, 3, 3)).astype("uint8")
    out, _ = assert_same_outputs(stock, ours, {"x": x})
    assert out[0].std() > 0


# -- float: bit-exactness rules ----------------------------------------------------------------------
def test_float_multiply_then_add_kept(caplog):
    x = relay.var("x", shape=(1, 64), dtype="float32")
    mod = infer(relay.add(stop(relay.multiply(x, relay.const(1.7))), relay.const(0.3)))
    assert_unchanged_with_reason(RemoveStopFusion(), mod, "fma", LOGGER, caplog)


def test_float_quantize_chain_fused_bit_exact():
    """relu |stop| -> multiply 16 -> round -> clip -> cast i8: the int8, not the float, crosses."""
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="float32")
    w = relay.const(RNG.standard_normal((16, 16, 3, 3)).astype("float32"))
    r = relay.nn.relu(relay.nn.conv2d(x, w, padding=(1, 1), channels=16, kernel_size=(3, 3)))
    q = lambda v: relay.cast(relay.clip(relay.round(relay.multiply(v, relay.const(16.0))), -127, 127), "int8")  # noqa
    before, expected = infer(q(stop(r))), infer(q(r))
    check(RemoveStopFusion(), before, expected)
    b, a = tvm_ext.build(before), tvm_ext.build(before, passes=[RemoveStopFusion()])
    ra, rb = a.kernel_report, b.kernel_report  # (the input's layout_transform crosses as float either way)
    assert ra.num_kernels <= rb.num_kernels
    assert ra.crossing.nbytes["float32"] < rb.crossing.nbytes["float32"] and "int8" in ra.crossing.count
    assert_same_outputs(b, a, {"x": RNG.standard_normal((1, 16, 8, 8)).astype("float32")})


# -- the zoo model ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_zoo():
    return tvm_ext.tools.zoo.load("resnet50_int8_relay", small=True)


@pytest.mark.slow  # a small zoo ResNet built twice: minutes on 2 cores
def test_zoo_small_fewer_kernels_bit_exact(small_zoo):
    z = small_zoo
    stock = tvm_ext.build(z.mod, params=z.params)
    ours = tvm_ext.build(z.mod, params=z.params, passes=[RemoveStopFusion()])
    s, o = stock.kernel_report, ours.kernel_report
    assert o.num_anchor_kernels == s.num_anchor_kernels
    assert o.num_kernels <= s.num_kernels - 25  # 74 -> 44 measured
    for k in o.kernels:  # never two anchors in one kernel
        assert sum(op_pattern(op) >= 3 for op in k.ops) <= 1, k.ops
    x = np.random.default_rng(0).standard_normal(z.input_shape).astype("float32")
    assert_same_outputs(stock, ours, {z.input_name: x}, rtol=0, atol=0)


# -- properties ------------------------------------------------------------------------------------
def test_idempotent():
    for mod in (chain(), move_before(), residual(), input_barriers(), input_barriers(nested=True),
                barrier_behind_barrier(0), barrier_behind_barrier(1)):
        once = RemoveStopFusion()(mod)
        assert_unchanged(RemoveStopFusion(), once)


def test_unchanged_when_nothing_matches():
    assert_unchanged(RemoveStopFusion(), chain(barriers=False))


def test_untyped_module_raises():
    x = relay.var("x", shape=(4,), dtype="int8")
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.cast(stop(x), "int32")))
    assert_untyped_module_raises(RemoveStopFusion(), mod, "RemoveStopFusion")


def test_dynamic_shapes_skipped(caplog):
    x = relay.var("x", shape=(relay.Any(), 16), dtype="int8")
    mod = infer(relay.nn.relu(relay.cast(stop(relay.abs(x)), "int32")))
    assert_unchanged_with_reason(RemoveStopFusion(), mod, "dynamic shape", LOGGER, caplog)


def test_if_and_let_skipped(caplog):
    x = relay.var("x", shape=(4,), dtype="int8")
    body = relay.cast(stop(relay.abs(x)), "int32")
    assert_if_and_let_skipped(RemoveStopFusion(), body, LOGGER, caplog)


def test_tuples_pass_through():
    """A barrier whose value is also returned in a tuple: removed, the tuple is untouched."""
    x = relay.var("x", shape=(4,), dtype="int8")
    a = relay.abs(x)
    check(RemoveStopFusion(), infer(relay.cast(stop(a), "int32"), a), infer(relay.cast(a, "int32"), a))


def test_registered_and_named():
    from tvm_ext.core.registry import get_pass

    assert get_pass("RemoveStopFusion").factory is RemoveStopFusion
    assert RemoveStopFusion().info.name == "RemoveStopFusion"
    seq = tvm.transform.Sequential([RemoveStopFusion()])
    with tvm.transform.PassContext(opt_level=3, disabled_pass=["RemoveStopFusion"]):
        tvm.ir.assert_structural_equal(seq(chain())["main"], chain()["main"])
