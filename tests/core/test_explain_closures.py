"""Closures and control flow, explained as FuseOps handles them: kernels inside closures and If
branches are FuseOps' own (and the VM's), and values crossing a Let, an If or a closure call are
boundaries with their reason."""
import json

import pytest
import tvm
from tvm import relay

from tvm_ext.core.explain import explain


def let_closure():
    """fn (%a: Tensor[(4), float32]) { let %f = fn () { exp(%a) }; %f() }"""
    a = relay.var("a", shape=(4,), dtype="float32")
    f = relay.var("f")
    return tvm.IRModule.from_expr(
        relay.Function([a], relay.Let(f, relay.Function([], relay.exp(a)), relay.Call(f, []))))


def if_of_closures():
    """TVM's test_fuse_myia_regression (tests/python/relay/test_pass_fuse_ops.py): a call of the
    closure an If returns."""
    x = relay.var("x", shape=(), dtype="int64")
    y = relay.var("y", shape=(), dtype="int64")
    sb = relay.ScopeBuilder()
    with sb.if_scope(relay.op.greater(x, y)):
        sb.ret(relay.Function([], x))
    with sb.else_scope():
        sb.ret(relay.Function([], y))
    return tvm.IRModule.from_expr(relay.Function([x, y], relay.Call(sb.get(), [])))


def let_tuple_if():
    """let %v = relu(x); let %f = fn () { exp(%v) }; %t = (%f(), tanh(%v));
    if (%c) { %t.0 + 1 } else { sigmoid(%t.1) }"""
    x, c = relay.var("x", shape=(1, 8)), relay.var("c", shape=(), dtype="bool")
    v, f = relay.var("v"), relay.var("f")
    t = relay.Tuple([relay.Call(f, []), relay.tanh(v)])
    body = relay.If(c, relay.add(relay.TupleGetItem(t, 0), relay.const(1.0)), relay.sigmoid(relay.TupleGetItem(t, 1)))
    return tvm.IRModule.from_expr(
        relay.Function([x, c], relay.Let(v, relay.nn.relu(x), relay.Let(f, relay.Function([], relay.exp(v)), body))))


def _vm_kernels(mod):
    """The kernels relay.vm.compile builds (its names carry the prefix vm_mod_ instead of tvmgen_default_)."""
    exe = relay.vm.compile(mod, target="llvm")
    return sorted(n[len("vm_mod_"):] for n in exe.primitive_ops)


@pytest.mark.parametrize("graph, kernels, construct", [
    (let_closure, ["fused_exp"], "call of the closure %f"),
    (if_of_closures, ["fused_greater"], "call of the function an If returns"),
    (let_tuple_if, ["fused_add", "fused_exp", "fused_nn_relu", "fused_sigmoid", "fused_tanh"],
     "call of the closure %f"),
])
def test_closures_and_control_flow_are_explained_as_fuse_ops_does(graph, kernels, construct):
    """The kernels inside closures and If branches are FuseOps' own (and the VM's), named as TVM names
    them; compile=True names the construct the graph executor cannot run."""
    from tvm_ext.core.tvm_bugs import UnsupportedByTVM

    mod = graph()
    ex = explain(mod)
    assert ex.verified is True, ex.verify_note
    names = sorted(k.name for k in ex.kernels)
    assert names == ["tvmgen_default_" + k for k in kernels]
    assert [n[len("tvmgen_default_"):] for n in names] == _vm_kernels(mod)
    json.loads(ex.to_json())
    assert ex.to_html().count('class="kernel"') == len(kernels) and all(n in ex.table() for n in names)
    with pytest.raises(UnsupportedByTVM, match=construct):
        explain(mod, compile=True)


def test_let_tuple_if_boundaries():
    """A kernel inside a closure reads a Let-bound value; an If's branches read a Let-bound tuple whole
    (TVM passes the tuple to each branch's kernel); the closure call's result is not followed."""
    ex = explain(let_tuple_if())
    kernel = {k.ops[0]: k.index for k in ex.kernels}
    by_op = {b.op: b for b in ex.boundaries}
    assert set(by_op) == {"nn.relu", "tanh"}
    relu, tanh = by_op["nn.relu"], by_op["tanh"]
    assert relu.consumers == tuple(sorted((kernel["exp"], kernel["tanh"]))) and relu.kind == "no_post_dominator"
    assert "Let/If/Match operand" in relu.detail
    assert tanh.consumers == tuple(sorted((kernel["add"], kernel["sigmoid"]))) and tanh.kind == "tuple"


def test_value_passed_to_a_closure_is_a_closure_call_boundary():
    """relu(x) read by tanh and passed to a let-bound closure %f: the call is kOpaque, no kernel."""
    x, q, f = relay.var("x", shape=(1, 8)), relay.var("q", shape=(1, 8)), relay.var("f")
    r = relay.nn.relu(x)
    body = relay.Let(f, relay.Function([q], relay.exp(q)), relay.Tuple([relay.Call(f, [r]), relay.tanh(r)]))
    ex = explain(tvm.IRModule.from_expr(relay.Function([x], body)))
    assert ex.verified is True and ex.num_kernels == 3
    (b,) = ex.boundaries
    assert b.op == "nn.relu" and b.kind == "closure_call" and "call of the closure %f" in b.detail
    assert b.remedy == "none"
