"""The fuzzer's runner: graphs checked in child processes, failures shrunk and written, the table.

:func:`run` draws specs (:func:`.grammar.generate`) and sends them to worker processes
(``multiprocessing`` spawn, :func:`run_specs`); a worker that dies (segfault, LLVM abort) or hangs
is reported as a crash of that spec and replaced, and the run goes on. Failing specs are shrunk
(:func:`shrink`, each candidate again in a child) and written to ``<out>/<id>.json`` (spec,
failure, Relay text of the module) for :func:`load_failure` / regression tests. :class:`Summary`
adds up the results; :func:`main` is ``python -m tvm_ext.testing.fuzz`` (``make fuzz``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from .builder import build_graph, short_error
from .execution import NUM_INPUTS, compiled_only_reason, foreign_arch
from .grammar import STEP_KINDS, Spec, generate
from .oracle import BUILD_CHECK_EVERY, PASSES, Failure, GraphResult, check_spec

logger = logging.getLogger(__name__)

__all__ = ["run", "specs_with_step", "run_specs", "check_spec_isolated", "shrink", "write_failure", "load_failure",
           "Summary", "main"]

#: Seconds a worker may spend on one graph before it is killed and reported as a hang.
GRAPH_TIMEOUT = 300

_DESCRIPTION = "Differential fuzzing of tvm-ext's passes, pipelines.int8() and tvm_ext.build."


# ------------------------------------------------------------------------------------------------
def _worker_main(conn, kw):  # pragma: no cover  (runs in the child)
    os.environ.setdefault("TOPHUB_LOCATION", "NONE")
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("autotvm").setLevel(logging.ERROR)
    logging.getLogger("te_compiler").setLevel(logging.ERROR)
    import tvm_ext  # noqa: F401

    kw = dict(kw)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        key, spec_json = job
        if kw.get("selftest_abort_seed") == spec_json.get("seed"):
            os.abort()  # lets the tests check that a dying worker is reported, not fatal
        try:
            res = check_spec(Spec.from_json(spec_json), **{k: v for k, v in kw.items() if not k.startswith("selftest")})
        except Exception as err:  # noqa: BLE001  (an oracle bug: reported, not fatal)
            res = GraphResult(variant=spec_json.get("variant", "static"))
            res.failures.append(Failure("oracle", "-", "oracle_error",
                                        f"{type(err).__name__}: {short_error(err)} | {traceback.format_exc()[-600:]}"))
        conn.send((key, dataclasses.asdict(res)))


class _Worker:
    def __init__(self, kw):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, kw), daemon=True)
        self.proc.start()
        child.close()
        self.job = None
        self.started = 0.0

    def send(self, key, spec: Spec):
        self.job = (key, spec)
        self.started = time.time()
        self.conn.send((key, spec.to_json()))

    def stop(self):
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def _from_dict(d: dict) -> GraphResult:
    d = dict(d)
    d["failures"] = [Failure(**f) for f in d["failures"]]
    return GraphResult(**d)


def run_specs(specs, *, workers: int = 2, kw=None, progress=None, timeout: float = GRAPH_TIMEOUT):
    """Check ``specs`` in ``workers`` child processes; yields ``(index, spec, GraphResult)``.

    A child that dies (segfault, abort) or exceeds ``timeout`` seconds on a graph yields a
    ``crash`` / ``hang`` failure for that graph and is replaced; the other graphs go on.
    """
    from multiprocessing.connection import wait

    kw = kw or {}
    specs = list(specs)
    todo = list(range(len(specs)))[::-1]
    pool = [_Worker(kw) for _ in range(max(1, min(workers, len(specs))))]
    try:
        for w in pool:
            if todo:
                i = todo.pop()
                w.send(i, specs[i])
        while any(w.job for w in pool):
            busy = [w for w in pool if w.job]
            ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout=5)
            for w in busy:
                done = None
                if w.conn in ready or w.conn.poll():
                    try:
                        key, d = w.conn.recv()
                        done = (key, _from_dict(d))
                    except (EOFError, OSError):
                        done = None
                if done is None and (not w.proc.is_alive() or time.time() - w.started > timeout):
                    key, spec = w.job
                    hang = w.proc.is_alive()
                    if hang:
                        w.proc.kill()
                    w.proc.join()
                    res = GraphResult(variant=spec.variant)
                    kind = "hang" if hang else "crash"
                    res.failures.append(Failure("process", "-", kind,
                                                f"worker {'hung' if hang else 'died'} (exit code {w.proc.exitcode})"))
                    done = (key, res)
                    idx = pool.index(w)
                    pool[idx] = w = _Worker(kw)
                if done is not None:
                    key, res = done
                    w.job = None
                    yield key, specs[key], res
                    if progress:
                        progress()
                    if todo:
                        i = todo.pop()
                        w.send(i, specs[i])
    finally:
        for w in pool:
            w.stop()


def check_spec_isolated(spec: Spec, kw=None, timeout: float = GRAPH_TIMEOUT) -> GraphResult:
    """:func:`check_spec` in a child process (a crash becomes a ``crash`` failure)."""
    for _, _, res in run_specs([spec], workers=1, kw=kw, timeout=timeout):
        return res
    raise RuntimeError("no result")


def _candidates(spec: Spec):
    steps = list(spec.steps)
    if spec.variant != "static":
        yield dataclasses.replace(spec, variant="static")
    if spec.extra_output != -1:
        yield dataclasses.replace(spec, extra_output=-1)
    for i in range(len(steps) - 1, -1, -1):  # drop one step
        yield dataclasses.replace(spec, steps=tuple(steps[:i] + steps[i + 1:]))
    for i in range(len(steps)):  # re-point operands at the input / previous value
        s = list(steps[i])
        if len(s) > 1 and isinstance(s[1], int) and s[1] != 0:
            for new in (0, i):
                if new != s[1]:
                    t = s.copy()
                    t[1] = new
                    yield dataclasses.replace(spec, steps=tuple(steps[:i] + [tuple(t)] + steps[i + 1:]))
    for name, small in (("channels", 2), ("height", 2), ("width", 2), ("seed", 0), ("layout", "NCHW")):
        if getattr(spec, name) != small:
            yield dataclasses.replace(spec, **{name: small})


def shrink(spec: Spec, still_fails, budget: int = 80) -> Spec:
    """Greedy delta debugging over :class:`Spec`: the smallest spec for which ``still_fails`` holds.

    ``still_fails(spec) -> bool`` is evaluated at most ``budget`` times (run it in a child process
    when the failure is a crash). Steps are dropped, operands re-pointed, shapes and the seed made
    small, until no candidate fails.
    """
    best = spec
    tries = 0
    improved = True
    while improved and tries < budget:
        improved = False
        for cand in _candidates(best):
            if tries >= budget:
                break
            tries += 1
            if still_fails(cand):
                best = cand
                improved = True
                break
    return best


def write_failure(out_dir, name: str, spec: Spec, failure: Failure, original: Spec | None = None,
                  target: str | None = None) -> Path:
    """Write ``<out_dir>/<name>.json``: the spec, the failure, the module's Relay text and the
    target the oracle compiled for (None: the host CPU)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        text = build_graph(spec).astext()
    except Exception as err:  # noqa: BLE001
        text = f"(does not build: {err})"
    doc = {
        "failure": dataclasses.asdict(failure),
        "spec": spec.to_json(),
        "original_spec": original.to_json() if original else None,
        "target": target,
        "relay": text,
    }
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def load_failure(path):
    """``(spec, module, failure dict)`` of a file written by the fuzzer (for regression tests); the
    failure dict's ``"target"`` is the target it was found at (None: the host CPU)."""
    doc = json.loads(Path(path).read_text())
    spec = Spec.from_json(doc["spec"])
    return spec, build_graph(spec), {**doc["failure"], "target": doc.get("target")}


@dataclass
class Summary:
    """Totals of a fuzzing run."""

    graphs: int = 0
    variants: dict = field(default_factory=dict)
    rewrites: dict = field(default_factory=dict)
    builds: int = 0
    compared: int = 0
    failures: dict = field(default_factory=dict)  # signature -> count
    examples: dict = field(default_factory=dict)  # signature -> (spec, Failure)
    skips: dict = field(default_factory=dict)
    seconds: float = 0.0
    files: list = field(default_factory=list)
    stock_checked: int = 0  # integer graphs whose stock relay.build at the target was compared with exact arithmetic
    stock_inexact: int = 0  # ... of them, graphs where it misses exact integer arithmetic
    target: str = ""  # what the graphs were compiled for ("" : the host CPU)
    build_check_every: int = BUILD_CHECK_EVERY  # the build check runs on one spec seed in this many
    execution: str = ""  # where the builds ran, or why they were compiled only

    def add(self, spec: Spec, res: GraphResult):
        self.graphs += 1
        self.variants[res.variant] = self.variants.get(res.variant, 0) + 1
        for k in res.rewrites:
            self.rewrites[k] = self.rewrites.get(k, 0) + 1
        self.builds += res.builds
        self.compared += res.compared
        self.stock_checked += int(res.stock_checked)
        self.stock_inexact += int(res.stock_inexact)
        for f in res.failures:
            sig = f.signature()
            self.failures[sig] = self.failures.get(sig, 0) + 1
            self.examples.setdefault(sig, (spec, f))
        for s in set(_skip_key(r) for r in res.skips):
            self.skips[s] = self.skips.get(s, 0) + 1

    def table(self) -> str:
        rate = self.graphs / self.seconds if self.seconds else 0.0
        lines = [
            f"target: {self.target or 'host CPU'}",
            f"executed: {self.execution or 'on this host'}",
            f"graphs tried: {self.graphs} in {self.seconds:.0f} s ({rate:.2f} graphs/s); "
            + "variants: " + ", ".join(f"{k} {v}" for k, v in sorted(self.variants.items())),
            f"TVM builds: {self.builds}; output comparisons: {self.compared} (x {NUM_INPUTS} inputs)",
            f"integer graphs where stock relay.build at the target differs from exact integer arithmetic: "
            f"{self.stock_inexact} of the {self.stock_checked} given the build check (one spec seed in "
            f"{self.build_check_every}; tvm_ext.build must not: failure kind 'inexact')",
            "",
            "| pass | stage | graphs rewritten |",
            "|---|---|---|",
        ]
        for label in PASSES:
            for stage in ("start", "before_fuse"):
                n = self.rewrites.get(f"{label}@{stage}")
                if n is not None:
                    lines.append(f"| {label} | {stage} | {n} |")
        lines.append(f"| int8() pipeline | both | {self.rewrites.get('int8()', 0)} |")
        lines += ["", "| failures (subject, stage, kind) | graphs |", "|---|---|"]
        if not self.failures:
            lines.append("| none (0 mismatches, 0 crashes) | 0 |")
        for sig, n in sorted(self.failures.items()):
            lines.append(f"| {' / '.join(sig)} | {n} |")
        lines += ["", "| skipped (reason) | graphs |", "|---|---|"]
        for reason, n in sorted(self.skips.items(), key=lambda kv: -kv[1]):
            lines.append(f"| {reason} | {n} |")
        if self.files:
            lines += ["", "failing graphs (shrunk):"] + [f"  {p}" for p in self.files]
        return "\n".join(lines)


def _skip_key(reason: str) -> str:
    """Group skip reasons (drop the variable tail after the first colon, keep the pass name)."""
    head = reason.split(":", 1)[0]
    return head[:120]


def _bad_target(target: str) -> str | None:
    """None for a target the oracle can compile for, else why not."""
    import tvm

    from tvm_ext.core import tvm_bugs

    try:
        tgt = tvm.target.Target(target)
        tvm_bugs.check_target(target)
    except Exception as err:  # noqa: BLE001  (TVMError, ValueError of tvm_bugs)
        return short_error(err)
    if tgt.kind.name not in ("llvm", "opencl"):
        return f"a {tgt.kind.name} target (the oracle runs CPU (llvm) and opencl targets only)"
    return None


def _target_kind(target) -> str:
    """The kind of ``target`` (``llvm`` for None, the host CPU)."""
    import tvm

    return "llvm" if target is None else tvm.target.Target(str(target)).kind.name


#: Graphs drawn per graph asked for when only graphs with a given step kind are wanted.
_DRAWS_PER_GRAPH = 100


def specs_with_step(n: int, seed: int, max_steps: int, kind: str) -> list:
    """The first ``n`` graphs of seed ``seed``'s stream that have a step of ``kind`` (a motif rare in the
    stream, e.g. ``sliced_conv``), drawn from ``_DRAWS_PER_GRAPH * n`` graphs; ValueError when fewer have one."""
    specs = [s for s in generate(_DRAWS_PER_GRAPH * n, seed, max_steps) if any(st[0] == kind for st in s.steps)]
    if len(specs) < n:
        raise ValueError(f"fuzz: only {len(specs)} of {_DRAWS_PER_GRAPH * n} graphs of seed {seed} have a "
                         f"{kind!r} step; ask for fewer")
    return specs[:n]


def run(n: int = 10000, seed: int = 0, workers: int = 2, out_dir="fuzz-failures", max_steps: int = 6,
        shrink_failures: bool = True, kw=None, progress: bool = True, with_step: str | None = None,
        graph_timeout: float = GRAPH_TIMEOUT) -> Summary:
    """Generate ``n`` graphs (only graphs with a step of kind ``with_step`` when given), check them in
    child processes, shrink and write the failures. A graph that takes longer than ``graph_timeout``
    seconds fails as a hang.

    ``kw`` goes to :func:`check_graph` (``target``: what every graph is compiled for; ``rpc``: the
    TVM RPC server that runs the builds for a target of another architecture, default the qemu-user
    server of :func:`where_builds_run`)."""
    t0 = time.time()
    specs = specs_with_step(n, seed, max_steps, with_step) if with_step else generate(n, seed, max_steps)
    with where_builds_run(kw) as (kw, where):
        summary = Summary(target=str(kw.get("target") or ""), execution=where,
                          build_check_every=kw.get("build_check_every", BUILD_CHECK_EVERY))
        _check_all(summary, specs, workers, out_dir, shrink_failures, kw, progress, t0, graph_timeout)
    summary.seconds = time.time() - t0
    return summary


@contextlib.contextmanager
def where_builds_run(kw=None):
    """``(kw, where)``: :func:`check_graph`'s arguments with the RPC server that runs the builds,
    and where they run, for the table.

    A target of another architecture without ``rpc`` in ``kw`` runs on an aarch64 TVM RPC server
    under qemu-user that this context starts and stops (:func:`tvm_ext.testing.aarch64.rpc_server`),
    when ``make arm-env`` has set one up; else its builds are compiled only, and ``where`` says
    what is missing.
    """
    from tvm_ext.testing import aarch64

    kw = dict(kw or {})
    target, rpc = kw.get("target"), kw.get("rpc")
    triple = foreign_arch(target)
    why = compiled_only_reason(target, rpc) if not triple or rpc else None
    if why:
        yield kw, f"compiled only: {why}"
    elif rpc:
        yield kw, f"on the TVM RPC server at {rpc}"
    elif not triple and _target_kind(target) == "opencl":
        from tvm_ext.gpu import opencl

        yield kw, f"on {opencl.describe()} (PoCL: correctness, not GPU speed), in each worker"
    elif not triple:
        yield kw, "on this host"
    elif not triple.startswith(("aarch64", "arm64")):
        yield kw, f"compiled only: {triple} code, and no RPC server to run it on (--rpc HOST:PORT)"
    elif aarch64.missing():
        yield kw, f"compiled only: {triple} code, and no RPC server to run it on: {aarch64.missing()}"
    else:
        with aarch64.rpc_server() as server:
            kw["rpc"] = server.address
            yield kw, f"on the aarch64 TVM RPC server under qemu-user at {server.address} (tvm_ext.testing.aarch64)"


def _check_all(summary, specs, workers, out_dir, shrink_failures, kw, progress, t0, timeout=GRAPH_TIMEOUT):
    """Check ``specs`` in workers, add them to ``summary``, shrink and write the failures."""
    done = [0]
    last = [0.0]

    def tick():
        done[0] += 1
        if progress and (time.time() - last[0] > 2 or done[0] == len(specs)):
            last[0] = time.time()
            el = time.time() - t0
            eta = el / done[0] * (len(specs) - done[0])
            bar = "#" * int(30 * done[0] / len(specs))
            nfail = sum(summary.failures.values())
            sys.stderr.write(f"\rfuzz [{bar:<30}] {done[0]}/{len(specs)} {el:.0f}s eta {eta:.0f}s failures {nfail} ")
            sys.stderr.flush()

    for _, spec, res in run_specs(specs, workers=workers, kw=kw, progress=tick, timeout=timeout):
        summary.add(spec, res)
        for f in res.failures:
            logger.warning("graph failed: %s %s %s: %s", f.subject, f.stage, f.kind, f.message)
    if progress:
        sys.stderr.write("\n")
    for n_sig, (sig, (spec, failure)) in enumerate(sorted(summary.examples.items())):
        small = spec
        if shrink_failures:
            def still(cand, sig=sig):
                r = check_spec_isolated(cand, kw, timeout)
                return any(f.signature() == sig for f in r.failures)
            small = shrink(spec, still)
        name = "_".join(x.replace("(", "_").replace(")", "").replace(".", "_") for x in sig) + f"_{n_sig}"
        summary.files.append(str(write_failure(out_dir, name, small, failure, spec, kw.get("target"))))


def main(argv=None) -> int:
    """``python -m tvm_ext.testing.fuzz [-n N] [--seed S] [--workers W] [--out DIR] [--target T] [--rpc HOST:PORT]``."""
    import argparse

    from tvm_ext.tools.rpc import parse_address

    ap = argparse.ArgumentParser(prog="python -m tvm_ext.testing.fuzz", description=_DESCRIPTION)
    ap.add_argument("-n", type=int, default=10000, help="graphs to try (default 10000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2, help="child processes (default 2)")
    ap.add_argument("--out", default="fuzz-failures", help="folder for shrunk failing graphs")
    ap.add_argument("--max-steps", type=int, default=6)
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("--graph-timeout", type=float, default=GRAPH_TIMEOUT, metavar="SECONDS",
                    help=f"a graph that takes longer fails as a hang (default {GRAPH_TIMEOUT}; raise it under "
                         "qemu or on a loaded host)")
    ap.add_argument("--with-step", default=None, choices=STEP_KINDS, metavar="KIND",
                    help="only graphs that have a step of this kind, e.g. sliced_conv (the first N of the seed's "
                         f"stream); kinds: {', '.join(STEP_KINDS)}")
    ap.add_argument("--no-build-check", action="store_true",
                    help="skip checking tvm_ext.build against exact integer arithmetic (integer graphs) or "
                         "relay.build (float graphs)")
    ap.add_argument("--build-check-every", type=int, default=BUILD_CHECK_EVERY, metavar="K",
                    help=f"run that check on the graphs whose spec seed K divides (default {BUILD_CHECK_EVERY}; "
                         "1: every graph)")
    ap.add_argument("--target", default=None,
                    help='TVM target the passes, prefix and builds are for (default: the host CPU), e.g. '
                         '"llvm -mcpu=x86-64-v3", or "opencl" (run on OpenCL device 0, `make gpu-env`); code this '
                         'host cannot execute is compiled, not run, unless an RPC server runs it')
    ap.add_argument("--rpc", default=None, metavar="HOST:PORT",
                    help="TVM RPC server that runs the builds for a --target of another architecture (a board); "
                         "default for aarch64: a server under qemu-user when `make arm-env` has set it up, "
                         "else compiled only")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    if args.target:
        bad = _bad_target(args.target)
        if bad:
            ap.error(f"--target {args.target!r}: {bad}")
        why = None if foreign_arch(args.target) else compiled_only_reason(args.target)
        if why:
            sys.stderr.write(f"--target {args.target}: {why}\n")
    if args.build_check_every < 1:
        ap.error("--build-check-every: must be a positive number of graphs")
    if args.graph_timeout <= 0:
        ap.error("--graph-timeout: must be a positive number of seconds")
    if args.rpc:
        try:
            parse_address(args.rpc)
        except ValueError as err:
            ap.error(f"--rpc: {err}")
        if not (args.target and foreign_arch(args.target)):
            ap.error("--rpc runs the builds for a --target of another architecture (e.g. aarch64)")
    kw = {"build_check": not args.no_build_check, "build_check_every": args.build_check_every, "target": args.target,
          "rpc": args.rpc}
    summary = run(args.n, args.seed, args.workers, args.out, args.max_steps, not args.no_shrink, kw,
                  with_step=args.with_step, graph_timeout=args.graph_timeout)
    print(summary.table())
    return 1 if summary.failures else 0
