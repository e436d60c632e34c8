"""tvm_ext.core.pipelines.int8: its tables (order, reasons, variants) and, on the small zoo models and a relay.quantize
ResNet, kernel floor, narrow boundaries, numerics."""
import numpy as np
import pytest
import tvm

import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.testing import run_module


INT8_ORDER = {
    "start": ["UniformZeroPointsToScalar", "QDQToInteger", "NonNegativeConvInputToUint8", "PadChannelsAtProducer"],
    "before_fuse": ["RemoveStopFusion", "NarrowBeforeMaxPool", "CombineParallelCast", "HoistUint8Shift",
                    "FoldPadIntoConv", "FoldZeroPointPadIntoConv", "EpilogueBeforeChannelSlice",
                    "FoldChannelRepadIntoConv", "NarrowKernelBoundaries", "WidenAfterMovement",
                    "WidenInEachReader", "FuseWideningIntoPool", "TabulateEightBit", "AffineEightBitJoin",
                    "AnchoredArgumentFirst", "DequantizeInConvTranspose"],
}
INT8_ORT_ORDER = {
    "start": ["UniformZeroPointsToScalar", "QDQToInteger", "AddAsOnnxRuntime", "QuantizeWeightsAsOnnxRuntime",
              "NonNegativeConvInputToUint8", "PadChannelsAtProducer"],
    "before_fuse": ["RemoveStopFusion", "NarrowBeforeMaxPool", "CombineParallelCast", "HoistUint8Shift",
                    "FoldPadIntoConv", "FoldZeroPointPadIntoConv", "EpilogueBeforeChannelSlice",
                    "FoldChannelRepadIntoConv", "NarrowKernelBoundaries", "WidenAfterMovement",
                    "WidenInEachReader", "FuseWideningIntoPool", "RoundHalfToEven", "TabulateEightBit",
                    "AffineEightBitJoin", "AnchoredArgumentFirst", "DequantizeInConvTranspose"],
}
VARIANTS = [("tvm", INT8_ORDER, "tvm_ext.int8", ()),
            ("onnxruntime", INT8_ORT_ORDER, "tvm_ext.int8_ort", pipelines.ORT_REQUANTIZE)]


def _flat(text):
    return " ".join(text.replace("``", "").split())


@pytest.mark.parametrize("numerics,order,name,requantize", VARIANTS)
def test_int8_full_order(numerics, order, name, requantize):
    """Every pass of both variants, in order, per stage; the passes are the tables' passes."""
    pipe = pipelines.int8(numerics=numerics)
    assert pipe.pass_names() == order
    assert {s.key: s.names() for s in pipe.stages} == order
    assert pipe.name == name and pipe.requantize == requantize


@pytest.mark.parametrize("numerics", pipelines.NUMERICS)
def test_building_twice_gives_equal_pass_names(numerics):
    one, two = pipelines.int8(numerics=numerics), pipelines.int8(numerics=numerics)
    assert one.pass_names() == two.pass_names()
    assert one.stages == two.stages and one.start is not two.start  # fresh passes, same tables


@pytest.mark.parametrize("numerics", pipelines.NUMERICS)
def test_pipeline_mapping_protocol(numerics):
    pipe = pipelines.int8(numerics=numerics)
    assert isinstance(pipe, pipelines.Pipeline)
    assert list(pipe) == ["start", "before_fuse"] and len(pipe) == 2 and set(pipe.keys()) == {"start", "before_fuse"}
    assert pipe["start"] == [pipe.start] and pipe["before_fuse"] == [pipe.before_fuse]
    assert all(isinstance(p, tvm.transform.Pass) for stage in pipe.values() for p in stage)
    assert pipe.start.info.name == f"{pipe.name}.start" and pipe.before_fuse.info.name == f"{pipe.name}.before_fuse"
    with pytest.raises(KeyError):
        pipe["after_fuse"]
    assert pipe.doc == pipelines.int8.__doc__


def test_unknown_numerics_raises():
    with pytest.raises(ValueError, match="numerics='mlas'"):
        pipelines.int8(numerics="mlas")
    with pytest.raises(ValueError, match="numerics='mlas'"):
        pipelines.listing("mlas")


@pytest.mark.parametrize("numerics", pipelines.NUMERICS)
def test_docstring_and_listing_give_every_pass_its_reason(numerics):
    """Both texts come from the tables: every pass with what it does and why it stands there, in order."""
    doc, text = _flat(pipelines.int8.__doc__), _flat(pipelines.listing(numerics))
    for stage in pipelines.int8_stages(numerics):
        at = -1
        for step in stage.steps:
            assert _flat(step.why) in doc and _flat(step.does) in doc, step.name
            assert _flat(step.why) in text and _flat(step.does) in text, step.name
            assert text.index(_flat(step.why)) > at, f"{step.name} out of order in the listing"
            at = text.index(_flat(step.why))
        assert all(s.why and s.does for s in stage.steps)


def test_every_order_constraint_names_a_pass_on_that_side():
    """The tables hold what their reasons say: each after/before names a pass of the stage on that side."""
    for stages in (pipelines.INT8, pipelines.INT8_ONNXRUNTIME):
        for stage in stages:
            names = stage.names()
            for i, step in enumerate(stage.steps):
                assert all(names.index(n) < i for n in step.after), step.name
                assert all(names.index(n) > i for n in step.before), step.name
                for n in (*step.after, *step.before):
                    assert n in step.why, f"{step.name}'s reason does not name {n}"


def test_onnxruntime_insertions_stand_next_to_their_neighbour():
    for ins in pipelines.ONNXRUNTIME_INSERTIONS:
        stage = {s.key: s for s in pipelines.INT8_ONNXRUNTIME}[ins.stage].names()
        i = stage.index(ins.step.name)
        assert stage[i - 1] == ins.after if ins.after else stage[i + 1] == ins.before
    assert pipelines.INT8_ONNXRUNTIME[0].step("QDQToInteger").args == (("shared_dequantize", True),)
    assert pipelines.INT8[0].step("QDQToInteger").args == ()


def _step(name, **kw):
    return pipelines.Step(name, does=f"{name} does", why=f"{name} why", **kw)


def test_insert_by_neighbour_rejects_a_bad_neighbour():
    stage = pipelines.INT8[1]
    with pytest.raises(ValueError, match="no pass 'TabulateEightBits'"):
        stage.insert(_step("RoundHalfToEven"), before="TabulateEightBits")
    with pytest.raises(ValueError, match="exactly one of after= and before="):
        stage.insert(_step("RoundHalfToEven"), after="FoldPadIntoConv", before="TabulateEightBit")
    with pytest.raises(ValueError, match="stand more than once"):
        stage.insert(_step("FoldPadIntoConv"), after="FoldPadIntoConv")
    with pytest.raises(ValueError, match="no pass 'QDQToIntegers'"):
        pipelines.Insertion("start", _step("AddAsOnnxRuntime"), after="QDQToIntegers").apply(pipelines.INT8)
    with pytest.raises(ValueError, match="no stage 'after_fuse'"):
        pipelines.Insertion("after_fuse", _step("AddAsOnnxRuntime"), after="QDQToInteger").apply(pipelines.INT8)
    new = stage.insert(_step("RoundHalfToEven"), before="TabulateEightBit")
    assert new.names()[new.names().index("TabulateEightBit") - 1] == "RoundHalfToEven"
    assert "RoundHalfToEven" not in stage.names()  # the table itself is unchanged


def test_stage_rejects_broken_order_constraints():
    a, b = _step("UniformZeroPointsToScalar"), _step("QDQToInteger", after=("UniformZeroPointsToScalar",))
    pipelines.Stage("start", "where", (a, b))
    with pytest.raises(ValueError, match="QDQToInteger must follow UniformZeroPointsToScalar, but stands at 1"):
        pipelines.Stage("start", "where", (b, a))
    with pytest.raises(ValueError, match="must precede Nothing, which is not in the stage"):
        pipelines.Stage("start", "where", (_step("QDQToInteger", before=("Nothing",)),))
    with pytest.raises(ValueError, match="must stand last"):
        pipelines.Stage("start", "where", (_step("QDQToInteger", place="last"), a))
    with pytest.raises(ValueError, match="key 'after_fuse'"):
        pipelines.Stage("after_fuse", "where", (a,))
    with pytest.raises(ValueError, match="why must be a non-empty string"):
        pipelines.Step("QDQToInteger", does="x", why=" ")
    with pytest.raises(ValueError, match="no pass 'Nothing'"):
        pipelines.INT8[0].with_args("Nothing", flag=True)


def test_step_creates_the_registered_pass_with_its_arguments():
    step = pipelines.INT8_ONNXRUNTIME[0].step("QDQToInteger")
    assert step.label == "QDQToInteger(shared_dequantize=True)"
    assert step.make().info.name == "QDQToInteger"


def _build_both(small_zoo_build, name):
    m, stock = small_zoo_build(name, "stock")
    _, ext = small_zoo_build(name, "int8")
    xs = [np.random.default_rng(1000 + s).standard_normal(m.input_shape).astype("float32") for s in range(3)]
    outs = [(run_module(stock, {m.input_name: x})[0], run_module(ext, {m.input_name: x})[0]) for x in xs]
    return m, tvm_ext.KernelReport.from_factory(stock), ext.kernel_report, outs


@pytest.mark.xdist_group("small_zoo:resnet50_int8_qoperator")
def test_qoperator_floor_narrow_and_bit_exact(small_zoo_build):
    _, stock, ext, outs = _build_both(small_zoo_build, "resnet50_int8_qoperator")
    assert ext.num_anchor_kernels == stock.num_anchor_kernels
    assert ext.num_kernels <= ext.num_anchor_kernels + 2 < stock.num_kernels
    assert set(ext.crossing.nbytes) <= {"uint8", "int8"}, ext.crossing.nbytes
    for a, b in outs:
        np.testing.assert_array_equal(a, b)


@pytest.mark.xdist_group("small_zoo:resnet50_int8_qdq")
def test_qdq_floor_and_narrow(small_zoo_build):
    _, stock, ext, outs = _build_both(small_zoo_build, "resnet50_int8_qdq")
    assert "float32" in stock.crossing.nbytes
    assert ext.num_kernels <= ext.num_anchor_kernels + 2
    assert set(ext.crossing.nbytes) <= {"uint8", "int8"}, ext.crossing.nbytes
    for a, b in outs:
        assert a.argmax() == b.argmax()


def _assert_relay_quantize_floor(stock, ext):
    assert ext.num_anchor_kernels == stock.num_anchor_kernels
    assert ext.num_kernels < stock.num_kernels / 2
    assert ext.crossing.total_bytes < stock.crossing.total_bytes / 2
    assert not [k for k in ext.kernels if sum(op.startswith(("nn.conv2d", "nn.contrib_conv2d", "nn.dense"))
                                               for op in k.ops) > 1], "two anchors in one kernel"


def test_relay_quantize_fewer_kernels_and_bytes():
    """A ResNet quantized by relay.quantize (relay.testing's 8-layer CIFAR form, 28 x 28): the int8 pipeline
    halves stock's kernels and crossing bytes, one anchor per kernel, and computes what the exact reference
    (``relay.build`` at plain ``llvm``: no int8 SIMD) computes. The graph keeps a float first conv and float
    output ops, so the comparison allows float rounding."""
    from tvm import relay

    from tvm_ext.tools import zoo_models

    mod, _ = zoo_models.relay_resnet_int8(num_layers=8, image_size=28, num_classes=10)
    target = tvm_ext.host_target()
    with tvm.transform.PassContext(opt_level=3):
        stock = relay.build(tvm_ext.copy_module(mod), target=target)
        exact = relay.build(tvm_ext.copy_module(mod), target="llvm")
    ext = tvm_ext.build(mod, target, passes=pipelines.int8())
    _assert_relay_quantize_floor(tvm_ext.KernelReport.from_factory(stock), ext.kernel_report)
    for s in range(2):
        x = np.random.default_rng(1000 + s).standard_normal((1, 3, 28, 28)).astype("float32")
        np.testing.assert_allclose(run_module(ext, {"data": x})[0], run_module(exact, {"data": x})[0],
                                   rtol=0, atol=1e-6)


@pytest.mark.slow  # the small zoo's relay.quantize ResNet-18: 80 s of builds; the 8-layer form above runs in CI
@pytest.mark.xdist_group("small_zoo:resnet50_int8_relay")
def test_small_zoo_relay_quantize_fewer_kernels_and_bytes(small_zoo_build):
    _, stock, ext, _ = _build_both(small_zoo_build, "resnet50_int8_relay")
    _assert_relay_quantize_floor(stock, ext)
