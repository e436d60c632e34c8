"""Tests of the machinery the passes share: passes/_util.py, passes/_chains.py, passes/_doc.py, tvm_ext._op_pattern,
tvm_ext._reject."""
from __future__ import annotations

import inspect
import logging

import pytest
import tvm
from tvm import relay

from tvm_ext import _op_pattern
from tvm_ext._reject import Reject
from tvm_ext.core.registry import list_passes
from tvm_ext.passes import _chains, _doc, _util
from tvm_ext.testing import infer


def _counting_step(limit):
    """A rewrite that wraps the body in one more ``negative`` per call, ``limit`` times at most."""

    def step(func):
        depth = _util.count_calls(func.body, ("negative",))
        if depth >= limit:
            return func
        return _util.with_body(func, relay.negative(func.body))

    return step


def _func():
    x = relay.var("x", shape=(2,), dtype="float32")
    return infer(relay.nn.relu(x))["main"]


def test_fixed_point_reaches_the_fixed_point_within_the_cap():
    out = _util.fixed_point(_func(), _counting_step(3), "SomePass", max_rounds=3)
    assert _util.count_calls(out.body, ("negative",)) == 3


def test_fixed_point_raises_naming_the_pass_at_the_cap():
    with pytest.raises(RuntimeError, match="SomePass: still rewriting after 2 rounds"):
        _util.fixed_point(_func(), _counting_step(5), "SomePass", max_rounds=2)


def test_fixed_point_warns_and_stops_at_the_cap_when_asked(caplog):
    with caplog.at_level(logging.WARNING, logger="tvm_ext.passes.SomePass"):
        out = _util.fixed_point(_func(), _counting_step(5), "SomePass", max_rounds=2, on_cap="warn")
    assert _util.count_calls(out.body, ("negative",)) == 2
    assert "still rewriting after 2 rounds" in caplog.text


def test_fixed_point_rejects_an_unknown_cap_policy():
    with pytest.raises(ValueError, match="on_cap"):
        _util.fixed_point(_func(), _counting_step(1), "SomePass", max_rounds=2, on_cap="ignore")


def test_substitute_without_replacements_returns_the_function_itself():
    func = _func()
    assert _util.substitute(func, "SomePass", lambda nodes, users, body: {}).same_as(func)


def test_substitute_rewrites_from_the_map():
    func = _func()
    out = _util.substitute(func, "SomePass", lambda nodes, users, body: {
        n: relay.abs(n.args[0]) for n in _util.op_calls(nodes, ("nn.relu",))})
    assert _util.op_name(out.body) == "abs" and _util.op_name(func.body) == "nn.relu"


def test_op_pattern_values_and_calls():
    x = relay.var("x", shape=(1, 4, 8, 8))
    w = relay.var("w", shape=(4, 4, 3, 3))
    assert _op_pattern.op_pattern("add") == _op_pattern.K_BROADCAST
    assert _op_pattern.op_pattern("nn.conv2d") == _op_pattern.K_OUT_EWISE_FUSABLE
    assert _op_pattern.op_pattern("no.such_op") == _op_pattern.K_OPAQUE
    assert _op_pattern.call_pattern(relay.nn.conv2d(x, w)) == _op_pattern.K_OUT_EWISE_FUSABLE
    assert _op_pattern.call_pattern(x) == _op_pattern.K_OPAQUE  # not a call


def test_one_reject_for_passes_and_pattern_tables():
    from tvm_ext import patterns

    assert patterns.Reject is Reject is _util.Reject
    r = Reject("bias is not per-channel")
    assert not r and str(r) == "bias is not per-channel" and repr(r) == "Reject('bias is not per-channel')"


def test_describe_and_static_shape():
    x = relay.var("x", shape=(2, 3), dtype="int8")
    c = infer(relay.cast(x, "int32"))["main"].body
    assert _util.describe(c) == "cast" and _util.describe(c, with_dtype=True) == "cast:int32"
    assert _util.describe(x) == "%x" and _util.static_shape(c) == (2, 3)


def test_walk_chain_finds_the_narrow_point_nearest_to_the_argument():
    x = relay.var("x", shape=(4,), dtype="uint8")
    wide = relay.multiply(relay.cast(x, "float32"), relay.const(0.5))
    body = relay.nn.relu(wide)
    nodes = _util.post_order(infer(body)["main"].body)
    users = _util.consumers(nodes)
    root = nodes[-1]  # relu, the function's result; its argument ends the chain
    src, narrow = _chains.walk_chain(root.args[0], users, root, "SomePass")
    assert src.name_hint == "x"  # the chain ends at the parameter
    assert narrow[1:] == ("uint8", "typed") and narrow[0].name_hint == "x"


def test_copy_chain_rebuilds_the_links_on_a_new_input():
    x = relay.var("x", shape=(4,), dtype="uint8")
    chain = infer(relay.multiply(relay.cast(x, "float32"), relay.const(0.5)))["main"].body
    y = relay.var("y", shape=(4,), dtype="uint8")
    copy = _chains.copy_chain([chain, chain.args[0]], y)
    assert tvm.ir.structural_equal(infer(copy)["main"].body,
                                   infer(relay.multiply(relay.cast(y, "float32"), relay.const(0.5)))["main"].body)


def test_every_pass_factory_documents_the_pass_it_returns():
    """Each registered factory's docstring names its own pass under Returns, in numpydoc order
    (Returns, then Raises and Notes where there are some)."""
    for spec in list_passes():
        doc = inspect.getdoc(spec.factory)
        returns, raises, notes = (doc.find(f"\n{t}\n{'-' * len(t)}\n") for t in ("Returns", "Raises", "Notes"))
        assert returns > 0 and f'pass named ``"{spec.name}"``' in doc[returns:], spec.name
        assert all(at == -1 or returns < at for at in (raises, notes)) and (-1 in (raises, notes) or raises < notes)


def test_factory_sections_insert_before_notes_and_reject_a_second_returns():
    def factory():
        """Summary.

        Notes
        -----
        Own note.
        """

    doc = _doc.factory_sections("Toy", raises=(("TypeError", "a bad argument."),))(factory).__doc__
    assert doc.index("Returns") < doc.index("TypeError") < doc.index("UntypedModuleError") < doc.index("Own note")
    assert '``"Toy"`` (opt_level 1)' in doc
    with pytest.raises(ValueError, match="factory_sections: factory's docstring already has Returns"):
        _doc.factory_sections("Toy")(factory)
