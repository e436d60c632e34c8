"""Relay pattern tables translated to Relax: names, order, no-counterpart reasons, checks."""
from __future__ import annotations

import logging

import pytest
import tvm
from tvm import relax
from tvm.relay.dataflow_pattern import is_op, wildcard
from tvm.script import relax as R

import tvm_ext.relax as tr
from tvm_ext.patterns import GENERIC, QNN, Entry, PatternTable, Reject, make_table
from tvm_ext.relax.patterns import NoRelaxCounterpart, translate_pattern

DENSE_ADD = make_table("mlp", kinds=("dense",), activations=(), residual_opts=(False,), bias_opts=(True,))


def test_generic_same_names_same_order():
    rt = tr.translate_table(GENERIC)
    assert [e.name for e in rt] == GENERIC.names()
    assert len(rt.translated) == len(GENERIC) == 120
    conv = rt["generic.conv2d_bias_relu"]
    assert any("nn.contrib_conv2d_NCHWc" in d and "AlterOpLayout" in d for d in conv.dropped)
    assert all(e.entry.check is GENERIC[e.name].check for e in rt)  # the same check objects


def test_qnn_no_counterpart_says_why():
    rt = tr.translate_table(QNN)
    missing = {e.name: e.reason for e in rt.untranslated}
    assert set(missing) == {"qnn.conv2d_bias_requantize_clip", "qnn.conv2d_bias_requantize",
                            "qnn.dense_bias_requantize_clip", "qnn.dense_bias_requantize"}
    assert all("no QNN dialect" in r for r in missing.values())
    assert any("TOpPattern" in d for d in rt["qnn.dq_conv2d_bias_q"].dropped)
    listing = "\n".join(rt.listing())
    assert "no Relax counterpart: qnn.requantize" in listing


def test_op_map_translations():
    p = translate_pattern(is_op("nn.dense")(wildcard(), wildcard()))
    assert "permute_dims" in str(p) and "matmul" in str(p)
    p = translate_pattern(is_op("clip")(wildcard()))
    assert "relax.clip" in str(p)
    with pytest.raises(NoRelaxCounterpart, match="no Relax op named relax.nn.bitpack"):
        translate_pattern(is_op("nn.bitpack")(wildcard()))
    with pytest.raises(NoRelaxCounterpart, match="QNN"):
        translate_pattern(is_op("qnn.conv2d")(*[wildcard()] * 6))


def test_table_without_counterpart_rejected_at_construction():
    qonly = QNN.select(["qnn.conv2d_bias_requantize", "qnn.dense_bias_requantize"])
    with pytest.raises(ValueError, match="no entry of table .qnn. has a Relax counterpart"):
        tr.FuseByPattern(qonly)
    with pytest.raises(ValueError, match="expected a PatternTable"):
        tr.translate_table([("a.b", wildcard())])


def _dense_plus(second_shape, second_is_param=True):
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((4, 8), "float32"))
    w = relax.Var("w", R.Tensor((6, 8), "float32"))
    b = relax.Var("b", R.Tensor(second_shape, "float32"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            d = bb.emit(relax.op.matmul(x, relax.op.permute_dims(w)))
            out = bb.emit_output(relax.op.add(d, b))
        bb.emit_func_output(out)
    return bb.get()


def test_check_accepts_per_channel_bias():
    fuse = tr.FuseByPattern(DENSE_ADD)
    out = fuse(_dense_plus((6,)))
    assert tr.composite_counts(out) == {"mlp.dense_bias": 1}


def test_check_rejects_residual_with_relay_reason(caplog):
    # add of a same-shape tensor is a residual, not a bias: the Relay entry's check says so on Relax too
    mod = _dense_plus((4, 6))
    fuse = tr.FuseByPattern(DENSE_ADD)
    with caplog.at_level(logging.DEBUG, logger="tvm_ext.relax.patterns"):
        out = fuse(mod)
    assert tr.composite_counts(out) == {}
    assert "mlp.dense_bias: rejected (add operand of shape [4, 6] is neither constant nor per-channel" in caplog.text
    assert fuse.last_rejections["mlp.dense_bias"]


def test_check_that_cannot_run_on_relax_rejects_with_reason(caplog):
    def needs_relay_attrs(ctx):
        return ctx.root.attrs.out_dtype == ""  # Relay attrs: no Relax counterpart in the view

    base = DENSE_ADD["mlp.dense_bias"]
    table = PatternTable("t", [Entry("t.dense_bias", base.pattern, needs_relay_attrs, annotations=base.annotations)])
    with caplog.at_level(logging.DEBUG, logger="tvm_ext.relax.patterns"):
        out = tr.FuseByPattern(table)(_dense_plus((6,)))
    assert tr.composite_counts(out) == {}
    assert "check cannot be evaluated on Relax: AttributeError" in caplog.text


def test_extra_checks_and_reject_reason():
    fuse = tr.FuseByPattern(DENSE_ADD, extra_checks=[lambda ctx: Reject("not today")])
    fuse(_dense_plus((6,)))
    assert fuse.last_rejections == {"mlp.dense_bias": ["not today"]}


def test_view_sees_relay_names_and_shapes():
    seen = {}

    def spy(ctx):
        seen["ops"] = [c.op.name for c in ctx.calls]
        seen["bias"] = ctx.get("bias_operand").checked_type.shape
        seen["root"] = ctx.root.op.name
        return True

    base = DENSE_ADD["mlp.dense_bias"]
    table = PatternTable("s", [Entry("s.dense_bias", base.pattern, spy, annotations=base.annotations)])
    tr.FuseByPattern(table)(_dense_plus((6,)))
    assert seen == {"ops": ["nn.dense", "add"], "bias": [6], "root": "add"}


def test_leaking_intermediate_rejected():
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((4, 8), "float32"))
    w = relax.Var("w", R.Tensor((8, 6), "float32"))
    b = relax.Var("b", R.Tensor((6,), "float32"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            d = bb.emit(relax.op.matmul(x, w))
            s = bb.emit(relax.op.add(d, b))
            out = bb.emit_output(relax.op.multiply(s, d))  # d is also read outside the group
        bb.emit_func_output(out)
    fuse = tr.FuseByPattern(DENSE_ADD)
    fuse(bb.get())
    assert "used outside the group" in fuse.last_rejections["mlp.dense_bias"][0]


def test_dynamic_shape_check_rejects_with_reason():
    bb = relax.BlockBuilder()
    n = tvm.tir.Var("n", "int64")
    x = relax.Var("x", R.Tensor((n, 8), "float32"))
    w = relax.Var("w", R.Tensor((6, 8), "float32"))
    b = relax.Var("b", R.Tensor((6,), "float32"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            d = bb.emit(relax.op.matmul(x, relax.op.permute_dims(w)))
            out = bb.emit_output(relax.op.add(d, b))
        bb.emit_func_output(out)
    mod = bb.get()
    fuse = tr.FuseByPattern(DENSE_ADD)
    after = fuse(mod)
    tvm.ir.assert_structural_equal(after, mod)
    assert "dynamic or unknown shape" in fuse.last_rejections["mlp.dense_bias"][0]
