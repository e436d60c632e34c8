"""``tvm_ext.build``: ``relay.build`` with an insertion point for user passes.

Design note
-----------
``relay.build`` (TVM 0.19, ``src/relay/backend/build_module.cc``) runs, in one C++ ``Sequential``:
bind params -> the *optimisation prefix* (``GetPassPrefix`` in ``backend/utils.cc``: qnn and target
Legalize, SimplifyInference, CSE, SimplifyExpr, CombineParallel*, FoldConstant, FoldScaleAxis,
CanonicalizeCast, CanonicalizeOps, AlterOpLayout, ...) -> SplitArgs -> PlanDevices -> FuseOps ->
lowering. There is no slot for user passes between the prefix and FuseOps.

``build(..., at="before_fuse")`` makes one without patching TVM:

1. the caller's module is copied (``relay.build`` mutates the module object it is given);
2. params are bound, as ``relay.build`` does first;
3. the prefix runs here, through TVM's own ``relay.backend.GetPassPrefixSeq`` under the same
   target, PassContext and AutoTVM dispatch context ``relay.build`` would use; an instrument
   records the names of the passes that actually ran;
4. the user passes run;
5. ``relay.build`` runs with those prefix passes disabled by name (``InferType`` excepted), so its
   prefix is a no-op and the user passes' output reaches FuseOps unchanged.

``at="start"`` runs the user passes on the bound module before ``relay.build``'s own prefix.
With no passes, both paths compile the same graph as plain ``relay.build`` (tested bit for bit).
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from .. import _compat

logger = logging.getLogger(__name__)

__all__ = ["build", "prepare", "Prepared", "copy_module", "prefix_pass_names", "pin_requantize", "AT_CHOICES"]

AT_CHOICES = ("before_fuse", "start")

# Passes the prefix runs that must stay enabled inside relay.build: type inference is required
# by every later pass and is idempotent.
_KEEP_ENABLED = frozenset({"InferType"})


def copy_module(mod):
    """A deep copy of an IRModule (so no TVM pass can mutate the caller's object)."""
    import tvm

    return tvm.ir.load_json(tvm.ir.save_json(mod))


class _PassRecorder:
    """PassInstrument collecting the names of the passes that run (in order) in its own PassContext.

    Passes run by a compilation *nested* inside a pass are not recorded: QNN legalization of
    ``qnn.sigmoid`` & co. computes its lookup table with a VM executor inside a new PassContext
    that inherits the instruments (``relay/qnn/op/canonicalizations.py::run_const_expr``), so
    PlanDevices, FuseOps, LowerTE, AnnotateMemoryScope... run "during the prefix". Recorded, they
    would be disabled in the final relay.build, which then segfaults in AnnotateMemoryScope
    (unplanned devices; a QDQ YOLOv8n has such ops). The instrument's ``enter_pass_ctx`` sees those
    nested contexts.
    """

    def __init__(self):
        self.names: list[str] = []
        self._depth = 0

    def make(self):
        import tvm

        recorder = self

        @tvm.instrument.pass_instrument
        class _Record:  # pylint: disable=too-few-public-methods
            def enter_pass_ctx(self):
                recorder._depth += 1

            def exit_pass_ctx(self):
                recorder._depth -= 1

            def run_before_pass(self, mod, info):  # noqa: D401
                if recorder._depth <= 1:
                    recorder.names.append(info.name)

        return _Record()


def _current_ctx_settings():
    """config, disabled passes and instruments of the PassContext the caller entered, if any."""
    import tvm

    cur = tvm.transform.PassContext.current()
    config = {str(k): v for k, v in cur.config.items()} if cur.config else {}
    disabled = [str(p) for p in cur.disabled_pass] if cur.disabled_pass else []
    instruments = list(cur.instruments) if cur.instruments else []
    return config, disabled, instruments


def _tophub_context(target):
    # Same dispatch context relay.build enters, so AlterOpLayout sees the same configs.
    from tvm import autotvm

    if isinstance(autotvm.DispatchContext.current, autotvm.FallbackContext):
        return autotvm.tophub.context([target])
    return contextlib.nullcontext()


def _as_module(mod):
    import tvm
    from tvm import relay

    if isinstance(mod, relay.Function):
        return tvm.IRModule.from_expr(mod)
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"tvm_ext.build: expected a tvm.IRModule or relay.Function, got {type(mod).__name__}")
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise ValueError("tvm_ext.build: the module has no 'main' function")
    return mod


def _check_passes(passes) -> list:
    import tvm

    if isinstance(passes, tvm.transform.Pass):
        passes = [passes]
    out = []
    for i, p in enumerate(passes):
        if not isinstance(p, tvm.transform.Pass):
            raise TypeError(
                f"tvm_ext.build: passes[{i}] is a {type(p).__name__}, not a tvm.transform.Pass "
                "(call the factory, e.g. CombineParallelCast(), not CombineParallelCast)"
            )
        out.append(p)
    return out


def _bind_params(mod, params):
    from tvm import relay

    if not params:
        return mod
    main = mod["main"]
    names = {p.name_hint for p in main.params}
    used = {k: v for k, v in params.items() if k in names}
    unused = sorted(set(params) - names)
    if unused:
        logger.debug("params not used by main: %s", unused[:10])
    mod = copy_module(mod)
    mod["main"] = relay.build_module.bind_params_by_name(mod["main"], used)
    return mod


def prefix_pass_names(mod, target, opt_level=3, **ctx) -> list[str]:
    """Names of the passes relay.build's optimisation prefix runs on ``mod`` for ``target``."""
    with _compat.no_tophub_download():
        _, names = _run_prefix(copy_module(_as_module(mod)), target, opt_level, **ctx)
    return names


def _run_prefix(mod, target, opt_level, config=None, disabled_pass=(), instruments=()):
    import tvm

    recorder = _PassRecorder()
    prefix = tvm.get_global_func("relay.backend.GetPassPrefixSeq")(True, False)
    with _tophub_context(target), _compat.te_compiler_libinfo_cached(), target, tvm.transform.PassContext(
        opt_level=opt_level,
        config=config,
        disabled_pass=list(disabled_pass),
        instruments=[recorder.make(), *instruments],
    ):
        mod = tvm.relay.transform.InferType()(mod)
        mod = prefix(mod)
    ran = []
    for name in recorder.names:
        if name not in ran and name not in _KEEP_ENABLED and name != "sequential":
            ran.append(name)
    return mod, ran


@dataclass
class Prepared:
    """A build as :func:`prepare` sets it up: what :func:`build` (and ``explain``, which stops before
    FuseOps) runs.

    Attributes
    ----------
    mod : tvm.IRModule
        A copy of the user's module.
    target : tvm.target.Target
        The resolved target (the back end's :meth:`~tvm_ext.backend.Backend.target`).
    backend : tvm_ext.backend.Backend
        The target's family.
    stages : dict
        Stage -> passes: the pipeline's for the family, then the back end's.
    split : bool
        Run relay.build's prefix here (``before_fuse`` passes exist or ``at="before_fuse"``).
    request : tvm_ext.backend.BuildRequest
        What the back end was asked (target, kernel policy and tuned records on or off, ...).
    plan : tvm_ext.backend.BuildPlan
        The back end's contexts, instruments, configuration and finishing step.
    requantize : dict
        ``relay.qnn.op.requantize_config`` settings (empty: TVM's defaults).
    """

    mod: object
    target: object
    backend: object
    stages: dict
    split: bool
    request: object
    plan: object
    requantize: dict

    def contexts(self) -> contextlib.ExitStack:
        """Every context the build runs in, entered: the requantize settings, then the back end's."""
        stack = contextlib.ExitStack()
        stack.enter_context(_compat.no_tophub_download())
        if self.requantize:
            from tvm.relay.qnn.op import requantize_config

            stack.enter_context(requantize_config(**self.requantize))
        stack.enter_context(self.plan.entered())
        return stack


def prepare(mod, target=None, passes=(), at: str = "before_fuse", *, kernels: bool | None = None,
            tuned: bool | None = None, **options) -> Prepared:
    """Resolve a build of ``mod``: the target's back end and target, the pipeline for its family,
    and the back end's plan (see :func:`build` for the arguments; ``options`` are the family's)."""
    from .. import families
    from ..backend import BuildRequest
    from . import tvm_bugs
    from .pipelines import resolve

    if at not in AT_CHOICES:
        raise ValueError(f"tvm_ext.build: at={at!r}; expected one of {AT_CHOICES}")
    mod = copy_module(_as_module(mod))
    if target is not None:
        tvm_bugs.check_target(target)  # an unknown -mtriple segfaults LLVM's feature query
    backend = families.for_target(target)
    tgt = backend.target(target, **options)
    chosen = resolve(passes, at, backend.family)
    stages = {stage: _check_passes(chosen.stages.get(stage, ())) for stage in AT_CHOICES}
    use_kernels = chosen.kernels if kernels is None else bool(kernels)
    use_tuned = use_kernels if tuned is None else bool(tuned)
    request = BuildRequest(tgt, mod, kernels=use_kernels, tuned=use_tuned, eight_bit=_has_8bit_tensors(mod),
                           options=options)
    plan = backend.plan(request)
    for stage, extra in plan.passes.items():
        stages[stage] = [*stages[stage], *extra]
    split = at == "before_fuse" or bool(stages["before_fuse"])
    requantize = dict(chosen.requantize)
    if requantize:
        mod = pin_requantize(mod, requantize)
    return Prepared(mod, tgt, backend, stages, split, request, plan, requantize)


def build(
    mod,
    target=None,
    params=None,
    passes: Sequence | Iterable = (),
    at: str = "before_fuse",
    opt_level: int = 3,
    *,
    config: dict | None = None,
    disabled_pass: Sequence[str] = (),
    instruments: Sequence = (),
    executor=None,
    runtime=None,
    mod_name: str = "default",
    allow_vnni: bool | None = None,
    kernels: bool | None = None,
    tuned: bool | None = None,
    amx: bool = False,
):
    """Build a Relay module like ``relay.build``, running ``passes`` at an insertion point.

    The target's back end (:mod:`tvm_ext.backend`: x86, aarch64, GPU) resolves the target, adds its
    passes, kernel policy, tuned records and instruments; docs/backends.md says what each adds.

    Parameters
    ----------
    mod : tvm.IRModule or relay.Function
        The model. Never modified: a copy is built.
    target : str or tvm.target.Target, optional
        Default: the host CPU. x86: ``-mcpu=native`` becomes the real CPU, AVX-512 VNNI is kept
        (:func:`tvm_ext.x86.target.build_target`); a GPU target gets the host CPU as its host.
    params : dict of str to array, optional
        Bound into ``main`` first, as ``relay.build`` does.
    passes : sequence of tvm.transform.Pass, mapping, or Pipeline
        User passes, run in order at ``at``; a mapping ``{"start": [...], "before_fuse": [...]}``
        runs each list at its stage. A :class:`tvm_ext.core.pipelines.Pipeline` (such as
        :func:`~tvm_ext.core.pipelines.int8`) is first narrowed to the target's family
        (:meth:`~tvm_ext.core.pipelines.Pipeline.for_family`), turns the family's kernel policy on,
        and fixes QNN requantize's lowering (its ``requantize`` settings, else
        :data:`~tvm_ext.core.pipelines.EXACT_REQUANTIZE`; every ``qnn.requantize`` is pinned to them
        first, :func:`pin_requantize`).
    at : {"before_fuse", "start"}
        ``"before_fuse"``: passes see the module after relay.build's optimisation prefix and their
        output reaches FuseOps without the prefix running again. ``"start"``: before the prefix.
    opt_level : int
        PassContext opt_level for everything (default 3).
    config, disabled_pass, instruments
        Merged with the PassContext the caller entered, if any (config: explicit wins; disabled
        passes and instruments: union).
    executor, runtime, mod_name
        Forwarded to ``relay.build``.
    allow_vnni : bool, optional
        x86 only. None (default): use AVX-512 VNNI where the CPU has it; False: mask it.
    kernels : bool, optional
        Apply the family's kernel policy (x86: :mod:`tvm_ext.x86.int8_conv`; aarch64:
        :mod:`tvm_ext.arm.int8_conv`). None (default): as the pipeline says (on for a
        :class:`~tvm_ext.core.pipelines.Pipeline`, off for a list of passes, so that without a
        pipeline the kernels are ``relay.build``'s).
    tuned : bool, optional
        Apply the tuned records of the target's instruction-set class (user's first, then shipped).
        None (default): as ``kernels``. ``kernel_report`` marks the kernels they reached.
    amx : bool
        x86 only, opt-in: keep ``amx-tile`` and ``amx-int8`` so int8 dense and batch_matmul compute
        on AMX tiles (:mod:`tvm_ext.x86.amx`; docs/x86-kernels.md).

    Returns
    -------
    tvm.relay.backend.executor_factory.GraphExecutorFactoryModule
        What ``relay.build`` returns, with two extra attributes: ``kernel_report``
        (:class:`tvm_ext.core.report.KernelReport`) and ``tvm_ext_module`` (the module that was handed
        to relay.build, after the user passes).

    Raises
    ------
    ValueError
        Bad ``at``, or a module without ``main``.
    TypeError
        A pass that is not a ``tvm.transform.Pass``, or an option the target's family does not take.
    tvm_ext.errors.UnsupportedByTVM
        A target or graph TVM 0.19 cannot build (the message says why).
    tvm_ext.core.build.PassFailed
        A user pass raised; the message names it.
    """
    options = {**({} if allow_vnni is None else {"allow_vnni": allow_vnni}), **({"amx": True} if amx else {})}
    prep = prepare(mod, target, passes, at, kernels=kernels, tuned=tuned, **options)
    with prep.contexts():
        factory = _build(prep.mod, prep.target, params, prep.stages, prep.split, opt_level, config, disabled_pass,
                         instruments, executor, runtime, mod_name, prep.plan)
    return prep.plan.finish(factory)


def pin_requantize(mod, settings: Mapping):
    """``mod`` with every ``qnn.requantize`` in its Relay functions made anew with ``settings``
    (``rounding``, ``compute_dtype``) as explicit attributes; an attribute ``settings`` does not name
    keeps the call's value (the ONNX importer's ``TONEAREST`` stays ``TONEAREST``).

    TVM 0.19's QNN canonicalization writes the values it lowers a requantize with into that call's
    attributes (``src/relay/qnn/op/requantize.cc``, ``RequantizeQnnCanonicalize``: ``const_cast``
    of the attrs, then ``SelectRequntizeParameter``), and an explicit attribute wins over
    ``requantize_config``. Modules share those attributes (copies of a module share its calls), so
    without this a build would lower requantize as the first build of the same graph in the process
    did: ``int64`` after one at plain ``llvm``, ``float32`` after one at an SSE4.1 target.
    """
    import tvm
    from tvm import relay

    requantize = relay.op.get("qnn.requantize")

    class _Pin(relay.ExprMutator):
        def visit_call(self, call):
            new = super().visit_call(call)
            if call.op != requantize:
                return new
            a = call.attrs
            return relay.qnn.op.requantize(*new.args, axis=int(a.axis), out_dtype=str(a.out_dtype),
                                           rounding=settings.get("rounding", str(a.rounding)),
                                           compute_dtype=settings.get("compute_dtype", str(a.compute_dtype)))

    functions = {gv: _Pin().visit(f) if isinstance(f, relay.Function) else f for gv, f in mod.functions.items()}
    return tvm.IRModule(functions, type_definitions=mod.type_definitions, attrs=mod.attrs)  # the caller's stays


def _has_8bit_tensors(mod) -> bool:
    """True when ``mod`` holds int8/uint8 tensors (an 8-bit graph: :func:`tvm_ext.x86.int8_conv.kernels`'s
    ``int8_graph``). A module that does not type-check says False here and fails later, in the build."""
    import tvm
    from tvm import relay

    try:
        typed = relay.transform.InferType()(mod)
    except tvm.TVMError:
        return False
    return any({"int8", "uint8"} & set(relay.analysis.all_dtypes(f))
               for _, f in typed.functions.items() if isinstance(f, relay.Function))


def _build(mod, tgt, params, stages, split, opt_level, config, disabled_pass, instruments, executor, runtime,
           mod_name, plan):
    import tvm
    from tvm import relay

    from . import tvm_bugs, tvm_reroutes
    from .report import KernelReport

    cur_config, cur_disabled, cur_instruments = _current_ctx_settings()
    cfg = plan.configure({**cur_config, **(config or {})})
    disabled = list(dict.fromkeys([*cur_disabled, *(disabled_pass or ())]))
    instr = [*cur_instruments, *(instruments or ())]

    mod = _bind_params(mod, params)
    prefix_names: list[str] = []
    if stages["start"]:
        mod = _run_user_passes(mod, stages["start"], tgt, opt_level, cfg, disabled, instr)
    mod, typed = tvm_reroutes.reroute(mod, tgt)  # constructs TVM lowers only in another form
    tvm_bugs.check_module(typed, tgt, executor is None)  # known TVM bugs: clear error
    workarounds: list = []  # rows of tvm_bugs.PREFIX_WORKAROUNDS applied to this module

    def turned_off() -> list:
        return [name for row in workarounds for name in row.disable]

    if split:
        while True:
            try:
                mod, prefix_names = _run_prefix(mod, tgt, opt_level, cfg, [*disabled, *turned_off()], instr)
                break
            except tvm.TVMError as err:
                if not _add_prefix_workaround(err, mod, workarounds):
                    raise
        logger.debug("relay.build prefix ran: %s", prefix_names)
    if stages["before_fuse"]:
        mod = _run_user_passes(mod, stages["before_fuse"], tgt, opt_level, cfg, disabled, instr)

    build_kwargs = {"mod_name": mod_name}
    if executor is not None:
        build_kwargs["executor"] = executor
    if runtime is not None:
        build_kwargs["runtime"] = runtime
    handed = mod

    def final_build(config, extra_disabled):
        with _compat.te_compiler_libinfo_cached(), tvm.transform.PassContext(
            opt_level=opt_level,
            config=config,
            disabled_pass=list(dict.fromkeys([*disabled, *prefix_names, *extra_disabled])),
            instruments=[*instr, *plan.instruments],
        ):
            return relay.build(copy_module(mod), target=tgt, **build_kwargs)

    while True:  # each known TVM bug is worked around at most once (tvm_bugs' design note)
        try:
            factory = final_build(cfg, turned_off())
            break
        except tvm.TVMError as err:
            if tvm_bugs.is_llvm_debug_info_error(err) and not cfg.get(tvm_bugs.NO_TIR_CSE):
                # TVM 0.19 + LLVM 22: debug info for a vector let variable that TIR CSE created fails
                # LLVM's verifier (tvm_bugs.is_llvm_debug_info_error); without TIR CSE no such variable.
                logger.warning("tvm_ext.build: LLVM rejected TVM's debug info for a vector variable (TVM 0.19 "
                               "with LLVM 22); building again with %s=True", tvm_bugs.NO_TIR_CSE)
                cfg = {**cfg, tvm_bugs.NO_TIR_CSE: True}
            elif not _add_prefix_workaround(err, mod, workarounds):
                raise
    factory.tvm_ext_module = handed
    factory.kernel_report = KernelReport.from_factory(factory)
    return factory


def _add_prefix_workaround(err, mod, applied: list) -> bool:
    """Append to ``applied`` the :data:`tvm_ext.core.tvm_bugs.PREFIX_WORKAROUNDS` row that recognises
    ``err`` (logged); False when none does (the caller re-raises)."""
    from . import tvm_bugs

    row = tvm_bugs.prefix_workaround(err, mod, applied)
    if row is None:
        return False
    applied.append(row)
    logger.warning("tvm_ext.build: TVM 0.19's %s (tvm_ext.core.tvm_bugs); running relay.build's prefix again "
                   "without %s", row.what, "/".join(row.disable))
    return True


class PassFailed(RuntimeError):
    """A user pass raised inside :func:`build`; the message names the pass."""


def _run_user_passes(mod, user_passes, tgt, opt_level, cfg, disabled, instr):
    import tvm

    names = [p.info.name for p in user_passes]
    # typed first: relay.build accepts an untyped module, and so must the stages around it
    infer = tvm.relay.transform.InferType()
    seq = tvm.transform.Sequential([infer, *user_passes, infer], name="tvm_ext.user_passes")
    with _tophub_context(tgt), tgt, tvm.transform.PassContext(
        opt_level=opt_level, config=cfg, disabled_pass=disabled, instruments=instr
    ):
        try:
            return seq(mod)
        except Exception as err:  # re-raised naming the passes, with the TVM message
            raise PassFailed(f"tvm_ext.build: user passes {names} failed: {err}") from err
