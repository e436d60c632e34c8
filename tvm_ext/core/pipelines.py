"""Named pass pipelines for :func:`tvm_ext.build`.

A :class:`Pipeline` maps build stages to ``tvm.transform.Sequential`` objects:
``"start"`` runs on the bound module before relay.build's optimisation prefix (where QNN ops
still exist), ``"before_fuse"`` runs after the prefix, right before FuseOps. Pass it as
``tvm_ext.build(mod, target, params, passes=pipelines.int8())``.

Design note
-----------
Each stage of :func:`int8` is data: a :class:`Stage`, an ordered table of :class:`Step` records
(the pass's registered name and arguments, what it does, and why it stands where it stands).
Order is execution order. A step names the passes of its stage it must follow (``after``) or
precede (``before``); the stage checks them when it is built and raises ``ValueError`` on a
name it does not hold or an order that breaks them. The ONNX Runtime variant is the default
table with passes inserted next to a named neighbour (:data:`ONNXRUNTIME_INSERTIONS`) and
``QDQToInteger`` built with other arguments. :func:`int8`'s docstring and
``tvm-ext passes --pipeline int8`` are generated from the tables (:func:`listing`). The tables
import nothing from TVM: the passes are created when :func:`int8` builds a pipeline, and each
must register under its step's name. Every pipeline here, :func:`onnxruntime_numerics` included,
makes its passes by name through :mod:`tvm_ext.core.registry`: this module imports no pass module.
"""
from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, replace

__all__ = ["Pipeline", "Step", "Stage", "Insertion", "Chosen", "resolve", "FAMILIES", "int8", "int8_stages", "listing",
           "onnxruntime_numerics",
           "INT8", "INT8_ONNXRUNTIME", "ONNXRUNTIME_INSERTIONS", "NUMERICS", "ORT_REQUANTIZE",
           "EXACT_REQUANTIZE"]

#: ``numerics=`` choices of :func:`int8`: whose rounding the built model follows.
NUMERICS = ("tvm", "onnxruntime")

#: How ONNX Runtime (MLAS) requantizes: ``acc * float32 scale``, rounded to nearest (and
#: :func:`~tvm_ext.passes.RoundHalfToEven` makes TVM's nearest ties-to-even, as MLAS's).
#: TVM's default is ``rounding="UPWARD"``, and ``compute_dtype="int64"`` (fixed point) on
#: targets without SSE4.1 (plain ``llvm``), ``float32`` on the others.
ORT_REQUANTIZE = (("rounding", "TONEAREST"), ("compute_dtype", "float32"))

#: How a :class:`Pipeline` without ``requantize`` settings (``numerics="tvm"``) requantizes at every
#: target: TVM's integer lowering (int64 fixed point), which it picks by default only without SSE4.1
#: (plain ``llvm``), with each call's own rounding (the ONNX importer's ``TONEAREST`` for ``QGemm`` and
#: ``QLinearMatMul``; TVM's default ``UPWARD`` where the call leaves it unset). Its float32 lowering,
#: the default at SSE4.1 targets, rounds ``acc * scale`` in float32 and so rounds some values within
#: about 1e-5 of a half the wrong way (full-size QOperator ResNet-50: ``acc = 17057``, scale ratio
#: 6.2514846e-05 / 0.037414595, exactly 28.4999935, gives 29 in float32), and those steps reach the
#: logits.
EXACT_REQUANTIZE = (("compute_dtype", "int64"),)

#: Build stages of a :class:`Pipeline`, in the order :func:`tvm_ext.build` runs them.
STAGE_KEYS = ("start", "before_fuse")

#: Target families a :class:`Step` may be limited to (the back ends' ``family``, :mod:`tvm_ext.backend`).
FAMILIES = ("x86", "aarch64", "gpu", "generic")


@dataclass(frozen=True)
class Pipeline(Mapping):
    """Passes per build stage; behaves as ``{"start": Sequential, "before_fuse": Sequential}``."""

    name: str
    start: object
    before_fuse: object
    doc: str = ""
    #: ``relay.qnn.op.requantize_config`` settings :func:`tvm_ext.build` compiles under, as
    #: ``(key, value)`` pairs (empty: :data:`EXACT_REQUANTIZE`). QNN canonicalization reads them.
    requantize: tuple = ()
    #: The :class:`Stage` tables the pipeline was built from (empty for a pipeline not built
    #: from tables).
    stages: tuple = ()
    #: Turn the target family's kernel policy and tuned records on (``tvm_ext.build``'s ``kernels``).
    kernels: bool = True
    #: The family the steps were chosen for (:meth:`for_family`); empty: every step.
    family: str = ""

    def for_family(self, family: str) -> "Pipeline":
        """The pipeline with only the steps that apply to ``family`` (:attr:`Step.families`): what
        :func:`tvm_ext.build` runs at a target of that family. A pipeline not built from tables, or
        whose steps all apply, is returned as it is."""
        if family not in FAMILIES:
            raise ValueError(f"pipelines: unknown family {family!r}; expected one of {FAMILIES}")
        if not self.stages or self.family == family:
            return self
        kept = tuple(s.for_family(family) for s in self.stages)
        if kept == self.stages:
            return self
        start, before_fuse = kept
        return replace(self, start=_sequential(start.passes(), f"{self.name}.start"),
                       before_fuse=_sequential(before_fuse.passes(), f"{self.name}.before_fuse"),
                       stages=kept, family=family)

    def __getitem__(self, key):
        if key == "start":
            return [self.start]
        if key == "before_fuse":
            return [self.before_fuse]
        raise KeyError(key)

    def __iter__(self):
        return iter(STAGE_KEYS)

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


@dataclass(frozen=True)
class Chosen:
    """What :func:`resolve` makes of ``tvm_ext.build``'s ``passes``: passes per stage, whether the
    family's kernel policy applies, and the requantize settings."""

    stages: dict
    kernels: bool
    requantize: tuple


def resolve(passes, at: str, family: str) -> Chosen:
    """``passes`` as :func:`tvm_ext.build` runs them at a target of ``family``.

    A :class:`Pipeline` is narrowed to the family (:meth:`Pipeline.for_family`) and brings its
    ``kernels`` and its ``requantize`` settings (none: :data:`EXACT_REQUANTIZE`). A mapping names its
    stages; a pass or a sequence of passes runs at ``at``; None is no passes. Neither turns the kernel
    policy on nor changes requantize.
    """
    if isinstance(passes, Pipeline):
        chosen = passes.for_family(family)
        return Chosen({k: list(chosen[k]) for k in STAGE_KEYS}, chosen.kernels,
                      tuple(chosen.requantize) or EXACT_REQUANTIZE)
    if passes is None:
        passes = ()
    if isinstance(passes, Mapping):
        unknown = sorted(set(passes) - set(STAGE_KEYS))
        if unknown:
            raise ValueError(f"tvm_ext.build: unknown pass stage(s) {unknown}; expected keys from {STAGE_KEYS}")
        return Chosen({k: _as_list(passes.get(k, ())) for k in STAGE_KEYS}, False, ())
    if at not in STAGE_KEYS:
        raise ValueError(f"tvm_ext.build: at={at!r}; expected one of {STAGE_KEYS}")
    return Chosen({k: _as_list(passes) if k == at else [] for k in STAGE_KEYS}, False, ())


def _as_list(passes) -> list:
    import tvm

    return [passes] if isinstance(passes, tvm.transform.Pass) else list(passes)


# -- tables --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """One pass of a stage: what it does, and why it stands where it stands.

    Parameters
    ----------
    name : str
        The pass's registered name (:mod:`tvm_ext.core.registry`), which is also its factory's name in
        :mod:`tvm_ext.passes` and what ``disabled_pass`` and instruments see.
    does : str
        What the pass does, in one or two sentences (its docstring has the rest).
    why : str
        Why it stands where it stands: the passes it must follow or precede and the reason, or
        that its place does not matter.
    after, before : tuple of str
        Passes of the same stage this one must follow / precede (checked by :class:`Stage`).
    place : {"", "first", "last"}
        ``"first"`` / ``"last"``: the step must open / close its stage (checked by :class:`Stage`).
    args : tuple of (str, object)
        Keyword arguments the factory is called with.
    families : tuple of str
        The target families (:data:`FAMILIES`) the step runs at; empty: all of them.
    """

    name: str
    does: str
    why: str
    after: tuple = ()
    before: tuple = ()
    place: str = ""
    args: tuple = ()
    families: tuple = ()

    def applies_to(self, family: str) -> bool:
        """True when the step runs at targets of ``family``."""
        return not self.families or family in self.families

    def __post_init__(self):
        for attr in ("name", "does", "why"):
            if not isinstance(getattr(self, attr), str) or not getattr(self, attr).strip():
                raise ValueError(f"pipelines.Step {self.name!r}: {attr} must be a non-empty string")
        for attr in ("after", "before"):
            names = getattr(self, attr)
            if not isinstance(names, tuple) or not all(isinstance(n, str) and n for n in names):
                raise ValueError(f"pipelines.Step {self.name!r}: {attr} must be a tuple of pass names, got {names!r}")
            if self.name in names:
                raise ValueError(f"pipelines.Step {self.name!r}: names itself in {attr}")
        if self.place not in ("", "first", "last"):
            raise ValueError(f"pipelines.Step {self.name!r}: place={self.place!r}; expected '', 'first' or 'last'")
        if not isinstance(self.families, tuple) or not set(self.families) <= set(FAMILIES):
            raise ValueError(f"pipelines.Step {self.name!r}: families must be a tuple of {FAMILIES}, "
                             f"got {self.families!r}")
        if not isinstance(self.args, tuple) or not all(
                isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str) for a in self.args):
            raise ValueError(f"pipelines.Step {self.name!r}: args must be (keyword, value) pairs, got {self.args!r}")

    @property
    def label(self) -> str:
        """``Name`` or ``Name(keyword=value, ...)``: how the pipeline creates the pass."""
        if not self.args:
            return self.name
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.args)})"

    def make(self):
        """The ``tvm.transform.Pass``: the registered factory called with :attr:`args`."""
        from .registry import create_pass

        p = create_pass(self.name, **dict(self.args))
        if p.info.name != self.name:
            raise ValueError(f"pipelines: the factory {self.name!r} made a pass named {p.info.name!r}")
        return p


@dataclass(frozen=True)
class Stage:
    """The ordered table of one build stage: its steps run in this order.

    Building one checks it: names are unique, every ``after`` / ``before`` of a step names a
    pass of the stage standing on that side of it, and a ``place="first"`` / ``"last"`` step opens /
    closes the stage; anything else raises ``ValueError``.
    """

    key: str
    #: when the stage runs, in words
    where: str
    steps: tuple = ()

    def __post_init__(self):
        if self.key not in STAGE_KEYS:
            raise ValueError(f"pipelines.Stage: key {self.key!r}; expected one of {STAGE_KEYS}")
        if not isinstance(self.steps, tuple) or not all(isinstance(s, Step) for s in self.steps):
            raise ValueError(f"pipelines.Stage {self.key!r}: steps must be a tuple of Step")
        names = self.names()
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"pipelines.Stage {self.key!r}: {dup} stand more than once")
        pos = {n: i for i, n in enumerate(names)}
        for i, s in enumerate(self.steps):
            if s.place and i != (0 if s.place == "first" else len(self.steps) - 1):
                raise ValueError(f"pipelines.Stage {self.key!r}: {s.name} must stand {s.place}, but stands at {i + 1} "
                                 f"of {len(self.steps)}")
            for rel, others in (("follow", s.after), ("precede", s.before)):
                for other in others:
                    if other not in pos:
                        raise ValueError(f"pipelines.Stage {self.key!r}: {s.name} must {rel} {other}, which is not "
                                         f"in the stage ({', '.join(names)})")
                    if (pos[other] < i) != (rel == "follow"):
                        raise ValueError(f"pipelines.Stage {self.key!r}: {s.name} must {rel} {other}, but stands "
                                         f"at {i + 1} and {other} at {pos[other] + 1}")

    def for_family(self, family: str) -> "Stage":
        """The stage with the steps that apply to ``family``; order constraints on a step left out
        are dropped with it."""
        steps = [s for s in self.steps if s.applies_to(family)]
        names = {s.name for s in steps}
        return replace(self, steps=tuple(replace(s, after=tuple(n for n in s.after if n in names),
                                                 before=tuple(n for n in s.before if n in names)) for s in steps))

    def names(self) -> list:
        """The pass names, in order."""
        return [s.name for s in self.steps]

    def step(self, name: str) -> Step:
        """The step of pass ``name`` (``ValueError`` when the stage has none)."""
        for s in self.steps:
            if s.name == name:
                return s
        raise ValueError(f"pipelines.Stage {self.key!r}: no pass {name!r} (passes: {', '.join(self.names())})")

    def insert(self, step: Step, *, after: str | None = None, before: str | None = None) -> "Stage":
        """A new stage with ``step`` right after the pass ``after`` or right before ``before``."""
        if (after is None) == (before is None):
            raise ValueError(f"pipelines.Stage.insert {step.name}: give exactly one of after= and before=")
        i = self.names().index(self.step(after or before).name) + (1 if after else 0)
        return replace(self, steps=self.steps[:i] + (step,) + self.steps[i:])

    def with_args(self, name: str, **kwargs) -> "Stage":
        """A new stage whose pass ``name`` is created with ``kwargs`` (added to its arguments)."""
        old = self.step(name)
        new = replace(old, args=tuple({**dict(old.args), **kwargs}.items()))
        return replace(self, steps=tuple(new if s is old else s for s in self.steps))

    def passes(self) -> list:
        """The ``tvm.transform.Pass`` of every step, in order."""
        return [s.make() for s in self.steps]


@dataclass(frozen=True)
class Insertion:
    """A step a pipeline variant adds to a stage, next to a named neighbour."""

    stage: str
    step: Step
    after: str | None = None
    before: str | None = None

    def apply(self, stages: tuple) -> tuple:
        """``stages`` with the step inserted (``ValueError``: no such stage, or no such neighbour in it)."""
        if self.stage not in [s.key for s in stages]:
            raise ValueError(f"pipelines.Insertion {self.step.name}: no stage {self.stage!r}")
        return tuple(s.insert(self.step, after=self.after, before=self.before) if s.key == self.stage else s
                     for s in stages)


_START_WHERE = "on the bound module, before relay.build's optimisation prefix (QNN ops still present)"
_BEFORE_FUSE_WHERE = ("after relay.build's optimisation prefix (Legalize, QNN lowering, CanonicalizeOps, "
                      "AlterOpLayout, FoldConstant, ...), right before FuseOps")

#: :func:`int8`'s stages (``numerics="tvm"``).
INT8 = (
    Stage("start", _START_WHERE, (
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
    Stage("before_fuse", _BEFORE_FUSE_WHERE, (
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
                 "the slice and the pad, AlterOpLayout the layout transforms around them.",
             after=("EpilogueBeforeChannelSlice",)),
        Step("NarrowKernelBoundaries",
             does="at residual joins, the 8-bit value crosses the kernel boundary and the widening (dequantize) "
                  "chain fuses into the consumer.",
             why="after ``RemoveStopFusion``, which acts on every barrier and so would judge its cuts, and after "
                 "``EpilogueBeforeChannelSlice`` (above). At ``before_fuse``: it matches the forms QNN lowering "
                 "and SimplifyExpr leave (an integer ``clip`` to 8-bit bounds). CPU targets: at GPU targets the "
                 "widening chain it hands a join does not fuse into the conv reading it and runs as a kernel of "
                 "its own.",
             after=("RemoveStopFusion",),
             families=("x86", "aarch64")),
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
                 "enters one (a transcendental op in the pool's elementwise consumers stays as it is). CPU "
                 "targets: TVM's GPU pool schedule leaves such a group's kernel without thread bindings.",
             after=("NarrowBeforeMaxPool", "WidenAfterMovement", "WidenInEachReader"),
             families=("x86", "aarch64")),
        Step("TabulateEightBit",
             does="an elementwise float function of one 8-bit value (quantized sigmoid, SiLU, tanh, GELU) becomes "
                  "a table lookup computed by TVM at compile time (exact), fused where the chain was: one table "
                  "read per element instead of a scalar ``expf`` call.",
             why="at ``before_fuse``, after AlterOpLayout: its ``tvm_ext.table_lookup`` op has no layout rule. "
                 "Before ``DequantizeInConvTranspose`` (last, below). No rule ties it to the passes before it: it "
                 "tabulates the chains as they leave them."),
        Step("DequantizeInConvTranspose",
             does="a transposed conv with stride = kernel (a DB head's upsampling) becomes one kernel from its "
                  "8-bit input to the 8-bit quantize after it, so no float32 crosses there (exact; llvm targets).",
             why="last: it makes each group a ``Primitive`` function, and the passes before it do not look inside "
                 "one.",
             place="last",
             families=("x86", "aarch64")),
    )),
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


def int8_stages(numerics: str = "tvm") -> tuple:
    """The ``(start, before_fuse)`` :class:`Stage` tables of :func:`int8` for ``numerics``."""
    if numerics not in NUMERICS:
        raise ValueError(f"pipelines.int8: numerics={numerics!r}; expected one of {NUMERICS}")
    return INT8_ONNXRUNTIME if numerics == "onnxruntime" else INT8


def _pipeline_name(numerics: str) -> str:
    return "tvm_ext.int8_ort" if numerics == "onnxruntime" else "tvm_ext.int8"


# -- text generated from the tables ---------------------------------------------------------------
_WIDTH = 100


def _wrap(text: str, first: str, rest: str) -> list:
    return textwrap.wrap(text, _WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False,
                         break_long_words=False)


def _rst_step(number: str, step: Step, note: str = "") -> list:
    """A numbered reST list item: ``Name``: what it does. *Order:* why it stands there."""
    sub = " " * (len(number) + 1)
    where = f" (only at {', '.join(step.families)} targets)" if step.families else ""
    return (_wrap(f"{number} ``{step.label}``{note}{where}: {step.does}", "", sub)
            + _wrap(f"*Order:* {step.why}", sub, sub))


def _text_step(number: str, step: Step) -> list:
    """The same as plain text for the CLI (no reST quotes)."""
    sub = "      "
    plain = lambda t: t.replace("``", "")  # noqa: E731
    where = f"   [only at {', '.join(step.families)} targets]" if step.families else ""
    return ([f"{number} {step.label}{where}"] + _wrap(f"does:  {plain(step.does)}", sub, sub + "       ")
            + _wrap(f"order: {plain(step.why)}", sub, sub + "       "))


def listing(numerics: str = "tvm") -> str:
    """Every pass of :func:`int8` (for ``numerics``), in order, with what it does and why it stands there.

    Plain text, as ``tvm-ext passes --pipeline int8 [--numerics onnxruntime]`` prints it.

    Raises
    ------
    ValueError
        An unknown ``numerics``.
    """
    stages = int8_stages(numerics)
    name = _pipeline_name(numerics)
    lines = [f"{name}: pipelines.int8(numerics={numerics!r}), "
             + ", ".join(f"{len(s.steps)} passes at {s.key}" for s in stages)]
    for s in stages:
        lines += [""] + _wrap(f"{s.key} (Sequential {name}.{s.key}): {s.where}", "", "  ") + [""]
        for i, step in enumerate(s.steps, 1):
            lines += _text_step(f"{i:2d}.", step)
    return "\n".join(lines)


_INT8_DOC_HEAD = """tvm-ext's recommended pipeline for quantized CNNs (the benchmark's "tvm-ext" column).

The passes in order, with what each does and why it stands there (generated from the tables
:data:`INT8` and :data:`ONNXRUNTIME_INSERTIONS`; ``tvm-ext passes --pipeline int8`` prints the
same). Every pass is exact on the graph it is given; see each pass's docstring for what it
rejects.
"""

_INT8_DOC_ORT = """With ``numerics="onnxruntime"`` (:data:`INT8_ONNXRUNTIME`), ``QDQToInteger`` runs with
``shared_dequantize=True`` (average pools and adds whose dequantize has other readers stay float
too: MobileNetV3's SE pools, YOLOv8n's C2f residual adds), QNN requantize is lowered with
:data:`ORT_REQUANTIZE` (float32 scale, round to nearest, where TVM rounds ``UPWARD``), and these
passes are inserted:
"""

_INT8_DOC_TAIL = """This changes outputs (near rounding ties only): it is not the default, so that the default
pipeline stays bit-exact to TVM's integer arithmetic.

Parameters
----------
numerics : {"tvm", "onnxruntime"}
    ``"tvm"`` (default): TVM's integer arithmetic, requantize included (:data:`EXACT_REQUANTIZE`)
    at every target: bit-exact to stock ``relay.build`` at plain ``llvm``, which is exact integer
    arithmetic. Stock at an SSE4.1 target requantizes in float32 and rounds some near-half values
    the other way.
    ``"onnxruntime"``: round as ONNX Runtime does (see above); the pipeline is then named
    ``tvm_ext.int8_ort``.

Returns
-------
Pipeline
    Its ``stages`` are the :class:`Stage` tables its passes were created from.

Raises
------
ValueError
    An unknown ``numerics``.
"""


def _int8_doc() -> str:
    parts = [_INT8_DOC_HEAD]
    for s in INT8:
        parts.append("\n".join(_wrap(f"Stage ``{s.key}``, {s.where}:", "", "")) + "\n")
        parts.append("\n".join(line for i, step in enumerate(s.steps, 1) for line in _rst_step(f"{i}.", step))
                     + "\n")
    parts.append(_INT8_DOC_ORT)
    for ins in ONNXRUNTIME_INSERTIONS:
        where = f"after ``{ins.after}``" if ins.after else f"before ``{ins.before}``"
        parts.append("\n".join(_rst_step("-", ins.step, f" (stage ``{ins.stage}``, {where})")) + "\n")
    parts.append(_INT8_DOC_TAIL)
    return "\n".join(parts)


def int8(numerics: str = "tvm") -> Pipeline:  # the docstring is generated from the tables below
    stages = int8_stages(numerics)
    name = _pipeline_name(numerics)
    start, before_fuse = stages
    return Pipeline(
        name=name,
        start=_sequential(start.passes(), f"{name}.start"),
        before_fuse=_sequential(before_fuse.passes(), f"{name}.before_fuse"),
        doc=int8.__doc__ or "",
        requantize=ORT_REQUANTIZE if numerics == "onnxruntime" else (),
        stages=stages,
    )


int8.__doc__ = _int8_doc()


def onnxruntime_numerics() -> Pipeline:
    """Round as ONNX Runtime does, and nothing else: for a build without the int8 pipeline.

    ``tvm_ext.build(mod, params=params, passes=pipelines.onnxruntime_numerics())`` compiles the
    graph stock ``relay.build`` compiles, except that (1) QNN requantize is lowered with
    :data:`ORT_REQUANTIZE` (float32 scale, round to nearest) instead of TVM's ``UPWARD`` rounding,
    and (2) ``AddAsOnnxRuntime`` and ``QuantizeWeightsAsOnnxRuntime`` run at ``start`` (quantized
    adds as MLAS computes them; float conv weights between a dequantize and a quantize quantized as
    ORT's graph optimizer does), and (3) ``RoundHalfToEven`` runs at ``before_fuse``: ``round`` (so
    ``qnn.quantize``) rounds ties to even, a rounded division by a scalar constant stays a true
    division, and a requantize's output zero point is added after rounding, as ONNX Runtime's kernels do.

    Returns
    -------
    Pipeline
        Named ``tvm_ext.onnxruntime_numerics``.
    """
    from .registry import create_pass

    name = "tvm_ext.onnxruntime_numerics"
    start = [create_pass("AddAsOnnxRuntime"), create_pass("QuantizeWeightsAsOnnxRuntime")]
    return Pipeline(name=name, start=_sequential(start, f"{name}.start"),
                    before_fuse=_sequential([create_pass("RoundHalfToEven")], f"{name}.before_fuse"),
                    doc=onnxruntime_numerics.__doc__ or "", requantize=ORT_REQUANTIZE)
