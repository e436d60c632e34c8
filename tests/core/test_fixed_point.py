"""tvm_ext.core._fixed_point and Stage.fixed_points: a group of passes that open matches for each other
runs until a round changes nothing, so the stage is idempotent as a whole."""
import logging

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.relay import dataflow_pattern as dfp

from tvm_ext.core import _fixed_point, pipelines
from tvm_ext.core._int8_tables import INT8


def _rewrite_pass(name, pattern, make):
    """A function pass rewriting every match of ``pattern`` with ``make(node_map)``."""

    class _Callback(dfp.DFPatternCallback):
        def __init__(self):
            super().__init__(require_type=False, rewrite_once=True)
            self.pattern = pattern

        def callback(self, pre, post, node_map):
            return make(node_map)

    @tvm.transform.module_pass(opt_level=0, name=name)
    def _pass(mod, _ctx):
        out = tvm.IRModule(mod.functions)
        out["main"] = dfp.rewrite(_Callback(), mod["main"])
        return relay.transform.InferType()(out)

    return _pass


X = dfp.wildcard()
def CANCEL():
    # negative(negative(x)) -> x
    return _rewrite_pass("Cancel", dfp.is_op("negative")(dfp.is_op("negative")(X)), lambda m: m[X][0])
def OPEN():
    # abs(x) -> negative(negative(maximum(x, negative(x)))): a pair that Cancel, standing before Open,
    # finds only in a second round
    return _rewrite_pass("Open", dfp.is_op("abs")(X),
                         lambda m: relay.negative(relay.negative(relay.maximum(m[X][0], relay.negative(m[X][0])))))
def GROW():
    # sqrt(x) -> sqrt(x + 0): a pass that never settles
    return _rewrite_pass("Grow", dfp.is_op("sqrt")(X), lambda m: relay.sqrt(relay.add(m[X][0], relay.const(0.0))))


def _module(op):
    x = relay.var("x", shape=(4,), dtype="float32")
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], op(x))))


def _count(mod, op_name):
    n = []
    relay.analysis.post_order_visit(mod["main"], lambda e: n.append(1) if isinstance(e, relay.Call)
                                    and getattr(e.op, "name", "") == op_name else None)
    return len(n)


def test_group_repeats_until_nothing_changes_and_is_idempotent():
    mod = _module(relay.abs)
    plain = tvm.transform.Sequential([CANCEL(), OPEN()])(mod)
    assert _count(plain, "negative") == 3  # one round leaves a pair Cancel would take
    fixed = _fixed_point.fixed_point([CANCEL(), OPEN()], ("Cancel", "Open"))
    once = fixed(mod)
    assert _count(once, "negative") == 1 and _count(once, "abs") == 0 and _count(once, "maximum") == 1
    assert tvm.ir.structural_equal(fixed(once), once)
    x = np.array([-2.0, -0.5, 0.0, 3.0], dtype="float32")
    got = relay.create_executor("graph", mod=once, target="llvm").evaluate()(x).numpy()
    np.testing.assert_array_equal(got, np.abs(x))
    assert "abs(" in mod.astext()  # the caller's module is not changed


def test_group_without_a_match_leaves_the_module_unchanged():
    mod = _module(relay.exp)
    out = _fixed_point.fixed_point([CANCEL(), OPEN()], ("Cancel", "Open"))(mod)
    assert tvm.ir.structural_equal(out, mod)


def test_group_that_never_settles_stops_with_a_warning(caplog):
    mod = _module(relay.sqrt)
    with caplog.at_level(logging.WARNING, logger=_fixed_point.__name__):
        out = _fixed_point.fixed_point([GROW(), CANCEL()], ("Grow", "Cancel"))(mod)
    assert _count(out, "add") == _fixed_point.MAX_ROUNDS
    assert "FixedPoint(Grow, Cancel): the module still changed after" in caplog.text


def _step(name):
    return pipelines.Step(name, does="d", why="w")


def test_stage_checks_its_groups():
    a, b, c = _step("FoldPadIntoConv"), _step("FoldZeroPointPadIntoConv"), _step("TabulateEightBit")
    pipelines.Stage("before_fuse", "where", (a, b, c), fixed_points=(("FoldPadIntoConv", "FoldZeroPointPadIntoConv"),))
    with pytest.raises(ValueError, match="must be consecutive"):
        pipelines.Stage("before_fuse", "where", (a, b, c), fixed_points=(("FoldPadIntoConv", "TabulateEightBit"),))
    with pytest.raises(ValueError, match="must name two or more passes of the stage"):
        pipelines.Stage("before_fuse", "where", (a, b, c), fixed_points=(("FoldPadIntoConv", "Nothing"),))
    with pytest.raises(ValueError, match="must name two or more passes of the stage"):
        pipelines.Stage("before_fuse", "where", (a, b, c), fixed_points=(("FoldPadIntoConv",),))
    with pytest.raises(ValueError, match="must be consecutive"):  # a step inserted inside a group breaks it
        pipelines.Stage("before_fuse", "where", (a, b), fixed_points=(("FoldPadIntoConv", "FoldZeroPointPadIntoConv"),)
                        ).insert(c, after="FoldPadIntoConv")


def test_int8_groups_the_repad_fold_with_the_epilogue_move_where_both_run():
    group = ("EpilogueBeforeChannelSlice", "FoldChannelRepadIntoConv")
    before_fuse = INT8[1]
    assert before_fuse.fixed_points == (group,)
    assert before_fuse.for_family("x86").fixed_points == (group,)
    assert before_fuse.for_family("gpu").fixed_points == ()  # EpilogueBeforeChannelSlice runs at CPU targets only
    names = [p.info.name for p in before_fuse.passes()]
    assert "FixedPoint(EpilogueBeforeChannelSlice, FoldChannelRepadIntoConv)" in names
    assert not set(group) & set(names)
    pipe = pipelines.int8()
    assert pipe.pass_names()["before_fuse"] == before_fuse.names()  # users still see every pass by name
    assert "EpilogueBeforeChannelSlice, FoldChannelRepadIntoConv: run again together" in pipelines.listing()


def test_disabled_pass_still_reaches_a_pass_inside_a_group():
    mod = _module(relay.abs)
    fixed = _fixed_point.fixed_point([CANCEL(), OPEN()], ("Cancel", "Open"))
    with tvm.transform.PassContext(opt_level=3, disabled_pass=["Cancel"]):
        out = fixed(mod)
    assert _count(out, "negative") == 3
