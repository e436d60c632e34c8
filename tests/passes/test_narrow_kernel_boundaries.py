"""Tests of tvm_ext.passes.narrow_kernel_boundaries (wide tensors crossing at residual adds)."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
import tvm_ext.core.pipelines
import tvm_ext.tools.zoo
from tvm_ext.passes._chains import narrow_type
from tvm_ext.passes.narrow_kernel_boundaries import NarrowKernelBoundaries
from tvm_ext.testing import assert_same_outputs, assert_unchanged, check, infer, random_inputs, run_module

from _helpers import assert_unchanged_with_reason, assert_untyped_module_raises

LOGGER = "tvm_ext.passes.NarrowKernelBoundaries"
W1 = np.random.default_rng(1).integers(-3, 4, (8, 8, 1, 1)).astype("int8")
W2 = np.random.default_rng(2).integers(-3, 4, (8, 8, 1, 1)).astype("int8")


def _x():
    return relay.var("x", shape=(1, 8, 6, 6), dtype="uint8")


def _conv(x, w):
    return relay.nn.conv2d(x, relay.const(w), kernel_size=(1, 1), channels=8, out_dtype="int32")


def _requant(v, scale):
    # cast f32 -> multiply -> floor -> cast i32   (the float requantize of x86's QNN lowering)
    return relay.cast(relay.floor(relay.multiply(relay.cast(v, "float32"), relay.const(scale))), "int32")


def _clip8(v):
    return relay.clip(v, 0.0, 255.0)


def _narrow_point(v, form):
    """The lhs chain's 8-bit point, in the given form."""
    if form == "clip":
        return _clip8(v)
    return relay.cast(_clip8(v), "uint8")  # "typed"


def residual(form="clip", cut=False):
    """Two conv chains meeting at an add (a projection-shortcut block after QNN lowering).

    ::

        x -> conv(W1) -> requant -> n (8-bit) -> requant -+-> add -> clip -> cast u8
        x -> conv(W2) -> requant -> clip ------------------+

    ``cut=True`` builds what the pass makes of it: the 8-bit n behind a stop_fusion.
    """
    x = _x()
    n = _narrow_point(_requant(_conv(x, W1), 0.01), form)
    if cut:
        if form == "clip":
            n = relay.cast(relay.annotation.stop_fusion(relay.cast(n, "uint8")), "int32")
        else:
            n = relay.annotation.stop_fusion(n)
    lhs = _requant(n, 1.5)
    rhs = _clip8(_requant(_conv(x, W2), 0.02))
    return infer(relay.cast(_clip8(relay.add(lhs, rhs)), "uint8"))


@pytest.mark.parametrize("form", ["clip", "typed"])
def test_residual_structure(form):
    after = check(NarrowKernelBoundaries(), residual(form), residual(form, cut=True))
    assert_unchanged(NarrowKernelBoundaries(), after)  # idempotent


def test_residual_kernels_crossing_and_outputs():
    before = tvm_ext.build(residual())
    after = tvm_ext.build(residual(), passes=[NarrowKernelBoundaries()])
    rb, ra = before.kernel_report, after.kernel_report
    assert rb.num_kernels == ra.num_kernels and rb.num_anchor_kernels == ra.num_anchor_kernels == 2
    # (what crosses on this toy graph is dominated by x86's legalization of its uint8 conv input;
    # the crossing dtypes are asserted on the zoo model below)
    x = np.random.default_rng(0).integers(0, 256, (1, 8, 6, 6)).astype("uint8")
    out_b, out_a = assert_same_outputs(before, after, {"x": x})  # uint8 output: bit for bit
    assert out_b[0].std() > 0  # not a degenerate comparison


def test_float_quantize_clip_is_a_narrow_point():
    """The stock QLinearAdd lowering: clip(round(y), 0, 255) in float32 is an 8-bit value."""
    x = _x()
    q = relay.clip(relay.round(relay.multiply(relay.cast(_conv(x, W1), "float32"), relay.const(0.01))), 0.0, 255.0)
    lhs = relay.multiply(q, relay.const(0.5))
    rhs = relay.multiply(relay.cast(_conv(x, W2), "float32"), relay.const(0.02))
    mod = infer(relay.cast(relay.clip(relay.round(relay.add(lhs, rhs)), 0.0, 255.0), "uint8"))
    assert "annotation.stop_fusion" in NarrowKernelBoundaries()(mod).astext()
    fb, fa = tvm_ext.build(mod), tvm_ext.build(mod, passes=[NarrowKernelBoundaries()])  # before_fuse
    assert fa.kernel_report.num_kernels == fb.kernel_report.num_kernels
    assert_same_outputs(fb, fa, random_inputs(mod))


@pytest.mark.parametrize(
    "expr, expected",
    [
        (lambda v: relay.clip(v, 0.0, 255.0), ("uint8", "clip")),
        (lambda v: relay.clip(v, -128.0, 127.0), ("int8", "clip")),
        (lambda v: relay.clip(v, 0.0, 256.0), None),
        (lambda v: relay.clip(v, 0.5, 100.0), None),
        (lambda v: relay.cast(v, "int8"), ("int8", "typed")),
        (lambda v: relay.clip(relay.cast(v, "float32"), 0.0, 255.0), None),  # floats not known integral
        (lambda v: relay.clip(relay.round(relay.cast(v, "float32")), 0.0, 255.0), ("uint8", "clip")),
        # a quantize with its zero point: clip(round(x) + 16) is integral (a QOperator hard-swish)
        (lambda v: relay.clip(relay.add(relay.round(relay.cast(v, "float32")), relay.const(16.0)), 0.0, 255.0),
         ("uint8", "clip")),
        (lambda v: relay.clip(relay.add(relay.round(relay.cast(v, "float32")), relay.const(0.5)), 0.0, 255.0), None),
        (lambda v: relay.clip(relay.add(relay.cast(v, "float32"), relay.const(16.0)), 0.0, 255.0), None),
    ],
)
def test_narrow_type(expr, expected):
    v = relay.var("v", shape=(4,), dtype="int32")
    node = infer(expr(v))["main"].body
    got = narrow_type(node)
    assert (got if got else None) == expected


# -- no match --------------------------------------------------------------------------------------
def identity_block():
    """x (u8, also read by the conv) -> requant -+-> add: one chain starts at x, a kernel input already."""
    x = _x()
    lhs = _requant(x, 1.5)
    rhs = _clip8(_requant(_conv(x, W2), 0.02))
    return infer(relay.cast(_clip8(relay.add(lhs, rhs)), "uint8"))


def test_identity_shortcut_unchanged(caplog):
    assert_unchanged_with_reason(NarrowKernelBoundaries(), identity_block(), "at most one anchor", LOGGER, caplog)


def test_chains_without_narrow_point_unchanged(caplog):
    x = _x()
    mod = infer(relay.add(_requant(_conv(x, W1), 0.5), _requant(_conv(x, W2), 0.5)))
    assert_unchanged_with_reason(NarrowKernelBoundaries(), mod, "no 8-bit point", LOGGER, caplog)


def diamond():
    r"""One anchor read by two private widening chains that meet again (a max pool of uint8 values
    widened twice with different scales and added, as WidenInEachReader leaves a QDQ add of one
    tensor)::

        x -> max_pool (u8) -> requant(1.5) -> clip -+-> add -> clip -> cast u8
                          \-> requant(0.5) --------+
    """
    x = _x()
    pool = relay.nn.max_pool2d(x, pool_size=(2, 2), strides=(2, 2))
    lhs = _requant(_clip8(_requant(pool, 1.5)), 1.0)
    rhs = _requant(pool, 0.5)
    return infer(relay.cast(_clip8(relay.add(lhs, rhs)), "uint8"))


def test_diamond_from_one_anchor_unchanged(caplog):
    """Both chains start at the same anchor: FuseOps fuses the whole diamond into one kernel, and a
    cut would make it two. Left alone with the reason; one kernel either way."""
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert_unchanged(NarrowKernelBoundaries(), diamond())
    assert "same" in caplog.text and "one kernel already" in caplog.text
    assert tvm_ext.build(diamond(), passes=[NarrowKernelBoundaries()]).kernel_report.num_kernels == 1


def test_untyped_module_raises():
    x = _x()
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.add(_conv(x, W1), _conv(x, W2))))
    assert_untyped_module_raises(NarrowKernelBoundaries(), mod, "NarrowKernelBoundaries")


def test_let_skipped(caplog):
    mod = residual()
    body, x = mod["main"].body, mod["main"].params[0]
    v = relay.var("v")
    mod = infer(relay.Function([x], relay.Let(v, body, v)))
    assert_unchanged_with_reason(NarrowKernelBoundaries(), mod, "Let", LOGGER, caplog)


def test_dynamic_shapes_skipped():
    x = relay.var("x", shape=(relay.Any(), 8, 6, 6), dtype="uint8")
    lhs = _requant(_clip8(_requant(_conv(x, W1), 0.01)), 1.5)
    rhs = _clip8(_requant(_conv(x, W2), 0.02))
    assert_unchanged(NarrowKernelBoundaries(), infer(relay.Function([x], relay.add(lhs, rhs))))


def test_tuple_output_join_ok():
    """The join's result also returned in a tuple: still one cut, outputs identical."""
    mod = residual()
    body = mod["main"].body
    tup = infer(relay.Function(mod["main"].params, relay.Tuple([body, body])))
    after = NarrowKernelBoundaries()(tup)
    assert after.astext().count("annotation.stop_fusion") == 1


@pytest.mark.slow  # the small QOperator ResNet built twice: a minute and a half on 2 cores
# -- the zoo model (small): the whole issue-6 pipeline ------------------------------------------
def test_small_qoperator_resnet_only_8bit_crosses_bit_exact():
    """The int8 pipeline (which ends with FoldPadIntoConv, NarrowKernelBoundaries and
    FuseWideningIntoPool) against stock and against the pipeline without those three."""
    m = tvm_ext.tools.zoo.load("resnet50_int8_qoperator", small=True)
    p = tvm_ext.core.pipelines.int8()
    mine = {"FoldPadIntoConv", "NarrowKernelBoundaries", "FuseWideningIntoPool"}
    assert mine <= set(p.pass_names()["before_fuse"])
    without = [getattr(tvm_ext.passes, n)() for n in p.pass_names()["before_fuse"] if n not in mine]
    ref = tvm_ext.build(m.mod, params=m.params)  # stock relay.build's graph
    partial = tvm_ext.build(m.mod, params=m.params, passes={"start": p["start"], "before_fuse": without})
    f = tvm_ext.build(m.mod, params=m.params, passes=p)
    rep = f.kernel_report
    assert rep.num_kernels <= rep.num_anchor_kernels + 2 < partial.kernel_report.num_kernels
    assert set(rep.crossing.count) <= {"uint8", "int8"}
    assert ref.kernel_report.crossing.count.get("float32", 0) > 0  # what the passes removed
    assert partial.kernel_report.crossing.count.get("float32", 0) > 0
    for seed in range(2):
        data = {"data": tvm_ext.tools.zoo.sample_input(m, seed)}
        np.testing.assert_array_equal(run_module(ref, data)[0], run_module(f, data)[0])


# -- broadcast joins (the squeeze-and-excitation gate of QDQ MobileNets) --------------------------
W16 = [np.random.default_rng(s).integers(-3, 4, (16, 16, 1, 1)).astype("int8") for s in (3, 4)]


def _conv16(x, w):  # 16 channels: x86 legalization neither pads nor slices them
    return relay.nn.conv2d(x, relay.const(w), kernel_size=(1, 1), channels=16, out_dtype="int32")


def se_join(cut=False, other_anchor=True, reshape=None):
    """x * gate with a per-channel gate from its own conv::

        x (1x16x6x6) -> conv  -> requant -> clip ----------------+-> multiply -> clip -> cast u8
        g (1x16x1x1) -> conv  -> requant -> n = clip -> requant -+   (broadcast edge)

    The gate's conv can never fuse through the broadcast edge: ``cut=True`` is the pass's result,
    the gate crossing as uint8. ``other_anchor=False``: x is a graph input (no anchor).
    ``reshape="after"``: the gate reaches the join through a reshape to ``(16, 1, 1)`` (an injective
    call, as the ``layout_transform`` back to NCHW after AlterOpLayout); ``reshape="before"``: the
    reshape comes before the 8-bit point, which is then outside the gate conv's kernel.
    """
    x = relay.var("x", shape=(1, 16, 6, 6), dtype="uint8")
    g = relay.var("g", shape=(1, 16, 1, 1), dtype="uint8")
    lhs = _clip8(_requant(_conv16(x, W16[0]), 0.01)) if other_anchor else relay.cast(x, "int32")
    wide = _requant(_conv16(g, W16[1]), 0.02)
    if reshape == "before":
        wide = relay.reshape(wide, (16, 1, 1))
    n = _clip8(wide)
    if cut:
        n = relay.cast(relay.annotation.stop_fusion(relay.cast(n, "uint8")), "int32")
    gate = _requant(n, 0.5)
    if reshape == "after":
        gate = relay.reshape(gate, (16, 1, 1))
    return infer(relay.cast(_clip8(relay.multiply(lhs, gate)), "uint8"))


@pytest.mark.parametrize("other_anchor", [True, False])
def test_broadcast_join_structure(other_anchor, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        after = check(NarrowKernelBoundaries(), se_join(other_anchor=other_anchor),
                      se_join(cut=True, other_anchor=other_anchor))
    assert "broadcast chain from nn.conv2d cut" in caplog.text
    assert_unchanged(NarrowKernelBoundaries(), after)  # idempotent


@pytest.mark.parametrize("reshape, other_anchor, anchors", [
    (None, True, 2),
    # det QDQ's SE gates reach the NCHW join through a layout_transform; x without an anchor (the
    # SE multiply reads a value with other readers): the join's elementwise kernel takes the reshape
    ("after", False, 1),
])
def test_broadcast_join_gate_crosses_as_uint8_bit_exact(reshape, other_anchor, anchors):
    before = tvm_ext.build(se_join(reshape=reshape, other_anchor=other_anchor))
    after = tvm_ext.build(se_join(reshape=reshape, other_anchor=other_anchor), passes=[NarrowKernelBoundaries()])
    rb, ra = before.kernel_report, after.kernel_report
    assert rb.num_kernels == ra.num_kernels and rb.num_anchor_kernels == ra.num_anchor_kernels == anchors
    assert rb.crossing.nbytes.get("int32", 0) > 0 and ra.crossing.nbytes.get("int32", 0) == 0, (rb.table(), ra.table())
    rng = np.random.default_rng(0)
    inputs = {"x": rng.integers(0, 256, (1, 16, 6, 6)).astype("uint8"),
              "g": rng.integers(0, 256, (1, 16, 1, 1)).astype("uint8")}
    out_b, _ = assert_same_outputs(before, after, inputs)
    assert out_b[0].std() > 0


def test_broadcast_join_through_injective_call_structure(caplog):
    # PP-OCRv4 det QDQ's SE gates (NCHW12c) reach the NCHW join through a layout_transform
    with caplog.at_level(logging.INFO, logger=LOGGER):
        after = check(NarrowKernelBoundaries(), se_join(reshape="after"), se_join(cut=True, reshape="after"))
    assert "broadcast chain from nn.conv2d cut" in caplog.text
    assert_unchanged(NarrowKernelBoundaries(), after)  # idempotent


def test_broadcast_join_narrow_point_below_injective_call_unchanged():
    # the clip after the reshape is not in the gate conv's kernel: a cut there would add a kernel
    assert_unchanged(NarrowKernelBoundaries(), se_join(reshape="before"))
