"""Tests of tvm_ext.passes.anchored_argument_first (the anchor's chain first at a commutative join)."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.core.explain import explain
from tvm_ext.passes.anchored_argument_first import AnchoredArgumentFirst
from tvm_ext.testing import assert_unchanged, infer, run_module

from _helpers import assert_if_and_let_skipped, assert_untyped_module_raises

LOGGER = "tvm_ext.passes.AnchoredArgumentFirst"
SHAPE = (1, 8, 6, 6)
W1 = np.random.default_rng(1).integers(-3, 4, (8, 8, 1, 1)).astype("int8")
W2 = np.random.default_rng(2).integers(-3, 4, (8, 8, 1, 1)).astype("int8")
OPENCL = tvm.target.Target("opencl", host="llvm")


def _conv(v, w):
    c = relay.nn.conv2d(v, relay.const(w), kernel_size=(1, 1), channels=8, out_dtype="int32")
    # bias as QNN lowering leaves it at GPU targets: a cast of a constant, not folded
    return relay.add(c, relay.cast(relay.const(np.arange(8, dtype="int8").reshape(8, 1, 1)), "int32"))


def _requant(v):
    return relay.right_shift(relay.add(v, relay.const(3)), relay.const(2))


def _widen(n):
    return relay.multiply(relay.subtract(relay.cast(n, "int32"), relay.const(5)), relay.const(2))


def shortcut_join(op="add", swapped=False, dtype="int32", typed=True):
    """A residual join as a QDQ graph lowers it: n = conv1's 8-bit output, read by conv2 and widened for
    the join's earlier argument; the later argument is conv2's chain (``swapped``: the pass's result)::

        x -> conv1 -> n (u8) -> conv2 -> requant -+-> join -> clip -> cast u8
                      n -> cast -> subtract -> multiply -+
    """
    x = relay.var("x", shape=SHAPE, dtype="uint8")
    n = relay.cast(relay.clip(_requant(_conv(x, W1)), 0, 255), "uint8")
    a = relay.clip(_requant(_conv(n, W2)), 0, 255)
    w = _widen(n)
    if dtype != "int32":
        a, w = relay.cast(a, dtype), relay.cast(w, dtype)
    join = getattr(relay, op)(a, w) if swapped else getattr(relay, op)(w, a)
    func = relay.Function([x], relay.cast(relay.clip(join, 0, 255), "uint8"))
    return infer(func) if typed else tvm.IRModule.from_expr(func)


def numpy_shortcut_join(x, op="add"):
    """``shortcut_join``'s output computed in numpy (int64), independently of TVM."""
    def conv(v, w):
        return np.einsum("oc,nchw->nohw", w[:, :, 0, 0].astype(np.int64), v.astype(np.int64)) + \
            np.arange(8).reshape(1, 8, 1, 1)

    def requant(v):
        return (v + 3) >> 2

    n = np.clip(requant(conv(x, W1)), 0, 255)
    a = np.clip(requant(conv(n, W2)), 0, 255)
    w = (n - 5) * 2
    join = {"add": np.add, "multiply": np.multiply, "maximum": np.maximum, "minimum": np.minimum}[op](w, a)
    return np.clip(join, 0, 255).astype(np.uint8)


def _at_opencl(mod, pass_=None):
    with OPENCL:
        return (pass_ or AnchoredArgumentFirst())(mod)


@pytest.mark.parametrize("op", ["add", "multiply", "maximum", "minimum"])
def test_swaps_the_join_at_a_gpu_target(op):
    tvm.ir.assert_structural_equal(_at_opencl(shortcut_join(op)), shortcut_join(op, swapped=True))


@pytest.mark.parametrize("op", ["add", "multiply", "maximum"])
def test_outputs_bit_exact_against_numpy(op):
    """The swapped graph, built at plain ``llvm``, against numpy: every uint8 input pattern of a random batch."""
    x = np.random.default_rng(3).integers(0, 256, SHAPE).astype("uint8")
    after = _at_opencl(shortcut_join(op))
    got = run_module(tvm_ext.build(after, target="llvm"), {"x": x})[0]
    np.testing.assert_array_equal(got, numpy_shortcut_join(x, op))


def test_idempotent():
    once = _at_opencl(shortcut_join())
    tvm.ir.assert_structural_equal(_at_opencl(once), once)


def test_unchanged_at_a_cpu_target(caplog):
    """Without max_function_args FuseOps fuses either argument's chain: nothing to swap."""
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        with tvm.target.Target("llvm"):
            assert_unchanged(AnchoredArgumentFirst(), shortcut_join())
    assert "no max_function_args" in caplog.text


def test_unchanged_when_the_anchor_is_first(caplog):
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        with OPENCL:
            assert_unchanged(AnchoredArgumentFirst(), shortcut_join(swapped=True))
    assert "already the chain of nn.conv2d" in caplog.text


def test_unchanged_float_maximum(caplog):
    """Float maximum is not commutative bit for bit (a NaN): left alone with the reason."""
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        with OPENCL:
            assert_unchanged(AnchoredArgumentFirst(), shortcut_join("maximum", dtype="float32"))
    assert "NaN" in caplog.text


def test_float_add_swaps():
    tvm.ir.assert_structural_equal(_at_opencl(shortcut_join(dtype="float32")),
                                   shortcut_join(swapped=True, dtype="float32"))


def test_unchanged_when_both_chains_have_anchors(caplog):
    x = relay.var("x", shape=SHAPE, dtype="uint8")
    join = relay.add(_requant(_conv(x, W1)), _requant(_conv(x, W2)))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        with OPENCL:
            assert_unchanged(AnchoredArgumentFirst(), infer(relay.Function([x], join)))
    assert "already the chain of nn.conv2d" in caplog.text


def test_unchanged_when_the_anchor_has_other_readers(caplog):
    """conv2's output also returned: its kernel ends before the join either way."""
    x = relay.var("x", shape=SHAPE, dtype="uint8")
    c2 = _conv(x, W2)
    join = relay.add(_widen(relay.cast(x, "uint8")), relay.clip(_requant(c2), 0, 255))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        with OPENCL:
            assert_unchanged(AnchoredArgumentFirst(), infer(relay.Function([x], relay.Tuple([join, c2]))))
    assert "other readers" in caplog.text


def test_untyped_module_raises():
    with OPENCL:
        assert_untyped_module_raises(AnchoredArgumentFirst(), shortcut_join(typed=False), "AnchoredArgumentFirst")


def test_if_and_let_skipped(caplog):
    with OPENCL:
        assert_if_and_let_skipped(AnchoredArgumentFirst(), shortcut_join()["main"].body, LOGGER, caplog)


def test_caller_module_not_mutated():
    mod = shortcut_join()
    text = mod.astext()
    _at_opencl(mod)
    assert mod.astext() == text


def test_opencl_kernels_and_explain():
    """At opencl stock FuseOps leaves the widening chain as a kernel writing int32; explain names the
    dropped postponed fusion and this pass as its remedy; with the pass the chain fuses into conv2's kernel."""
    mod = shortcut_join()
    stock = tvm_ext.build(mod, target=OPENCL).kernel_report
    built = tvm_ext.build(mod, target=OPENCL, passes=[AnchoredArgumentFirst()]).kernel_report
    assert stock.num_launched_kernels == 3 and built.num_launched_kernels == 2
    assert "int32" in stock.crossing.nbytes and set(built.crossing.nbytes) == {"uint8"}
    ex = explain(mod, OPENCL)
    dropped = [b for b in ex.boundaries if b.kind == "postponed_dropped"]
    assert len(dropped) == 1 and dropped[0].dtype == "int32"
    assert "AnchoredArgumentFirst" in (dropped[0].remedy or "")
    assert not [b for b in explain(mod, OPENCL, passes=[AnchoredArgumentFirst()]).boundaries
                if b.kind == "postponed_dropped"]
