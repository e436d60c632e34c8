"""The records pipelines are tables of: :class:`Step` (one pass, what it does, why it stands
there), :class:`Stage` (an ordered table of steps, checked when built) and :class:`Insertion` (a step
a variant adds next to a named neighbour). Order is execution order; a step names the passes of its
stage it must follow (``after``) or precede (``before``), and the target families it runs at
(``families``; empty: all). Building a stage checks them and raises ``ValueError`` with the reason.
The records import nothing from TVM: a step's pass is created by name (:mod:`tvm_ext.core.registry`)
when a pipeline is built (:mod:`tvm_ext.core.pipelines`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["Step", "Stage", "Insertion", "STAGE_KEYS", "FAMILIES"]

#: Build stages of a :class:`Pipeline`, in the order :func:`tvm_ext.build` runs them.
STAGE_KEYS = ("start", "before_fuse")

#: Target families a :class:`Step` may be limited to (the back ends' ``family``, :mod:`tvm_ext.backend`).
FAMILIES = ("x86", "aarch64", "gpu", "generic")


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
    pass of the stage standing on that side of it, a ``place="first"`` / ``"last"`` step opens /
    closes the stage, and each group of :attr:`fixed_points` is two or more consecutive steps;
    anything else raises ``ValueError``.
    """

    key: str
    #: when the stage runs, in words
    where: str
    steps: tuple = ()
    #: Groups of consecutive steps (tuples of their names) that run again together until a round
    #: changes nothing (:func:`tvm_ext.core._fixed_point.fixed_point`): passes that open matches
    #: for each other, so that the stage stays idempotent as a whole. The later step's ``why`` says why.
    fixed_points: tuple = ()

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
        for group in self.fixed_points:
            if not isinstance(group, tuple) or len(group) < 2 or any(n not in pos for n in group):
                raise ValueError(f"pipelines.Stage {self.key!r}: fixed-point group {group!r} must name two or more "
                                 f"passes of the stage ({', '.join(names)})")
            if [pos[n] for n in group] != list(range(pos[group[0]], pos[group[0]] + len(group))):
                raise ValueError(f"pipelines.Stage {self.key!r}: fixed-point group {group!r} must be consecutive "
                                 f"steps in stage order")

    def for_family(self, family: str) -> "Stage":
        """The stage with the steps that apply to ``family``; order constraints on a step left out
        are dropped with it."""
        steps = [s for s in self.steps if s.applies_to(family)]
        names = {s.name for s in steps}
        groups = tuple(kept for g in self.fixed_points if len(kept := tuple(n for n in g if n in names)) > 1)
        return replace(self, steps=tuple(replace(s, after=tuple(n for n in s.after if n in names),
                                                 before=tuple(n for n in s.before if n in names)) for s in steps),
                       fixed_points=groups)

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
        """The ``tvm.transform.Pass`` of every step, in order; the steps of a :attr:`fixed_points`
        group as one pass that repeats them."""
        from ._fixed_point import fixed_point

        out, i = [], 0
        starts = {g[0]: g for g in self.fixed_points}
        while i < len(self.steps):
            group = starts.get(self.steps[i].name, (self.steps[i].name,))
            made = [s.make() for s in self.steps[i:i + len(group)]]
            out.append(made[0] if len(group) == 1 else fixed_point(made, group))
            i += len(group)
        return out


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
