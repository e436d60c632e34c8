"""The fuzzer's oracle: what must hold when a pass, ``pipelines.int8()`` or ``tvm_ext.build`` meets a graph.

Per registered pass (:data:`PASSES`), per stage (``start``: the module as given; ``before_fuse``:
after relay.build's prefix, as ``tvm_ext.build`` hands it to passes), plus ``pipelines.int8()`` and
``tvm_ext.build`` itself (:func:`check_graph`):

* no exception, except a ``ValueError``/``TypeError`` naming the pass on a graph it must refuse;
* the caller's module is unchanged, the output type-checks and is well formed;
* running the pass again changes nothing; a graph with ``If``/``Let``/closures comes back unchanged;
* if the pass changed a static graph: ``tvm_ext.build`` with the pass equals ``tvm_ext.build``
  without passes on seeded inputs (:mod:`.compare`: integers bit for bit, floats within a
  tolerance, ``QDQToInteger`` within how far :data:`QDQ_STEPS` levels at its quantize points carry
  to each output, :mod:`.bounds`);
* ``tvm_ext.build`` without passes computes an integer graph exactly (bit for bit what
  ``relay.build`` at plain ``llvm`` gives); a float graph is compared with stock ``relay.build``.

Builds for a target whose code cannot run (here or on an RPC server: :mod:`.execution`) are
compiled only: structure, idempotence and build errors are still checked, outputs are not. The
full contract: docs/fuzzing.md, the "Oracle" item.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


from . import execution
from .builder import GeneratorError, build_graph, short_error
from .bounds import output_bounds
from .compare import QDQ_STEPS, _is_float_graph, _same, _well_formed, compare_outputs
from .execution import EXACT_TARGET, build_prefixed, executor, prefixed, seeded_inputs, targets
from .grammar import Spec

__all__ = ["PASSES", "Failure", "GraphResult", "check_graph", "check_spec"]

#: ``tvm_ext.build`` vs plain ``relay.build`` is compared on one graph in this many (spec seed).
BUILD_CHECK_EVERY = 8


def _make_passes():
    """label -> (factory of a fresh pass, stages it is tried at)."""
    from tvm_ext import passes as P

    both = ("start", "before_fuse")
    return {
        "AffineEightBitJoin": (lambda: P.AffineEightBitJoin(), ("before_fuse",)),
        "AnchoredArgumentFirst": (lambda: P.AnchoredArgumentFirst(), ("before_fuse",)),  # GPU targets only
        "CombineParallelCast": (lambda: P.CombineParallelCast(), both),
        "CombineParallelOpBatch(nn.dense)": (lambda: P.CombineParallelOpBatch("nn.dense", "nn.batch_matmul", 2), both),
        "CombineParallelOpBatch(add)": (lambda: P.CombineParallelOpBatch("add", "add", 2), both),
        "CombineParallelOpBatch(multiply)": (lambda: P.CombineParallelOpBatch("multiply", "multiply", 2), both),
        "EpilogueBeforeChannelSlice": (lambda: P.EpilogueBeforeChannelSlice(), ("before_fuse",)),
        "FoldChannelRepadIntoConv": (lambda: P.FoldChannelRepadIntoConv(), ("before_fuse",)),  # legalization's slice
        "FoldPadIntoConv": (lambda: P.FoldPadIntoConv(), both),
        "FoldZeroPointPadIntoConv": (lambda: P.FoldZeroPointPadIntoConv(), both),
        "FuseByPattern(generic)": (lambda: P.FuseByPattern("generic"), ("before_fuse",)),
        "FuseByPattern(qnn)": (lambda: P.FuseByPattern("qnn"), both),
        "FuseWideningIntoPool": (lambda: P.FuseWideningIntoPool(), both),
        "HoistUint8Shift": (lambda: P.HoistUint8Shift(), ("before_fuse",)),  # x86 legalization's shift
        "NarrowBeforeMaxPool": (lambda: P.NarrowBeforeMaxPool(), both),
        "NarrowKernelBoundaries": (lambda: P.NarrowKernelBoundaries(), both),
        "NonNegativeConvInputToUint8": (lambda: P.NonNegativeConvInputToUint8(), ("start",)),
        "QDQToInteger": (lambda: P.QDQToInteger(), ("start",)),
        "RemoveStopFusion": (lambda: P.RemoveStopFusion(), both),
        "TabulateEightBit": (lambda: P.TabulateEightBit(), ("before_fuse",)),
        "UniformZeroPointsToScalar": (lambda: P.UniformZeroPointsToScalar(), ("start",)),
        "WidenAfterMovement": (lambda: P.WidenAfterMovement(), both),
        "WidenInEachReader": (lambda: P.WidenInEachReader(), ("before_fuse",)),
    }


#: Labels of the passes the oracle runs (registry names, with arguments where a pass needs them).
PASSES = (
    "AffineEightBitJoin",
    "AnchoredArgumentFirst",
    "CombineParallelCast",
    "CombineParallelOpBatch(nn.dense)",
    "CombineParallelOpBatch(add)",
    "CombineParallelOpBatch(multiply)",
    "EpilogueBeforeChannelSlice",
    "FoldChannelRepadIntoConv",
    "FoldPadIntoConv",
    "FoldZeroPointPadIntoConv",
    "FuseByPattern(generic)",
    "FuseByPattern(qnn)",
    "FuseWideningIntoPool",
    "HoistUint8Shift",
    "NarrowBeforeMaxPool",
    "NarrowKernelBoundaries",
    "NonNegativeConvInputToUint8",
    "QDQToInteger",
    "RemoveStopFusion",
    "TabulateEightBit",
    "UniformZeroPointsToScalar",
    "WidenAfterMovement",
    "WidenInEachReader",
)


@dataclass
class Failure:
    """One oracle violation."""

    subject: str  # pass label, "int8()" or "build"
    stage: str  # "start" / "before_fuse" / "build"
    kind: str  # exception, mutated, ill_formed, not_idempotent, rewrote_control, mismatch, crash, hang
    message: str

    def signature(self) -> tuple:
        return (self.subject, self.stage, self.kind)


@dataclass
class GraphResult:
    """What the oracle saw on one graph."""

    variant: str = "static"
    rewrites: dict = field(default_factory=dict)  # "label@stage" -> 1
    builds: int = 0
    compared: int = 0
    failures: list = field(default_factory=list)
    skips: list = field(default_factory=list)  # reasons
    seconds: float = 0.0
    stock_checked: bool = False  # stock relay.build at the target was compared with exact integer arithmetic
    stock_inexact: bool = False  # ... and differs from it


def check_graph(mod, *, variant: str = "static", numeric: bool = True, build_check: bool = True,
                passes=PASSES, stages=("start", "before_fuse"), pipeline: bool = True,
                target: str | None = None, rpc: str | None = None) -> GraphResult:
    """Run the oracle on one type-inferred module (in this process: may crash with TVM).

    Parameters
    ----------
    mod : tvm.IRModule
        Typed module (never modified).
    variant : str
        ``"static"``; ``"dynamic"`` (not built: graph executor needs static shapes);
        ``"if"``/``"let"``/``"closure"`` (passes must return it unchanged).
    numeric : bool
        Build and run every rewrite (else structure only).
    build_check : bool
        Also compare ``tvm_ext.build`` without passes with exact integer arithmetic (integer
        graphs) or plain ``relay.build`` (float graphs).
    target : str, optional
        The target passes, prefix and builds are for (default: the host CPU, as
        ``tvm_ext.build``). One whose code cannot run (:func:`.execution.executor`) is compiled
        only: every build is made, none is run, and the graph's skips say that its outputs were
        not compared.
    rpc : str, optional
        ``HOST:PORT`` of a TVM RPC server that runs the builds for a ``target`` of another
        architecture (an aarch64 board, or :func:`tvm_ext.testing.aarch64.rpc_server`).
    """
    t0 = time.time()
    oracle = _Oracle(mod, variant, numeric, target, rpc)
    oracle.run_prefix(stages)
    oracle.check_passes(passes, stages)
    if pipeline:
        oracle.check_pipeline()
    if build_check and oracle.runnable:
        oracle.check_build()
    oracle.res.seconds = time.time() - t0
    return oracle.res


class _Oracle:
    """The checks of :func:`check_graph` on one module, and what they share: the prefixed module,
    the reference outputs, the builds made so far."""

    def __init__(self, mod, variant, numeric, target, rpc):
        self.mod = mod
        self.variant = _actual_variant(mod, variant)
        self.res = GraphResult(variant=self.variant)
        self.factories = _make_passes()
        self.text0 = mod.astext()
        self.control = self.variant in ("if", "let", "closure", "control")
        self.runnable = numeric and self.variant == "static"  # built (and run, when the target runs)
        self.float_graph = _is_float_graph(mod)
        self.out_bounds = output_bounds(mod, QDQ_STEPS)
        self.target = target
        self.tgt, self.masked = targets(target)
        self.run, self.not_run = executor(target, rpc) if self.runnable else (None, None)
        if self.not_run:
            self.res.skips.append(self.not_run)
        self.cache: dict = {}
        self.built: dict = {}  # (stage, structural hash) -> [(module, outputs)]
        self.pre, self.prefix_names = None, []

    # -- building and running --------------------------------------------------------------------
    def reference(self):
        """Outputs of ``tvm_ext.build(mod)`` (from the prefixed module when there is one)."""
        import tvm_ext
        from tvm_ext.core import tvm_bugs

        if "ref" not in self.cache:
            self.cache["inputs"] = seeded_inputs(self.mod)
            self.res.builds += 1
            if self.pre is not None:
                tvm_bugs.check_module(self.mod, self.tgt)  # what tvm_ext.build checks before its prefix
                factory = build_prefixed(self.pre, self.tgt, self.prefix_names)
            else:
                factory = tvm_ext.build(self.mod, target=self.target)
            self.cache["ref"] = self.outputs(factory)
        return self.cache["ref"]

    def outputs(self, factory):
        """The outputs of a build at the target on the seeded inputs (None when compiled only)."""
        return None if self.not_run else self.run(factory, self.cache["inputs"])

    def outputs_of(self, stage, rewritten, build):
        """Outputs of a build of ``rewritten`` (the module after the pass at ``stage``); graphs
        that several passes rewrite to the same module are built once."""
        import tvm

        key = (stage, tvm.ir.structural_hash(rewritten))
        for other, outs in self.built.get(key, ()):
            if tvm.ir.structural_equal(other, rewritten):
                return outs
        self.res.builds += 1
        outs = self.outputs(build())
        self.built.setdefault(key, []).append((rewritten, outs))
        return outs

    def checked_reference(self):
        """``(reference outputs, True)``, or ``(None, False)`` with the reason in the skips when the
        reference cannot be built (its outputs are None too when the target is compiled only)."""
        from tvm_ext.core import tvm_bugs

        try:
            return self.reference(), True
        except tvm_bugs.UnsupportedByTVM as err:  # tvm-ext refuses a known TVM bug: the oracle cannot run
            self.res.skips.append(f"reference refused (known TVM 0.19 bug, tvm_ext.core.tvm_bugs): {short_error(err)}")
        except Exception as err:  # noqa: BLE001  (the unrewritten graph itself does not build)
            self.res.skips.append(f"reference does not build: {short_error(err)}")
        return None, False

    def compare(self, subject, stage, passes_arg, at, steps=0, rewritten=None):
        """Build the graph with ``passes_arg`` (or ``rewritten``, the module a pass made) and compare
        its outputs with the reference's."""
        import tvm_ext

        ref, ok = self.checked_reference()
        if not ok:
            return
        try:
            if rewritten is None:  # the whole pipeline: through tvm_ext.build's own stages
                self.res.builds += 1
                got = self.outputs(tvm_ext.build(self.mod, passes=passes_arg, at=at, target=self.target))
            elif at == "before_fuse":
                got = self.outputs_of(at, rewritten, lambda: build_prefixed(rewritten, self.tgt, self.prefix_names))
            else:  # tvm_ext.build(mod, passes, at="start") == the prefix and relay.build on the output
                got = self.outputs_of(at, rewritten, lambda: tvm_ext.build(rewritten, at="start", target=self.target))
        except Exception as err:  # noqa: BLE001
            self.res.failures.append(Failure(subject, stage, "build_error", short_error(err)))
            return
        if self.not_run:
            return
        self.res.compared += 1
        why = compare_outputs(ref, got, self.float_graph, steps, self.out_bounds)
        if why:
            self.res.failures.append(Failure(subject, stage, "mismatch", why))

    # -- structure -------------------------------------------------------------------------------
    def structural(self, subject, stage, make, base):
        """Apply ``make()`` to ``base`` and check the structural rules; the output when it changed,
        else None."""
        text = base.astext() if base is not self.mod else self.text0
        out = self.apply(subject, stage, make, base)
        if out is None:
            return None
        if base.astext() != text:
            self.fail(subject, stage, "mutated", "the input module was modified")
        bad = _well_formed(out)
        if bad:
            self.fail(subject, stage, "ill_formed", bad)
            return None
        changed = not _same(out, base)
        if changed and self.control:
            self.fail(subject, stage, "rewrote_control", f"rewrote a function with {self.variant}")
        again = self.apply(subject, stage, make, out, "second run: ")
        if again is not None and not _same(again, out):
            self.fail(subject, stage, "not_idempotent", "a second run changed the module")
        return out if changed else None

    def apply(self, subject, stage, make, base, what=""):
        """``make()(base)`` at the target; None (with a failure or a skip) when it raises. A pass may
        refuse a graph that is not static with a ``ValueError``/``TypeError`` naming it."""
        import tvm

        try:
            with self.tgt, tvm.transform.PassContext(opt_level=3):
                return make()(base)
        except Exception as err:  # noqa: BLE001
            msg = short_error(err)
            name = subject.split("(")[0]
            if (not what and self.variant != "static" and isinstance(err, (ValueError, TypeError))
                    and name in str(err)):
                self.res.skips.append(f"{subject} refused {self.variant}: {msg}")
            else:
                self.fail(subject, stage, "exception", f"{what}{type(err).__name__}: {msg}")
            return None

    def fail(self, subject, stage, kind, message):
        self.res.failures.append(Failure(subject, stage, kind, message))

    # -- the checks ------------------------------------------------------------------------------
    def run_prefix(self, stages):
        """relay.build's prefix, once, for the ``before_fuse`` stage (static graphs only)."""
        if "before_fuse" in stages and self.variant == "static":
            try:
                self.pre, self.prefix_names = prefixed(self.mod, self.tgt)
            except Exception as err:  # noqa: BLE001
                self.res.skips.append(f"relay.build prefix fails: {short_error(err)}")
        elif "before_fuse" in stages:
            self.res.skips.append(f"before_fuse stage not tried ({self.variant})")

    def family_steps_left_out(self) -> dict:
        """Pass name -> families, at a GPU target, for the steps of ``pipelines.int8()`` that do not
        run there (CPU int8 kernel steps, :meth:`Pipeline.for_family`; their kernels have no GPU
        schedule). Empty at CPU targets: every pass is tried there."""
        from tvm_ext import families
        from tvm_ext.core.pipelines import int8

        family = families.family(self.tgt)
        if family != "gpu":
            return {}
        return {st.name: st.families for stage in int8().stages for st in stage.steps if not st.applies_to(family)}

    def check_passes(self, passes, stages):
        """Every pass at every stage it is tried at: structure, then outputs when it rewrote. A pass
        that ``pipelines.int8()`` runs only at other target families is not tried (a skip)."""
        left_out = self.family_steps_left_out()
        for label in passes:
            make, where = self.factories[label]
            if label in left_out:
                self.res.skips.append(f"{label}: a step of {'/'.join(left_out[label])} targets only, not tried here")
                continue
            for stage in stages:
                base = self.mod if stage == "start" else self.pre
                if stage not in where or base is None:
                    continue
                out = self.structural(label, stage, make, base)
                if out is None:
                    continue
                self.res.rewrites[f"{label}@{stage}"] = 1
                if self.runnable:
                    steps = QDQ_STEPS if label == "QDQToInteger" else 0
                    self.compare(label, stage, [make()], stage, steps, rewritten=out)
                elif self.variant == "dynamic":
                    self.res.skips.append("rewrite of a dynamic graph not run (graph executor)")

    def check_pipeline(self):
        """``pipelines.int8()``: both stages' structure, and the build through ``tvm_ext.build``."""
        from tvm_ext import families
        from tvm_ext.core.pipelines import int8

        pl = int8().for_family(families.family(self.tgt))  # the steps tvm_ext.build runs at the target
        out = self.structural("int8()", "start", lambda: pl.start, self.mod)
        changed = out is not None
        qdq = out is not None and self.qdq_rewrites()
        out2 = None
        if self.pre is not None:
            out2 = self.structural("int8()", "before_fuse", lambda: pl.before_fuse, self.pre)
            changed |= out2 is not None
        if not changed:
            return
        self.res.rewrites["int8()"] = 1
        if self.runnable and out is None:  # start stage unchanged: the build is that of out2 (deduplicated)
            self.compare("int8()", "build", pl, "before_fuse", QDQ_STEPS if qdq else 0, rewritten=out2)
        elif self.runnable:
            self.compare("int8()", "build", pl, "before_fuse", QDQ_STEPS if qdq else 0)

    def qdq_rewrites(self) -> bool:
        """Whether ``QDQToInteger`` (approximate by design) rewrites the graph at ``start``: then the
        pipeline's outputs are compared within :data:`QDQ_STEPS` moved levels, whichever passes are
        tried on their own."""
        import tvm

        if any(k.startswith("QDQToInteger") for k in self.res.rewrites):
            return True
        make, _ = self.factories["QDQToInteger"]
        try:
            with self.tgt, tvm.transform.PassContext(opt_level=3):
                return not _same(make()(self.mod), self.mod)
        except Exception:  # noqa: BLE001  (the pass's own check reports its errors)
            return False

    def check_build(self):
        """``tvm_ext.build(mod)``'s outputs against the independent reference.

        An integer graph's reference is exact integer arithmetic: ``relay.build`` at plain ``llvm``
        for this host, whose int8 ops use no SIMD dot product (no ``vpmaddubsw``), run here, bit for
        bit. Stock ``relay.build`` at the target is compared with it too, and only counted
        (``stock_inexact``): without VNNI its pair sums saturate. A graph that computes in float is
        compared with stock ``relay.build`` at the target within the float tolerance (a generic
        build rounds float differently: no FMA).
        """
        ref, ok = self.checked_reference()
        if not ok:
            return
        if self.float_graph:  # aarch64: stock's requantize rounded once, as tvm_ext.build does (tvm_ext.arm.requantize)
            stock = self.build_and_run(self.masked, "relay.build fails", one_rounding=True)
            if stock is not None:
                self.res.compared += 1
                why = compare_outputs(ref, stock, True)
                if why and self.differs_from_exact_too(ref):
                    self.fail("build", "build", "mismatch", f"tvm_ext.build vs relay.build: {why}")
            return
        exact = self.build_and_run(EXACT_TARGET, "generic llvm build fails", here=True)
        if exact is None or ref is None:
            return
        self.res.compared += 1
        why = compare_outputs(exact, ref, float_graph=False)
        if why:
            self.fail("build", "build", "inexact", f"tvm_ext.build vs exact integer arithmetic (generic llvm): {why}")
        stock = self.build_and_run(self.masked, "relay.build fails")
        if stock is not None:
            self.res.stock_checked = True
            self.res.stock_inexact = compare_outputs(exact, stock, float_graph=False) is not None

    def differs_from_exact_too(self, ref) -> bool:
        """Whether a float graph's outputs that differ from stock ``relay.build`` at the target also
        differ from plain ``llvm``'s beyond the float tolerance. Stock's int8 convs saturate without
        VNNI where ``tvm_ext.build``'s do not, so a float graph holding int8 convs may differ from
        stock and still be right: plain ``llvm`` has no SIMD dot product to saturate (its float
        rounding differs, hence the tolerance)."""
        exact = self.build_and_run(EXACT_TARGET, "generic llvm build fails", here=True)
        return exact is None or compare_outputs(ref, exact, True) is not None

    def build_and_run(self, target, fails, here=False, one_rounding=False):
        """A plain ``relay.build`` of the graph at ``target``, run at the target (``here``: on this
        host) on the seeded inputs; None when it fails (``fails`` and the error in the skips) or is
        compiled only. ``one_rounding``: at aarch64, TVM's generic lowering of the fixed-point
        multiply (one rounding, as on x86) instead of its ``sqrdmulh`` + ``srshl`` (two)."""
        import contextlib

        import tvm
        from tvm import relay

        from tvm_ext.arm.requantize import generic_q_multiply_shift

        aarch64 = one_rounding and "aarch64" in str(tvm.target.Target(target).attrs.get("mtriple", ""))
        try:
            with tvm.transform.PassContext(opt_level=3), \
                    (generic_q_multiply_shift() if aarch64 else contextlib.nullcontext()):
                factory = relay.build(self.mod, target=target)
            self.res.builds += 1
            if self.not_run:
                return None
            return execution.run_factory(factory, self.cache["inputs"]) if here else self.outputs(factory)
        except Exception as err:  # noqa: BLE001
            self.res.skips.append(f"{fails}: {short_error(err)}")
            return None


def _actual_variant(mod, variant: str) -> str:
    """What ``main`` really contains (a spec's If/Let/closure may be dead code, left out of the graph)."""
    import tvm
    from tvm import relay

    from tvm_ext.passes._util import unsupported_construct

    main = mod["main"]
    if not unsupported_construct(main):
        return variant if variant in ("if", "let", "closure") else "control"
    for p in main.params:
        ty = p.checked_type
        if isinstance(ty, relay.TensorType) and not all(isinstance(d, tvm.tir.IntImm) for d in ty.shape):
            return "dynamic"
    return "static"


def check_spec(spec: Spec, **kw) -> GraphResult:
    """Build ``spec`` and run :func:`check_graph` on it (in this process); the build check runs on the
    specs whose seed ``kw["build_check_every"]`` (default :data:`BUILD_CHECK_EVERY`) divides."""
    try:
        mod = build_graph(spec)
    except GeneratorError as err:
        r = GraphResult(variant=spec.variant)
        r.skips.append(f"generator: {err}")
        return r
    kw = dict(kw)
    every = kw.pop("build_check_every", BUILD_CHECK_EVERY)
    if kw.get("build_check", True) and spec.seed % every:
        kw["build_check"] = False  # tvm_ext.build vs the independent reference: one graph in ``every``
    return check_graph(mod, variant=spec.variant, **kw)
