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
from typing import Iterable, Mapping, Sequence

from .. import _compat

logger = logging.getLogger(__name__)

__all__ = ["build", "copy_module", "prefix_pass_names", "kernel_settings", "kernel_contexts", "pin_requantize",
           "AT_CHOICES"]

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


def _stage_passes(passes, at) -> dict:
    """``passes`` as {stage: [Pass, ...]}: a sequence runs at ``at``; a mapping names its stages;
    None is no passes (as ``()``)."""
    if passes is None:
        passes = ()
    if isinstance(passes, Mapping):
        unknown = sorted(set(passes) - set(AT_CHOICES))
        if unknown:
            raise ValueError(f"tvm_ext.build: unknown pass stage(s) {unknown}; expected keys from {AT_CHOICES}")
        return {stage: _check_passes(passes.get(stage, ())) for stage in AT_CHOICES}
    if at not in AT_CHOICES:
        raise ValueError(f"tvm_ext.build: at={at!r}; expected one of {AT_CHOICES}")
    out = {stage: [] for stage in AT_CHOICES}
    out[at] = _check_passes(passes)
    return out


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
    _, names = _run_prefix(copy_module(_as_module(mod)), target, opt_level, **ctx)
    return names


def _run_prefix(mod, target, opt_level, config=None, disabled_pass=(), instruments=()):
    import tvm

    recorder = _PassRecorder()
    prefix = tvm.get_global_func("relay.backend.GetPassPrefixSeq")(True, False)
    with _tophub_context(target), target, tvm.transform.PassContext(
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

    Parameters
    ----------
    mod : tvm.IRModule or relay.Function
        The model. Never modified: a copy is built.
    target : str or tvm.target.Target, optional
        Default: the host CPU. Resolved by :func:`tvm_ext.x86.target.build_target`: ``-mcpu=native``
        becomes the real CPU, and AVX-512 VNNI is kept (LLVM targets are compiled inside
        :func:`tvm_ext.x86.int8_conv.kernels`, whose VNNI intrinsic LLVM 22 accepts).
    params : dict of str to array, optional
        Bound into ``main`` first, as ``relay.build`` does.
    passes : sequence of tvm.transform.Pass, or mapping
        User passes, run in order as one ``tvm.transform.Sequential`` at ``at``. A mapping
        ``{"start": [...], "before_fuse": [...]}`` (such as :func:`tvm_ext.core.pipelines.int8`) runs
        each list at its own stage, and ``at`` only decides whether the prefix is split off.
        A :class:`tvm_ext.core.pipelines.Pipeline` is built inside
        ``relay.qnn.op.requantize_config(**settings)``, with its ``requantize`` settings (e.g.
        ``pipelines.int8(numerics="onnxruntime")``) or, without any, ``pipelines.EXACT_REQUANTIZE``
        (TVM's int64 fixed point at every target, each call's own rounding), and every
        ``qnn.requantize`` of ``mod`` is given them as attributes first (:func:`pin_requantize`).
    at : {"before_fuse", "start"}
        ``"before_fuse"``: passes see the module after relay.build's optimisation prefix
        (layouts altered, constants folded, CSE done) and their output reaches FuseOps without
        the prefix running again. ``"start"``: passes run before the prefix.
    opt_level : int
        PassContext opt_level for everything (default 3, like ``relay.build`` users set).
    config, disabled_pass, instruments
        Merged with the PassContext the caller entered, if any (config: explicit wins;
        disabled passes and instruments: union).
    executor, runtime, mod_name
        Forwarded to ``relay.build``.
    allow_vnni : bool, optional
        None (default): use AVX-512 VNNI where the CPU has it. False: mask it (the instruction
        set a plain ``relay.build`` can survive). See :func:`tvm_ext.x86.target.build_target`.
        AMX is masked (:data:`tvm_ext.x86.target.AMX_FEATURES`) unless ``amx``.
    kernels : bool, optional
        Compile x86 int8 ops with tvm-ext's kernel policy (:mod:`tvm_ext.x86.int8_conv`: layouts,
        channel blocks and schedules per instruction set). None (default): on when ``passes`` is a
        :class:`tvm_ext.core.pipelines.Pipeline` (such as :func:`tvm_ext.core.pipelines.int8`), off
        otherwise, so that without a pipeline the kernels and outputs are ``relay.build``'s. Off,
        only TVM's VNNI intrinsic is replaced by one LLVM 22 accepts (the same instruction).
    tuned : bool, optional
        Use the int8 conv layouts and schedules tuned for this CPU and instruction set
        (:mod:`tvm_ext.x86.tuning`): the user's records (``tvm-ext tune``; for an aarch64 target,
        ``tvm-ext tune --rpc/--tracker`` on a board of that CPU) first, then shipped ones.
        None (default): as ``kernels``. ``kernel_report`` marks the kernels they reached
        (``Kernel.tuned``).
    amx : bool
        Opt-in, off by default: keep ``amx-tile`` and ``amx-int8`` on a target that has them
        (Sapphire/Granite Rapids), so TVM's uint8 x int8 dense and batch_matmul compute on AMX
        tiles where their shapes fit whole tiles, each kernel configuring its tiles in the thread
        that runs it (:mod:`tvm_ext.x86.amx`: :func:`~tvm_ext.x86.amx.ConfigureTiles` as a TIR lower pass,
        :func:`~tvm_ext.x86.amx.tile_schedules`). Convolutions stay on AVX-512 VNNI. Running the result
        needs Linux's tile permission (:func:`tvm_ext.x86.amx.request_tile_state`): a build with
        ``amx=True`` asks for it on an AMX host, as :func:`tvm_ext.tools.deploy.load_library` does.
        Never run on an AMX CPU by this project's tests: checked by reading the generated code and
        by running it with the tile instructions emulated.

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
        A pass that is not a ``tvm.transform.Pass``.
    tvm_ext.core.build.PassFailed
        A user pass raised; the message names it.
    """
    import tvm

    from . import tvm_bugs
    from ..arm import requantize as arm_requantize
    from ..x86 import exact_int8
    from ..x86.target import build_target

    if at not in AT_CHOICES:
        raise ValueError(f"tvm_ext.build: at={at!r}; expected one of {AT_CHOICES}")
    stages = _stage_passes(passes, at)
    split = at == "before_fuse" or bool(stages["before_fuse"])
    mod = copy_module(_as_module(mod))
    if target is not None:
        tvm_bugs.check_target(target)  # an unknown -mtriple segfaults LLVM's feature query
    tgt = build_target(target, allow_vnni, allow_amx=amx)
    if tgt.kind.name == "llvm" and tgt.host is None:
        tgt = tvm.target.Target(tgt, host=tgt)
    use_kernels, use_tuned = kernel_settings(passes, kernels, tuned)
    if tgt.kind.name == "llvm" and exact_int8.packs_pairs(tgt) and _has_8bit_tensors(mod):
        # exact int8 convs without VNNI: kernels whose vpmaddubsw pairs saturate go to int16 pairs,
        # last before FuseOps (tvm_ext.x86.exact_int8)
        stages["before_fuse"] = [*stages["before_fuse"], exact_int8.PairPackInt8Convs()]
        split = True
    kernels, schedules = kernel_contexts(tgt, mod, use_kernels, use_tuned)
    from .pipelines import EXACT_REQUANTIZE, Pipeline

    # a Pipeline fixes QNN requantize's lowering: its own settings, or TVM's integer one at every target
    requantize = dict(getattr(passes, "requantize", ()) or ()) or (
        dict(EXACT_REQUANTIZE) if isinstance(passes, Pipeline) else {})
    if requantize:
        from tvm.relay.qnn.op import requantize_config

        mod = pin_requantize(mod, requantize)
        rq = requantize_config(**requantize)
    else:
        rq = contextlib.nullcontext()
    tiles = contextlib.nullcontext()
    if amx and tgt.kind.name == "llvm":
        from ..x86 import amx as amx_tiles

        amx_tiles.prepare_process()  # the result runs in this process too: ask Linux for the tile state now
        config, tiles = amx_tiles.lower_config(config), amx_tiles.tile_schedules()
    # aarch64: qnn.requantize rounded once, as on every other CPU (tvm_ext.arm.requantize)
    arm = arm_requantize.generic_q_multiply_shift() if _is_aarch64(tgt) else contextlib.nullcontext()
    with kernels, schedules, rq, tiles, arm:
        factory = _build(mod, tgt, params, stages, split, opt_level, config, disabled_pass, instruments, executor,
                         runtime, mod_name)
    hits = getattr(schedules, "hits", None)
    if hits:
        factory.kernel_report = factory.kernel_report.with_tuned(hits)
    return factory


def _is_aarch64(tgt) -> bool:
    """True for an LLVM target that compiles for 64-bit ARM."""
    return tgt.kind.name == "llvm" and str(tgt.attrs.get("mtriple", "")).startswith(("aarch64", "arm64"))


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


def kernel_settings(passes=(), kernels: bool | None = None, tuned: bool | None = None) -> tuple[bool, bool]:
    """``(kernels, tuned)`` for a build with ``passes``: see :func:`build`'s parameters of those names.

    tvm-ext's x86 kernel policy and tuned records change layouts (and so kernels); they are for
    graphs a tvm-ext pipeline made, and a build without one stays ``relay.build``'s.
    """
    from .pipelines import Pipeline

    if kernels is None:
        kernels = isinstance(passes, Pipeline)
    if tuned is None:
        tuned = kernels
    return bool(kernels), bool(tuned)


def kernel_contexts(tgt, mod, kernels: bool, tuned: bool) -> tuple:
    """The (kernel policy, tuned records) context managers a build of ``mod`` at ``tgt`` enters.

    For an LLVM target the first is always :func:`tvm_ext.x86.int8_conv.kernels`: with ``kernels``
    False it only makes TVM's VNNI intrinsic buildable with LLVM 22 (TVM's layouts and schedules
    stay); the second has ``hits`` when records were applied.
    """
    from ..arm import int8_conv as arm_int8
    from ..x86 import tuning, int8_conv as x86_int8

    if tgt.kind.name != "llvm":
        return contextlib.nullcontext(), contextlib.nullcontext()
    if _is_aarch64(tgt):
        # aarch64: 8-bit operands for every int8 conv and dense (tvm_ext.arm.int8_conv); the records
        # `tvm-ext tune --rpc` measured on a board of this CPU (tvm_ext.x86.tuning's aarch64 files)
        policy = arm_int8.kernels(int8_graph=_has_8bit_tensors(mod)) if kernels else contextlib.nullcontext()
        return policy, tuning.apply(tgt) if tuned else contextlib.nullcontext()
    policy = x86_int8.kernels(schedule=kernels, int8_graph=kernels and _has_8bit_tensors(mod))
    return policy, tuning.apply(tgt) if tuned else contextlib.nullcontext()


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
           mod_name):
    import tvm
    from tvm import relay

    from . import tvm_bugs
    from .report import KernelReport
    from ..x86 import exact_int8

    _compat.install_libinfo_cache()
    cur_config, cur_disabled, cur_instruments = _current_ctx_settings()
    cfg = {**cur_config, **(config or {})}
    disabled = list(dict.fromkeys([*cur_disabled, *disabled_pass]))
    instr = [*cur_instruments, *instruments]

    mod = _bind_params(mod, params)
    prefix_names: list[str] = []
    if stages["start"]:
        mod = _run_user_passes(mod, stages["start"], tgt, opt_level, cfg, disabled, instr)
    tvm_bugs.check_module(relay.transform.InferType()(mod), tgt, executor is None)  # known TVM bugs: clear error
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
        # x86 without VNNI: which int8 workloads keep the saturating vpmaddubsw (tvm_ext.x86.exact_int8)
        with exact_int8.recording(), tvm.transform.PassContext(
            opt_level=opt_level,
            config=config,
            disabled_pass=list(dict.fromkeys([*disabled, *prefix_names, *extra_disabled])),
            instruments=[*instr, exact_int8.RecordWeights()],
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
