"""The back-end interface every target family implements, and the records a build exchanges with it.

A build (:func:`tvm_ext.build`) resolves the user's target with :meth:`Backend.target`, then asks
:meth:`Backend.plan` once for a :class:`BuildPlan`: the passes the family adds to each stage, the
context managers that patch TOPI strategies and schedules while the build runs, the instruments and
PassContext settings of ``relay.build``, and a last step on the built factory. The defaults here are
the empty answers: a family overrides only what it changes. Nothing here imports a family;
:mod:`tvm_ext.families` is the table that picks one, and docs/backends.md says how to add one.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["Backend", "BuildRequest", "BuildPlan", "STAGES", "llvm_arch"]

#: Build stages a back end may add passes to, in the order :func:`tvm_ext.build` runs them.
STAGES = ("start", "before_fuse")


@dataclass(frozen=True)
class BuildRequest:
    """What a build tells its back end.

    Attributes
    ----------
    target : tvm.target.Target
        The resolved target (:meth:`Backend.target`), with its host.
    mod : tvm.IRModule
        The user's module (a copy), before any pass.
    kernels : bool
        Apply the family's kernel policy (layouts, schedules): on for a pipeline that asks for it
        (:attr:`tvm_ext.core.pipelines.Pipeline.kernels`) or ``build(kernels=True)``.
    tuned : bool
        Apply the tuned records for the target's instruction-set class.
    eight_bit : bool
        The module holds int8/uint8 tensors.
    options : dict
        Family options the user passed to :func:`tvm_ext.build` (``amx`` for x86).
    """

    target: object
    mod: object
    kernels: bool = False
    tuned: bool = False
    eight_bit: bool = False
    options: dict = field(default_factory=dict)


@dataclass
class BuildPlan:
    """A back end's answer for one build.

    Attributes
    ----------
    passes : dict
        Stage name (:data:`STAGES`) -> passes the family appends to the user's passes there.
    contexts : list
        Context managers entered around the whole build (prefix, passes and ``relay.build``): TOPI
        strategies, schedules and legalizations the family patches, tuned records it applies.
    instruments : list
        Pass instruments added to ``relay.build``'s PassContext.
    configure : callable
        ``config -> config``: the PassContext options ``relay.build`` runs with, given the user's
        (a family adds to them, e.g. a TIR lowering pass, and keeps the user's).
    finish : callable
        ``factory -> factory``, called on what ``relay.build`` returned, after the contexts exit.
    """

    passes: dict = field(default_factory=dict)
    contexts: list = field(default_factory=list)
    instruments: list = field(default_factory=list)
    configure: Callable = field(default=lambda config: config)
    finish: Callable = field(default=lambda factory: factory)

    def add_configure(self, step: Callable) -> None:
        """Apply ``step`` (``config -> config``, e.g. a TIR lowering pass added) after :attr:`configure`'s
        steps so far."""
        previous = self.configure
        self.configure = lambda config: step(previous(config))

    def add_records(self, records) -> None:
        """Apply the tuned-records context ``records`` during the build (a context with ``hits``, the
        workloads it answered), and mark those kernels tuned in the kernel report."""
        self.contexts.append(records)
        previous = self.finish

        def finish(factory):
            factory = previous(factory)
            hits = getattr(records, "hits", None)
            if hits:
                factory.kernel_report = factory.kernel_report.with_tuned(hits)
            return factory

        self.finish = finish

    def entered(self) -> contextlib.ExitStack:
        """An exit stack with every context of :attr:`contexts` entered, in order."""
        stack = contextlib.ExitStack()
        try:
            for ctx in self.contexts:
                stack.enter_context(ctx)
        except BaseException:
            stack.close()
            raise
        return stack


def llvm_arch(target) -> str:
    """The architecture an ``llvm`` target compiles for: its ``-mtriple``'s first part, else this
    host's (``x86_64``, ``aarch64``, ...); ``""`` for other target kinds."""
    from tvm.target import codegen

    if target.kind.name != "llvm":
        return ""
    triple = str(target.attrs.get("mtriple", "") or "") or str(codegen.llvm_get_system_triple())
    return triple.split("-")[0]


class Backend:
    """One target family. The defaults build as ``relay.build`` does and change nothing.

    Attributes
    ----------
    family : str
        The family's name: pipelines keep the steps whose ``families`` name it
        (:meth:`tvm_ext.core.pipelines.Pipeline.for_family`).
    """

    family = "generic"

    def claims(self, target) -> bool:  # noqa: ARG002
        """True when ``target`` (a ``tvm.target.Target``) belongs to this family."""
        return False

    def target(self, target, **options):
        """The target a build compiles for, with its host (None: this host's CPU); ``-mcpu=native``
        becomes the host CPU's name (TVM 0.19 with LLVM 22 would build for a generic CPU). Raises
        :class:`tvm_ext.errors.UnsupportedByTVM` for a target this TVM cannot build without crashing,
        ``TypeError`` for an option the family does not know."""
        import tvm
        from tvm.target import codegen

        if options:
            raise TypeError(f"tvm_ext.build: {sorted(options)} are not options of the {self.family} back end")
        if target is None:
            target = f"llvm -mcpu={codegen.llvm_get_system_cpu()}"
        tgt = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
        if tgt.kind.name == "llvm" and str(tgt.attrs.get("mcpu", "")) == "native":
            text = str(tgt).replace("-mcpu=native", f"-mcpu={codegen.llvm_get_system_cpu()}")
            tgt = tvm.target.Target(text, host=tgt.host)
        if tgt.host is None and tgt.kind.name == "llvm":
            tgt = tvm.target.Target(tgt, host=tgt)
        return tgt

    def plan(self, request: BuildRequest) -> BuildPlan:  # noqa: ARG002
        """What the family adds to the build of ``request``."""
        return BuildPlan()

    def isa_class(self, target) -> str:  # noqa: ARG002
        """The int8 instruction-set class of ``target`` (records and per-class tables key on it)."""
        return "other"

    def tuning(self):
        """The family's tuning module (``load_records``, ``user_path``, ``apply``), or None."""
        return None

    def records(self, target) -> list:
        """The tuned records that apply to ``target`` (user's first, then shipped)."""
        tuning = self.tuning()
        return tuning.load_records(target) if tuning else []

    def records_path(self, target):
        """Where ``tvm-ext tune`` writes the user's records for ``target`` (None: the family has none)."""
        tuning = self.tuning()
        return tuning.user_path(target) if tuning else None

    def __repr__(self) -> str:
        return f"<tvm-ext back end {self.family}>"
