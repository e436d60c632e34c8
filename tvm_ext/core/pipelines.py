"""Named pass pipelines for :func:`tvm_ext.build`.

A :class:`Pipeline` maps build stages to ``tvm.transform.Sequential`` objects: ``"start"`` runs on
the bound module before relay.build's optimisation prefix (where QNN ops still exist),
``"before_fuse"`` right before FuseOps. Pass it as ``tvm_ext.build(mod, target, params,
passes=pipelines.int8())``; the build narrows it to the target's family first
(:meth:`Pipeline.for_family`, :func:`resolve`).

Each stage of :func:`int8` is data: a :class:`~tvm_ext.core._steps.Stage`, an ordered table of
:class:`~tvm_ext.core._steps.Step` records (:mod:`tvm_ext.core._int8_tables`). The ONNX Runtime
variant is the default table with passes inserted next to a named neighbour. :func:`int8`'s
docstring and ``tvm-ext passes --pipeline int8`` are generated from the tables (:func:`listing`).
Every pipeline makes its passes by name through :mod:`tvm_ext.core.registry`.
"""
from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ._int8_tables import INT8, INT8_ONNXRUNTIME, ONNXRUNTIME_ARGS, ONNXRUNTIME_INSERTIONS
from ._steps import FAMILIES, STAGE_KEYS, Insertion, Stage, Step

__all__ = ["Pipeline", "Step", "Stage", "Insertion", "Chosen", "resolve", "FAMILIES", "STAGE_KEYS", "int8",
           "int8_stages", "listing", "onnxruntime_numerics", "INT8", "INT8_ONNXRUNTIME", "ONNXRUNTIME_INSERTIONS",
           "ONNXRUNTIME_ARGS", "NUMERICS", "ORT_REQUANTIZE", "EXACT_REQUANTIZE"]

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
        return replace(self, start=_sequential(start, f"{self.name}.start"),
                       before_fuse=_sequential(before_fuse, f"{self.name}.before_fuse"),
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
    """A ``Sequential`` of a :class:`Stage`'s passes (or of a list of passes) that remembers their names."""
    import tvm

    if isinstance(passes, Stage):
        made, names = passes.passes(), passes.names()
    else:
        made, names = list(passes), [p.info.name for p in passes]
    seq = tvm.transform.Sequential(made, opt_level=0, name=name)
    seq._tvm_ext_names = names  # Sequential does not expose its passes
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
        for group in s.fixed_points:
            lines += [""] + _wrap(f"{', '.join(group)}: run again together until they change nothing.", "", "  ")
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
        start=_sequential(start, f"{name}.start"),
        before_fuse=_sequential(before_fuse, f"{name}.before_fuse"),
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
