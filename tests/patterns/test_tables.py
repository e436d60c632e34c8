"""Pattern-table data model, built-in tables and listing."""
import dataclasses

import numpy as np
import pytest
from tvm import relay
from tvm.relay.dataflow_pattern import is_op, wildcard

from tvm_ext.patterns import GENERIC, QNN, Entry, PatternTable, Reject, evaluate, list_tables, make_entry, make_table
from tvm_ext.patterns import qnn as qnn_mod
from tvm_ext.testing import infer


def _e(name, check=None):
    return Entry(name, is_op("nn.relu")(wildcard()), check, "relu(x)", "relu")


def test_table_rejects_empty_duplicate_and_foreign_names():
    with pytest.raises(ValueError, match="empty"):
        PatternTable("t", [])
    with pytest.raises(ValueError, match="duplicate"):
        PatternTable("t", [_e("t.relu"), _e("t.relu")])
    with pytest.raises(ValueError, match="t.<ops>"):
        PatternTable("t", [_e("u.relu")])
    with pytest.raises(ValueError, match="<table>.<ops>"):
        _e("relu")
    with pytest.raises(ValueError, match="not a DFPattern"):
        Entry("t.x", "nn.relu")
    with pytest.raises(ValueError):
        PatternTable("a.b", [_e("a.b.relu")])


def test_factories_reject_bad_arguments():
    with pytest.raises(ValueError, match="unknown anchor"):
        make_entry("conv3d")
    with pytest.raises(ValueError, match="unknown activation"):
        make_entry("conv2d", act="swish")
    with pytest.raises(ValueError, match="bools"):
        make_entry("conv2d", with_bias="yes")
    with pytest.raises(ValueError, match="unknown anchor"):
        make_table("x", kinds=("pool",))
    with pytest.raises(ValueError):
        qnn_mod.epilogue(wildcard(), max_len=1, min_len=2)


def test_entries_are_frozen_and_ordered():
    e = GENERIC[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.name = "generic.other"
    assert GENERIC.names()[0] == "generic.conv2d_bias_add_relu"
    assert GENERIC.names().index("generic.conv2d_bias_relu") < GENERIC.names().index("generic.conv2d")
    assert all(n.startswith("generic.") for n in GENERIC.names())
    assert all(n.startswith("qnn.") for n in QNN.names())
    assert all(e.equation and e.doc for t in (GENERIC, QNN) for e in t)
    for kind in ("conv2d", "conv2d_transpose", "dense", "batch_matmul", "matmul"):
        for act in ("relu", "clip", "sigmoid", "tanh", "gelu"):
            assert f"generic.{kind}_bias_add_{act}" in GENERIC.names()


def test_list_tables():
    tables = list_tables()
    assert {"generic", "qnn"} <= set(tables)
    assert len(tables["generic"]) == len(GENERIC)
    assert tables["qnn"][0].startswith("qnn.conv2d_bias_requantize_add ")


def test_reject_carries_reason_and_is_logged(caplog):
    entry = _e("t.relu", lambda ctx: Reject("never"))
    x = relay.var("x", shape=(2,))
    root = infer(relay.nn.relu(x))["main"].body
    with caplog.at_level("DEBUG", logger="tvm_ext.patterns"):
        ok, reason = evaluate(entry, root)
    assert not ok and reason == "never" and "t.relu: rejected (never)" in caplog.text
    raising = _e("t.relu", lambda ctx: 1 / 0)
    ok, reason = evaluate(raising, root)
    assert not ok and "ZeroDivisionError" in reason
    assert not bool(Reject("x"))


def _conv_chain(layout_bias):
    x = relay.var("x", shape=(1, 4, 8, 8))
    w = relay.const(np.ones((4, 4, 3, 3), "float32"))
    y = relay.nn.conv2d(x, w, padding=(1, 1), channels=4, kernel_size=(3, 3))
    y = (relay.nn.bias_add(y, relay.const(np.ones(4, "float32"))) if layout_bias
         else relay.add(y, relay.const(np.ones((4, 1, 1), "float32"))))
    return x, y


@pytest.mark.parametrize("act", ["relu", "clip", "sigmoid", "tanh", "gelu"])
def test_generic_activations_match(act):
    x, y = _conv_chain(True)
    y = relay.add(y, x)
    if act == "relu":
        y = relay.nn.relu(y)
    elif act == "clip":
        y = relay.clip(y, 0.0, 6.0)
    elif act == "sigmoid":
        y = relay.sigmoid(y)
    elif act == "tanh":
        y = relay.tanh(y)
    else:  # as relay.frontend.onnx expands Gelu
        y = relay.multiply(relay.multiply(relay.const(0.5), y),
                           relay.add(relay.const(1.0), relay.erf(relay.divide(y, relay.const(1.4142135)))))
    root = infer(y)["main"].body
    entry = GENERIC[f"generic.conv2d_bias_add_{act}"]
    assert entry.pattern.match(root)
    assert evaluate(entry, root) == (True, "")


def test_generic_bias_vs_residual_checks():
    x, y = _conv_chain(False)  # add of a per-channel constant: a bias, not a residual
    root = infer(y)["main"].body
    ok, reason = evaluate(GENERIC["generic.conv2d_add"], root)
    assert not ok and "constant" in reason
    assert evaluate(GENERIC["generic.conv2d_bias"], root)[0]
    x2 = relay.var("x", shape=(1, 4, 8, 8))
    z = relay.add(relay.nn.conv2d(x2, relay.var("w", shape=(4, 4, 1, 1))), relay.var("r", shape=(1, 4, 8, 8)))
    root = infer(z)["main"].body
    ok, reason = evaluate(GENERIC["generic.conv2d_bias"], root)
    assert not ok and "residual" in reason
    assert evaluate(GENERIC["generic.conv2d_add"], root)[0]


def test_qnn_source_form_matches():
    x = relay.var("x", shape=(1, 4, 8, 8), dtype="uint8")
    w = relay.const(np.ones((4, 4, 1, 1), "int8"))
    y = relay.qnn.op.conv2d(x, w, relay.const(0), relay.const(0), relay.const(0.1), relay.const(0.1),
                            kernel_size=(1, 1), channels=4)
    y = relay.nn.bias_add(y, relay.const(np.ones(4, "int32")))
    y = relay.qnn.op.requantize(y, relay.const(0.01), relay.const(0), relay.const(0.1), relay.const(0),
                                out_dtype="uint8")
    root = infer(y)["main"].body
    assert QNN["qnn.conv2d_bias_requantize"].pattern.match(root)
    assert evaluate(QNN["qnn.conv2d_bias_requantize"], root)[0]
    assert QNN["qnn.conv2d_bias_requantize_clip"].pattern.match(infer(relay.clip(y, 0, 100))["main"].body)


def test_qnn_lowered_check_rejects_float_epilogue_without_rounding():
    x, y = _conv_chain(True)
    root = infer(relay.nn.relu(y))["main"].body
    entry = QNN["qnn.dq_conv2d_bias_q"]
    assert entry.pattern.match(root)  # structurally an anchor + elementwise chain ...
    ok, reason = evaluate(entry, root)
    assert not ok and "round" in reason  # ... but no quantize in it
    ok, reason = evaluate(QNN["qnn.conv2d_bias_requantize"], root)
    assert not ok and "int32" in reason
