"""Tests of tvm_ext/_rules.py: rules of one shape (pattern, check, rewrite), ordered; the first
rule whose pattern matches and whose check accepts rewrites; every rejection is logged with its reason."""
from __future__ import annotations

import logging

import pytest
from tvm import relay
from tvm.relay import dataflow_pattern as dfp

from tvm_ext._reject import Reject
from tvm_ext._rules import Rule, accept, first_rewrite, rewrites, root_ops

LOG = logging.getLogger("tvm_ext.passes.test_rules")


def _x():
    return relay.var("x", shape=(4,), dtype="float32")


def _negate_of_exp():
    return dfp.is_op("negative")(dfp.is_op("exp")(dfp.wildcard()))


def _inner_var(call):
    v = call.args[0].args[0]
    return v if isinstance(v, relay.Var) else Reject("not a var")


RULES = (
    # negative(exp(v)) -> v        (only when v is a variable: a side condition that can reject)
    Rule("t.negative_exp", _negate_of_exp, _inner_var, lambda call, v: v, depth=2),
    # negative(v) -> v
    Rule("t.negative", lambda: dfp.is_op("negative")(dfp.wildcard()), accept, lambda call, _: call.args[0]),
)


def test_the_first_rule_that_matches_and_accepts_wins():
    x = _x()
    found = first_rewrite(RULES, relay.negative(relay.exp(x)), LOG)
    assert found.rule.name == "t.negative_exp" and found.new.same_as(x) and found.found.same_as(x)
    found = first_rewrite(RULES, relay.negative(relay.abs(x)), LOG)
    assert found.rule.name == "t.negative" and found.new.args[0].same_as(x)


def test_a_rejected_match_falls_through_and_is_logged(caplog):
    x = _x()
    deep = relay.exp(relay.abs(x))
    with caplog.at_level(logging.DEBUG, logger=LOG.name):
        found = first_rewrite(RULES, relay.negative(deep), LOG)
    assert found.rule.name == "t.negative" and found.new.same_as(deep)
    assert "t.negative_exp: not rewritten: not a var" in caplog.text


def test_the_rewrite_runs_only_after_the_check_accepts():
    calls = []
    rule = Rule("t.never", lambda: dfp.is_op("negative")(dfp.wildcard()), lambda call: Reject("no"),
                lambda call, found: calls.append(call))
    assert not first_rewrite((rule,), relay.negative(_x()), LOG) and calls == []


def test_a_check_may_hand_an_array_to_the_rewrite():
    """Only a Reject, None or False rejects: a numpy array (whose truth value is ambiguous) is accepted."""
    import numpy as np

    rule = Rule("t.array", lambda: dfp.is_op("negative")(dfp.wildcard()), lambda call: np.zeros(3),
                lambda call, found: relay.const(found))
    found = first_rewrite((rule,), relay.negative(_x()), LOG)
    assert found and found.new.data.numpy().shape == (3,)
    none = Rule("t.none", lambda: dfp.is_op("negative")(dfp.wildcard()), lambda call: None, lambda call, _: call)
    assert not first_rewrite((none,), relay.negative(_x()), LOG)


def test_no_match_is_a_reject_with_the_reason():
    found = first_rewrite(RULES, relay.abs(_x()), LOG)
    assert not found and "no rule's pattern matches" in str(found)


def test_the_pattern_sees_only_its_depth():
    """A rule of depth 1 does not see the calls below the root: negative(exp(x)) matched at depth 1
    sees negative(v), so a depth-2 pattern given depth 1 cannot match."""
    shallow = (Rule("t.cut", _negate_of_exp, accept, lambda call, _: call, depth=1),)
    assert not first_rewrite(shallow, relay.negative(relay.exp(_x())), LOG)


def test_a_sweep_rewrites_each_call_of_a_root_op():
    x = _x()
    inner = relay.negative(relay.exp(x))
    outer = relay.negative(relay.abs(x))
    subst = rewrites([x, relay.exp(x), inner, relay.abs(x), outer], RULES, LOG)
    assert set(subst) == {inner, outer}
    assert subst[inner].same_as(x)


def test_root_ops_of_calls_and_alternations():
    alt = Rule("t.alt", lambda: dfp.is_op("add")(dfp.wildcard(), dfp.wildcard())
               | dfp.is_op("multiply")(dfp.wildcard(), dfp.wildcard()), accept, lambda c, _: c)
    assert root_ops(alt) == {"add", "multiply"}
    assert root_ops(Rule("t.or", lambda: (dfp.is_op("add") | dfp.is_op("subtract"))(dfp.wildcard(), dfp.wildcard()),
                         accept, lambda c, _: c)) == {"add", "subtract"}


def test_a_pattern_not_rooted_at_an_op_is_refused_naming_the_rule():
    with pytest.raises(ValueError, match="t.any"):
        root_ops(Rule("t.any", dfp.wildcard, accept, lambda c, _: c))


@pytest.mark.parametrize("kwargs, error", [
    (dict(name=""), ValueError),
    (dict(check="not callable"), TypeError),
    (dict(depth=0), ValueError),
    (dict(depth=True), ValueError),
])
def test_malformed_rules_are_refused_at_construction(kwargs, error):
    fields = dict(name="t.r", pattern=dfp.wildcard, check=accept, rewrite=lambda c, _: c, depth=1)
    fields.update(kwargs)
    with pytest.raises(error):
        Rule(**fields)
