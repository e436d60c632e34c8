"""Tests of tvm_ext.testing.fuzz: the graph grammar, the oracle, crash isolation, and a seeded smoke run.

The smoke run (``test_smoke``) checks SMOKE_N fuzzed graphs in two child processes: every
registered pass at stage ``start`` (structure, mutation, idempotence, skips) and, for every graph a
pass rewrote, the outputs of ``tvm_ext.build`` with that pass against ``tvm_ext.build`` without.
``make fuzz`` runs the full oracle (both stages, the int8 pipeline, relay.build) on many more.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_ext.testing import fuzz

SMOKE_N = 200
SMOKE_SEED = 12


def test_specs_roundtrip_json_and_build_typed_modules():
    specs = fuzz.generate(150, seed=1)
    assert specs == fuzz.generate(150, seed=1)  # reproducible for a seed
    variants = {s.variant for s in specs}
    assert "static" in variants and len(variants) > 1
    for spec in specs:
        assert fuzz.Spec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
        mod = fuzz.build_graph(spec)
        assert mod["main"].checked_type is not None
        assert fuzz.build_graph(spec).astext() == mod.astext()  # deterministic weights


def test_grammar_covers_the_constructs_of_the_issue():
    ops = set()

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op):
            ops.add(node.op.name)
        elif isinstance(node, (relay.If, relay.Let, relay.TupleGetItem)):
            ops.add(type(node).__name__)

    for spec in fuzz.generate(300, seed=2) + fuzz.generate(300, seed=3) + fuzz.generate(100, seed=4, variants=("if", "let")):
        relay.analysis.post_order_visit(fuzz.build_graph(spec)["main"], visit)
    for op in ["nn.conv2d", "qnn.conv2d", "qnn.dense", "nn.dense", "qnn.requantize", "qnn.quantize", "qnn.dequantize",
               "qnn.add", "cast", "nn.pad", "nn.max_pool2d", "nn.avg_pool2d", "nn.global_avg_pool2d", "clip",
               "nn.relu", "sigmoid", "annotation.stop_fusion", "layout_transform", "concatenate", "add", "multiply",
               "If", "Let", "TupleGetItem"]:
        assert op in ops, op


def test_oracle_catches_a_wrong_rewrite(monkeypatch):
    """A pass that changes results is reported as a mismatch (the oracle can fail)."""
    from tvm_ext import passes

    @relay.transform.function_pass(opt_level=0, name="FoldPadIntoConv")
    def wrong(func, _mod, _ctx):  # relu -> negative: silently wrong
        class M(relay.ExprMutator):
            def visit_call(self, call):
                new = super().visit_call(call)
                return relay.negative(new.args[0]) if isinstance(new.op, tvm.ir.Op) and new.op.name == "nn.relu" else new
        return M().visit(func)

    monkeypatch.setattr(passes, "FoldPadIntoConv", lambda: wrong)
    x = relay.var("x", shape=(1, 4, 4, 4), dtype="int32")
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.nn.relu(x))))
    res = fuzz.check_graph(mod, passes=("FoldPadIntoConv",), stages=("start",), pipeline=False, build_check=False)
    assert [(f.subject, f.kind) for f in res.failures] == [("FoldPadIntoConv", "mismatch")]


def test_compare_outputs_tolerances():
    a = [[np.array([1, 2, 3], "int8"), np.array([1.0, 2.0], "float32")]]
    assert fuzz.compare_outputs(a, a, float_graph=False) is None
    b = [[np.array([1, 2, 4], "int8"), np.array([1.0, 2.0], "float32")]]
    assert "differ by more than 0" in fuzz.compare_outputs(a, b, float_graph=False)
    assert fuzz.compare_outputs(a, b, float_graph=True) is None  # one step where floats round
    c = [[np.array([1, 2, 3], "int8"), np.array([1.0, 2.01], "float32")]]
    assert "float" in fuzz.compare_outputs(a, c, float_graph=True)


def test_dequantized_outputs_get_the_steps_integer_outputs_get():
    """QDQToInteger may move an 8-bit level by QDQ_STEPS; where the graph output is the dequantize of
    that level (a float holding levels of scale 0.05), the oracle allows the same steps of the scale
    (fuzz seed 4401, QDQToInteger_start_mismatch: one level, 0.05, at a rounding tie), and no more."""
    from tvm.relay import qnn

    x = relay.var("x", shape=(4,), dtype="float32")
    q = qnn.op.quantize(x, relay.const(0.05), relay.const(0, "int32"), out_dtype="uint8")
    deq = qnn.op.dequantize(q, relay.const(0.05), relay.const(128, "int32"))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.Tuple([deq, x]))))
    steps = fuzz._output_steps(mod)
    assert steps[0] == pytest.approx(0.05) and steps[1] is None
    ref = [[np.array([6.4, 0.0, 1.0, 2.0], "float32"), np.array([1.0], "float32")]]
    one = [[np.array([6.35, 0.0, 1.0, 2.0], "float32"), np.array([1.0], "float32")]]
    three = [[np.array([6.25, 0.0, 1.0, 2.0], "float32"), np.array([1.0], "float32")]]
    assert "float" in fuzz.compare_outputs(ref, one, float_graph=True)  # float tolerance alone
    assert fuzz.compare_outputs(ref, one, True, fuzz.QDQ_STEPS, steps) is None
    assert "float" in fuzz.compare_outputs(ref, three, True, fuzz.QDQ_STEPS, steps)
    # the plain float output (no dequantize) keeps the float tolerance
    off = [[ref[0][0], np.array([1.01], "float32")]]
    assert "float" in fuzz.compare_outputs(ref, off, True, fuzz.QDQ_STEPS, steps)


def test_worker_crash_is_reported_and_the_run_goes_on():
    specs = [fuzz.Spec(seed=s, steps=(("ewise", 0, "relu"),)) for s in (1, 666, 2)]
    results = {i: r for i, _, r in fuzz.run_specs(specs, workers=1, kw={"selftest_abort_seed": 666, "numeric": False,
                                                                        "stages": ("start",), "pipeline": False})}
    assert [f.kind for f in results[1].failures] == ["crash"]
    assert not results[0].failures and not results[2].failures  # the graph after the crash still ran


def test_shrink_finds_a_minimal_spec_and_failure_file_loads(tmp_path):
    spec = fuzz.Spec(seed=5, channels=8, height=5, steps=(("ewise", 0, "relu"), ("stop", 1), ("pool", 1, "max", 2, 1, 0),
                                                         ("ewise", 2, "clip")), variant="let")
    # "fails" while the graph has a stop_fusion: the minimal failing spec is that one step
    small = fuzz.shrink(spec, lambda s: any(st[0] == "stop" for st in s.steps))
    assert small.steps == (("stop", 0),) and small.variant == "static" and small.channels == 2
    path = fuzz.write_failure(tmp_path, "x", small, fuzz.Failure("P", "start", "mismatch", "m"), spec)
    loaded, mod, failure = fuzz.load_failure(path)
    assert loaded == small and failure["kind"] == "mismatch"
    assert "annotation.stop_fusion" in mod.astext()


def test_smoke(tmp_path):
    """SMOKE_N seeded graphs, two child processes: no mismatch, crash or oracle violation."""
    specs = fuzz.generate(SMOKE_N, seed=SMOKE_SEED, max_steps=3)
    kw = {"stages": ("start",), "build_check": False}
    summary = fuzz.Summary()
    for _, spec, res in fuzz.run_specs(specs, workers=2, kw=kw):
        summary.add(spec, res)
    assert summary.graphs == SMOKE_N
    assert sum(summary.rewrites.values()) > 0  # the grammar reaches the passes
    if summary.failures:
        sig, (spec, failure) = sorted(summary.examples.items())[0]

        def still(cand):
            return any(f.signature() == sig for f in fuzz.check_spec_isolated(cand, kw).failures)

        small = fuzz.shrink(spec, still, budget=30)
        path = fuzz.write_failure(tmp_path, "smoke_failure", small, failure, spec)
        pytest.fail(f"{summary.table()}\n\nshrunk failing graph: {path}\n{json.dumps(small.to_json())}\n"
                    f"{fuzz.build_graph(small).astext(show_meta_data=False)}")
