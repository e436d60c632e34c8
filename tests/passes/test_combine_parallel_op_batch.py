"""Tests of tvm_ext.passes.combine_parallel_op_batch: the safe binding of TVM's C++ pass.

Crashing C++ calls run only in a child process.
"""
from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
import tvm
from tvm import relay

from tvm_ext.passes import combine_parallel_op_batch as cpob
from tvm_ext.passes.combine_parallel_op_batch import SUPPORTED_PAIRS, CombineParallelOpBatch
from tvm_ext.testing import assert_same_outputs, assert_unchanged, check, infer, random_inputs

from _helpers import assert_unchanged_with_reason, pass_names_seen

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
    assert_unchanged_with_reason(CombineParallelOpBatch("add", "add"), ewise_before(y_shape=(8,)),
                                 "broadcasts", LOGGER, caplog)


def test_following_op_with_scalar_is_stacked_with_unit_axes(caplog):
    """C++ would stack the scalars to [3] and build an ill-typed graph; the Python rewrite gives each
    scalar two unit axes first ([3, 1, 1] against the batched [3, 3, 8])."""
    before = ewise_before(follow=lambda e, i: relay.multiply(e, relay.const(float(i + 1))))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        after = CombineParallelOpBatch("add", "add")(before)
    assert "not delegated" in caplog.text
    assert sum(1 for c in _calls(after) if c.op.name == "add") == 1
    (mul,) = [c for c in _calls(after) if c.op.name == "multiply"]
    assert [int(d) for d in mul.args[1].checked_type.shape] == [3, 1, 1]
    assert_same_outputs(after, before, random_inputs(before))


def test_following_op_argument_that_would_grow_the_branch_stops_it(caplog):
    """add(add(x, y_i)[3, 8], z_i[2, 3, 8]) is [2, 3, 8]: stacking z_i would misalign the batch axis."""
    before = ewise_before(follow=lambda e, i: relay.add(e, relay.var(f"z{i}", shape=(2, 3, 8))))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        after = CombineParallelOpBatch("add", "add")(before)
    assert "does not broadcast into [3, 8]" in caplog.text
    assert sum(1 for c in _calls(after) if c.op.name == "add") == 1 + 3  # the roots combined, the branches stop
    assert_same_outputs(after, before, random_inputs(before))


# -- dense with a bias: TVM's own test graphs (tests/python/relay/test_pass_combine_parallel_dense.py) ---------
def dense_bias_before(i=3, j=5, k=4, bias_shape=None, scale=False, newshape=None, n=2):
    """x -> n x (dense(x, w_b) -> add(b_b) [-> multiply(s_b) -> reshape])

    ::

        x -+-> dense(w1) -> add(b1[j]) [-> multiply(s1[1]) -> reshape]
           +-> dense(w2) -> add(b2[j]) [-> multiply(s2[1]) -> reshape]
    """
    x = relay.var("x", shape=(i, k))
    outs = []
    for b in range(1, n + 1):
        y = relay.add(relay.nn.dense(x, relay.var(f"w{b}", shape=(j, k))),
                      relay.var(f"b{b}", shape=bias_shape or (j,)))
        if scale:
            y = relay.multiply(y, relay.var(f"scale{b}", shape=(1,)))
        if newshape:
            y = relay.reshape(y, newshape=newshape)
        outs.append(y)
    return infer(relay.Tuple(outs))


def dense_bias_expected(i=3, j=5, k=4, bias_shape=None, scale=False, newshape=None):
    """stack -> batch_matmul -> add(stack(expand_dims(b_i, 0))) [-> multiply(stack(expand_dims(s_i, 0)))]
    -> split -> squeeze [-> reshape]: TVM's expected graph, with the same variables."""
    x = relay.var("x", shape=(i, k))
    w = [relay.var(f"w{b}", shape=(j, k)) for b in (1, 2)]
    bias = [relay.var(f"b{b}", shape=bias_shape or (j,)) for b in (1, 2)]
    s = [relay.var(f"scale{b}", shape=(1,)) for b in (1, 2)]
    y = relay.nn.batch_matmul(relay.stack([x, x], axis=0), relay.stack(w, axis=0))
    y = relay.add(y, relay.stack([relay.expand_dims(b, 0) if bias_shape is None else b for b in bias], axis=0))
    if scale:
        y = relay.multiply(y, relay.stack([relay.expand_dims(v, 0) for v in s], axis=0))
    parts = relay.split(y, 2, axis=0).astuple()
    outs = [relay.squeeze(relay.TupleGetItem(parts, b), axis=[0]) for b in (0, 1)]
    if newshape:
        outs = [relay.reshape(o, newshape=newshape) for o in outs]
    params = [x, w[0], bias[0]] + ([s[0]] if scale else []) + [w[1], bias[1]] + ([s[1]] if scale else [])
    return infer(relay.Function(params, relay.Tuple(outs)))


BIAS_CASES = {
    "biasadd_1d": dict(),
    "biasadd_2d": dict(bias_shape=(3, 5)),
    "biasadd_scale_reshape": dict(scale=True, newshape=(1, 1, 15)),
}


@pytest.mark.parametrize("case", list(BIAS_CASES))
def test_dense_bias_is_stacked_as_tvm_does(case):
    kw = BIAS_CASES[case]
    p = CombineParallelOpBatch("nn.dense", "nn.batch_matmul", 2)
    before = dense_bias_before(**kw)
    after = check(p, before, dense_bias_expected(**kw))
    # TVM's own pass builds the same graph
    tvm.ir.assert_structural_equal(after["main"],
                                   relay.transform.CombineParallelDense(2, to_batch=True)(before)["main"])
    assert_same_outputs(after, before, random_inputs(before, seed=2))


def test_dense_bias_idempotent_and_unchanged_without_match():
    p = CombineParallelOpBatch("nn.dense", "nn.batch_matmul", 2)
    combined = p(dense_bias_before(scale=True, newshape=(1, 1, 15)))
    assert_unchanged(p, combined)
    assert_unchanged(CombineParallelOpBatch("nn.dense", "nn.batch_matmul", 3), dense_bias_before())
    # one dense only: nothing to combine
    assert_unchanged(p, dense_bias_before(n=1))


def test_dense_bias_of_other_shape_stops_the_branch():
    """A bias [i, j] x 2 broadcast from [2, i, j] would grow each branch: the adds stay per branch."""
    p = CombineParallelOpBatch("nn.dense", "nn.batch_matmul", 2)
    before = dense_bias_before(bias_shape=(2, 3, 5))
    after = p(before)
    assert [c.op.name for c in _calls(after)].count("add") == 2
    assert any(c.op.name == "nn.batch_matmul" for c in _calls(after))
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
    before = dense_before()
    seq = tvm.transform.Sequential([CombineParallelOpBatch("nn.dense", "nn.batch_matmul", 3)])
    with tvm.transform.PassContext(opt_level=3, disabled_pass=["CombineParallelOpBatch"]):
        tvm.ir.assert_structural_equal(seq(before)["main"], before["main"])
    assert "CombineParallelOpBatch" in pass_names_seen(lambda: seq(before))


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
    assert_unchanged(CombineParallelOpBatch("nn.dense", "nn.batch_matmul", 3),
                     infer(relay.If(cond, branches, branches)))
    xd = relay.var("x", shape=(relay.Any(), 8))
    dyn = infer(relay.Tuple([relay.nn.dense(xd, w) for w in ws]))
    assert_unchanged(CombineParallelOpBatch("nn.dense", "nn.batch_matmul", 3), dyn)


def test_registered():
    from tvm_ext.core.registry import get_pass

    assert get_pass("CombineParallelOpBatch").factory is CombineParallelOpBatch
    assert CombineParallelOpBatch("add", "add").info.name == "CombineParallelOpBatch"


def dependent_before():
    """The second add reads the first one's result.

    ::

        x -> a = x * 0.05 -+-> s1 = add(a, x * 0.1) ----------------+--> (s1, s2)
                           +-> s2 = add(a, round(s1 / 0.1) * 0.1) <-+

    Both adds share ``a`` and have equal shapes, so C++ and the Python planner group them; the
    stacked arguments would then need ``s1`` itself (the group computed twice, the original add
    kept, and a second run changing the graph again), so the group is not combined.
    """
    x = relay.var("x", shape=(1, 4, 2, 8))
    a = relay.multiply(x, relay.const(0.05))
    s1 = relay.add(a, relay.multiply(x, relay.const(0.1)))
    s2 = relay.add(a, relay.multiply(relay.round(relay.divide(s1, relay.const(0.1))), relay.const(0.1)))
    return infer(s1, s2)


@pytest.mark.parametrize("op", ["add"])
def test_dependent_branches_are_not_combined(op, caplog):
    assert_unchanged_with_reason(CombineParallelOpBatch(op, op, 2), dependent_before(),
                                 "depends on another branch", LOGGER, caplog)
