"""Named pass pipelines for :func:`tvm_ext.build`.

A :class:`Pipeline` maps build stages to ``tvm.transform.Sequential`` objects:
``"start"`` runs on the bound module before relay.build's optimisation prefix (where QNN ops
still exist), ``"before_fuse"`` runs after the prefix, right before FuseOps. Pass it as
``tvm_ext.build(mod, target, params, passes=pipelines.int8())``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Pipeline", "int8", "onnxruntime_numerics", "NUMERICS", "ORT_REQUANTIZE"]

#: ``numerics=`` choices of :func:`int8`: whose rounding the built model follows.
NUMERICS = ("tvm", "onnxruntime")

#: How ONNX Runtime (MLAS) requantizes: ``acc * float32 scale``, rounded to nearest (and
#: :func:`~tvm_ext.passes.RoundHalfToEven` makes TVM's nearest ties-to-even, as MLAS's).
#: TVM's default is ``rounding="UPWARD"``, and ``compute_dtype="int64"`` (fixed point) on
#: targets without SSE4.1 (plain ``llvm``), ``float32`` on the others.
ORT_REQUANTIZE = (("rounding", "TONEAREST"), ("compute_dtype", "float32"))


@dataclass(frozen=True)
class Pipeline(Mapping):
    """Passes per build stage; behaves as ``{"start": Sequential, "before_fuse": Sequential}``."""

    name: str
    start: object
    before_fuse: object
    doc: str = ""
    #: ``relay.qnn.op.requantize_config`` settings :func:`tvm_ext.build` compiles under, as
    #: ``(key, value)`` pairs (empty: TVM's defaults). QNN canonicalization reads them.
    requantize: tuple = ()

    def __getitem__(self, key):
        if key == "start":
            return [self.start]
        if key == "before_fuse":
            return [self.before_fuse]
        raise KeyError(key)

    def __iter__(self):
        return iter(("start", "before_fuse"))

    def __len__(self) -> int:
        return 2

    def pass_names(self) -> dict:
        """Names of the passes in each stage (what ``disabled_pass`` and instruments see)."""
        return {"start": _names(self.start), "before_fuse": _names(self.before_fuse)}


def _names(seq) -> list:
    return list(getattr(seq, "_tvm_ext_names", []))


def _sequential(passes, name):
    import tvm

    seq = tvm.transform.Sequential(list(passes), opt_level=0, name=name)
    seq._tvm_ext_names = [p.info.name for p in passes]  # Sequential does not expose its passes
    return seq


def int8(numerics: str = "tvm") -> Pipeline:
    """tvm-ext's recommended pipeline for quantized CNNs (the benchmark's "tvm-ext" column).

    Stage ``start`` (QNN ops still present, before relay.build's prefix):

    1. ``UniformZeroPointsToScalar``: per-channel zero-point vectors whose entries are equal (ONNX
       Runtime's per-channel weights: all 0) become scalars, so TVM's QNN canonicalization drops
       the zero-point terms (three kernels and an int32 tensor per conv otherwise).
    2. ``QDQToInteger``: QDQ graphs become integer QNN graphs (TVM's FakeQuantizationToInteger),
       keeping residual adds in float with one rounding, as ONNX Runtime computes them. uint8
       instead of float32 then flows between kernels. No-op on QOperator / relay.quantize graphs.
    3. ``NonNegativeConvInputToUint8``: int8 conv inputs proven to lie in [0, 127] are read as
       uint8, so x86 legalisation adds no +128 shift kernel, no explicit pad and no
       compensation (relay.quantize graphs; exact, and it avoids the saturating shifted path).
    3a. ``PadChannelsAtProducer``: an int8 conv input whose channels x86 would pad to a multiple
       of 4 (an ``nn.pad`` kernel) is written padded by the float conv producing it (zero output
       channels; the int8 convs get zero input channels; exact). x86 targets only.

    Stage ``before_fuse`` (after Legalize, CanonicalizeOps, AlterOpLayout, FoldConstant):

    4. ``RemoveStopFusion``: relay.quantize's fusion barriers are removed where fusing across
       them keeps bits and anchors apart, else moved so the narrowest tensor crosses.
    5. ``NarrowBeforeMaxPool``: a monotone quantizing chain after a max pool moves in front of
       it (``f(max_pool(x)) == max_pool(f(x))``), so the producer writes int8, not float32.
    6. ``CombineParallelCast``: one narrowing cast per value, fused into its producer.
       ``HoistUint8Shift``: x86's ``+128`` shift in front of an int8-input (S8S8) conv moves
       into the producer of a value that also has other readers (a residual's block input):
       the producer writes uint8, the others read ``cast(s, int32) - 128`` (exact).
    7. ``FoldPadIntoConv``: explicit zero / zero-point pads fold into the (NCHWc) convolution.
       ``FoldZeroPointPadIntoConv``: a non-zero pad (an asymmetric input zero point, which the
       conv cannot pad with) folds too; its border contribution, a constant, is added in the
       conv's epilogue (exact).
    7b. ``EpilogueBeforeChannelSlice``: x86 pads integer convs' output channels to a multiple of
       16 and slices them back after the conv's kernel; the requantize epilogue moves in front
       of the slice (per-channel constants blocked and padded), so the conv writes 8 bits, not
       int32 accumulators (exact).
    8. ``NarrowKernelBoundaries``: at residual joins, the 8-bit value crosses the kernel
       boundary and the widening (dequantize) chain fuses into the consumer.
    8a. ``WidenAfterMovement``: a dequantize chain in front of data movement (concatenate, split,
       reshape, transpose, layout transforms, slices: a detector head's multi-scale concatenation)
       moves behind it, constants moved with the data, so the movement runs on 8-bit values and
       the dequantize reaches the reader that computes in float (exact).
    8b. ``WidenInEachReader``: a dequantized value read by several ops (the SE block's input:
       pool and gating multiply) crosses as its 8-bit source, and each reader widens it (exact).
    9. ``FuseWideningIntoPool``: the requantize in front of global average pooling (or of a
       softmax) fuses into the pool's kernel, so the pool reads uint8.
    10. ``TabulateEightBit``: an elementwise float function of one 8-bit value (quantized
        sigmoid, SiLU, tanh, GELU) becomes a table lookup computed by TVM at compile time (exact),
        fused where the chain was: one table read per element instead of a scalar ``expf`` call.
    10b. ``DequantizeInConvTranspose``: a float transposed conv with stride = kernel (a DB head's
        upsampling, kept float by ONNX Runtime's QOperator graphs) becomes one kernel from its 8-bit
        input to the 8-bit quantize after it, so no float32 crosses there (exact; llvm targets).

    Every pass is exact on the graph it is given; see each pass's docstring for what it rejects.

    With ``numerics="onnxruntime"``, ``QDQToInteger`` runs with ``shared_dequantize=True`` (average
    pools and adds whose dequantize has other readers stay float too: MobileNetV3's SE pools,
    YOLOv8n's C2f residual adds), stage ``start`` gets, after ``QDQToInteger``,

    3b. ``AddAsOnnxRuntime``: quantized adds (``QLinearAdd``, and the ``qnn.add`` of QDQ adds)
        computed with ONNX Runtime's MLAS arithmetic (fused multiply-adds, one rounding);
    3c. ``QuantizeWeightsAsOnnxRuntime``: the float weight (and bias) of a conv / transposed conv
        between a ``dequantize`` and a ``quantize`` quantized to int8 as ONNX Runtime's graph
        optimizer (``WeightBiasQuantization``) does, so TVM computes with ORT's weights (PP-OCRv4
        det QOperator's head ``ConvTranspose``);

    and stage ``before_fuse`` gets, before ``TabulateEightBit`` (so tables round as ONNX does),

    11. ``RoundHalfToEven``: every ``round`` (TVM's lowered ``qnn.quantize`` rounds
        ``x / scale`` with it) rounds halfway cases to even, as ONNX's ``QuantizeLinear`` and
        ONNX Runtime do, instead of away from zero; a rounded division by a scalar constant
        stays a true division; a requantize's zero point is added after rounding.

    and QNN requantize is lowered with :data:`ORT_REQUANTIZE` (float32 scale, round to nearest,
    where TVM rounds ``UPWARD``). This changes outputs (near rounding ties only): it is not the
    default, so that the default pipeline stays bit-exact to stock TVM.

    Parameters
    ----------
    numerics : {"tvm", "onnxruntime"}
        ``"tvm"`` (default): results bit-exact to stock ``relay.build`` at the same target.
        ``"onnxruntime"``: round as ONNX Runtime does (see above); the pipeline is then named
        ``tvm_ext.int8_ort``.

    Returns
    -------
    Pipeline

    Raises
    ------
    ValueError
        An unknown ``numerics``.
    """
    if numerics not in NUMERICS:
        raise ValueError(f"pipelines.int8: numerics={numerics!r}; expected one of {NUMERICS}")
    from .passes import (
        AddAsOnnxRuntime,
        CombineParallelCast,
        DequantizeInConvTranspose,
        EpilogueBeforeChannelSlice,
        FoldPadIntoConv,
        FoldZeroPointPadIntoConv,
        FuseWideningIntoPool,
        HoistUint8Shift,
        NarrowBeforeMaxPool,
        NarrowKernelBoundaries,
        NonNegativeConvInputToUint8,
        PadChannelsAtProducer,
        QDQToInteger,
        QuantizeWeightsAsOnnxRuntime,
        RemoveStopFusion,
        RoundHalfToEven,
        TabulateEightBit,
        UniformZeroPointsToScalar,
        WidenAfterMovement,
        WidenInEachReader,
    )

    ort = numerics == "onnxruntime"
    # shared_dequantize (onnxruntime): SE pools and C2f adds stay float, as ORT computes them
    start = [UniformZeroPointsToScalar(), QDQToInteger(shared_dequantize=ort), NonNegativeConvInputToUint8(),
             PadChannelsAtProducer()]
    before_fuse = [
        RemoveStopFusion(),
        NarrowBeforeMaxPool(),
        CombineParallelCast(),
        HoistUint8Shift(),
        FoldPadIntoConv(),
        FoldZeroPointPadIntoConv(),
        EpilogueBeforeChannelSlice(),
        NarrowKernelBoundaries(),
        WidenAfterMovement(),
        WidenInEachReader(),
        FuseWideningIntoPool(),
        tables := TabulateEightBit(),
        DequantizeInConvTranspose(),  # last: the passes before it do not enter Primitive functions
    ]
    name, requantize = "tvm_ext.int8", ()
    if ort:
        start.insert(2, AddAsOnnxRuntime())  # after QDQToInteger, whose qnn.add it rewrites
        start.insert(3, QuantizeWeightsAsOnnxRuntime())  # after QDQToInteger: FQ2I must not see its dequantized weight
        # before TabulateEightBit: tables round as ONNX does
        before_fuse.insert(before_fuse.index(tables), RoundHalfToEven())
        name, requantize = "tvm_ext.int8_ort", ORT_REQUANTIZE
    return Pipeline(
        name=name,
        start=_sequential(start, f"{name}.start"),
        before_fuse=_sequential(before_fuse, f"{name}.before_fuse"),
        doc=int8.__doc__ or "",
        requantize=requantize,
    )


def onnxruntime_numerics() -> Pipeline:
    """Round as ONNX Runtime does, and nothing else: for a build without the int8 pipeline.

    ``tvm_ext.build(mod, params=params, passes=pipelines.onnxruntime_numerics())`` compiles the
    graph stock ``relay.build`` compiles, except that (1) QNN requantize is lowered with
    :data:`ORT_REQUANTIZE` (float32 scale, round to nearest) instead of TVM's ``UPWARD`` rounding,
    and (2) ``AddAsOnnxRuntime`` and ``QuantizeWeightsAsOnnxRuntime`` run at ``start`` (quantized
    adds as MLAS computes them; float conv weights between a dequantize and a quantize quantized as
    ORT's graph optimizer does), and (3) ``RoundHalfToEven`` runs at ``before_fuse``: ``round`` (so ``qnn.quantize``) rounds
    ties to even, a rounded division by a scalar constant stays a true division, and a requantize's
    output zero point is added after rounding, as ONNX Runtime's kernels do.

    Returns
    -------
    Pipeline
        Named ``tvm_ext.onnxruntime_numerics``.
    """
    from .passes import AddAsOnnxRuntime, QuantizeWeightsAsOnnxRuntime, RoundHalfToEven

    name = "tvm_ext.onnxruntime_numerics"
    return Pipeline(name=name, start=_sequential([AddAsOnnxRuntime(), QuantizeWeightsAsOnnxRuntime()], f"{name}.start"),
                    before_fuse=_sequential([RoundHalfToEven()], f"{name}.before_fuse"),
                    doc=onnxruntime_numerics.__doc__ or "", requantize=ORT_REQUANTIZE)
