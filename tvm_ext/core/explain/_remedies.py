"""What would remove a kernel boundary: the ordered remedy table.

Per boundary the first remedy whose predicate holds names it: a tvm-ext pass, a pattern-table
change or a config. A remedy also says how to apply it (a pass run last before FuseOps or first in
the pipeline, a FuseOps config, or changed ``explain`` arguments), which
:meth:`tvm_ext.core.explain.Explanation.check_remedies` uses to measure it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Optional

from ._result import Boundary
from ._fusion_sim import MAX_FUSED_OPS


@dataclass(frozen=True)
class Remedy:
    """What would remove a boundary: a tvm-ext pass, a pattern-table change or a config."""

    name: str
    kind: str  # pass | config | pattern | none
    matches: Callable
    text: str
    apply: Optional[Callable] = None  # (explain kwargs) -> explain kwargs, or None if not applicable
    pass_name: Optional[str] = None  # a tvm-ext pass run last before FuseOps (stage "before_fuse")
    stage: str = "before_fuse"  # "start": the pass runs first, the whole pipeline is re-run
    config: Optional[Callable] = None  # (FuseOps PassContext config) -> config


@dataclass
class RemedyResult:
    """Boundaries one remedy names, and (when checked) what applying it did."""

    remedy: str
    kind: str
    text: str
    boundaries: int
    nbytes: int
    measured: bool = False
    kernels_saved: Optional[int] = None
    bytes_saved: Optional[int] = None
    remaining: Optional[int] = None  # boundaries the remedy still names after applying it
    error: Optional[str] = None

    def to_dict(self) -> dict:
        return asdict(self)


def _with_start_pass(kw, name):
    """``kw`` (explain's arguments) with pass ``name`` added first in the ``start`` stage."""
    from collections.abc import Mapping

    import tvm

    from ..registry import create_pass

    passes, at = kw.get("passes", ()), kw.get("at", "before_fuse")
    if isinstance(passes, Mapping):
        stages = {k: list(passes[k]) for k in ("start", "before_fuse")}
    else:
        plist = [passes] if isinstance(passes, tvm.transform.Pass) else list(passes)
        stages = {"start": [], "before_fuse": []}
        stages[at] = plist
    stages["start"] = [create_pass(name)] + stages["start"]
    return {**kw, "passes": stages}


def _raise_max_depth(cfg):
    return {**cfg, "relay.FuseOps.max_depth": max(int(cfg.get("relay.FuseOps.max_depth", MAX_FUSED_OPS)) * 4, 1024)}


def _disable_alter_layout(kw):
    return {**kw, "disabled_pass": [*kw.get("disabled_pass", ()), "AlterOpLayout"]}


def _drop_fuse_by_pattern(kw):
    import tvm

    passes = kw.get("passes", ())
    if isinstance(passes, tvm.transform.Pass):
        passes = [passes]
    if not isinstance(passes, (list, tuple)):
        return None  # a pipeline: the entry lives inside it; not applied automatically
    kept = [p for p in passes if p.info.name != "FuseByPattern"]
    if len(kept) == len(passes):
        return None
    return {**kw, "passes": kept}


_ZP_FOLD_CONVS = ("nn.conv2d", "nn.contrib_conv2d_NCHWc", "nn.contrib_depthwise_conv2d_NCHWc")


_QUANT_OPS = ("cast", "fixed_point_multiply", "qnn.requantize", "qnn.dequantize", "clip", "round")


def _bits(dtype: str) -> int:
    import tvm

    try:
        return tvm.DataType(dtype).bits
    except Exception:  # "tuple" or unknown
        return 0


def _wide(dtype: str) -> bool:
    return dtype in ("float32", "float16", "int32", "int16", "float64", "int64")


def _inserted(b: Boundary, op: str, pass_name: str) -> bool:
    return any(o == op and pass_name in ps for o, ps in b.inserted_by)


#: Ordered remedy table: the first entry whose predicate holds names a boundary's remedy.
#: convolutions x86 int8 legalization pads to 16 output channels and slices back (their int32
#: accumulators then cross to the slice's kernel)
_SLICED_CONVS = ("nn.contrib_conv2d_NCHWc", "nn.conv2d")


#: ``tvm_ext.pattern`` names of the Primitive groups tvm-ext passes make (not a user's pattern table)
_PASS_GROUPS = ("DequantizeInConvTranspose",)


REMEDIES = (
    Remedy("RemoveStopFusion", "pass",
           lambda b: b.kind == "stop_fusion" and not any(o == "annotation.stop_fusion" for o, _ in b.inserted_by),
           "tvm-ext pass RemoveStopFusion: removes relay.quantize's stop_fusion where fusing keeps bits and one "
           "anchor per kernel", pass_name="RemoveStopFusion"),
    Remedy("PadChannelsAtProducer", "pass",
           lambda b: b.kind == "prologue_into_anchor" and b.pads_channels
           and any(r is not None and "conv2d" in r for r in b.readers),
           "tvm-ext pass PadChannelsAtProducer (start stage): the float conv writing an int8 conv's input pads its "
           "channels to the multiple of 4 x86 legalization pads to, so no pad kernel is needed",
           pass_name="PadChannelsAtProducer", stage="start"),
    Remedy("FoldPadIntoConv", "pass",
           lambda b: b.kind == "prologue_into_anchor" and b.op == "nn.pad"
           and (b.pad_value == 0 or any(r == "qnn.conv2d" for r in b.readers)),
           "tvm-ext pass FoldPadIntoConv: folds the explicit pad into the convolution's padding",
           pass_name="FoldPadIntoConv"),
    Remedy("CombineParallelCast", "pass",
           lambda b: b.kind == "multiple_readers" and len(b.readers) > 1 and all(r == "cast" for r in b.readers)
           and len(set(b.reader_casts)) == 1 and _bits(b.reader_casts[0]) < _bits(b.dtype),
           "tvm-ext pass CombineParallelCast: one narrowing cast per value, fused into the producer",
           pass_name="CombineParallelCast"),
    Remedy("FuseWideningIntoPool", "pass",
           lambda b: _wide(b.dtype) and any(r in ("nn.global_avg_pool2d", "nn.adaptive_avg_pool2d") for r in b.readers),
           "tvm-ext pass FuseWideningIntoPool: the requantize before global average pooling joins the pool kernel",
           pass_name="FuseWideningIntoPool"),
    Remedy("NarrowKernelBoundaries", "pass",
           lambda b: b.kind == "multiple_readers" and _wide(b.dtype) and b.join is not None
           and b.join.startswith("add") and any(o in _QUANT_OPS for o in b.producer_ops),
           "tvm-ext pass NarrowKernelBoundaries: at the residual join, the 8-bit value crosses instead",
           pass_name="NarrowKernelBoundaries"),
    Remedy("AnchoredArgumentFirst", "pass", lambda b: b.kind == "postponed_dropped",
           "tvm-ext pass AnchoredArgumentFirst: the join's arguments swap, so this chain is the later one and its "
           "postponed fusion is retried before the anchor's", pass_name="AnchoredArgumentFirst"),
    Remedy("NonNegativeConvInputToUint8", "pass",
           lambda b: b.kind == "prologue_into_anchor" and "nn.pad" in b.producer_ops
           and any(o == "nn.pad" and "Legalize" in ps for o, ps in b.inserted_by)
           or (b.kind == "prologue_into_anchor" and b.op == "nn.pad" and b.pad_value == 128),
           "tvm-ext pass NonNegativeConvInputToUint8 (start stage): an int8 conv input proven >= 0 is read as "
           "uint8, so x86 legalisation adds no +128 shift and no explicit pad",
           pass_name="NonNegativeConvInputToUint8", stage="start"),
    Remedy("FoldZeroPointPadIntoConv", "pass",
           lambda b: b.kind == "prologue_into_anchor" and b.op == "nn.pad" and b.pad_value not in (None, 0)
           and bool(b.readers) and all(r in _ZP_FOLD_CONVS for r in b.readers),
           "tvm-ext pass FoldZeroPointPadIntoConv: the zero-point pad folds into the integer convolution, its "
           "border contribution added as a constant in the conv's epilogue", pass_name="FoldZeroPointPadIntoConv"),
    Remedy("EpilogueBeforeChannelSlice", "pass",
           lambda b: b.kind == "injective_after_anchor" and b.dtype == "int32" and b.op in _SLICED_CONVS
           and any(r in ("layout_transform", "strided_slice") for r in b.readers),
           "tvm-ext pass EpilogueBeforeChannelSlice: the requantize epilogue moves in front of the conv's "
           "output-channel slice, so the padded conv writes 8 bits instead of its int32 accumulators",
           pass_name="EpilogueBeforeChannelSlice"),
    Remedy("relay.FuseOps.max_depth", "config", lambda b: b.kind == "max_depth",
           "config: raise PassContext(config={'relay.FuseOps.max_depth': N})", config=_raise_max_depth),
    Remedy("disabled_pass=AlterOpLayout", "config",
           lambda b: b.kind in ("injective_after_anchor", "prologue_into_anchor")
           and (_inserted(b, b.op, "AlterOpLayout") or any(_inserted(b, r, "AlterOpLayout") for r in b.readers)),
           "config: PassContext(disabled_pass=['AlterOpLayout']) keeps the layout (changes the conv schedules)",
           _disable_alter_layout),
    Remedy("tvm-ext pass group", "none", lambda b: b.kind == "function_boundary" and b.entry in _PASS_GROUPS,
           "a tvm-ext pass made this group one kernel on purpose (DequantizeInConvTranspose: the transposed "
           "conv's kernel reads and writes 8 bits); nothing to remove", None),
    Remedy("pattern entry", "pattern", lambda b: b.kind == "function_boundary" and b.entry is not None
           and not b.entry.startswith("Primitive"),
           "pattern table: the named entry makes this group one kernel; drop or widen the entry "
           "(FuseByPattern / MergeComposite)", _drop_fuse_by_pattern),
    Remedy("none", "none", lambda b: True,
           "no remedy in tvm-ext: TVM kernels hold one anchor and FuseOps fuses forward only", None),
)


_REMEDY_BY_NAME = {r.name: r for r in REMEDIES}
