"""tvm_ext.build: insertion points, faithfulness to relay.build, purity and PassContext."""
import json

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.x86 import exact_record, isa
from tvm_ext.core import pipelines
from tvm_ext.core.build import PassFailed, prefix_pass_names
from tvm_ext.core.report import KernelReport
from tvm_ext.testing import random_inputs, run_module

TARGET = tvm_ext.host_target()


def small_cnn():
    """data -> conv3x3 -> bias -> relu -> conv1x1 -> add(residual) -> relu -> global pool -> dense."""
    rng = np.random.default_rng(0)
    x = relay.var("data", shape=(1, 8, 16, 16))
    w1 = relay.var("w1", shape=(8, 8, 3, 3))
    b1 = relay.var("b1", shape=(8,))
    w2 = relay.var("w2", shape=(8, 8, 1, 1))
    wd = relay.var("wd", shape=(10, 8))
    y = relay.nn.relu(relay.nn.bias_add(relay.nn.conv2d(x, w1, padding=(1, 1), channels=8, kernel_size=3), b1))
    y = relay.nn.relu(relay.add(relay.nn.conv2d(y, w2, channels=8, kernel_size=1), x))
    y = relay.nn.batch_flatten(relay.nn.global_avg_pool2d(y))
    y = relay.nn.dense(y, wd)
    mod = tvm.IRModule.from_expr(relay.Function(relay.analysis.free_vars(y), y))
    params = {
        "w1": rng.standard_normal((8, 8, 3, 3)).astype("float32") * 0.2,
        "b1": rng.standard_normal(8).astype("float32"),
        "w2": rng.standard_normal((8, 8, 1, 1)).astype("float32") * 0.3,
        "wd": rng.standard_normal((10, 8)).astype("float32"),
    }
    return mod, params, {"data": rng.standard_normal((1, 8, 16, 16)).astype("float32")}


def small_int8():
    """relay.quantize'd tiny CNN (integer graph with stop_fusion annotations and requantize)."""
    mod, params, inputs = small_cnn()
    with relay.quantize.qconfig(calibrate_mode="global_scale", global_scale=8.0, skip_conv_layers=[]):
        qmod = relay.quantize.quantize(mod, params)
    return qmod, {}, inputs


def _stock(mod, params, opt_level=3):
    with tvm.transform.PassContext(opt_level=opt_level):
        return relay.build(tvm_ext.copy_module(mod), target=TARGET, params=params)


@pytest.fixture(scope="module")
def cnn():
    return small_cnn()


# --- a toy pass that only has something to act on after AlterOpLayout -------------------------
@relay.transform.function_pass(opt_level=0, name="ToyNegateLayoutTransform")
class ToyNegateLayoutTransform:
    """layout_transform(x) -> negative(negative(layout_transform(x))): same values, visible ops."""

    def transform_function(self, func, mod, ctx):
        class Rewriter(relay.ExprMutator):
            def visit_call(self, call):
                new = super().visit_call(call)
                if isinstance(new.op, tvm.ir.Op) and new.op.name == "layout_transform":
                    return relay.negative(relay.negative(new))
                return new

        return Rewriter().visit(func)


def _kernel_ops(factory):
    return [op for k in factory.kernel_report.kernels for op in k.ops]


def test_before_fuse_sees_altered_layouts(cnn):
    mod, params, inputs = cnn
    ext = tvm_ext.build(mod, TARGET, params, passes=[ToyNegateLayoutTransform()], at="before_fuse")
    assert "layout_transform" in _kernel_ops(ext)
    assert "negative" in _kernel_ops(ext), "the pass's effect must reach the graph JSON"
    start = tvm_ext.build(mod, TARGET, params, passes=[ToyNegateLayoutTransform()], at="start")
    assert "negative" not in _kernel_ops(start), "at=start runs before AlterOpLayout creates layout_transform"
    ref = run_module(_stock(mod, params), inputs)
    for fac in (ext, start):
        np.testing.assert_allclose(run_module(fac, inputs)[0], ref[0], rtol=1e-5, atol=1e-5)


@tvm.instrument.pass_instrument
class PassNames:
    """Records the name of every pass that runs (after it ran)."""

    def __init__(self):
        self.names = []

    def run_after_pass(self, _mod, info):
        self.names.append(info.name)


def test_prefix_runs_once(cnn):
    mod, params, _ = cnn
    prefix = prefix_pass_names(mod, TARGET)
    assert "AlterOpLayout" in prefix and "FoldConstant" in prefix
    ours, stock = PassNames(), PassNames()
    tvm_ext.build(mod, TARGET, params, instruments=[ours])
    with tvm.transform.PassContext(opt_level=3, instruments=[stock]):
        relay.build(tvm_ext.copy_module(mod), target=TARGET, params=params)
    for name in prefix:
        assert ours.names.count(name) == stock.names.count(name), name
    # FuseOps still runs exactly once, after our passes
    assert ours.names.count("FuseOps") == stock.names.count("FuseOps") == 1


@pytest.mark.parametrize("at", ["before_fuse", "start"])
@pytest.mark.parametrize("model", ["cnn", "int8"])
def test_no_passes_equals_relay_build(model, at):
    mod, params, inputs = small_cnn() if model == "cnn" else small_int8()
    stock = _stock(mod, params)
    ext = tvm_ext.build(mod, TARGET, params, at=at)
    n_stock = sum(1 for n in json.loads(stock.get_graph_json())["nodes"] if n["op"] == "tvm_op")
    assert ext.kernel_report.num_kernels == n_stock
    assert [k.ops for k in ext.kernel_report.kernels] == [k.ops for k in KernelReport.from_factory(stock).kernels]
    for a, b in zip(run_module(stock, inputs), run_module(ext, inputs)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_passes_none_is_no_passes():
    mod, params, _ = small_cnn()
    a, b = tvm_ext.build(mod, TARGET, params, passes=None), tvm_ext.build(mod, TARGET, params)
    assert [k.ops for k in a.kernel_report.kernels] == [k.ops for k in b.kernel_report.kernels]


def test_caller_module_not_mutated():
    qmod, params, _ = small_int8()
    text = qmod.astext()
    tvm_ext.build(qmod, TARGET, params, passes=[ToyNegateLayoutTransform()])
    assert qmod.astext() == text


def test_opt_level_and_disabled_pass(cnn):
    mod, params, inputs = cnn
    off = tvm_ext.build(mod, TARGET, params, passes=[ToyNegateLayoutTransform()],
                        disabled_pass=["ToyNegateLayoutTransform"])
    assert "negative" not in _kernel_ops(off)
    with tvm.transform.PassContext(opt_level=3, disabled_pass=["ToyNegateLayoutTransform"]):
        off2 = tvm_ext.build(mod, TARGET, params, passes=[ToyNegateLayoutTransform()])
    assert "negative" not in _kernel_ops(off2)
    low = tvm_ext.build(mod, TARGET, params, opt_level=1)
    assert "layout_transform" not in _kernel_ops(low), "AlterOpLayout is an opt_level 3 pass"
    # None means none, as relay.build takes it
    none = tvm_ext.build(mod, TARGET, params, passes=[ToyNegateLayoutTransform()], disabled_pass=None, instruments=None)
    assert "negative" in _kernel_ops(none)


def test_instruments_see_user_pass(cnn):
    mod, params, _ = cnn
    seen = PassNames()
    with tvm.transform.PassContext(opt_level=3, instruments=[seen]):
        tvm_ext.build(mod, TARGET, params, passes=[ToyNegateLayoutTransform()])
    assert "ToyNegateLayoutTransform" in seen.names


def test_bad_arguments(cnn):
    mod, params, _ = cnn
    with pytest.raises(ValueError, match="at="):
        tvm_ext.build(mod, TARGET, params, at="middle")
    with pytest.raises(TypeError, match="passes\\[0\\]"):
        tvm_ext.build(mod, TARGET, params, passes=[ToyNegateLayoutTransform])
    with pytest.raises(TypeError, match="IRModule"):
        tvm_ext.build("not a module", TARGET)

    @relay.transform.function_pass(opt_level=0, name="Broken")
    def broken(func, mod, ctx):
        raise RuntimeError("boom")

    with pytest.raises(PassFailed, match="Broken"):
        tvm_ext.build(mod, TARGET, params, passes=[broken])


def test_function_input_and_inputs_helper():
    x = relay.var("x", shape=(2, 3), dtype="int32")
    f = relay.Function([x], relay.cast(relay.add(x, relay.const(1)), "int8"))
    fac = tvm_ext.build(f, TARGET)
    inputs = random_inputs(tvm.IRModule.from_expr(f))
    out = run_module(fac, inputs)[0]
    np.testing.assert_array_equal(out, (inputs["x"] + 1).astype("int8"))


# Target classes: vendor-neutral CPU levels, so that both AMD and Intel hosts run what they can.
AVX2 = "llvm -mcpu=x86-64-v3"
AVX512_VNNI = "llvm -mcpu=x86-64-v4 -mattr=+avx512vnni"


def _relay_build_at(mod, params, target):
    """Plain relay.build at ``target``; for a VNNI target inside ``x86_int8.kernels(schedule=False)``,
    which only gives TVM's VNNI intrinsic LLVM 22's operand types (without it LLVM aborts)."""
    from tvm_ext.x86 import int8_conv as x86_int8

    with x86_int8.kernels(schedule=False), tvm.transform.PassContext(opt_level=3):
        return relay.build(tvm_ext.copy_module(mod), target=target, params=params)


def _assert_no_passes_is_relay_build(m, target, sample):
    tgt = tvm_ext.build_target(target)
    ext = tvm_ext.build(m.mod, target, m.params)
    stock = _relay_build_at(m.mod, m.params, tgt)
    want = KernelReport.from_factory(stock)
    assert ext.kernel_report.num_kernels == want.num_kernels, (target, ext.kernel_report.num_kernels,
                                                               want.num_kernels)
    assert [k.ops for k in ext.kernel_report.kernels] == [k.ops for k in want.kernels]
    assert [k.name for k in ext.kernel_report.kernels] == [k.name for k in want.kernels]
    if not isa.runs_on_host(tgt):
        return f"compiled only: the host lacks {isa.missing_on_host(tgt)}"
    for seed in (0, 1):
        x = {m.input_name: sample(seed)}
        for a, b in zip(run_module(stock, x), run_module(ext, x)):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)  # the same kernels and schedules: the same bits
    return "run"


# The zoo ResNets take minutes each on 2 cores: slow tests. QDQ at AVX2 is the pair the x86 kernel
# policy would change if it applied without a pipeline (the QDQ graph computes its convs in float,
# and on AVX2 fallback_register_tile changes float convs). The CI checks a three-conv QOperator net
# at AVX-512 VNNI (compiled here) below.
_SLOW = pytest.mark.slow
ZOO_CASES = [pytest.param("resnet50_int8_qoperator", AVX512_VNNI, marks=_SLOW),
             pytest.param("resnet50_int8_qdq", AVX2, marks=_SLOW),
             pytest.param("resnet50_int8_qdq", AVX512_VNNI, marks=_SLOW),
             pytest.param("resnet50_int8_qoperator", AVX2, marks=_SLOW)]


@pytest.mark.parametrize("name, target", ZOO_CASES)
def test_no_passes_equals_relay_build_on_zoo_resnets(name, target):
    """Without a pipeline, tvm-ext's x86 kernel policy and tuned records stay out: relay.build's
    kernels and outputs, for QDQ (a graph that computes in float) and QOperator alike."""
    from tvm_ext.tools import zoo

    m = zoo.load(name, small=True)
    _assert_no_passes_is_relay_build(m, target, lambda seed: zoo.sample_input(m, seed=seed, small=True))


def test_no_passes_equals_relay_build_on_a_qoperator_net():
    """As on the zoo ResNets, on three QOperator-style convs at AVX-512 VNNI (compiled here): seconds
    instead of a minute."""
    target = AVX512_VNNI
    from tvm_ext.testing import qoperator_net

    m = qoperator_net()
    rng = np.random.default_rng
    _assert_no_passes_is_relay_build(m, target, lambda seed: rng(seed).standard_normal(m.input_shape).astype("float32"))


@pytest.mark.slow
@pytest.mark.parametrize("target", [AVX2, AVX512_VNNI])
def test_no_passes_equals_relay_build_on_a_real_model(target):
    from tvm_ext.tools import zoo, zoo_real

    try:
        m = zoo.load("ppocr_cls_v2_int8_qdq")
    except zoo_real.ModelUnavailable as err:
        pytest.skip(f"the real model's wheel is not available here: {err}")
    _assert_no_passes_is_relay_build(m, target, lambda seed: zoo.sample_input(m, seed=seed))


def test_a_pipeline_turns_the_kernel_policy_on():
    from tvm_ext.core.build import prepare

    mod = tvm.IRModule.from_expr(relay.Function([x := relay.var("x", shape=(2,))], x))

    def settings(passes, **kw):
        prep = prepare(mod, "llvm -mcpu=x86-64-v3", passes, **kw)
        return prep.request.kernels, prep.request.tuned, bool(prep.requantize)

    assert settings(()) == (False, False, False)
    assert settings([relay.transform.InferType()]) == (False, False, False)
    assert settings(pipelines.int8()) == (True, True, True)
    assert settings(pipelines.int8(), tuned=False) == (True, False, True)
    assert settings((), kernels=True) == (True, True, False)


@pytest.mark.slow
@pytest.mark.parametrize("target", [AVX2, AVX512_VNNI])
@pytest.mark.parametrize("name", ["resnet50_int8_qdq", "resnet50_int8_qoperator"])
def test_no_passes_equals_relay_build_on_full_size_resnet50s(name, target):
    from tvm_ext.tools import zoo

    m = zoo.load(name)
    _assert_no_passes_is_relay_build(m, target, lambda seed: zoo.sample_input(m, seed=seed))


# TARGET is the host with VNNI masked (host_target), so its int8 dot product is vpmaddubsw, which
# saturates where a uint8 x int8 weight pair's sum leaves int16. There tvm_ext.build takes the exact
# form (PairPackInt8Convs: README, "With no passes"; docs/x86-kernels.md), so its outputs are not
# relay.build's on full-range weights. What is relay.build's: the kernels, and the outputs once the
# exact form is off (exact_record.saturating). The exact outputs are checked against relay.build's
# kernels computing exactly (inside kernels(schedule=False), every workload takes the byte split).
def _assert_relay_build_but_exact(mod, params, inputs):
    stock = _stock(mod, params)
    ext = tvm_ext.build(mod, TARGET, params)
    with exact_record.saturating():
        saturating = tvm_ext.build(mod, TARGET, params)
    want = KernelReport.from_factory(stock)
    for fac in (ext, saturating):
        assert fac.kernel_report.num_kernels == want.num_kernels
        assert [k.ops for k in fac.kernel_report.kernels] == [k.ops for k in want.kernels]
        assert [k.name for k in fac.kernel_report.kernels] == [k.name for k in want.kernels]
    stock_out, ext_out = run_module(stock, inputs), run_module(ext, inputs)
    for a, b in zip(stock_out, run_module(saturating, inputs)):
        np.testing.assert_array_equal(a, b)  # nothing else in the no-pass build differs from relay.build
    for a, b in zip(run_module(_relay_build_at(mod, params, TARGET), inputs), ext_out):
        np.testing.assert_array_equal(a, b)
    return stock_out, ext_out


# three full-range convs built with and without the exact form (about 20 s); test_no_passes_equals_relay_build and
# tests/x86/test_exact_int8.py::test_stock_saturates_where_tvm_ext_is_exact check both halves in the default tier
@pytest.mark.slow
def test_no_passes_at_a_saturating_target_is_relay_build_but_exact():
    """Three QOperator convs with full-range weights at TARGET (VNNI masked): relay.build's kernels;
    relay.build's outputs with the exact form off, the exact ones (which differ here) with it on."""
    from tvm_ext.testing import qoperator_net

    m = qoperator_net()
    x = {m.input_name: 3 * np.random.default_rng(0).standard_normal(m.input_shape).astype("float32")}
    stock_out, ext_out = _assert_relay_build_but_exact(m.mod, {}, x)
    assert not np.array_equal(stock_out[0], ext_out[0]), "the data must reach pairs that saturate"


@pytest.mark.slow
def test_no_passes_equals_relay_build_full_resnet50_int8():
    """Full-size int8 ResNet-50 (QOperator, from the zoo) at TARGET: relay.build's kernels, and its
    outputs bit for bit but where vpmaddubsw saturates (53 convs packed in pairs, the stem's first)."""
    from tvm_ext.tools import zoo

    m = zoo.load("resnet50_int8_qoperator")
    _assert_relay_build_but_exact(m.mod, m.params, {m.input_name: zoo.sample_input(m, seed=3)})


# -- QNN lookup ops: their legalization runs a nested VM build inside the prefix ------------------
def qnn_sigmoid_module():
    """x: u8 -> qnn.sigmoid -> u8: QNN legalization computes the lookup table with a nested VM build.

    The shrunken form of YOLOv8n QDQ after FakeQuantizationToInteger (58 of them there).
    """
    x = relay.var("x", shape=(1, 4, 8, 8), dtype="uint8")
    y = relay.qnn.op.sigmoid(x, relay.const(0.1), relay.const(3, "int32"), relay.const(1 / 255.0),
                             relay.const(0, "int32"))
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))


def test_nested_compilation_passes_are_not_prefix_passes():
    """The table's VM build inside QNN Legalize runs PlanDevices, FuseOps, ... under the prefix's
    PassContext; they are not prefix passes, so relay.build must not see them disabled."""
    names = prefix_pass_names(qnn_sigmoid_module(), TARGET)
    assert "Legalize" in names or "QnnLegalize" in names or "CanonicalizeOps" in names, names
    for nested in ("PlanDevices", "FuseOps", "LowerTE", "AnnotateMemoryScope", "ManifestAlloc"):
        assert nested not in names, (nested, names)


_CHILD = """
import sys, numpy as np
sys.path.insert(0, {tests!r})
import tvm, tvm_ext
from tvm import relay
from test_build import qnn_sigmoid_module, TARGET
from tvm_ext.testing import run_module
mod = qnn_sigmoid_module()
x = {{"x": np.arange(256).astype("uint8").reshape(1, 4, 8, 8)}}
ext = run_module(tvm_ext.build(mod, TARGET), x)[0]
with tvm.transform.PassContext(opt_level=3):
    stock = run_module(relay.build(tvm_ext.copy_module(mod), target=TARGET), x)[0]
np.testing.assert_array_equal(ext, stock)
print("OK")
"""


def test_qnn_lookup_op_builds_and_equals_relay_build():
    """A QNN lookup op whose legalization compiles a nested VM build: relay.build must not see the
    nested passes disabled (with PlanDevices disabled, AnnotateMemoryScope segfaults, so the build
    runs in a child process), and the result equals relay.build's."""
    import os
    import subprocess
    import sys

    code = _CHILD.format(tests=os.path.dirname(__file__))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and "OK" in res.stdout, (res.returncode, res.stderr[-2000:])


def test_start_stage_types_an_untyped_module():
    """relay.build takes an untyped module; so does tvm_ext.build with start-stage passes (which
    read types): the stage infers them first."""
    x = relay.var("x", shape=(1, 4, 6, 6), dtype="float32")
    q = relay.qnn.op.quantize(x, relay.const(np.float32(0.1)), relay.const(3), out_dtype="uint8")
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.qnn.op.dequantize(q, relay.const(np.float32(0.1)),
                                                                             relay.const(3))))
    lib = tvm_ext.build(mod, passes=tvm_ext.core.pipelines.int8())
    assert lib.kernel_report.num_kernels >= 1
