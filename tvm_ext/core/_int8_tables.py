"""The tables of :func:`tvm_ext.core.pipelines.int8`: :data:`INT8` (its two stages, in order, each
step with what it does and why it stands there) and what ``numerics="onnxruntime"`` changes
(:data:`ONNXRUNTIME_INSERTIONS`, :data:`ONNXRUNTIME_ARGS`, giving :data:`INT8_ONNXRUNTIME`).
"""
from __future__ import annotations

from ._steps import Insertion, Stage, Step

__all__ = ["INT8", "INT8_ONNXRUNTIME", "ONNXRUNTIME_INSERTIONS", "ONNXRUNTIME_ARGS", "START_WHERE",
           "BEFORE_FUSE_WHERE"]

START_WHERE = "on the bound module, before relay.build's optimisation prefix (QNN ops still present)"
BEFORE_FUSE_WHERE = ("after relay.build's optimisation prefix (Legalize, QNN lowering, CanonicalizeOps, "
                      "AlterOpLayout, FoldConstant, ...), right before FuseOps")

#: :func:`int8`'s stages (``numerics="tvm"``).
INT8 = (
    Stage("start", START_WHERE, (
        Step("UniformZeroPointsToScalar",
             does="per-channel zero-point vectors whose entries are equal (ONNX Runtime's per-channel weights: "
                  "all 0) become scalars, so TVM's QNN canonicalization drops the zero-point terms (three "
                  "kernels and an int32 tensor per conv otherwise).",
             why="first, before ``QDQToInteger``, so that pass carries the scalar zero points of the "
                 "``qnn.dequantize`` it reads into the integer ops it creates. At ``start``: QNN ops exist only "
                 "before relay.build's prefix canonicalizes them.",
             before=("QDQToInteger",), place="first"),
        Step("QDQToInteger",
             does="QDQ graphs become integer QNN graphs (TVM's FakeQuantizationToInteger), keeping residual adds "
                  "in float with one rounding, as ONNX Runtime computes them; uint8 instead of float32 then flows "
                  "between kernels. No-op on QOperator / relay.quantize graphs.",
             why="after ``UniformZeroPointsToScalar`` (above), and before ``PadChannelsAtProducer``, which pads "
                 "channels for the ``qnn.conv2d`` this pass makes of a QDQ conv. At ``start``: "
                 "FakeQuantizationToInteger rewrites ``dequantize -> op -> quantize`` regions, which exist only "
                 "before relay.build's prefix lowers QNN ops.",
             after=("UniformZeroPointsToScalar",)),
        Step("NonNegativeConvInputToUint8",
             does="int8 conv inputs proven to lie in [0, 127] are read as uint8, so x86 legalisation adds no +128 "
                  "shift kernel, no explicit pad and no compensation (relay.quantize graphs; exact).",
             why="at ``start`` because it must run before Legalize, which adds the shift it avoids. Its place "
                 "within the stage does not matter: it rewrites the ``nn.conv2d`` of relay.quantize graphs (an "
                 "int8 cast as input), which the other passes of the stage neither create nor change (they "
                 "rewrite QNN ops and QDQ regions, and ``QDQToInteger`` leaves a graph holding ``stop_fusion`` "
                 "alone)."),
        Step("PadChannelsAtProducer",
             does="an int8 conv input whose channels x86 would pad to a multiple of 4 (an ``nn.pad`` kernel) is "
                  "written padded by the conv producing it (zero output channels; the int8 convs get zero input "
                  "channels; exact). x86 targets only.",
             why="after ``QDQToInteger``: the int8 convs it pads channels for are the ``qnn.conv2d`` that pass "
                 "makes of a QDQ graph's convs (and the float producers are the convs it keeps in float). At "
                 "``start``: it matches QNN ops, and does at the producer what Legalize would otherwise do with "
                 "a pad.",
             after=("QDQToInteger",),
             families=("x86", "aarch64")),
    )),
    Stage("before_fuse", BEFORE_FUSE_WHERE, (
        Step("RemoveStopFusion",
             does="relay.quantize's fusion barriers are removed where fusing across them keeps bits and anchors "
                  "apart, else moved so the narrowest tensor crosses.",
             why="first: ``stop_fusion`` is opaque, so a barrier ends the chains and hides the producers the later "
                 "passes match (``NarrowBeforeMaxPool`` does not move a chain across one, ``CombineParallelCast`` "
                 "does not merge the casts of one). It acts on every barrier of the graph, so it also precedes "
                 "``NarrowKernelBoundaries``, whose cuts are barriers. At ``before_fuse``: the barriers must still "
                 "constrain relay.build's prefix (FoldScaleAxis, SimplifyExpr), and CanonicalizeCast has by then "
                 "given each reader its own widening cast.",
             before=("NarrowBeforeMaxPool", "CombineParallelCast", "NarrowKernelBoundaries"), place="first"),
        Step("NarrowBeforeMaxPool",
             does="a monotone quantizing chain after a max pool moves in front of it "
                  "(``f(max_pool(x)) == max_pool(f(x))``), so the producer writes 8 bits, not float32; a widening "
                  "chain in front of a max pool moves behind it.",
             why="after ``RemoveStopFusion`` (a barrier is a link it does not move across), and before "
                 "``FuseWideningIntoPool``, which takes the widening chain this pass moves behind a max pool into "
                 "the kernel of a global average pool reading it. At ``before_fuse``: after the prefix has folded "
                 "batch norms into constants.",
             after=("RemoveStopFusion",), before=("FuseWideningIntoPool",)),
        Step("CombineParallelCast",
             does="parallel narrowing casts of one value become one, which fuses into the producer.",
             why="after ``RemoveStopFusion``: it merges only the casts of a producer FuseOps fuses an elementwise "
                 "consumer into, which a barrier is not. No other pass of the stage has to stand on a "
                 "given side of it; it stands early so that the passes after it see one narrowing cast per "
                 "value (``HoistUint8Shift`` matches a shift whose ``+128`` has that cast as its only reader).",
             after=("RemoveStopFusion",)),
        Step("HoistUint8Shift",
             does="x86's ``+128`` shift in front of an int8-input (S8S8) conv moves into the producer of a value "
                  "that also has other readers (a residual's block input): the producer writes uint8, the others "
                  "read ``cast(s, int32) - 128`` (exact).",
             why="at ``before_fuse``: relay.build's QNN legalization and lowering create the shift. After "
                 "``CombineParallelCast`` (above). The pad folds after it rewrite the convs reading the shifted "
                 "value, this pass the other readers of the value before the shift."),
        Step("FoldPadIntoConv",
             does="explicit zero pads fold into the (NCHWc) convolution.",
             why="at ``before_fuse``: the pads are the ones QNN lowering writes in the prefix, and the convs are "
                 "blocked by AlterOpLayout (``NCHW16c``, which TVM's FoldExplicitPadding leaves alone). Its order "
                 "against ``FoldZeroPointPadIntoConv`` does not matter: this pass folds pads of value 0, that one "
                 "every other value."),
        Step("FoldZeroPointPadIntoConv",
             does="a non-zero pad (an asymmetric input zero point, which the conv cannot pad with) folds too; its "
                  "border contribution, a constant, is added in the conv's epilogue (exact).",
             why="next to ``FoldPadIntoConv`` (their order does not matter: they split pads by value). At "
                 "``before_fuse``: after QNN lowering wrote the pad and AlterOpLayout blocked the conv."),
        Step("EpilogueBeforeChannelSlice",
             does="x86 pads integer convs' output channels to a multiple of 16 and slices them back after the "
                  "conv's kernel; the requantize epilogue moves in front of the slice (per-channel constants "
                  "blocked and padded), so the conv writes 8 bits, not int32 accumulators (exact).",
             why="at ``before_fuse``: Legalize and AlterOpLayout write the ``NCHW<k>c -> NCHW`` layout transform "
                 "and the slice it moves the epilogue across. Before ``NarrowKernelBoundaries``: it puts a sliced "
                 "conv's 8-bit point in front of the slice, the only place where that pass can cut a chain that "
                 "reaches its join through the slice (an SE gate's broadcast edge: cuts go upstream of every "
                 "injective call). Its order against the pad folds does not matter: they rewrite the conv's input "
                 "(and add a border term right after the conv), this pass starts at the layout transform, "
                 "whatever feeds it.",
             before=("NarrowKernelBoundaries",),
             families=("x86", "aarch64")),
        Step("FoldChannelRepadIntoConv",
             does="a conv reading channels sliced off and padded back (int8 legalization between a conv whose "
                  "output channels are no multiple of the channel block and the next conv, whose weights are zero "
                  "on those channels) reads the tensor below the slice: the slice/pad kernel goes (exact).",
             why="after ``EpilogueBeforeChannelSlice``, which moves the first conv's requantize in front of the "
                 "slice, so only data movement stands between the two convs. At ``before_fuse``: Legalize writes "
                 "the slice and the pad, AlterOpLayout the layout transforms around them. The two run again "
                 "together until neither changes the module: removing the re-pad's read of a sliced value can "
                 "leave an epilogue as that slice's only reader, which ``EpilogueBeforeChannelSlice`` then moves.",
             after=("EpilogueBeforeChannelSlice",)),
        Step("NarrowKernelBoundaries",
             does="at residual joins, the 8-bit value crosses the kernel boundary and the widening (dequantize) "
                  "chain fuses into the consumer.",
             why="after ``RemoveStopFusion``, which acts on every barrier and so would judge its cuts, and after "
                 "``EpilogueBeforeChannelSlice`` (above). At ``before_fuse``: it matches the forms QNN lowering "
                 "and SimplifyExpr leave (an integer ``clip`` to 8-bit bounds). At GPU targets it cuts the join's "
                 "later argument only: there FuseOps fuses a widening chain into a join holding an anchor "
                 "only from that side.",
             after=("RemoveStopFusion",)),
        Step("WidenAfterMovement",
             does="a dequantize chain in front of data movement (concatenate, split, reshape, transpose, layout "
                  "transforms, slices: a detector head's multi-scale concatenation) moves behind it, constants "
                  "moved with the data, so the movement runs on 8-bit values (exact).",
             why="before ``WidenInEachReader`` and ``FuseWideningIntoPool``: it gives a shared link of a widening "
                 "chain its own copy exactly where ``WidenInEachReader`` would give every reader one, so one run "
                 "of the pipeline moves the widening (with the order reversed, a second run would move more); the "
                 "chain it moves stops in front of a pool or softmax, which ``FuseWideningIntoPool`` then takes.",
             before=("WidenInEachReader", "FuseWideningIntoPool")),
        Step("WidenInEachReader",
             does="a dequantized value read by several ops (the SE block's input: pool and gating multiply) "
                  "crosses as its 8-bit source, and each reader widens it (exact).",
             why="after ``WidenAfterMovement`` (above), and right before ``FuseWideningIntoPool``, which takes "
                 "the copy of the chain a pool reader gets into the pool's kernel.",
             before=("FuseWideningIntoPool",)),
        Step("FuseWideningIntoPool",
             does="the requantize in front of global average pooling (or of a softmax) fuses into the pool's "
                  "kernel, so the pool reads 8 bits.",
             why="after the passes that bring a widening chain to a pool's input: ``NarrowBeforeMaxPool``, "
                 "``WidenAfterMovement`` and ``WidenInEachReader``. Each pool group it makes is a ``Primitive`` "
                 "function; of the passes after it only the rounding pass of ``numerics=\"onnxruntime\"`` "
                 "enters one (a transcendental op in the pool's elementwise consumers stays as it is). At GPU "
                 "targets the GPU back end's pool and softmax schedules inline the chain (TVM's would leave "
                 "it unscheduled).",
             after=("NarrowBeforeMaxPool", "WidenAfterMovement", "WidenInEachReader")),
        Step("TabulateEightBit",
             does="an elementwise float function of one 8-bit value (quantized sigmoid, SiLU, tanh, GELU, or a "
                  "chain of 16 ops or more such as a quantized hard-swish) becomes a table lookup computed "
                  "by TVM at compile time (exact), fused where the chain was: one table read per element instead "
                  "of a scalar ``expf`` call or the chain's ops.",
             why="at ``before_fuse``, after AlterOpLayout: its ``tvm_ext.table_lookup`` op has no layout rule. "
                 "Before ``DequantizeInConvTranspose`` (last, below). No rule ties it to the passes before it: it "
                 "tabulates the chains as they leave them."),
        Step("AffineEightBitJoin",
             does="an elementwise function of two 8-bit values that computes in float (a QDQ residual add's "
                  "requantize) or through ``fixed_point_multiply`` (a QNN add lowered to integers) becomes one int32 "
                  "form, ``clip((a * Ma + b * Mb + C) >> n)``, found at compile time so that it equals the chain, as "
                  "TVM computes it, on every pair of values (exact): no float conversions, products, division or "
                  "second requantize in the kernel's epilogue. A chain with no such form is rewritten up to its "
                  "latest integer clip or cast that has one.",
             why="at ``before_fuse``: the chain is the one QNN lowering and the layout passes leave, with its "
                 "constants' final shapes (a one-element parameter divides, a scalar multiplies by its "
                 "reciprocal). After ``TabulateEightBit``, whose lookups it reads as 8-bit sources, and before "
                 "``AnchoredArgumentFirst``, which then sees the integer join.",
             after=("TabulateEightBit",)),
        Step("AnchoredArgumentFirst",
             does="at a commutative join (a residual ``add``) whose later argument is a chain of no anchor and whose "
                  "earlier one an anchor's chain, the arguments swap (exact), so the chain fuses into the anchor's "
                  "kernel (a shortcut's widening: no int32 crosses). GPU targets only.",
             why="after ``TabulateEightBit``, which turns a SiLU's two readers of a conv's output into one table "
                 "lookup and so makes that conv's chain private (before it, the join has no anchor's chain), and "
                 "after ``NarrowKernelBoundaries``, whose cuts make chains of no anchor at joins of two anchors. At "
                 "``before_fuse``: the joins are the ones QNN lowering writes. GPU targets only: there FuseOps "
                 "(``max_function_args``) fuses a chain into a join holding an anchor from its later argument only.",
             after=("TabulateEightBit", "NarrowKernelBoundaries"),
             families=("gpu",)),
        Step("DequantizeInConvTranspose",
             does="a transposed conv with stride = kernel (a DB head's upsampling) becomes one kernel from its "
                  "8-bit input to the 8-bit quantize after it, so no float32 crosses there (exact).",
             why="last: it makes each group a ``Primitive`` function, and the passes before it do not look inside "
                 "one. At GPU targets the GPU back end's transposed-conv schedule inlines the dequantize in front "
                 "of the conv (TVM's would leave it unscheduled).",
             place="last"),
    ), fixed_points=(("EpilogueBeforeChannelSlice", "FoldChannelRepadIntoConv"),)),
)

#: What ``numerics="onnxruntime"`` adds to :data:`INT8`: each pass placed next to a named neighbour.
ONNXRUNTIME_INSERTIONS = (
    Insertion("start", Step(
        "AddAsOnnxRuntime",
        does="quantized adds (``QLinearAdd``, and the ``qnn.add`` of QDQ adds) computed with ONNX Runtime's MLAS "
             "arithmetic (fused multiply-adds, one rounding).",
        why="after ``QDQToInteger``: it rewrites the ``qnn.add`` that pass makes of a QDQ add, and the float "
            "adds it keeps. At ``start``: it matches QNN ops.",
        after=("QDQToInteger",)), after="QDQToInteger"),
    Insertion("start", Step(
        "QuantizeWeightsAsOnnxRuntime",
        does="the float weight (and bias) of a conv / transposed conv between a ``dequantize`` and a "
             "``quantize`` is quantized to int8 as ONNX Runtime's graph optimizer (``WeightBiasQuantization``) "
             "does, so TVM computes with ORT's weights.",
        why="after ``QDQToInteger``, whose FakeQuantizationToInteger would turn the float conv with the "
            "dequantized weight this pass writes into an integer QNN op. Its order against ``AddAsOnnxRuntime`` "
            "does not matter: that pass rewrites adds, this one conv weights. ``PadChannelsAtProducer``, after "
            "it, accepts the dequantized weight it writes.",
        after=("QDQToInteger",)), after="AddAsOnnxRuntime"),
    Insertion("before_fuse", Step(
        "RoundHalfToEven",
        does="every ``round`` (TVM's lowered ``qnn.quantize`` rounds ``x / scale`` with it) rounds halfway cases "
             "to even, as ONNX's ``QuantizeLinear`` and ONNX Runtime do, instead of away from zero; a rounded "
             "division by a scalar constant stays a true division; a requantize's zero point is added after "
             "rounding.",
        why="after the passes that find 8-bit points with ``narrow_type`` (``NarrowBeforeMaxPool``, "
            "``EpilogueBeforeChannelSlice``, ``NarrowKernelBoundaries``, ``WidenAfterMovement``, "
            "``WidenInEachReader``, ``FuseWideningIntoPool``): they take a float quantize "
            "``clip(round(x / s) + z)`` for one, not the ``round_half_to_even`` this pass writes. Right "
            "before ``TabulateEightBit``, so the tables it computes round as ONNX does, and before "
            "``DequantizeInConvTranspose``, which takes either form. It rewrites the rounds inside the "
            "``Primitive`` pool groups ``FuseWideningIntoPool`` made before it as well. "
            "At ``before_fuse``: most of the rounds it rewrites are created by relay.build's prefix "
            "when it lowers QNN ops.",
        after=("NarrowBeforeMaxPool", "EpilogueBeforeChannelSlice", "NarrowKernelBoundaries", "WidenAfterMovement",
               "WidenInEachReader", "FuseWideningIntoPool"),
        before=("TabulateEightBit", "DequantizeInConvTranspose")), before="TabulateEightBit"),
)

#: Arguments ``numerics="onnxruntime"`` builds passes of :data:`INT8` with: ``QDQToInteger`` keeps
#: average pools and adds whose dequantize has other readers in float too (MobileNetV3's SE pools,
#: YOLOv8n's C2f residual adds), as ONNX Runtime computes them.
ONNXRUNTIME_ARGS = (("QDQToInteger", (("shared_dequantize", True),)),)


def _onnxruntime(stages: tuple) -> tuple:
    for name, args in ONNXRUNTIME_ARGS:
        stages = tuple(s.with_args(name, **dict(args)) if name in s.names() else s for s in stages)
    for ins in ONNXRUNTIME_INSERTIONS:
        stages = ins.apply(stages)
    return stages


#: :func:`int8`'s stages with ``numerics="onnxruntime"``.
INT8_ONNXRUNTIME = _onnxruntime(INT8)
