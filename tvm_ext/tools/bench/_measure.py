"""What the benchmark measures: engines, their interleaved timing after a quiet wait, and the
comparison of their outputs (see :mod:`tvm_ext.tools.bench`)."""
from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

logger = logging.getLogger(__name__)


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


def ort_engine(path, input_name, threads, package_dir=None, exact: bool = False):
    """ONNX Runtime in this process, or, with ``package_dir`` (:func:`tvm_ext.tools.ort_isa.masked_package`),
    in a child process importing onnxruntime from there; ``exact``: on its exact int8 path
    (engine ``onnxruntime_exact``, :func:`tvm_ext.tools.ort_isa.session_options`)."""
    name = "onnxruntime_exact" if exact else "onnxruntime"
    if exact:
        from ..ort_isa import exact_path_model

        path = exact_path_model(path)
    if package_dir is not None:
        from ..ort_isa import ChildSession

        child = ChildSession(path, input_name, threads, package_dir, exact=exact)
        return Engine(name, child.run, timer=child.time, close=child.close, pid=child.pid)
    import onnxruntime as ort

    from ..ort_isa import session_options

    so = session_options(ort, threads, exact)
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    def call(x):
        return sess.run(None, {input_name: x})[0]

    return Engine(name, call)


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


def compare_outputs(outputs: dict, integer_graph: bool) -> dict:
    """The benchmark's numerics: ``outputs`` maps an engine name (``tvm``, ``tvm_ext``, ``onnxruntime``,
    ``exact``, ...) to its outputs on the same inputs; returns the comparisons present (max differences,
    top-1 agreement, bit-exactness, outputs differing from the exact reference) as a JSON-able dict."""
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
        for name in ("tvm", "tvm_same", "tvm_ext", "tvm_ext_untuned", "tvm_ext_saturating", "onnxruntime_exact"):
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
