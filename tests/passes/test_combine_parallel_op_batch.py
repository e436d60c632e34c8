"""Tests of tvm_ext.passes.combine_parallel_op_batch: the safe binding of TVM's C++ pass.

Crashing C++ calls run only in a child process.
"""
from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_ext.passes import combine_parallel_op_batch as cpob
from tvm_ext.passes.combine_parallel_op_batch import SUPPORTED_PAIRS, CombineParallelOpBatch
from tvm_ext.testing import assert_same_outputs, assert_unchanged, check, infer, random_inputs

LOGGER = "tvm_ext.passes.CombineParallelOpBatch"


def dense_before(dtype="float32", out_dtype="", n=3):
    """x -> n x (dense(x, w_i) -> relu)

    ::

        x -+-> dense(w0) -> relu
           +-> dense(w1) -> relu
           +-> dense(w2) -> relu
    """
    x = relay.var("x", shape=(2, 8), dtype=dtype)
    ws = [relay.var(f"w{i}", shape=(4, 8), dtype=dtype) for i in range(n)]
    return infer(relay.Tuple([relay.nn.relu(relay.nn.dense(x, w, out_dtype=out_dtype)) for w in ws]))


def dense_expected(dtype="float32", out_dtype=""):
    """stack -> batch_matmul(transpose_b, out_dtype) -> relu -> split -> squeeze."""
    x = relay.var("x", shape=(2, 8), dtype=dtype)
    ws = [relay.var(f"w{i}", shape=(4, 8), dtype=dtype) for i in range(3)]
    bmm = relay.nn.batch_matmul(relay.stack([x, x, x], axis=0), relay.stack(ws, axis=0),
                                out_dtype=out_dtype, transpose_a=False, transpose_b=True)
    split = relay.split(relay.nn.relu(bmm), 3, axis=0).astuple()
    return infer(relay.Tuple([relay.squeeze(relay.TupleGetItem(split, i), axis=[0]) for i in range(3)]))


@pytest.mark.parametrize("dtype, out_dtype", [("float32", ""), ("int8", "int32")])
def test_dense_to_batch_matmul(dtype, out_dtype):
    before = dense_before(dtype, out_dtype)
    after = check(CombineParallelOpBatch("nn.dense", "nn.batch_matmul", 3), before, dense_expected(dtype, out_dtype))
    reference = relay.transform.CombineParallelDense(3, to_batch=True)(before)
    assert_same_outputs(after, reference, random_inputs(before))
    assert_same_outputs(after, before, random_inputs(before, seed=1))
    outs = [c for c in _calls(after) if c.op.name == "nn.batch_matmul"]
    assert len(outs) == 1 and outs[0].checked_type.dtype == (out_dtype or dtype)


def _calls(mod):
    calls = []
    relay.analysis.post_order_visit(
        mod["main"], lambda n: calls.append(n) if isinstance(n, relay.Call) and isinstance(n.op, tvm.ir.Op) else None
    )
    return calls


def test_dense_groups_need_equal_attributes_and_min_branches():
    x = relay.var("x", shape=(2, 8))
    ws = [relay.var(f"w{i}", shape=(4, 8)) for i in range(3)]
    mixed = infer(relay.Tuple([relay.nn.dense(x, ws[0]), relay.nn.dense(x, ws[1]),
                               relay.nn.dense(x, ws[2], out_dtype="float16")]))
    assert_unchanged(CombineParallelOpBatch("nn.dense", "nn.batch_matmul", 3), mixed)
    assert_unchanged(CombineParallelOpBatch("nn.dense", "nn.batch_matmul", 4), dense_before())


def test_cpp_pass_crashes_where_the_binding_is_safe():
    """TVM's C++ pass segfaults on nn.dense -> nn.batch_matmul (empty attributes); ours does not."""
    code = textwrap.dedent(
        """
        import tvm
        from tvm import relay
        x = relay.var("x", shape=(2, 8))
        ws = [relay.var(f"w{i}", shape=(4, 8)) for i in range(3)]
        mod = relay.transform.InferType()(tvm.IRModule.from_expr(
            relay.Function([x, *ws], relay.Tuple([relay.nn.dense(x, w) for w in ws]))))
        cpp = tvm.get_global_func("relay._transform.CombineParallelOpBatch")("nn.dense", "nn.batch_matmul", 3)
        with tvm.transform.PassContext(opt_level=4):
            relay.transform.InferType()(cpp(mod))
        print("survived")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "survived" not in proc.stdout  # SIGSEGV on TVM 0.19
    # the binding, in this process, on the same graph
    CombineParallelOpBatch("nn.dense", "nn.batch_matmul", 3)(dense_before())


# -- elementwise pairs ---------------------------------------------------------------------------------
def ewise_before(y_shape=(3, 8), follow=lambda e, i: relay.nn.relu(e)):
    """x -> 3 x (add(x, y_i) -> follow)"""
    x = relay.var("x", shape=(3, 8))
    ys = [relay.var(f"y{i}", shape=y_shape) for i in range(3)]
    return infer(relay.Tuple([follow(relay.add(x, y), i) for i, y in enumerate(ys)]))


def test_elementwise_delegated_to_cpp_equals_python_rewrite(caplog):
    before = ewise_before()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        after = CombineParallelOpBatch("add", "add")(before)
    assert "delegating" in caplog.text
    rule = SUPPORTED_PAIRS[("add", "add")]
    python = relay.transform.InferType()(tvm.IRModule.from_expr(
        cpob._rewrite(before["main"], cpob._plan(before["main"], "add", rule, 3)[0], rule, "add")))
    tvm.ir.assert_structural_equal(after["main"], python["main"])
    assert_same_outputs(after, before, random_inputs(before))


def test_broadcasting_add_is_not_combined(caplog):
    """C++ would stack y_i[8] into [3, 8] and add it along the wrong axis (silently wrong)."""
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert_unchanged(CombineParallelOpBatch("add", "add"), ewise_before(y_shape=(8,)))
    assert "broadcasts" in caplog.text


def test_following_op_with_scalar_stops_the_branch(caplog):
    """C++ would build an ill-typed graph here; the Python rewrite stops before the multiply."""
    before = ewise_before(follow=lambda e, i: relay.multiply(e, relay.const(float(i + 1))))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        after = CombineParallelOpBatch("add", "add")(before)
    assert "not delegated" in caplog.text
    assert sum(1 for c in _calls(after) if c.op.name == "add") == 1
    assert_same_outputs(after, before, random_inputs(before))


# -- construction errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, match",
    [
        (("nn.bogus", "nn.batch_matmul"), "nn.bogus"),
        (("nn.dense", "nn.bogus_bmm"), "nn.bogus_bmm"),
        (("cast", "cast"), "unsupported pair cast->cast"),
        (("nn.conv2d", "nn.batch_matmul"), "unsupported pair"),
        (("nn.dense", "nn.batch_matmul", 1), "min_num_branches"),
    ],
)
def test_bad_arguments_rejected_at_construction(args, match):
    with pytest.raises(ValueError, match=match):
        CombineParallelOpBatch(*args)


# -- pass infrastructure ------------------------------------------------------------------------------------
def test_runs_under_default_context_unlike_cpp():
    before = dense_before()
    seq = tvm.transform.Sequential([CombineParallelOpBatch("nn.dense", "nn.batch_matmul", 3)])
    with tvm.transform.PassContext():  # opt_level 2; TVM's C++ pass (level 4) would not run
        after = seq(before)
    assert any(c.op.name == "nn.batch_matmul" for c in _calls(after))
    cpp = tvm.get_global_func("relay._transform.CombineParallelOpBatch")("add", "add", 3)
    with tvm.transform.PassContext():
        assert tvm.ir.structural_equal(tvm.transform.Sequential([cpp])(ewise_before()), ewise_before())


def test_disabled_and_instrumented():
    seen = []

    @tvm.instrument.pass_instrument
    class Names:  # pylint: disable=too-few-public-methods
        def run_before_pass(self, mod, info):
            seen.append(info.name)

    before = dense_before()
    seq = tvm.transform.Sequential([CombineParallelOpBatch("nn.dense", "nn.batch_matmul", 3)])
    with tvm.transform.PassContext(opt_level=3, disabled_pass=["CombineParallelOpBatch"]):
        tvm.ir.assert_structural_equal(seq(before)["main"], before["main"])
    with tvm.transform.PassContext(opt_level=2, instruments=[Names()]):
        seq(before)
    assert "CombineParallelOpBatch" in seen


def test_idempotent_and_unchanged_without_match():
    p = CombineParallelOpBatch("nn.dense", "nn.batch_matmul", 3)
    assert_unchanged(p, p(dense_before()))
    assert_unchanged(CombineParallelOpBatch("add", "add"), p(dense_before()))
    assert_unchanged(p, dense_before(n=2))


def test_bad_input():
    x = relay.var("x", shape=(2, 8))
    ws = [relay.var(f"w{i}", shape=(4, 8)) for i in range(3)]
    untyped = tvm.IRModule.from_expr(relay.Function([x, *ws], relay.Tuple([relay.nn.dense(x, w) for w in ws])))
    with pytest.raises(Exception, match="CombineParallelOpBatch: the module is not type-inferred"):
        CombineParallelOpBatch("nn.dense", "nn.batch_matmul", 3)(untyped)
    cond = relay.var("c", shape=(), dtype="bool")
    branches = relay.Tuple([relay.nn.dense(x, w) for w in ws])
    assert_unchanged(CombineParallelOpBatch("nn.dense", "nn.batch_matmul", 3), infer(relay.If(cond, branches, branches)))
    xd = relay.var("x", shape=(relay.Any(), 8))
    dyn = infer(relay.Tuple([relay.nn.dense(xd, w) for w in ws]))
    assert_unchanged(CombineParallelOpBatch("nn.dense", "nn.batch_matmul", 3), dyn)


def test_registered():
    from tvm_ext.registry import get_pass

    assert get_pass("CombineParallelOpBatch").factory is CombineParallelOpBatch
    assert CombineParallelOpBatch("add", "add").info.name == "CombineParallelOpBatch"


def dependent_before():
    """Found by the fuzzer (issue 12): the second add reads the first one's result.

    ::

        x -> a = x * 0.05 -+-> s1 = add(a, x * 0.1) ----------------+--> (s1, s2)
                           +-> s2 = add(a, round(s1 / 0.1) * 0.1) <-+

    Both adds share ``a`` and have equal shapes, so C++ and the Python planner grouped them; the
    stacked arguments then need ``s1`` itself. The rewrite computed the group twice (once to feed
    s2's argument), kept the original add, and a second run changed the graph again.
    """
    x = relay.var("x", shape=(1, 4, 2, 8))
    a = relay.multiply(x, relay.const(0.05))
    s1 = relay.add(a, relay.multiply(x, relay.const(0.1)))
    s2 = relay.add(a, relay.multiply(relay.round(relay.divide(s1, relay.const(0.1))), relay.const(0.1)))
    return infer(s1, s2)


@pytest.mark.parametrize("op", ["add"])
def test_dependent_branches_are_not_combined(op, caplog):
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert_unchanged(CombineParallelOpBatch(op, op, 2), dependent_before())
    assert "depends on another branch" in caplog.text
