"""Tests of passes/_rules.py: ordered dataflow_pattern rules, the first that matches and accepts wins."""
from __future__ import annotations

import logging

from tvm import relay
from tvm.relay import dataflow_pattern as dfp

from tvm_ext._reject import Reject
from tvm_ext.passes._rules import Rule, first_rewrite

LOG = logging.getLogger("tvm_ext.passes.test_rules")


def _x():
    return relay.var("x", shape=(4,), dtype="float32")


def _negate_of_exp():
    return dfp.is_op("negative")(dfp.is_op("exp")(dfp.wildcard()))


RULES = (
    # negative(exp(v)) -> v        (only when v is a variable: a side condition that can reject)
    Rule("t.negative_exp", _negate_of_exp,
         lambda call: call.args[0].args[0] if isinstance(call.args[0].args[0], relay.Var) else Reject("not a var"),
         depth=2),
    # negative(v) -> v
    Rule("t.negative", lambda: dfp.is_op("negative")(dfp.wildcard()), lambda call: call.args[0]),
)


def test_the_first_rule_that_matches_and_accepts_wins():
    x = _x()
    rule, new = first_rewrite(RULES, relay.negative(relay.exp(x)), LOG)
    assert rule.name == "t.negative_exp" and new.same_as(x)
    rule, new = first_rewrite(RULES, relay.negative(relay.abs(x)), LOG)
    assert rule.name == "t.negative" and new.args[0].same_as(x)


def test_a_rejected_match_falls_through_and_is_logged(caplog):
    x = _x()
    deep = relay.exp(relay.abs(x))
    with caplog.at_level(logging.DEBUG, logger=LOG.name):
        rule, new = first_rewrite(RULES, relay.negative(deep), LOG)
    assert rule.name == "t.negative" and new.same_as(deep)
    assert "t.negative_exp: not rewritten: not a var" in caplog.text


def test_no_match_is_a_reject_with_the_reason():
    found = first_rewrite(RULES, relay.abs(_x()), LOG)
    assert not found and "no rule's pattern matches" in str(found)


def test_the_pattern_sees_only_its_depth():
    """A rule of depth 1 does not see the calls below the root: negative(exp(x)) matched at depth 1
    sees negative(v), so a depth-2 pattern given depth 1 cannot match."""
    shallow = (Rule("t.cut", _negate_of_exp, lambda call: call, depth=1),)
    assert not first_rewrite(shallow, relay.negative(relay.exp(_x())), LOG)
