"""Tests of tvm_ext.passes.combine_parallel_cast: the seed graphs and both directions."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.passes.combine_parallel_cast import CombineParallelCast, is_narrowing_cast
from tvm_ext.core.report import KernelReport
from tvm_ext.testing import assert_same_outputs, assert_unchanged, check, infer, random_inputs, run_module

from _helpers import (assert_if_and_let_skipped, assert_unchanged_with_reason, assert_untyped_module_raises,
                      pass_names_seen)

LOGGER = "tvm_ext.passes.CombineParallelCast"
W1 = np.random.default_rng(1).integers(-3, 4, (16, 16)).astype("int8")
W2 = np.random.default_rng(2).integers(-3, 4, (16, 16)).astype("int8")



# -- the seed's small graph ---------------------------------------------------------------------
def small_before():
    """data f32 -> cast i32 -> {cast i8 -> relu -> dense}, {cast i8 -> relu -> dense} -> add

    ::

        data -> cast(i32) -+-> cast(i8) -> relu -> dense(W1) -+-> add
                           +-> cast(i8) -> relu -> dense(W2) -+
    """
    data = relay.var("data", shape=(1, 16), dtype="float32")
    c0 = relay.cast(data, "int32")
    b1 = relay.nn.relu(relay.cast(c0, "int8"))
    b2 = relay.nn.relu(relay.cast(c0, "int8"))
    d1 = relay.nn.dense(b1, relay.const(W1), out_dtype="int32")
    d2 = relay.nn.dense(b2, relay.const(W2), out_dtype="int32")
    return infer(relay.add(d1, d2))


def small_expected():
    """One cast, and the relu the merge made common: data -> cast -> cast -> relu -> 2 x dense -> add."""
    data = relay.var("data", shape=(1, 16), dtype="float32")
    r = relay.nn.relu(relay.cast(relay.cast(data, "int32"), "int8"))
    d1 = relay.nn.dense(r, relay.const(W1), out_dtype="int32")
    d2 = relay.nn.dense(r, relay.const(W2), out_dtype="int32")
    return infer(relay.add(d1, d2))


def test_small_graph_structure():
    check(CombineParallelCast(), small_before(), small_expected())


@pytest.mark.parametrize("opt_level, stock", [(2, 5), (3, 3)])
def test_small_graph_kernels_and_outputs(opt_level, stock):
    before = tvm_ext.build(small_before(), opt_level=opt_level)
    after = tvm_ext.build(small_before(), opt_level=opt_level, passes=[CombineParallelCast()])
    # stock TVM 0.19: 5 kernels at opt_level 2 (no CSE), 3 at opt_level 3 (CSE merges the casts)
    assert before.kernel_report.num_kernels == stock
    assert after.kernel_report.num_kernels == 3
    assert after.kernel_report.num_anchor_kernels == 2
    inputs = {"data": (np.random.default_rng(0).standard_normal((1, 16)) * 50).astype("float32")}
    assert_same_outputs(before, after, inputs)


# -- the ResNet-50 fragment ----------------------------------------------------------------------
def fragment_before(consumer_casts=("int8", "int8")):
    """max_pool2d -> requantize chain ending in cast(i32) -> two branches cast(i8) -> conv2d -> add

    ::

        x -> max_pool2d -> cast i32 -> fpm -> add -> relu -> cast i64 -> fpm -> clip -> cast i32
             -+-> cast i8 -> conv2d -+-> add
              +-> cast i8 -> conv2d -+
    """
    x = relay.var("x", shape=(1, 8, 16, 16), dtype="int8")
    c = relay.nn.max_pool2d(x, pool_size=(3, 3), strides=(2, 2), padding=(1, 1, 1, 1))
    c = relay.cast(c, "int32")
    c = relay.fixed_point_multiply(c, 1395864371, -5)
    c = relay.add(c, relay.const(np.arange(8, dtype="int32").reshape(8, 1, 1)))
    c = relay.nn.relu(c)
    c = relay.cast(c, "int64")
    c = relay.fixed_point_multiply(c, 1395864371, 1)
    c = relay.clip(c, -127, 127)
    c = relay.cast(c, "int32")
    outs = []
    for i, dtype in enumerate(consumer_casts):
        w = relay.const(np.random.default_rng(10 + i).integers(-3, 4, (8, 8, 1, 1)).astype(dtype))
        conv = relay.nn.conv2d(relay.cast(c, dtype), w, kernel_size=(1, 1), channels=8, out_dtype="int32")
        outs.append(conv)
    return infer(relay.add(outs[0], outs[1]))


def test_fragment_producer_writes_int8_two_kernels_fewer():
    before = tvm_ext.build(fragment_before(), opt_level=2).kernel_report
    after_f = tvm_ext.build(fragment_before(), opt_level=2, passes=[CombineParallelCast()])
    after = after_f.kernel_report
    # host target: 6 -> 4 where x86 pads the 8-channel int8 convs to 16 and slices (AVX-512
    # without VNNI), 5 -> 3 where they take an 8-channel block (AVX2, AVX-512 VNNI)
    assert before.num_kernels - after.num_kernels == 2, (before.num_kernels, after.num_kernels)
    assert before.num_anchor_kernels == after.num_anchor_kernels == 3
    # the pooling kernel now ends with the narrowing cast and writes 8-bit data (x86 legalizes
    # int8 conv input to uint8, hence uint8 there), so one int32 tensor less crosses kernels
    pool = next(k for k in after.kernels if k.anchor == "nn.max_pool2d")
    assert pool.outputs[0][1] in ("int8", "uint8")
    assert after.crossing.count.get("int32", 0) == before.crossing.count["int32"] - 1
    x = np.random.default_rng(0).integers(-128, 128, (1, 8, 16, 16)).astype("int8")
    assert_same_outputs(tvm_ext.build(fragment_before(), opt_level=2), after_f, {"x": x})


def test_fragment_opt_level_3_already_merged_by_cse():
    """At opt_level 3 relay.build's CSE merged the casts already: the pass finds nothing to do."""
    before = tvm_ext.build(fragment_before(), opt_level=3).kernel_report
    after = tvm_ext.build(fragment_before(), opt_level=3, passes=[CombineParallelCast()]).kernel_report
    assert before.num_kernels == after.num_kernels == 5


# -- the post-FuseOps form (the seed's first IR) -------------------------------------------------
def fused_fragment():
    with tvm.transform.PassContext(opt_level=2):
        return relay.transform.InferType()(relay.transform.FuseOps()(fragment_before()))


def _cast_only_calls(mod):
    calls = []

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.op, relay.Function):
            body = node.op.body
            if (isinstance(body, relay.Call) and isinstance(body.op, tvm.ir.Op) and body.op.name == "cast"
                    and isinstance(body.args[0], relay.Var)):
                calls.append(node)

    relay.analysis.post_order_visit(mod["main"].body, visit)
    return calls


def test_post_fuse_cast_functions_become_one_call():
    fused = fused_fragment()
    assert len(_cast_only_calls(fused)) == 2  # %588 and %600 of the seed
    after = CombineParallelCast()(fused)
    assert len(_cast_only_calls(after)) == 1
    inputs = random_inputs(fused)
    with tvm.transform.PassContext(opt_level=2):
        k_before = KernelReport.from_factory(relay.build(fused, target="llvm")).num_kernels
        k_after = KernelReport.from_factory(relay.build(after, target="llvm")).num_kernels
    assert k_after == k_before - 1
    np.testing.assert_array_equal(run_module(fused, inputs, opt_level=2)[0],
                                  run_module(after, inputs, opt_level=2)[0])
    assert_unchanged(CombineParallelCast(), after)  # idempotent


# -- direction -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "src, dst, merged",
    [
        ("int32", "int8", True), ("int64", "int32", True), ("float32", "float16", True),
        ("float32", "int32", True), ("float32", "int8", True), ("float16", "int8", True),
        ("int8", "int32", False), ("int32", "int64", False), ("float16", "float32", False),
        ("int8", "float32", False), ("int32", "uint32", False), ("int32", "float32", False),
        ("float32", "int64", False),
    ],
)
def test_narrowing_rule(src, dst, merged):
    assert bool(is_narrowing_cast(src, dst)) is merged


def upcast_before():
    """x i8 -> relu -> {cast i32 -> add c1}, {cast i32 -> multiply c2}: widening casts stay apart."""
    x = relay.var("x", shape=(4, 8), dtype="int8")
    r = relay.nn.relu(x)
    a = relay.add(relay.cast(r, "int32"), relay.const(3, "int32"))
    b = relay.multiply(relay.cast(r, "int32"), relay.const(5, "int32"))
    return infer(relay.add(a, b))


def test_upcasts_are_not_merged(caplog):
    assert_unchanged_with_reason(CombineParallelCast(), upcast_before(), "widens", LOGGER, caplog)


def test_upcasts_keep_their_fusion_at_opt_level_3():
    """CanonicalizeCast's case: two upcasts of one value; merging would cost a kernel."""
    before = tvm_ext.build(upcast_before(), opt_level=3).kernel_report.num_kernels
    after = tvm_ext.build(upcast_before(), opt_level=3, passes=[CombineParallelCast()]).kernel_report.num_kernels
    assert after == before


def downcast_branches(producer):
    """producer(x) -> {cast i8 -> dense}, {cast i8 -> dense} -> add"""
    outs = []
    for w in (W1, W2):
        outs.append(relay.nn.dense(relay.cast(producer, "int8"), relay.const(w), out_dtype="int32"))
    return infer(relay.add(*outs))


def test_downcasts_merged_generic():
    x = relay.var("x", shape=(2, 16), dtype="int32")
    before = downcast_branches(relay.nn.relu(x))
    x2 = relay.var("x", shape=(2, 16), dtype="int32")
    c = relay.cast(relay.nn.relu(x2), "int8")
    expected = infer(relay.add(relay.nn.dense(c, relay.const(W1), out_dtype="int32"),
                              relay.nn.dense(c, relay.const(W2), out_dtype="int32")))
    after = check(CombineParallelCast(), before, expected)
    assert_same_outputs(before, after, random_inputs(before, seed=3))


# -- rejected producers ------------------------------------------------------------------------------
def _var_producer():
    return downcast_branches(relay.var("x", shape=(2, 16), dtype="int32"))


def _reduce_producer():
    x = relay.var("x", shape=(2, 16, 3), dtype="int32")
    return downcast_branches(relay.sum(x, axis=2))


def _other_users():
    x = relay.var("x", shape=(2, 16), dtype="int32")
    r = relay.nn.relu(x)
    outs = [relay.nn.dense(relay.cast(r, "int8"), relay.const(w), out_dtype="int32") for w in (W1, W2)]
    return infer(relay.Tuple([relay.add(*outs), relay.exp(relay.cast(r, "float32"))]))


@pytest.mark.parametrize(
    "builder, reason",
    [(_var_producer, "parameter"), (_reduce_producer, "TOpPattern 3"), (_other_users, "other users")],
)
def test_unfusable_producers_rejected_with_reason(builder, reason, caplog):
    assert_unchanged_with_reason(CombineParallelCast(), builder(), reason, LOGGER, caplog)


def test_min_num_branches():
    assert_unchanged(CombineParallelCast(min_num_branches=3), small_before())
    for bad in (1, 0, True, "2", 2.0):
        with pytest.raises((ValueError, TypeError), match="CombineParallelCast"):
            CombineParallelCast(min_num_branches=bad)


def test_idempotent():
    once = CombineParallelCast()(small_before())
    assert_unchanged(CombineParallelCast(), once)


def test_unchanged_when_nothing_matches():
    x = relay.var("x", shape=(4,), dtype="float32")
    assert_unchanged(CombineParallelCast(), infer(relay.nn.relu(relay.exp(x))))


# -- bad input ---------------------------------------------------------------------------------------
def test_untyped_module_raises():
    data = relay.var("data", shape=(1, 16), dtype="float32")
    c = relay.cast(data, "int32")
    mod = tvm.IRModule.from_expr(relay.Function([data], relay.add(relay.cast(c, "int8"), relay.cast(c, "int8"))))
    assert_untyped_module_raises(CombineParallelCast(), mod, "CombineParallelCast")


def test_dynamic_shapes_skipped(caplog):
    x = relay.var("x", shape=(relay.Any(), 16), dtype="int32")
    r = relay.nn.relu(x)
    mod = infer(relay.Tuple([relay.nn.relu(relay.cast(r, "int8")), relay.abs(relay.cast(r, "int8"))]))
    assert_unchanged_with_reason(CombineParallelCast(), mod, "dynamic shape", LOGGER, caplog)


def test_if_and_let_skipped(caplog):
    x = relay.var("x", shape=(4,), dtype="int32")
    r = relay.nn.relu(x)
    pair = relay.add(relay.cast(r, "int8"), relay.cast(r, "int8"))
    assert_if_and_let_skipped(CombineParallelCast(), pair, LOGGER, caplog)


def test_tuple_values_skipped():
    """Casts of tuple fields (producer is a TupleGetItem): left alone."""
    x = relay.var("x", shape=(4, 8), dtype="int32")
    part = relay.split(x, 2, axis=0)[0]
    mod = infer(relay.Tuple([relay.nn.relu(relay.cast(part, "int8")), relay.abs(relay.cast(part, "int8"))]))
    assert_unchanged(CombineParallelCast(), mod)


# -- pass infrastructure ----------------------------------------------------------------------------
def test_runs_under_default_context_and_in_sequential():
    expected = small_expected()
    with tvm.transform.PassContext():  # default opt_level 2
        out = CombineParallelCast()(small_before())
        tvm.ir.assert_structural_equal(out["main"], expected["main"])
        seq = tvm.transform.Sequential([relay.transform.InferType(), CombineParallelCast()], name="seq")
        tvm.ir.assert_structural_equal(seq(small_before())["main"], expected["main"])


def test_disabled_pass_skips_it():
    """TVM checks opt_level and disabled_pass in Sequential (as relay.build does), not on a bare call."""
    mod = small_before()
    seq = tvm.transform.Sequential([CombineParallelCast()])
    with tvm.transform.PassContext(opt_level=3, disabled_pass=["CombineParallelCast"]):
        out = seq(mod)
    tvm.ir.assert_structural_equal(out["main"], mod["main"])
    with tvm.transform.PassContext(opt_level=0):  # below the pass's opt_level 1
        out = seq(mod)
    tvm.ir.assert_structural_equal(out["main"], mod["main"])


def test_visible_to_instruments():
    assert "CombineParallelCast" in pass_names_seen(lambda: CombineParallelCast()(small_before()))


def test_registered():
    from tvm_ext.core.registry import get_pass

    assert get_pass("CombineParallelCast").factory is CombineParallelCast
    assert CombineParallelCast().info.name == "CombineParallelCast"


def test_casts_of_a_value_also_returned_in_a_tuple():
    """A producer whose other user is the output Tuple is left alone (``op_name`` of a Tuple is None).

    ::

        x -> clip -> cast i32 ---+-> add -> 3 x cast u8 --> (c1, a, c2, c3)
                 \\-> cast i32 --+
    """
    x = relay.var("x", shape=(1, 2, 2, 2))
    c = relay.clip(x, -100.0, 100.0)
    a = relay.add(relay.cast(c, "int32"), relay.cast(c, "int32"))
    casts = [relay.cast(a, "uint8") for _ in range(3)]
    mod = infer(relay.Tuple([casts[0], a, casts[1], casts[2]]))
    out = CombineParallelCast()(mod)
    tvm.ir.assert_structural_equal(CombineParallelCast()(out)["main"], out["main"])  # idempotent
    assert_same_outputs(mod, out, random_inputs(mod))
