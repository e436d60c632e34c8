"""``tvm_ext.explain``: why every kernel boundary exists, and what would remove it.

Design note
-----------
*What is explained.* The module FuseOps sees: ``explain`` runs the same stages as
:func:`tvm_ext.build` (bind params, relay.build's optimisation prefix, the user passes, under the
same target, PassContext, x86 int8 kernels and tuned-schedule contexts), stopping right before
FuseOps. Closures and control flow are explained as FuseOps handles them (see :func:`explain`).

*Kernel names.* Each kernel carries the name the build gives it (``tvmgen_default_fused_...``):
TVM 0.19's naming (``te_compiler_cache.cc``, ``name_supply.cc``) replayed on the Primitive
functions TVM's own FuseOps makes of the same module, without compiling; ``compile=True`` also
builds with :func:`tvm_ext.build` and checks them against its ``KernelReport``.

*How a reason is found.* :mod:`tvm_ext.core._fusion_sim` replays FuseOps (TVM 0.19 ``fuse_ops.cc`` and
``graph_partitioner.cc``) with a decision log: op patterns from ``TOpPattern``, edge patterns,
the post-dominator tree, the three phases, ``CheckPath``, ``relay.FuseOps.max_depth``. A kernel
boundary is a kernel's output read by another kernel; FuseOps only ever fuses a node into its
immediate post-dominator, so the reason is the rule that refused to fuse the producing group's
root into its post-dominator, with the node where the rule failed (the join, the anchor, the
barrier). Nothing is inferred from kernel names. The replay is checked against TVM's real
``FuseOps`` on the same module (``Explanation.verified``): same kernels, op for op.

*Reason kinds* (``REASONS``, ordered data): two anchors meeting, an op after a reduction, an
injective op after an anchor, an elementwise/injective prologue before an anchor, several
readers whose post-dominator lies past a join, no post-dominator, ``annotation.stop_fusion``, a
``Primitive``/``Composite`` function (pattern-table entry named), an opaque op, a dynamic
shape, a tuple, ``max_depth``, fusion disabled. Ops that relay.build's prefix created
(``layout_transform`` by AlterOpLayout, ``nn.pad`` by legalisation, ...) are attributed to the
pass by counting ops after every pass (``Boundary.inserted_by``).

*Remedies* (``REMEDIES``, ordered data): per boundary the first remedy whose predicate holds: a
tvm-ext pass, a pattern-table change or a config. :meth:`Explanation.check_remedies` applies each
one and explains again, measuring kernels and bytes saved and how many of the named boundaries
remain; otherwise the numbers are structural estimates (the bytes of the boundaries named).
"""
from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, replace
from typing import Callable, Optional, Sequence

from .. import _compat  # noqa: F401
from ._fusion_sim import (
    K_COMM_REDUCE,
    K_INJECTIVE,
    K_OPAQUE,
    K_OUT_EWISE_FUSABLE,
    K_TUPLE,
    MAX_FUSED_OPS,
    PATTERN_NAMES,
    FusionGraph,
    node_label,
)

logger = logging.getLogger(__name__)

__all__ = ["explain", "explain_prefused", "FuseOpsInput", "Explanation", "Kernel", "Boundary", "RemedyResult",
           "REASONS", "REMEDIES", "summary_markdown", "summary_dict"]

#: Reason kinds, in report order: (kind, one-line meaning in FuseOps' terms).
REASONS = (
    ("two_anchors", "both sides are anchors: a kOutEWiseFusable/kCommReduce group meets another; "
                    "FuseOps puts one anchor in a kernel"),
    ("after_reduction", "the producer is a kCommReduce group; FuseOps never fuses a reduction into its reader"),
    ("injective_after_anchor", "a kBroadcast/kInjective op (layout_transform, reshape, pad, ...) reads an anchor; "
                               "FuseOps fuses only elementwise epilogues into kOutEWiseFusable"),
    ("prologue_into_anchor", "an elementwise/injective op feeds an anchor (or a kernel already holding one); "
                             "FuseOps fuses epilogues, never prologues"),
    ("multiple_readers", "the value has several readers; its post-dominator lies past a join and a path to it "
                         "breaks FuseOps' CheckPath condition"),
    ("no_post_dominator", "the readers never join again (or the value is also a graph output): no post-dominator"),
    ("stop_fusion", "an annotation.stop_fusion barrier"),
    ("function_boundary", "a Primitive/Composite function (a pattern-table group) is opaque to FuseOps"),
    ("closure_call", "the value is an argument of a call of a closure, a global function or a function an If "
                     "returns (not an op): FuseOps makes such a call kOpaque and leaves it out of every kernel"),
    ("opaque_op", "an op whose TOpPattern is kOpaque"),
    ("dynamic_shape", "a data-dependent op with a dynamic shape is kOpaque"),
    ("tuple", "the value goes into a tuple; FuseOps fuses only injective producers into tuples (phase 2)"),
    ("max_depth", "relay.FuseOps.max_depth reached"),
    ("fusion_disabled", "FuseOps ran at opt_level 0"),
    ("other", "not classified (see detail)"),
)
_REASON_DOC = dict(REASONS)
_REASON_ORDER = {k: i for i, (k, _) in enumerate(REASONS)}


@dataclass(frozen=True)
class Kernel:
    """One kernel (a fused group with at least one op).

    ``name`` is the built module's function name, as TVM's TE compiler gives it
    (``tvmgen_<mod_name>_fused_<ops>``, long names truncated with a hash, ``_1``, ``_2`` for
    different kernels of equal names, one name for structurally equal kernels); ``func_name`` is
    the graph executor's (and so the kernel report's and the debug executor's) name for the call:
    ``name``, or ``"__nop"`` for a reshape-only kernel, which the graph executor does not run.
    Both are ``None`` when the replay's kernel has no counterpart in TVM's FuseOps
    (``Explanation.verified`` is then ``False``).
    """

    index: int
    name: Optional[str]
    ops: tuple
    anchor: Optional[str]
    pattern: str
    outputs: tuple  # ((shape, dtype), ...)
    reshape_only: bool = False
    func_name: Optional[str] = None

    @property
    def title(self) -> str:
        """The built function name, with the graph executor's when it differs (``__nop``)."""
        if self.name is None:
            return "(no TVM kernel of these ops)"
        if self.func_name in (None, self.name):
            return self.name
        return f"{self.name} (graph executor: {self.func_name})"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ops"] = list(self.ops)
        d["outputs"] = [{"shape": list(s), "dtype": t} for s, t in self.outputs]
        return d


@dataclass(frozen=True)
class Boundary:
    """A tensor crossing kernels: producer kernel output read by consumer kernel(s), and why."""

    producer: int
    consumers: tuple
    output: Optional[int]  # field of a tuple-valued kernel, else None
    op: str  # op at the producer kernel's root (what writes the tensor)
    readers: tuple  # op names of the direct readers in the pre-fusion graph
    dtype: str
    shape: tuple
    nbytes: int
    kind: str
    detail: str
    rule: str  # the FuseOps rule that refused, e.g. "phase 0: dom pattern kInjective != kElemWise"
    join: Optional[str] = None  # the post-dominator, e.g. "add in kernel #12"
    blocker: Optional[str] = None  # the op that broke the rule
    entry: Optional[str] = None  # pattern-table entry / function name
    inserted_by: tuple = ()  # ((op, (pass, ...)), ...) for ops relay.build's prefix or user passes created
    remedy: Optional[str] = None
    producer_ops: tuple = ()  # ops of the producer kernel
    reader_casts: tuple = ()  # target dtypes of the readers that are casts
    pad_value: Optional[float] = None  # the constant pad value when the producer root is nn.pad
    pads_channels: bool = False  # the producer kernel holds an nn.pad of a 4-d tensor's axis 1

    def to_dict(self) -> dict:
        d = asdict(self)
        d["consumers"] = list(self.consumers)
        d["producer_ops"] = list(self.producer_ops)
        d["readers"] = list(self.readers)
        d["shape"] = list(self.shape)
        d["inserted_by"] = {op: list(ps) for op, ps in self.inserted_by}
        return d


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


# -- remedies ----------------------------------------------------------------------------------
def _apply_remedy(ex, remedy) -> Optional["Explanation"]:
    """Explain again with ``remedy`` applied. A pass remedy runs on the cached module FuseOps saw
    (it would run last among the before_fuse passes: the same module); a FuseOps config re-runs
    the replay; anything else re-runs the whole pipeline."""
    pre, tgt, cfg, opt_level = ex._prefused
    if remedy.pass_name is not None and remedy.stage == "start":
        if "mod" not in ex._request:
            return None
        return explain(**_with_start_pass(dict(ex._request), remedy.pass_name))
    if remedy.pass_name is not None:
        from . import build as b
        from .registry import create_pass

        counter = _OpCounter()
        use_kernels, use_tuned = b.kernel_settings(ex._request.get("passes", ()), ex._request.get("kernels"),
                                                   ex._request.get("tuned"))
        kernels, schedules = b.kernel_contexts(tgt, pre, use_kernels, use_tuned)
        with kernels, schedules:
            counter._last = _OpCounter.counts(pre)
            mod = b._run_user_passes(_copy(pre), [create_pass(remedy.pass_name)], tgt, opt_level, cfg,
                                     list(ex._request.get("disabled_pass", ())), [counter.make()])
        created = {op: dict(ps) for op, ps in ex.inserted_by.items()}
        for op, ps in counter.created.items():
            for p, n in ps.items():
                created.setdefault(op, {})[p] = created.get(op, {}).get(p, 0) + n
        return _explain_prefused(mod, tgt, cfg, opt_level, created, ex.settings, ex._request)
    if remedy.config is not None:
        cfg2 = remedy.config(dict(cfg))
        return _explain_prefused(pre, tgt, cfg2, opt_level, ex.inserted_by, ex.settings, ex._request)
    if remedy.apply is None or "mod" not in ex._request:
        return None
    kw = remedy.apply(dict(ex._request))
    if kw is None:
        return None
    return explain(**kw)


def _with_start_pass(kw, name):
    """``kw`` (explain's arguments) with pass ``name`` added first in the ``start`` stage."""
    from collections.abc import Mapping

    import tvm

    from .registry import create_pass

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
           "tvm-ext pass EpilogueBeforeChannelSlice: the requantize epilogue moves in front of x86's output-channel "
           "slice, so the padded conv writes 8 bits instead of its int32 accumulators",
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


# -- the result --------------------------------------------------------------------------------
class Explanation:
    """Kernels, the tensors crossing them with a reason each, and remedies.

    Attributes
    ----------
    kernels : list of Kernel
    boundaries : list of Boundary
        One per kernel output read by other kernels (counted once, as in ``KernelReport``).
    verified : bool or None
        The FuseOps replay produced the same kernels as TVM's FuseOps (None: not checked).
    inserted_by : dict
        ``{op: {pass: count}}`` ops that passes before FuseOps created.
    remedies : list of RemedyResult
        Filled by :meth:`check_remedies` (measured); structural before that.
    """

    def __init__(self, kernels, boundaries, *, settings: dict, verified=None, verify_note: str = "",
                 inserted_by=None, kernel_report=None, request=None):
        self.kernels: list[Kernel] = list(kernels)
        self.boundaries: list[Boundary] = list(boundaries)
        self.settings = settings
        self.verified = verified
        self.verify_note = verify_note
        self.inserted_by = inserted_by or {}
        self.kernel_report = kernel_report
        self._request = request
        self._prefused = None  # (module FuseOps saw, target, config, opt_level), set by explain
        self._fusion_graph = None  # the FuseOps replay (FusionGraph), set by explain
        self.remedies: list[RemedyResult] = self._structural_remedies()

    # -- numbers ---------------------------------------------------------------------------
    @property
    def num_kernels(self) -> int:
        return len(self.kernels)

    @property
    def crossing_bytes(self) -> int:
        return sum(b.nbytes for b in self.boundaries)

    def by_reason(self) -> dict:
        """``{kind: (boundaries, bytes)}`` in ``REASONS`` order."""
        out: dict = {}
        for b in sorted(self.boundaries, key=lambda b: _REASON_ORDER.get(b.kind, 99)):
            n, nb = out.get(b.kind, (0, 0))
            out[b.kind] = (n + 1, nb + b.nbytes)
        return out

    def non_anchor_kernels_by_reason(self) -> dict:
        """Kernels without an anchor, by the reason their output was not fused onward."""
        out: dict = {}
        reason_of = {b.producer: b.kind for b in self.boundaries}
        for k in self.kernels:
            if k.anchor is None:
                kind = reason_of.get(k.index, "graph_output")
                out[kind] = out.get(kind, 0) + 1
        return out

    def _structural_remedies(self) -> list:
        res: dict = {}
        for b in self.boundaries:
            r = _REMEDY_BY_NAME[b.remedy]
            cur = res.get(r.name) or RemedyResult(r.name, r.kind, r.text, 0, 0)
            cur.boundaries += 1
            cur.nbytes += b.nbytes
            res[r.name] = cur
        order = {r.name: i for i, r in enumerate(REMEDIES)}
        return sorted(res.values(), key=lambda r: order[r.remedy])

    def check_remedies(self, names: Optional[Sequence[str]] = None) -> list:
        """Apply each remedy (or those in ``names``), explain again and measure what it removed.

        Returns the updated :attr:`remedies`: ``kernels_saved``, ``bytes_saved`` (crossing bytes)
        and ``remaining`` (boundaries the remedy still names afterwards) per remedy.
        """
        if self._request is None:
            raise ValueError("explain: this Explanation has no request to re-run (built by hand?)")
        for rr in self.remedies:
            if names is not None and rr.remedy not in names:
                continue
            remedy = _REMEDY_BY_NAME[rr.remedy]
            if remedy.kind == "none":
                continue
            try:
                after = _apply_remedy(self, remedy)
            except Exception as err:  # reported per remedy, the others still run
                rr.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                logger.warning("explain: applying %s failed: %s", rr.remedy, rr.error)
                continue
            if after is None:
                rr.error = "not applicable automatically to this pass list"
                continue
            rr.measured = True
            rr.kernels_saved = self.num_kernels - after.num_kernels
            rr.bytes_saved = self.crossing_bytes - after.crossing_bytes
            rr.remaining = sum(1 for b in after.boundaries if b.remedy == rr.remedy and remedy.matches(b))
        return self.remedies

    # -- output ----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """JSON-serialisable form."""
        return {
            "settings": self.settings,
            "verified": self.verified,
            "verify_note": self.verify_note,
            "num_kernels": self.num_kernels,
            "num_anchor_kernels": sum(1 for k in self.kernels if k.anchor),
            "num_boundaries": len(self.boundaries),
            "crossing_bytes": self.crossing_bytes,
            "by_reason": {k: {"boundaries": n, "bytes": nb, "meaning": _REASON_DOC.get(k, "")}
                          for k, (n, nb) in self.by_reason().items()},
            "remedies": [r.to_dict() for r in self.remedies],
            "inserted_by": self.inserted_by,
            "kernels": [k.to_dict() for k in self.kernels],
            "boundaries": [b.to_dict() for b in self.boundaries],
        }

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), indent=kw.pop("indent", 2), **kw)

    def summary(self) -> str:
        """The summary table: reason -> boundaries, MB; then remedies."""
        nk, na = self.num_kernels, sum(1 for k in self.kernels if k.anchor)
        check = {True: "yes", False: "NO (" + self.verify_note + ")", None: "not checked"}[self.verified]
        lines = [f"{nk} kernels ({na} with an anchor), {len(self.boundaries)} tensors / "
                 f"{self.crossing_bytes / 1e6:.2f} MB crossing kernels; FuseOps replay matches TVM's FuseOps: {check}",
                 ""]
        rows = [("reason", "boundaries", "MB", "meaning")]
        for kind, (n, nb) in self.by_reason().items():
            rows.append((kind, str(n), f"{nb / 1e6:.3f}", _REASON_DOC.get(kind, "")))
        lines += _table(rows)
        lines.append("")
        rows = [("what would remove it", "boundaries", "MB", "measured: kernels / MB saved, named left")]
        for r in self.remedies:
            if r.measured:
                m = f"{r.kernels_saved} / {r.bytes_saved / 1e6:.3f}, {r.remaining} left"
            elif r.error:
                m = "not applied: " + r.error
            elif r.kind == "none":
                m = "-"
            else:
                m = "structural estimate (check_remedies() / --check measures it)"
            rows.append((r.remedy, str(r.boundaries), f"{r.nbytes / 1e6:.3f}", m))
        lines += _table(rows)
        if self.inserted_by:
            lines.append("")
            lines.append("ops created before FuseOps: " + "; ".join(
                f"{op} by {', '.join(f'{p} (+{n})' for p, n in ps.items())}"
                for op, ps in sorted(self.inserted_by.items())))
        return "\n".join(lines)

    def table(self, max_rows: Optional[int] = None) -> str:
        """Text: the summary, then every boundary, then the kernels with what they read."""
        lines = [self.summary(), "", "boundaries (producer -> readers: tensor, reason):"]
        shown = self.boundaries if max_rows is None else self.boundaries[:max_rows]
        for b in shown:
            cons = ", ".join(f"#{c}" for c in b.consumers)
            out = f".{b.output}" if b.output is not None else ""
            lines.append(f"  #{b.producer}{out} {b.op} -> {cons}: {b.dtype}{list(b.shape)} {_kb(b.nbytes)}")
            lines.append(f"      {b.kind}: {b.detail}")
            lines.append(f"      rule: {b.rule}; remedy: {b.remedy}")
        if max_rows is not None and len(self.boundaries) > max_rows:
            lines.append(f"  ... {len(self.boundaries) - max_rows} more (--all)")
        lines.append("")
        lines.append("kernels (inputs from other kernels, with reasons):")
        incoming: dict = {}
        for b in self.boundaries:
            for c in b.consumers:
                incoming.setdefault(c, []).append(b)
        shown_k = self.kernels if max_rows is None else self.kernels[:max_rows]
        for k in shown_k:
            name = k.title
            anchor = f" anchor {k.anchor}" if k.anchor else ""
            lines.append(f"  #{k.index} {name}{anchor}: {' '.join(k.ops)}")
            for b in incoming.get(k.index, []):
                lines.append(f"      <- #{b.producer} {b.dtype}{list(b.shape)} [{b.kind}]")
        if max_rows is not None and len(self.kernels) > max_rows:
            lines.append(f"  ... {len(self.kernels) - max_rows} more kernels (--all)")
        return "\n".join(lines)

    def to_html(self, title: str = "tvm-ext explain") -> str:
        """One self-contained HTML page: the kernel graph (SVG), coloured by reason, and tables."""
        from ._explain_html import render

        return render(self, title)

    def __repr__(self) -> str:
        return (f"Explanation({self.num_kernels} kernels, {len(self.boundaries)} boundaries, "
                f"{self.crossing_bytes / 1e6:.2f} MB, verified={self.verified})")


def _kb(n: int) -> str:
    return f"{n / 1e3:.1f} KB" if n < 1e6 else f"{n / 1e6:.2f} MB"


def _table(rows) -> list:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join(r[i].ljust(widths[i]) for i in range(len(widths))) + "  " + r[-1] for r in rows]


def summary_dict(ex: "Explanation") -> dict:
    """JSON-able summary: kernels, non-anchor kernels by reason, boundaries and bytes by reason."""
    return {
        "num_kernels": ex.num_kernels,
        "verified": ex.verified,
        "non_anchor_by_reason": ex.non_anchor_kernels_by_reason(),
        "by_reason": {k: {"boundaries": n, "bytes": nb} for k, (n, nb) in ex.by_reason().items()},
    }


def summary_markdown(explanations: dict) -> str:
    """Markdown table of non-anchor kernels and crossing bytes by reason, one row per variant.

    Parameters
    ----------
    explanations : dict of str to Explanation or to :func:`summary_dict` output
        Variant name -> explanation (e.g. the benchmark's variants).
    """
    lines = ["| variant | kernels | non-anchor kernels by reason | crossing MB by reason |", "|---|---|---|---|"]
    for name, ex in explanations.items():
        d = summary_dict(ex) if isinstance(ex, Explanation) else ex
        na = d["non_anchor_by_reason"]
        na_txt = ", ".join(f"{k} {v}"
                           for k, v in sorted(na.items(), key=lambda kv: _REASON_ORDER.get(kv[0], 99))) or "none"
        br = d["by_reason"]
        mb = ", ".join(f"{k} {v['bytes'] / 1e6:.2f}"
                       for k, v in sorted(br.items(), key=lambda kv: _REASON_ORDER.get(kv[0], 99))) or "none"
        lines.append(f"| {name} | {d['num_kernels']} | {na_txt} | {mb} |")
    return "\n".join(lines) + "\n"


class FuseOpsInput:
    """PassInstrument factory capturing the module FuseOps receives inside any ``relay.build``.

    ``cap = FuseOpsInput(); PassContext(instruments=[cap.make()])`` around ``relay.build`` (or
    ``tvm_ext.build(..., instruments=[cap.make()])``), then ``explain_prefused(cap.module, target)``.
    """

    def __init__(self):
        self.module = None

    def make(self):
        import tvm

        cap = self

        depth = [0]  # PassContexts entered with this instrument: >1 is a nested compilation

        @tvm.instrument.pass_instrument
        class _Capture:  # pylint: disable=too-few-public-methods
            def enter_pass_ctx(self):
                depth[0] += 1

            def exit_pass_ctx(self):
                depth[0] -= 1

            def run_before_pass(self, mod, info):
                # not the FuseOps of a nested build (QNN legalization's lookup-table VM build)
                if info.name == "FuseOps" and cap.module is None and depth[0] <= 1:
                    cap.module = _copy(mod)

        return _Capture()


def explain_prefused(mod, target=None, opt_level: int = 3, config: Optional[dict] = None,
                     mod_name: str = "default") -> "Explanation":
    """Explain a module exactly as FuseOps receives it (e.g. captured by :class:`FuseOpsInput`).

    No pass runs first, so ops created earlier are not attributed and remedies that re-run the
    pipeline are not applied; pass remedies and the max_depth config still are. Kernels are named
    as ``relay.build(..., mod_name=mod_name)`` names them. Control flow and closures as in
    :func:`explain`.
    """
    import tvm

    from ..x86.target import build_target

    tgt = build_target(target) if not isinstance(target, tvm.target.Target) else target
    cfg = dict(config or {})
    settings = {"target": str(tgt), "opt_level": opt_level, "at": "FuseOps input", "passes": [],
                "disabled_pass": [], "config": {k: str(v) for k, v in cfg.items()}, "mod_name": mod_name}
    return _explain_prefused(_copy(mod), tgt, cfg, opt_level, {}, settings, {"tuned": False, "mod_name": mod_name})


# -- the pipeline up to FuseOps ------------------------------------------------------------------
class _OpCounter:
    """PassInstrument: op counts after each pass until FuseOps, to attribute created ops to passes."""

    def __init__(self):
        self.created: dict = {}
        self.stopped = False
        self._last = None

    @staticmethod
    def counts(mod) -> dict:
        import tvm
        from tvm import relay

        c: dict = {}

        def visit(e):
            if isinstance(e, relay.Call) and isinstance(e.op, tvm.ir.Op):
                c[e.op.name] = c.get(e.op.name, 0) + 1

        for gv in mod.get_global_vars():
            f = mod[gv]
            if isinstance(f, relay.Function):
                relay.analysis.post_order_visit(f, visit)
        return c

    def make(self):
        import tvm

        rec = self

        depth = [0]  # PassContexts entered with this instrument: >1 is a nested compilation

        @tvm.instrument.pass_instrument
        class _Count:  # pylint: disable=too-few-public-methods
            def enter_pass_ctx(self):
                depth[0] += 1

            def exit_pass_ctx(self):
                depth[0] -= 1

            def run_before_pass(self, mod, info):
                if depth[0] > 1:  # a nested build (QNN legalization's lookup table): not the pipeline
                    return
                if info.name == "FuseOps":
                    rec.stopped = True
                if rec.stopped or rec._last is not None:
                    return
                rec._last = rec.counts(mod)

            def run_after_pass(self, mod, info):
                if (depth[0] > 1 or rec.stopped or info.name in ("sequential", "InferType")
                        or info.name.startswith("tvm_ext.") or info.name == "tvm_ext.user_passes"):
                    return
                now = rec.counts(mod)
                for op, n in now.items():
                    d = n - rec._last.get(op, 0)
                    if d > 0:
                        rec.created.setdefault(op, {})
                        rec.created[op][info.name] = rec.created[op].get(info.name, 0) + d
                rec._last = now

        return _Count()


def _prefuse_module(mod, target, params, passes, at, opt_level, config, disabled_pass, instruments, allow_vnni,
                    kernels, tuned):
    """The module relay.build hands to FuseOps, built as tvm_ext.build builds it."""
    import tvm

    from . import build as b
    from ..x86.target import build_target

    stages = b._stage_passes(passes, at)
    mod = b.copy_module(b._as_module(mod))
    tgt = build_target(target, allow_vnni)
    if tgt.kind.name == "llvm" and tgt.host is None:
        tgt = tvm.target.Target(tgt, host=tgt)
    kernels, schedules = b.kernel_contexts(tgt, mod, *b.kernel_settings(passes, kernels, tuned))
    cur_config, cur_disabled, cur_instr = b._current_ctx_settings()
    cfg = {**cur_config, **(config or {})}
    disabled = list(dict.fromkeys([*cur_disabled, *disabled_pass]))
    instr = [*cur_instr, *instruments]
    with kernels, schedules:
        mod = b._bind_params(mod, params)
        if stages["start"]:
            mod = b._run_user_passes(mod, stages["start"], tgt, opt_level, cfg, disabled, instr)
        mod, _ = b._run_prefix(mod, tgt, opt_level, cfg, disabled, instr)
        if stages["before_fuse"]:
            mod = b._run_user_passes(mod, stages["before_fuse"], tgt, opt_level, cfg, disabled, instr)
    return mod, tgt, cfg


def _tvm_fused_functions(mod, tgt, opt_level, cfg) -> list:
    """The Primitive functions TVM's FuseOps makes of ``mod``'s main, one per call, in the order
    LowerTE lowers (and names) them: post-order of the calls."""
    import tvm
    from tvm import relay

    from ._fusion_sim import is_primitive_function

    with tgt, tvm.transform.PassContext(opt_level=opt_level, config=cfg):
        fused = relay.transform.FuseOps()(relay.transform.InferType()(mod))
    fns = []
    relay.analysis.post_order_visit(
        fused["main"], lambda e: fns.append(e.op) if isinstance(e, relay.Call) and is_primitive_function(e.op)
        and int(e.op.attrs["Primitive"]) == 1 else None)
    return fns


# -- kernel names, as TVM's TE compiler gives them ---------------------------------------------------
# TVM 0.19: LowerToTECompute (src/relay/backend/te_compiler_cache.cc) names a Primitive function
# "fused" + "_<op>" per op call in post-order, truncated past kMaxFuncNameLength; TECompiler's
# GlobalVarSupply (src/ir/name_supply.cc, prefix "tvmgen_<mod_name>" from relay.build's
# mangle_module_name) prefixes it, turns '.' into '_' and appends "_1", "_2", ... to a name taken by
# another kernel; structurally equal functions share one lowered kernel (the CCacheKey cache).
_MAX_FUNC_NAME = 80  # kMaxFuncNameLength
_U64 = (1 << 64) - 1


def _std_hash(text: str) -> int:
    """libstdc++'s ``std::hash<std::string>`` on 64-bit (``_Hash_bytes``, seed 0xc70f6907), which TVM
    appends to a truncated kernel name."""
    data = text.encode()
    mul = (0xC6A4A793 << 32) + 0x5BD1E995

    def shift_mix(v):
        return v ^ (v >> 47)

    h = (0xC70F6907 ^ (len(data) * mul)) & _U64
    aligned = len(data) & ~7
    for i in range(0, aligned, 8):
        h = ((h ^ (shift_mix(int.from_bytes(data[i:i + 8], "little") * mul & _U64) * mul & _U64)) * mul) & _U64
    if len(data) & 7:
        h = ((h ^ int.from_bytes(data[aligned:], "little")) * mul) & _U64
    return shift_mix(shift_mix(h) * mul & _U64)


def _candidate_name(ops) -> str:
    """LowerToTECompute's ``candidate_name_`` for a function calling ``ops`` (post-order)."""
    name = "_".join(["fused", *ops])
    if len(name) > _MAX_FUNC_NAME:
        name = f"{name[:_MAX_FUNC_NAME]}_{_std_hash(name):x}_"
    return name


class _NameSupply:
    """TVM's ``NameSupply::FreshName`` with ``add_prefix`` and ``add_underscore``."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.taken: dict = {}

    def fresh(self, name: str) -> str:
        base = (f"{self.prefix}_{name}" if self.prefix else name).replace(".", "_")
        if base not in self.taken:
            self.taken[base] = 0
            return base
        new = base
        while new in self.taken:
            self.taken[base] += 1
            new = f"{base}_{self.taken[base]}"
        self.taken[new] = 0
        return new


def _tvm_kernel_names(fns, mod_name: str = "default") -> list:
    """``[(function name, graph executor name)]`` for ``fns`` (:func:`_tvm_fused_functions`), as
    ``relay.build(..., mod_name=mod_name)`` names them."""
    import tvm

    supply = _NameSupply(f"tvmgen_{mod_name}" if mod_name else "tvmgen")
    cache: dict = {}  # structural hash -> [(function, name)]
    out = []
    for fn in fns:
        bucket = cache.setdefault(tvm.ir.structural_hash(fn), [])
        name = next((n for f, n in bucket if tvm.ir.structural_equal(f, fn)), None)
        if name is None:
            name = supply.fresh(_candidate_name(_fn_ops(fn)))
            bucket.append((fn, name))
        # GraphExecutorCodegen: a reshape-only kernel aliases its input and becomes "__nop"
        reshape = "relay.reshape_only" in fn.attrs and int(fn.attrs["relay.reshape_only"]) == 1
        out.append((name, "__nop" if reshape and len(fn.params) == 1 else name))
    return out


def _name_kernels(kernels, fns, names) -> tuple:
    """Give each replay kernel the name of its TVM kernel: the first unnamed one with the same ops
    and outputs, in lowering order. Returns (kernels, number left without a TVM kernel)."""
    pool: dict = {}
    for fn, nm in zip(fns, names):
        ret = fn.ret_type if fn.ret_type is not None else fn.body.checked_type
        key = (tuple(sorted(_fn_ops(fn))), _Analysis._outputs(ret))
        pool.setdefault(key, []).append(nm)
    out, unmatched = [], 0
    for k in kernels:
        got = pool.get((tuple(sorted(k.ops)), k.outputs))
        if got:
            name, func_name = got.pop(0)
            out.append(replace(k, name=name, func_name=func_name))
        else:
            out.append(replace(k, name=None, func_name=None))
            unmatched += 1
    return out, unmatched


# -- kernels and boundaries from the replay -------------------------------------------------------
def _dtype_bytes(dtype: str) -> int:
    from .report import dtype_bytes

    return dtype_bytes(dtype)


def _tensor_info(ty):
    from tvm import relay, tir

    if isinstance(ty, relay.TensorType):
        shape = tuple(int(d) if isinstance(d, tir.IntImm) else -1 for d in ty.shape)
        nbytes = int(math.prod(max(d, 0) for d in shape) * _dtype_bytes(ty.dtype)) if -1 not in shape else 0
        return shape, str(ty.dtype), nbytes
    return (), "tuple", 0


class _Analysis:
    def __init__(self, fg: FusionGraph, inserted_by: dict):
        import tvm

        self.fg = fg
        self.inserted = inserted_by
        nodes = fg.nodes
        self.root = [fg.find_root(i) for i in range(len(nodes))]
        members: dict = {}
        for i, _n in enumerate(nodes):
            members.setdefault(self.root[i], []).append(i)
        self.members = members
        # a kernel: a group of the function itself whose root is an op call (not a non-computational
        # op) or a TupleGetItem of a tuple in the same group, as FuseMutator makes Primitive functions
        self.kernel_of_group: dict = {}
        kernels = []
        for r in sorted(members):
            n = nodes[r]
            if not n.outer:
                continue
            if n.kind == "call":
                if n.op and not n.op.startswith("fn:"):
                    op = tvm.ir.Op.get(n.op)
                    if n.op == "annotation.stop_fusion" or (_bool_attr(op, "TNonComputational")
                                                            and not _bool_attr(op, "FTVMQnnCanonicalize")):
                        n.noncomputational = True
                        continue
            elif n.kind == "getitem":
                src = self.fg.index_of.get(n.expr.tuple_value)
                if src is None or self.root[src] != r:
                    continue
            else:
                continue
            self.kernel_of_group[r] = len(kernels)
            kernels.append(r)
        self.kernel_roots = kernels
        from tvm import relay

        self.let_values = {}
        for n in nodes:
            if isinstance(n.expr, relay.Let) and n.expr.value in fg.index_of:
                self.let_values[n.expr.var] = n.expr.value

    def kernel_list(self) -> list:
        out = []
        for ki, r in enumerate(self.kernel_roots):
            ops = []
            for i in sorted(self.members[r]):
                n = self.fg.nodes[i]
                if n.kind == "call" and n.op:
                    ops += _fn_ops(n.expr.op) if n.op.startswith("fn:") else [n.op]
            best, best_pat = None, -1
            for o in ops:
                pat = _pattern_of(o)
                if K_COMM_REDUCE <= pat < K_TUPLE and pat > best_pat:
                    best, best_pat = o, pat
            ty = self.fg.nodes[r].expr.checked_type
            outs = self._outputs(ty)
            reshape_only = all(_bool_attr_name(o, "TReshapeOp") for o in ops) and bool(ops)
            pat = max(self.fg.g_pattern[r], max((self.fg.nodes[i].pattern for i in self.members[r]
                                                  if self.fg.nodes[i].kind == "call"), default=0))
            out.append(Kernel(ki, None, tuple(ops), best, PATTERN_NAMES.get(pat, str(pat)), outs,
                              reshape_only))
        return out

    @staticmethod
    def _outputs(ty):
        from tvm import relay

        if isinstance(ty, relay.TupleType):
            return tuple((_tensor_info(f)[0], _tensor_info(f)[1]) for f in ty.fields)
        s, d, _ = _tensor_info(ty)
        return ((s, d),)

    def resolve(self, idx: Optional[int]) -> list:
        """[(kernel index, output field or None)] that value ``idx`` comes from.

        Followed: Let-bound variables to their values, a Let to its body, tuples to their fields,
        non-computational ops to their input. Not followed (``[]``): parameters (of the function
        or of a closure), constants, and what a closure call or an ``If``/``Match`` returns.
        """
        from tvm import relay

        if idx is None:  # not a node of the graph (a function literal, a global)
            return []
        n = self.fg.nodes[idx]
        r = self.root[idx]
        if r in self.kernel_of_group:
            return [(self.kernel_of_group[r], None)]
        index_of = self.fg.index_of
        if n.kind == "var" and n.expr in self.let_values:  # a Let-bound value: its producer
            return self.resolve(index_of.get(self.let_values[n.expr]))
        if n.kind in ("var", "const", "closure_call"):
            return []
        if n.kind == "tuple":
            out = []
            for f in n.expr.fields:
                out += self.resolve(index_of.get(f))
            return out
        if n.kind == "getitem":
            tup = n.expr.tuple_value
            while isinstance(tup, relay.Var) and tup in self.let_values:  # a Let-bound tuple
                tup = self.let_values[tup]
            if isinstance(tup, relay.Tuple):  # the field itself
                fields = list(tup.fields)
                return self.resolve(index_of.get(fields[n.expr.index])) if n.expr.index < len(fields) else []
            src = self.resolve(index_of.get(tup))
            return [(k, n.expr.index) for k, _ in src[:1]] if len(src) == 1 else src
        if n.kind == "call" and n.noncomputational and len(n.expr.args) >= 1:
            return self.resolve(index_of.get(n.expr.args[0]))
        if isinstance(n.expr, relay.Let):  # its value is its body's (the innermost body of a chain)
            body = n.expr.body
            while isinstance(body, relay.Let):
                body = body.body
            return self.resolve(index_of.get(body))
        return []

    def boundaries(self) -> list:
        """Crossing values -> {consumer kernels}, and the producing root node."""
        edges: dict = {}
        for ki, r in enumerate(self.kernel_roots):
            for i in self.members[r]:
                n = self.fg.nodes[i]
                for child in _operands(n.expr):
                    ci = self.fg.index_of.get(child)
                    if ci is None or self.root[ci] == r:
                        continue
                    for src in self.resolve(ci):
                        if src[0] == ki:
                            continue
                        ty = self.fg.nodes[self.kernel_roots[src[0]]].expr.checked_type
                        if src[1] is None and hasattr(ty, "fields"):  # a tuple read whole: every field crosses
                            for f in range(len(ty.fields)):
                                edges.setdefault((src[0], f), set()).add(ki)
                        else:
                            edges.setdefault(src, set()).add(ki)
        return edges

    # -- reasons ---------------------------------------------------------------------------
    def reason(self, r: int) -> dict:
        out = self._reason(r)
        d = self.fg.final_decision(r)
        if d is not None and d.count is not None and d.code != "max_depth":
            out["detail"] += (f" (the fused group would also exceed relay.FuseOps.max_depth={self.fg.max_depth}: "
                              f"{d.count} ops)")
        return out

    def _reason(self, r: int) -> dict:
        fg = self.fg
        n = fg.nodes[r]
        d = fg.final_decision(r)
        out = {"rule": "", "join": None, "blocker": None, "entry": None}
        readers = self.direct_readers(r)
        out["readers"] = tuple(fg.nodes[x].op or fg.nodes[x].kind for x in readers)
        closure_readers = [x for x in readers if fg.nodes[x].kind == "closure_call"]
        gp = PATTERN_NAMES.get(fg.g_pattern[r], "?")
        anchor = self.group_anchor(r)
        what = f"{n.op}" + (f" (kernel anchor {anchor})" if anchor and anchor != n.op else "")
        if d is None:
            out.update(kind="other", detail=f"{what}: no FuseOps decision recorded", rule="-")
            return out
        phase = f"phase {d.phase}"
        dom = d.dom
        if dom is not None:
            out["join"] = self.describe(dom)
        if d.code == "opt_level_0":
            out.update(kind="fusion_disabled", detail="FuseOps ran at opt_level 0: every op is its own kernel",
                       rule="GraphPartitioner::Partition: opt_level 0")
            return out
        if d.code == "opaque":
            if n.op and n.op.startswith("fn:"):
                out.update(kind="function_boundary", entry=n.op[3:],
                           detail=f"the value is produced by the function '{n.op[3:]}' (a Primitive/Composite "
                                  "group FuseOps does not enter)", rule=f"{phase}: group pattern kOpaque")
            elif n.pattern == K_OPAQUE and n.kind == "call" and _is_dynamic_type(n.expr.checked_type):
                out.update(kind="dynamic_shape", detail=f"{n.op} has a dynamic output shape and is data dependent",
                           rule=f"{phase}: kOpaque (IsDynamic && IsDataDependent)")
            else:
                out.update(kind="opaque_op", detail=f"{n.op} has TOpPattern kOpaque",
                           rule=f"{phase}: group pattern kOpaque")
            return out
        if closure_readers:  # a closure call reads it: kOpaque, the value cannot fuse onward
            c = fg.nodes[closure_readers[0]]
            out.update(kind="closure_call", blocker=self.describe(closure_readers[0]),
                       detail=f"{what} is passed to the {node_label(c)} (not an op): FuseOps makes the call "
                              "kOpaque and no kernel",
                       rule=f"{phase}: a reader is a call of a non-op (kOpaque)")
            return out
        if d.code == "no_dom":
            if n.extern:
                detail = (f"{what} is a graph output (or a Let/If/Match operand: FuseOps does not fuse through "
                          "them), so it has no post-dominator")
            else:
                detail = f"{what} has {len(readers)} readers whose paths never join again"
            out.update(kind="no_post_dominator", detail=detail, rule=f"{phase}: post-dominator is null")
            return out
        if d.code == "max_depth":
            out.update(kind="max_depth", detail=f"fusing {what} into {self.describe(dom)} would make a group of "
                                                f"{d.count} ops > relay.FuseOps.max_depth={fg.max_depth}",
                       rule=f"{phase}: CountFusedNodesWithNewChild > max_fuse_depth")
            return out
        if d.code == "dom_tuple" and len(readers) > 1:
            blocker = self.max_edge(r, dom)
            out.update(kind="multiple_readers", blocker=self.describe(blocker),
                       detail=f"{what} has {len(readers)} readers ({', '.join(sorted(set(out['readers'])))}); their "
                              f"paths join only at the tuple feeding {self.tuple_reader(dom)}, and FuseOps does not "
                              f"fuse into a tuple (the paths also pass {self.describe(blocker)})",
                       rule=f"{phase}: post-dominator is a tuple")
            return out
        if d.code in ("dom_tuple", "p2_tuple_root"):
            out.update(kind="tuple", detail=f"{what} goes into the tuple of {self.tuple_reader(dom)}; "
                                            "FuseOps does not fuse into a tuple unless the producer is injective "
                                            "and the tuple joins an injective group", rule=f"{phase}: {d.code}")
            return out
        if d.code == "reduce":
            out.update(kind="after_reduction", detail=f"{what} is a kCommReduce group; FuseOps fuses producers into a "
                                                      f"reduction, never a reduction into {self.describe(dom)}",
                       rule=f"{phase}: group pattern kCommReduce: no action")
            return out
        # dom_pattern / path: find what broke the rule on the way to the post-dominator
        blocker = d.failed_at if d.code == "path" else self.max_edge(r, dom)
        bdesc = self.describe(blocker) if blocker is not None else None
        out["blocker"] = bdesc
        bnode = fg.nodes[blocker] if blocker is not None else None
        rule = (f"{phase}: {gp} group, post-dominator {self.describe(dom)}, "
                + (f"dom pattern {PATTERN_NAMES.get(d.dom_pattern)}" if d.code == "dom_pattern"
                   else f"CheckPath failed at {bdesc}"))
        out["rule"] = rule
        # barriers on a direct reader take precedence
        if bnode is not None and blocker in readers:
            if bnode.op == "annotation.stop_fusion":
                by = self.inserted.get("annotation.stop_fusion")
                note = f"; placed by {', '.join(by)}" if by else ""
                out.update(kind="stop_fusion",
                           detail=f"{what} is read by annotation.stop_fusion (a fusion barrier){note}")
                return out
            if bnode.op and bnode.op.startswith("fn:"):
                out.update(kind="function_boundary", entry=bnode.op[3:],
                           detail=f"{what} is read by the function '{bnode.op[3:]}' (a Primitive/Composite group "
                                  "FuseOps does not enter)")
                return out
            if bnode.pattern == K_OPAQUE and bnode.kind == "call":
                kind = "dynamic_shape" if _is_dynamic_type(bnode.expr.checked_type) else "opaque_op"
                out.update(kind=kind, detail=f"{what} is read by {bnode.op} (kOpaque)")
                return out
        if len(readers) > 1:
            if blocker == dom:
                why = (f"the join itself is in the kernel of {self.group_anchor(dom)}" if self.group_anchor(dom)
                       else f"the join breaks the {PATTERN_NAMES.get(fg.g_pattern[r])} rule")
            else:
                why = f"the path passes {bdesc}"
            out.update(kind="multiple_readers",
                       detail=f"{what} has {len(readers)} readers ({', '.join(sorted(set(out['readers'])))}); its "
                              f"post-dominator is the join {self.describe(dom)} and {why}")
            return out
        if bnode is not None and bnode.op == "annotation.stop_fusion":
            out.update(kind="stop_fusion", detail=f"{what} reaches annotation.stop_fusion")
            return out
        g_has_anchor = fg.g_pattern[r] in (K_COMM_REDUCE, K_OUT_EWISE_FUSABLE) or anchor is not None
        bpat = fg.g_pattern[fg.find_root(blocker)] if blocker is not None else None
        reader_anchor = self.group_anchor(blocker) if blocker is not None else None
        if g_has_anchor and bnode is not None and (bnode.pattern in (K_COMM_REDUCE, K_OUT_EWISE_FUSABLE)
                                                   or reader_anchor is not None):
            out.update(kind="two_anchors", detail=f"{what} meets {bdesc}"
                                                  + (f" (kernel anchor {reader_anchor})"
                                                     if reader_anchor and reader_anchor != bnode.op else "")
                                                  + f": two anchors ({gp} and "
                                                  f"{PATTERN_NAMES.get(max(bnode.pattern, bpat or 0))})")
            return out
        if g_has_anchor:
            out.update(kind="injective_after_anchor",
                       detail=f"{bdesc} ({PATTERN_NAMES.get(bnode.pattern) if bnode else '?'}) reads the "
                              f"{anchor or n.op} kernel; only kElemWise epilogues fuse into kOutEWiseFusable")
            return out
        if bnode is not None and (bnode.pattern in (K_COMM_REDUCE, K_OUT_EWISE_FUSABLE) or reader_anchor is not None):
            holder = f" (in the kernel of {reader_anchor})" if reader_anchor and reader_anchor != bnode.op else ""
            out.update(kind="prologue_into_anchor",
                       detail=f"{what} ({PATTERN_NAMES.get(n.pattern)}) feeds {bdesc}{holder}; "
                              + ("injective ops fuse only into injective groups" if n.pattern == K_INJECTIVE
                                 else "FuseOps does not fuse a prologue into an anchor"))
            return out
        out.update(kind="other", detail=f"{what}: {d.code} toward {self.describe(dom)} (blocker {bdesc})")
        return out

    def tuple_reader(self, t: int) -> str:
        outs = [o for o, _ in self.fg.nodes[t].outputs]
        if outs:
            return self.describe(outs[0])
        return "the graph output" if self.fg.nodes[t].expr.same_as(self.fg.func.body) else "a Let/If/Match operand"

    def reader_casts(self, r: int) -> tuple:
        out = []
        for x in self.direct_readers(r):
            n = self.fg.nodes[x]
            if n.op == "cast":
                out.append(str(n.expr.attrs.dtype))
        return tuple(out)

    def pad_value(self, r: int):
        from tvm import relay

        n = self.fg.nodes[r]
        if n.op != "nn.pad" or len(n.expr.args) < 2 or not isinstance(n.expr.args[1], relay.Constant):
            return None
        return float(n.expr.args[1].data.numpy())

    def pads_channels(self, r: int) -> bool:
        """Does the kernel rooted at ``r`` pad the channel axis (axis 1 of a 4-d ``nn.pad``) of a tensor
        that a convolution's kernel wrote (what ``PadChannelsAtProducer`` removes)?"""
        from tvm import relay

        from .._attrs import int_list

        for m in self.members[r]:
            n = self.fg.nodes[m]
            if n.op != "nn.pad":
                continue
            width = [int_list(w) for w in n.expr.attrs.pad_width]
            if len(width) != 4 or width[1] in (None, [0, 0]):
                continue
            src = n.expr.args[0]  # walk up inside this kernel to the tensor it reads
            while isinstance(src, relay.Call) and src in self.fg.index_of and self.root[self.fg.index_of[src]] == r:
                src = src.args[0]
            i = self.fg.index_of.get(src)
            if i is not None and any("conv2d" in (self.fg.nodes[k].op or "") for k in self.members[self.root[i]]):
                return True
        return False

    def direct_readers(self, r: int) -> list:
        """Distinct graph nodes reading ``r`` (through tuples/no-op nodes they are themselves)."""
        return sorted({o for o, _ in self.fg.nodes[r].outputs})

    def group_anchor(self, i: Optional[int]):
        if i is None:
            return None
        root = self.root[i]
        best, best_pat = None, -1
        for m in self.members[root]:
            n = self.fg.nodes[m]
            if n.kind == "call" and n.pattern in (K_COMM_REDUCE, K_OUT_EWISE_FUSABLE) and n.pattern > best_pat:
                best, best_pat = node_label(n), n.pattern
        return best

    def max_edge(self, r: int, dom: int) -> Optional[int]:
        """The node on the paths r -> dom entered by the highest-pattern edge (the rule breaker)."""
        best, best_pat = None, -1
        seen = set()
        stack = [r]
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            for o, ep in self.fg.nodes[i].outputs:
                if o > dom:
                    continue
                pat = max(ep, self.fg.g_pattern[self.root[o]] if o != dom else ep)
                if pat > best_pat:
                    best, best_pat = o, pat
                if o != dom:
                    stack.append(o)
        return best

    def describe(self, i: Optional[int]) -> str:
        if i is None:
            return "(none)"
        n = self.fg.nodes[i]
        label = node_label(n)
        r = self.root[i]
        if r in self.kernel_of_group:
            return f"{label} in kernel #{self.kernel_of_group[r]}"
        return label


def _fn_ops(fn) -> list:
    """Op names called inside a function literal, in post-order ([] for any other callee)."""
    import tvm
    from tvm import relay

    ops = []
    if not isinstance(fn, relay.Function):
        return ops
    relay.analysis.post_order_visit(fn.body, lambda x: ops.append(x.op.name) if isinstance(x, relay.Call)
                                    and isinstance(x.op, tvm.ir.Op) else None)
    return ops


def _copy(mod):
    from .build import copy_module

    return copy_module(mod)


def _pattern_of(op_name: str) -> int:
    from .report import op_pattern

    return K_OPAQUE if op_name.startswith("fn:") else op_pattern(op_name)


def _operands(e) -> list:
    """The dataflow operands of a Call/Tuple/TupleGetItem (``_fusion_sim._children``); none of other nodes."""
    from tvm import relay

    from ._fusion_sim import _children

    return _children(e) if isinstance(e, (relay.Call, relay.Tuple, relay.TupleGetItem)) else []


def _is_dynamic_type(ty) -> bool:
    from ._fusion_sim import _is_dynamic

    return _is_dynamic(ty)


def _bool_attr(op, name) -> bool:
    try:
        v = op.get_attr(name)
    except Exception:
        return False
    if v is None:
        return False
    try:
        return bool(v)
    except Exception:
        return True


def _bool_attr_name(op_name: str, name: str) -> bool:
    import tvm

    try:
        return _bool_attr(tvm.ir.Op.get(op_name), name)
    except Exception:
        return False


def _check_report_names(kernels, report) -> str:
    """'' when the kernels' graph executor names are the built module's, name for name; else what differs."""
    from collections import Counter

    mine, built = Counter(k.func_name for k in kernels), Counter(k.func_name for k in report.kernels)
    if mine == built:
        return ""
    missing, extra = sorted((built - mine).elements()), sorted(str(n) for n in (mine - built).elements())
    return (f"graph executor has {report.num_kernels} kernels, replay {len(kernels)}; names only built: "
            f"{', '.join(missing[:3]) or '-'}; only predicted: {', '.join(extra[:3]) or '-'}")


def _closure_calls(fg) -> list:
    """Labels of the calls of closures (or other non-op callees) in the explained function."""
    from ._fusion_sim import node_label

    return [node_label(n) for n in fg.nodes if n.kind == "closure_call"]


def explain(
    mod,
    target=None,
    params=None,
    passes=(),
    at: str = "before_fuse",
    opt_level: int = 3,
    *,
    config: Optional[dict] = None,
    disabled_pass: Sequence[str] = (),
    compile: bool = False,  # noqa: A002  (the natural name)
    check_remedies: bool = False,
    allow_vnni: Optional[bool] = None,
    kernels: Optional[bool] = None,
    tuned: Optional[bool] = None,
    mod_name: str = "default",
) -> Explanation:
    """Explain every kernel boundary FuseOps leaves in ``mod``, and what would remove it.

    Parameters
    ----------
    mod : tvm.IRModule or relay.Function
        The model (never modified).
    target, params, passes, at, opt_level, config, disabled_pass, allow_vnni, kernels, tuned, mod_name
        As for :func:`tvm_ext.build`: the explained graph is the one FuseOps sees in that build.
        ``config["relay.FuseOps.max_depth"]`` is honoured; kernels are named as that build names
        them (``tvmgen_<mod_name>_fused_...``, see :class:`Kernel`), without compiling.
    compile : bool
        Also build with :func:`tvm_ext.build`, attach its ``KernelReport`` and check the kernels'
        names against it (slower: compiles every kernel). A difference sets ``verified`` to False.
    check_remedies : bool
        Apply every applicable remedy and measure what it removes
        (:meth:`Explanation.check_remedies`).

    Returns
    -------
    Explanation

    Control flow and closures are explained as FuseOps handles them: kernels inside a closure's
    body or an ``If``/``Match`` branch are kernels; a ``Let``, ``If``, ``Match`` or reference
    node fuses nothing through it (a value read across one is a ``no_post_dominator``
    boundary); a call of a ``let``-bound closure, of a function an ``If`` returns, of a global
    function or of a constructor is no kernel and fuses nothing into it (``closure_call``).
    Values passed into a closure's parameters or returned by a closure call or an ``If`` are not
    followed across it: a kernel reading one has no boundary recorded for it.

    Raises
    ------
    TypeError, ValueError
        Bad module, passes or ``at`` (from the build stages, naming ``tvm_ext.build``).
    tvm_ext.core.tvm_bugs.UnsupportedByTVM
        A ``ValueError``: ``compile=True`` on a graph relay.build's graph executor cannot run, naming
        the construct: a call of a closure (``let``-bound, returned by an ``If``, ...) here, or
        ``If``/``Match``/references from :func:`tvm_ext.build`. ``compile=False`` explains them.
    """
    request = dict(mod=mod, target=target, params=params, passes=passes, at=at, opt_level=opt_level,
                   config=config, disabled_pass=list(disabled_pass), allow_vnni=allow_vnni, kernels=kernels,
                   tuned=tuned, mod_name=mod_name)
    counter = _OpCounter()
    logger.info("explain: running relay.build's stages up to FuseOps")
    pre, tgt, cfg = _prefuse_module(mod, target, params, passes, at, opt_level, config, disabled_pass,
                                    [counter.make()], allow_vnni, kernels, tuned)
    settings = {"target": str(tgt), "opt_level": opt_level, "at": at,
                "passes": _pass_names(passes), "disabled_pass": list(disabled_pass),
                "config": {k: str(v) for k, v in (config or {}).items()}, "mod_name": mod_name}
    ex = _explain_prefused(pre, tgt, cfg, opt_level, {op: dict(ps) for op, ps in counter.created.items()},
                           settings, request)
    if compile:
        from .build import build
        from .tvm_bugs import UnsupportedByTVM

        closures = _closure_calls(ex._fusion_graph)
        if closures:
            raise UnsupportedByTVM(f"explain(compile=True): main makes a {closures[0]}: relay.build's graph "
                                   "executor cannot run closures (explain with compile=False, or relay.vm)")
        factory = build(mod, target=target, params=params, passes=passes, at=at, opt_level=opt_level,
                        config=config, disabled_pass=disabled_pass, allow_vnni=allow_vnni, kernels=kernels,
                        tuned=tuned, mod_name=mod_name)
        report = factory.kernel_report
        ex.kernel_report = report
        note = _check_report_names(ex.kernels, report)
        if note:
            ex.verified = False
            ex.verify_note = (ex.verify_note + "; " if ex.verify_note else "") + note
    if check_remedies:
        ex.check_remedies()
    return ex


def _explain_prefused(pre, tgt, cfg, opt_level, created, settings, request) -> "Explanation":
    """Replay FuseOps on the module relay.build would fuse and explain its boundaries."""
    import tvm

    pre = tvm.relay.transform.InferType()(pre)
    max_depth = int(cfg.get("relay.FuseOps.max_depth", MAX_FUSED_OPS))
    logger.info("explain: replaying FuseOps")
    fg = FusionGraph(pre["main"], opt_level=opt_level, max_depth=max_depth)
    an = _Analysis(fg, created)
    kernels = an.kernel_list()

    # check the replay against TVM's FuseOps, and name the kernels as the build will
    mine = sorted(tuple(sorted(k.ops)) for k in kernels)
    try:  # on a copy: FuseOps may rewrite the module object it is given
        fns = _tvm_fused_functions(_copy(pre), tgt, opt_level, cfg)
        theirs = sorted(tuple(sorted(_fn_ops(f))) for f in fns)
        verified = mine == theirs
        note = "" if verified else f"replay {len(mine)} kernels, TVM {len(theirs)}; first difference: " + \
            next((f"{a} vs {b}" for a, b in zip(mine, theirs) if a != b), "count")
        kernels, unnamed = _name_kernels(kernels, fns, _tvm_kernel_names(fns, request.get("mod_name", "default")))
        if unnamed and verified:
            verified, note = False, f"{unnamed} kernels without a TVM kernel of the same ops and outputs"
    except Exception as err:  # the check must not hide the explanation
        verified, note = None, f"TVM FuseOps failed: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
    if verified is False:
        logger.warning("explain: FuseOps replay differs from TVM's FuseOps: %s", note)

    boundaries = []
    for (ki, field_), consumers in sorted(an.boundaries().items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        r = an.kernel_roots[ki]
        ty = fg.nodes[r].expr.checked_type
        if field_ is not None and hasattr(ty, "fields"):
            ty = ty.fields[field_]
        shape, dtype, nbytes = _tensor_info(ty)
        info = an.reason(r)
        # ops a pass created, among the producer and its readers (layout_transform, pad, cast, ...; not anchors)
        ops_involved = {fg.nodes[r].op, *info["readers"]}
        inserted = tuple((op, tuple(created[op])) for op in sorted(o for o in ops_involved if o)
                         if op in created and (_pattern_of(op) <= K_INJECTIVE or op == "annotation.stop_fusion"))
        b = Boundary(ki, tuple(sorted(consumers)), field_, fg.nodes[r].op or fg.nodes[r].kind, info["readers"],
                     dtype, shape, nbytes, info["kind"], info["detail"], info["rule"], info["join"],
                     info["blocker"], info["entry"], inserted, None, kernels[ki].ops,
                     an.reader_casts(r), an.pad_value(r), an.pads_channels(r))
        if inserted:
            b = replace(b, detail=b.detail + "; created by "
                        + ", ".join(f"{op}: {'/'.join(ps)}" for op, ps in inserted))
        remedy = next(rm for rm in REMEDIES if rm.matches(b))
        boundaries.append(replace(b, remedy=remedy.name))
    settings = {**settings, "max_depth": max_depth}
    ex = Explanation(kernels, boundaries, settings=settings, verified=verified, verify_note=note,
                     inserted_by=created, request=request)
    ex._prefused = (pre, tgt, cfg, opt_level)
    ex._fusion_graph = fg
    return ex


def _pass_names(passes):
    from collections.abc import Mapping

    import tvm

    if isinstance(passes, Mapping):
        names = getattr(passes, "pass_names", None)
        if callable(names):
            return names()
        return {k: [p.info.name for p in v] for k, v in passes.items()}
    if isinstance(passes, tvm.transform.Pass):
        return [passes.info.name]
    return [p.info.name for p in passes]
