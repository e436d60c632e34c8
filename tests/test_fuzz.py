"""Tests of tvm_ext.testing.fuzz: the graph grammar, the oracle, crash isolation, and a seeded smoke run.

The smoke run (``test_smoke``) checks SMOKE_N fuzzed graphs in two child processes: every
registered pass at stage ``start`` (structure, mutation, idempotence, skips) and, for every graph a
pass rewrote, the outputs of ``tvm_ext.build`` with that pass against ``tvm_ext.build`` without.
``make fuzz`` runs the full oracle (both stages, the int8 pipeline, relay.build) on many more.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_ext.testing import fuzz
from tvm_ext.testing.fuzz import compare, execution, runner

SMOKE_N = 10  # a quarter of a minute of the CI on 2 cores; `make fuzz` runs the long campaigns
SMOKE_SEED = 12


def test_specs_roundtrip_json_and_build_typed_modules():
    specs = fuzz.generate(150, seed=2)
    assert specs == fuzz.generate(150, seed=2)  # reproducible for a seed
    variants = {s.variant for s in specs}
    assert "static" in variants and len(variants) > 1
    for spec in specs:
        assert fuzz.Spec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
        mod = fuzz.build_graph(spec)
        assert mod["main"].checked_type is not None
        assert fuzz.build_graph(spec).astext() == mod.astext()  # deterministic weights


def test_grammar_covers_qnn_ops_control_flow_and_tuples():
    ops = set()

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op):
            ops.add(node.op.name)
        elif isinstance(node, (relay.If, relay.Let, relay.TupleGetItem)):
            ops.add(type(node).__name__)

    for spec in (fuzz.generate(300, seed=2) + fuzz.generate(300, seed=5) + fuzz.generate(300, seed=6)
                 + fuzz.generate(200, seed=4, variants=("if", "let"))):
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
                if isinstance(new.op, tvm.ir.Op) and new.op.name == "nn.relu":
                    return relay.negative(new.args[0])
                return new
        return M().visit(func)

    monkeypatch.setattr(passes, "FoldPadIntoConv", lambda: wrong)
    x = relay.var("x", shape=(1, 4, 4, 4), dtype="int32")
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.nn.relu(x))))
    res = fuzz.check_graph(mod, passes=("FoldPadIntoConv",), stages=("start",), pipeline=False, build_check=False)
    assert [(f.subject, f.kind) for f in res.failures] == [("FoldPadIntoConv", "mismatch")]


def test_qnn_graph_with_float_scales_is_an_integer_graph():
    x = relay.var("x", shape=(1, 2, 2, 2), dtype="int8")
    w = relay.const(np.ones((4, 2, 1, 1), "int8"))
    acc = relay.qnn.op.conv2d(x, w, relay.const(0), relay.const(0), relay.const(0.05), relay.const(0.1),
                              kernel_size=(1, 1), channels=4, out_dtype="int32")
    out = relay.qnn.op.requantize(acc, relay.const(0.005), relay.const(0), relay.const(0.5), relay.const(0),
                                  out_dtype="uint8")

    def typed(body, *params):
        return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(list(params), body)))

    assert not compare._is_float_graph(typed(out, x))  # float scales only: compared bit for bit
    deq = relay.qnn.op.dequantize(out, relay.const(0.5), relay.const(0))
    assert compare._is_float_graph(typed(deq, x))  # a float result
    f = relay.var("f", shape=(2,), dtype="float32")
    assert compare._is_float_graph(typed(relay.cast(f, "int8"), f))  # a float input


def test_compare_outputs_tolerances():
    a = [[np.array([1, 2, 3], "int8"), np.array([1.0, 2.0], "float32")]]
    assert fuzz.compare_outputs(a, a, float_graph=False) is None
    b = [[np.array([1, 2, 4], "int8"), np.array([1.0, 2.0], "float32")]]
    assert "differ by more than 0" in fuzz.compare_outputs(a, b, float_graph=False)
    assert fuzz.compare_outputs(a, b, float_graph=True) is None  # one step where floats round
    c = [[np.array([1, 2, 3], "int8"), np.array([1.0, 2.01], "float32")]]
    assert "float" in fuzz.compare_outputs(a, c, float_graph=True)


# -- --target: compile for another instruction set; execute only what this host runs ---------------
def _stop_graph():
    """x -> abs -> stop_fusion -> cast i32: RemoveStopFusion rewrites it at stage start."""
    x = relay.var("x", shape=(1, 4, 4, 4), dtype="int8")
    body = relay.cast(relay.annotation.stop_fusion(relay.abs(x)), "int32")
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], body)))


def _foreign_target():
    """An x86 target whose code this host cannot run (an Intel host lacks AMD's sse4a, an AMD host
    Intel's avx512fp16), or None."""
    from tvm_ext.x86.isa import runs_on_host

    for t in ("llvm -mcpu=znver3", "llvm -mcpu=sapphirerapids"):
        if not runs_on_host(execution.targets(t)[0]):
            return t
    return None


def test_foreign_target_is_compiled_not_run(monkeypatch):
    target = _foreign_target()
    if target is None:
        pytest.skip("this host runs both znver3 and sapphirerapids code")

    def no_run(*_a, **_k):
        raise AssertionError("code compiled for a target this host lacks was executed")

    monkeypatch.setattr(execution, "run_factory", no_run)
    res = fuzz.check_graph(_stop_graph(), passes=("RemoveStopFusion",), stages=("start",), pipeline=False,
                           target=target)
    assert not res.failures, res.failures
    assert res.rewrites == {"RemoveStopFusion@start": 1}
    assert res.builds >= 3 and res.compared == 0  # reference, rewrite, plain relay.build: compiled
    assert [r for r in res.skips if "compiled only" in r and "lacks" in r]


def test_host_runnable_target_is_compared():
    from tvm_ext.x86.isa import runs_on_host

    target = "llvm -mcpu=x86-64-v3"
    if not runs_on_host(target):
        pytest.skip("this host does not run x86-64-v3 (AVX2) code")
    res = fuzz.check_graph(_stop_graph(), passes=("RemoveStopFusion",), stages=("start",), pipeline=False,
                           build_check=False, target=target)
    assert not res.failures and not res.skips
    assert res.compared == 1


def test_target_option_reaches_the_oracle_and_the_table(monkeypatch, capsys):
    seen = {}

    def fake_run(n, seed, workers, out, max_steps, shrink_failures, kw, with_step=None,
                 graph_timeout=runner.GRAPH_TIMEOUT):
        seen.update(kw, with_step=with_step, graph_timeout=graph_timeout)
        return fuzz.Summary(target=kw["target"])

    monkeypatch.setattr(runner, "run", fake_run)
    assert fuzz.main(["-n", "1", "--target", "llvm -mcpu=x86-64-v3"]) == 0
    assert seen["target"] == "llvm -mcpu=x86-64-v3"
    assert "target: llvm -mcpu=x86-64-v3" in capsys.readouterr().out
    assert fuzz.main(["-n", "1"]) == 0 and seen["target"] is None and seen["with_step"] is None
    assert "target: host CPU" in capsys.readouterr().out
    assert fuzz.main(["-n", "1", "--with-step", "sliced_conv"]) == 0 and seen["with_step"] == "sliced_conv"
    assert seen["graph_timeout"] == runner.GRAPH_TIMEOUT
    assert fuzz.main(["-n", "1", "--graph-timeout", "1800"]) == 0 and seen["graph_timeout"] == 1800
    capsys.readouterr()
    with pytest.raises(SystemExit):
        fuzz.main(["-n", "1", "--graph-timeout", "0"])
    assert "--graph-timeout" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fuzz.main(["-n", "1", "--with-step", "no_such_step"])
    assert "--with-step" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fuzz.main(["-n", "1", "--target", "llvm -mcpu=no-such-cpu"])
    assert "--target" in capsys.readouterr().err
    aarch64 = "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1"
    assert fuzz.main(["-n", "1", "--target", aarch64, "--rpc", "10.0.0.2:9090"]) == 0
    assert seen["rpc"] == "10.0.0.2:9090"
    # a malformed address; an x86 target (none runs remotely)
    for bad in (["--target", aarch64, "--rpc", "host:notaport"], ["--rpc", "10.0.0.2:9090"]):
        with pytest.raises(SystemExit):
            fuzz.main(["-n", "1", *bad])
        assert "--rpc" in capsys.readouterr().err


def test_build_check_every_chooses_the_specs_given_the_build_check(monkeypatch, capsys):
    """The build check runs on the specs whose seed ``--build-check-every`` divides (default one in
    BUILD_CHECK_EVERY; 1: every graph); the table says which."""
    from tvm_ext.testing.fuzz import oracle

    given = {}
    monkeypatch.setattr(oracle, "check_graph", lambda mod, **kw: given.update(kw) or fuzz.GraphResult())
    spec = next(s for s in fuzz.generate(40, seed=3) if s.seed % oracle.BUILD_CHECK_EVERY)
    oracle.check_spec(spec, build_check=True)
    assert given["build_check"] is False and "build_check_every" not in given
    oracle.check_spec(spec, build_check=True, build_check_every=1)
    assert given["build_check"] is True
    oracle.check_spec(spec, build_check=False, build_check_every=1)
    assert given["build_check"] is False

    seen = {}
    monkeypatch.setattr(runner, "run", lambda *a, **k: seen.update(a[6]) or fuzz.Summary(
        build_check_every=a[6]["build_check_every"]))
    assert fuzz.main(["-n", "1"]) == 0 and seen["build_check_every"] == oracle.BUILD_CHECK_EVERY
    assert fuzz.main(["-n", "1", "--build-check-every", "1"]) == 0 and seen["build_check_every"] == 1
    assert "(one spec seed in 1;" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        fuzz.main(["-n", "1", "--build-check-every", "0"])
    assert "--build-check-every" in capsys.readouterr().err


def test_graphs_with_a_step_kind_are_the_seed_streams_first_with_one(monkeypatch):
    specs = runner.specs_with_step(3, 0, 6, "sliced_conv")
    assert len(specs) == 3 and all(any(st[0] == "sliced_conv" for st in s.steps) for s in specs)
    stream = [s for s in fuzz.generate(300, 0) if any(st[0] == "sliced_conv" for st in s.steps)]
    assert specs == stream[:3]
    monkeypatch.setattr(runner, "_DRAWS_PER_GRAPH", 1)
    with pytest.raises(ValueError, match="have a 'sliced_conv' step; ask for fewer"):
        runner.specs_with_step(40, 0, 6, "sliced_conv")


def test_make_fuzz_passes_the_target():
    import shutil
    import subprocess
    from pathlib import Path

    if shutil.which("make") is None:
        pytest.skip("no make")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(["make", "-n", "-C", str(root), "fuzz", "TARGET=llvm -mcpu=x86-64-v3"], capture_output=True,
                         text=True, check=True).stdout
    line = [ln for ln in out.splitlines() if "tvm_ext.testing.fuzz" in ln]
    assert line and line[0].endswith('--target "llvm -mcpu=x86-64-v3"'), out
    out = subprocess.run(["make", "-n", "-C", str(root), "fuzz"], capture_output=True, text=True, check=True).stdout
    assert "--target" not in out and "--rpc" not in out
    out = subprocess.run(["make", "-n", "-C", str(root), "fuzz", "TARGET=llvm -mtriple=aarch64-linux-gnu",
                          "RPC=10.0.0.2:9090"], capture_output=True, text=True, check=True).stdout
    assert '--target "llvm -mtriple=aarch64-linux-gnu" --rpc 10.0.0.2:9090' in out


def test_worker_crash_is_reported_and_the_run_goes_on():
    specs = [fuzz.Spec(seed=s, steps=(("ewise", 0, "relu"),)) for s in (1, 666, 2)]
    results = {i: r for i, _, r in fuzz.run_specs(specs, workers=1, kw={"selftest_abort_seed": 666, "numeric": False,
                                                                        "stages": ("start",), "pipeline": False})}
    assert [f.kind for f in results[1].failures] == ["crash"]
    assert not results[0].failures and not results[2].failures  # the graph after the crash still ran


def test_shrink_finds_a_minimal_spec_and_failure_file_loads(tmp_path):
    spec = fuzz.Spec(seed=5, channels=8, height=5,
                     steps=(("ewise", 0, "relu"), ("stop", 1), ("pool", 1, "max", 2, 1, 0), ("ewise", 2, "clip")),
                     variant="let")
    # "fails" while the graph has a stop_fusion: the minimal failing spec is that one step
    small = fuzz.shrink(spec, lambda s: any(st[0] == "stop" for st in s.steps))
    assert small.steps == (("stop", 0),) and small.variant == "static" and small.channels == 2
    path = fuzz.write_failure(tmp_path, "x", small, fuzz.Failure("P", "start", "mismatch", "m"), spec,
                              target="llvm -mcpu=x86-64-v3")
    loaded, mod, failure = fuzz.load_failure(path)
    assert loaded == small and failure["kind"] == "mismatch"
    assert failure["target"] == "llvm -mcpu=x86-64-v3"  # the regression replays at the target it failed at
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


def test_aarch64_target_without_a_server_is_compiled_only(monkeypatch):
    """Without an RPC server, builds for aarch64 are compiled and never run here: no reference is
    lost to an architecture mismatch, and the skip says why outputs were not compared."""
    from tvm_ext.testing.aarch64 import TARGETS

    def no_run(*_a, **_k):
        raise AssertionError("code compiled for aarch64 was executed here")

    monkeypatch.setattr(execution, "run_factory", no_run)
    res = fuzz.check_graph(_stop_graph(), passes=("RemoveStopFusion",), stages=("start",), pipeline=False,
                           target=TARGETS["neoverse-n1"])
    assert not res.failures, res.failures
    assert res.builds >= 3 and res.compared == 0  # reference, rewrite, exact reference: compiled
    assert [r for r in res.skips if "compiled only" in r and "aarch64" in r]
    assert not [r for r in res.skips if "does not build" in r], res.skips


def test_campaign_says_where_its_builds_run(monkeypatch):
    from tvm_ext.testing import aarch64

    target = aarch64.TARGETS["cortex-a72"]
    monkeypatch.setattr(aarch64, "missing", lambda *_a, **_k: "no qemu-aarch64 here")
    with runner.where_builds_run({"target": target}) as (kw, where):
        assert kw.get("rpc") is None
        assert where.startswith("compiled only") and "no qemu-aarch64 here" in where
    with runner.where_builds_run({"target": target, "rpc": "127.0.0.1:9"}) as (kw, where):
        assert kw["rpc"] == "127.0.0.1:9" and where == "on the TVM RPC server at 127.0.0.1:9"
    with runner.where_builds_run({}) as (kw, where):
        assert where == "on this host"


def test_summary_counts_the_graphs_given_the_stock_check():
    """The 'stock differs from exact' count is read against how many graphs had stock compared."""
    summary = fuzz.Summary()
    spec = fuzz.generate(1, seed=0, max_steps=2)[0]
    results = [fuzz.GraphResult(stock_checked=True, stock_inexact=True), fuzz.GraphResult(stock_checked=True),
               fuzz.GraphResult()]
    for res in results:
        summary.add(spec, res)
    assert (summary.stock_checked, summary.stock_inexact) == (2, 1)
    assert "arithmetic: 1 of the 2 given the build check" in summary.table()


# -- qdq_add's residual blocks: two 8-bit sources for AffineEightBitJoin ----------------------------
_BLOCKS = ("projection", "conv_branch")


def _is_conv_output(expr) -> bool:
    """``quantize([relu](conv2d(...)))``: the 8-bit output of a QDQ conv."""
    if getattr(getattr(expr, "op", None), "name", "") != "qnn.quantize":
        return False
    inner = expr.args[0]
    if getattr(inner.op, "name", "") == "nn.relu":
        inner = inner.args[0]
    return getattr(getattr(inner, "op", None), "name", "") == "nn.conv2d"


def test_qdq_add_residual_blocks_add_two_distinct_8bit_tensors():
    """Every ``quantize(dequantize(a) + dequantize(b))`` of a ``projection`` / ``conv_branch`` step
    reads two different uint8 tensors: ``b`` a conv's output, and ``a`` one too for ``projection``
    (one tensor read twice would be one source for AffineEightBitJoin). Each drawn step is checked
    as the last step of its spec (the graph's output; later steps may leave it unread)."""
    specs = fuzz.generate(300, seed=0) + fuzz.generate(300, seed=1) + fuzz.generate(300, seed=5)
    for block in _BLOCKS:
        drawn = [dataclasses.replace(s, steps=s.steps[:k + 1]) for s in specs for k, st in enumerate(s.steps)
                 if st[0] == "qdq_add" and st[3:] == (block,)]
        assert len(drawn) >= 3, f"the grammar no longer draws qdq_add's {block}"
        for spec in drawn:
            adds = []

            def visit(node, adds=adds):
                if (isinstance(node, relay.Call) and getattr(node.op, "name", "") == "qnn.quantize"
                        and getattr(node.args[0].op, "name", "") == "add"):
                    adds.append([d.args[0] for d in node.args[0].args])

            relay.analysis.post_order_visit(fuzz.build_graph(spec)["main"], visit)
            pairs = [(a, b) for a, b in adds if _is_conv_output(b) and (block != "projection" or _is_conv_output(a))]
            assert pairs, (block, spec)
            for a, b in pairs:
                assert a.checked_type.dtype == b.checked_type.dtype == "uint8"
                assert not tvm.ir.structural_equal(a, b)


def test_affine_eight_bit_join_alone_rewrites_the_grammars_residual_block_bit_exactly():
    """``qdq_add`` with ``projection`` on an int8 input (``q(dq(conv1x1(a)) + dq(conv3x3(a)))``): the
    per-pass oracle runs AffineEightBitJoin alone at ``before_fuse``, the pass rewrites the add, and
    the build with it equals the build without it bit for bit (the oracle itself allows a float
    graph one step)."""
    from tvm_ext.passes import AffineEightBitJoin
    from tvm_ext.x86.isa import runs_on_host

    target = "llvm -mcpu=x86-64-v3"
    if not runs_on_host(target):
        pytest.skip("this host does not run x86-64-v3 (AVX2) code")
    mod = fuzz.build_graph(fuzz.Spec(seed=5, steps=(("qdq_add", 0, 0, "projection"),)))
    res = fuzz.check_graph(mod, passes=("AffineEightBitJoin",), stages=("before_fuse",), pipeline=False,
                           build_check=False, target=target)
    assert not res.failures, res.failures
    assert res.rewrites == {"AffineEightBitJoin@before_fuse": 1} and res.compared == 1
    tgt, _ = execution.targets(target)
    pre, names = execution.prefixed(mod, tgt)
    with tgt, tvm.transform.PassContext(opt_level=3):
        out = AffineEightBitJoin()(pre)
    inputs = execution.seeded_inputs(mod)
    ref = execution.run_factory(execution.build_prefixed(pre, tgt, names), inputs)
    got = execution.run_factory(execution.build_prefixed(out, tgt, names), inputs)
    assert fuzz.compare_outputs(ref, got, float_graph=False) is None


@pytest.mark.parametrize("steps,sigmoid", [(6, False), (2, True)])
def test_stepwise_chain_is_tabulated_and_checked_bit_exactly(steps, sigmoid):
    """``stepwise_chain``: a uint8 input through ``steps`` requantized steps. Six steps are a chain of
    more than ``LONG_CHAIN`` ops, two ending in a sigmoid hold a transcendental op: either way
    TabulateEightBit, run alone by the oracle at ``before_fuse``, rewrites it, and the build with it
    equals the build without it (the oracle's comparison: bit for bit on an 8-bit output)."""
    from tvm_ext.x86.isa import runs_on_host

    target = "llvm -mcpu=x86-64-v3"
    if not runs_on_host(target):
        pytest.skip("this host does not run x86-64-v3 (AVX2) code")
    mod = fuzz.build_graph(fuzz.Spec(seed=7, in_dtype="uint8", steps=(("stepwise_chain", 0, steps, sigmoid),)))
    assert str(mod["main"].ret_type.dtype) in ("int8", "uint8")
    res = fuzz.check_graph(mod, passes=("TabulateEightBit",), stages=("before_fuse",), pipeline=False,
                           build_check=False, target=target)
    assert not res.failures, res.failures
    assert res.rewrites == {"TabulateEightBit@before_fuse": 1} and res.compared == 1


@pytest.mark.parametrize("k, between", [(1, "max"), (3, "head")])
def test_paired_convs_are_reordered_and_built_exactly(k, between, caplog):
    """``paired_convs``: two int8 convs with trained-like weights [and a classifier head: pool, flatten,
    qnn.dense]. At AVX2 ``tvm_ext.build`` renumbers the channels between them (OrderChannelsInSafePairs,
    in the x86 back end; the dense's columns with them) so that the reader keeps vpmaddubsw, and the
    oracle's build check (``tvm_ext.build`` against exact integer arithmetic at plain llvm) holds."""
    import logging

    from tvm_ext.x86.isa import runs_on_host

    target = "llvm -mcpu=x86-64-v3"
    if not runs_on_host(target):
        pytest.skip("this host does not run x86-64-v3 (AVX2) code")
    mod = fuzz.build_graph(fuzz.Spec(seed=0, layout="NCHW", in_dtype="uint8", channels=8,
                                     steps=(("paired_convs", 0, 16, k, between),)))
    assert ("qnn.dense" in mod.astext()) == (between == "head")
    with caplog.at_level(logging.INFO, logger="tvm_ext.x86.pair_order"):
        res = fuzz.check_graph(mod, passes=(), pipeline=False, build_check=True, target=target)
    assert not res.failures, res.failures
    assert res.compared >= 1 and res.stock_checked, res.skips
    assert "1 channel group(s) reordered" in caplog.text


def test_float_graph_right_where_stock_saturates_is_not_a_failure():
    """A float graph holding int8 convs whose data and weights saturate stock TVM's vpmaddubsw: the
    build check compares tvm_ext.build with stock relay.build at the target, which is wrong there;
    the graph passes because it equals plain llvm (no SIMD dot product) within the float tolerance."""
    from tvm_ext.x86.isa import runs_on_host

    target = "llvm -mcpu=x86-64-v3"
    if not runs_on_host(target):
        pytest.skip("this host does not run x86-64-v3 (AVX2) code")
    spec = fuzz.Spec(seed=529, layout="NCHW", in_dtype="float32", channels=2, height=5, width=2,
                     steps=(("paired_convs", 4, 8, 3, "max"), ("requant", 5, "qnn", "int8", True),
                            ("paired_convs", 4, 8, 3, "max")), extra_output=2)
    mod = fuzz.build_graph(spec)
    inputs = execution.seeded_inputs(mod)
    with tvm.transform.PassContext(opt_level=3):
        stock = execution.run_factory(relay.build(mod, target=target), inputs)
        plain = execution.run_factory(relay.build(mod, target="llvm"), inputs)
    assert fuzz.compare_outputs(plain, stock, True) is not None, "stock does not saturate here: the test says nothing"
    res = fuzz.check_graph(mod, passes=(), pipeline=False, build_check=True, target=target)
    assert not res.failures, res.failures
    assert res.compared == 1


def test_paired_convs_reach_the_24_channel_output_block():
    """``paired_convs`` over 24 channels back to 24: built with ``pipelines.int8()`` at AVX-512 VNNI, the second
    conv (24 input channels, 3x3) writes 24-channel blocks (``vnni_24_lanes``), so the fuzzer's graphs reach
    that kernel; where the host runs AVX-512 VNNI code the oracle holds (the pipeline's build against
    ``tvm_ext.build`` without passes, and that against exact integer arithmetic at plain llvm), compiled
    only elsewhere."""
    import tvm_ext
    from tvm_ext.core import pipelines
    from tvm_ext.x86.isa import runs_on_host

    target = "llvm -mcpu=x86-64-v4 -mattr=+avx512vnni"
    mod = fuzz.build_graph(fuzz.Spec(seed=3, layout="NCHW", in_dtype="uint8", channels=8, height=5, width=6,
                                     steps=(("paired_convs", 0, 24, 3, "none", 24),)))
    assert [int(d) for d in mod["main"].ret_type.shape] == [1, 24, 5, 6]
    lib = tvm_ext.build(mod, target=target, passes=pipelines.int8())
    graph = json.loads(lib.get_graph_json())
    shapes = graph["attrs"]["shape"][1]
    blocks = [shapes[i][-1] for i, n in enumerate(graph["nodes"])
              if n["op"] == "tvm_op" and "conv2d" in n["attrs"]["func_name"] and len(shapes[i]) == 5]
    assert 24 in blocks, blocks
    if runs_on_host(target):
        res = fuzz.check_graph(mod, passes=(), pipeline=True, build_check=True, target=target)
        assert not res.failures, res.failures
        assert res.compared >= 1 and res.stock_checked, res.skips


@pytest.mark.parametrize("target", ["llvm -mcpu=icelake-server", "llvm -mcpu=cascadelake"])
def test_mobile_block_reaches_the_depthwise_tap_forms(target):
    """``mobile_block``: a 1x1 conv and a uint8 depthwise conv over 16 channels. Built with ``pipelines.int8()``
    at AVX-512 VNNI targets, the depthwise kernel multiplies with ``vpdpbusd`` (the tap forms: permuted in
    registers with VBMI, regrouped without); where the host runs the target's code the oracle holds (the
    pipeline's build against ``tvm_ext.build`` without passes, and that against exact integer arithmetic at
    plain llvm), compiled only elsewhere."""
    import tvm_ext
    from tvm_ext.core import pipelines
    from tvm_ext.tools.mca import _asm
    from tvm_ext.x86.isa import runs_on_host

    mod = fuzz.build_graph(fuzz.Spec(seed=5, layout="NCHW", in_dtype="uint8", channels=8, height=6, width=6,
                                     steps=(("mobile_block", 0, 16, 5, 1),)))
    assert "groups=16" in mod.astext()
    asm = tvm_ext.build(mod, target=target, passes=pipelines.int8()).get_lib().get_source("asm")
    funcs = _asm.parse(asm)  # a kernel's functions: its own and its parallel lambdas
    loops = [_asm.hot_loop(n, funcs, fs, "depthwise") for n, fs in _asm.kernels(funcs).items() if "depthwise" in n]
    assert loops and all(hot is not None and "vpdpbusd zmm" in hot.dots for hot in loops), loops
    if runs_on_host(target):
        res = fuzz.check_graph(mod, passes=(), pipeline=True, build_check=True, target=target)
        assert not res.failures, res.failures
        assert res.compared >= 1 and res.stock_checked, res.skips
