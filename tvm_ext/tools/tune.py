"""``tvm-ext tune``: tune a model's int8 convolutions and dense layers on this machine.

Design note
-----------
Sits on top of :func:`tvm_ext.build` (records what a build compiles) and writes what
:mod:`tvm_ext.x86.tuning` applies. Three stages, each measured, in this order, within a time budget:

1. **Channel blocking** (``ic_bn``/``oc_bn``, the ``NCHW{c}c`` layouts AlterOpLayout picks). A
   block size chosen per convolution would put a ``layout_transform`` kernel between every two
   convs that disagree, so one block ``B`` is chosen for the whole model: for each candidate
   (16, 32, 64; AVX2 also 8 for the data), the model is built with ``NCHW`` records asking for
   ``oc_bn = B`` and ``ic_bn = B`` (or the largest divisor of the channels that fits) and timed end
   to end against TVM's own rule. A candidate is kept only if the whole model got faster.
2. **Schedule knobs** of every ``NCHWc`` int8 conv the build compiles under that layout
   (``tile_ow`` x ``unroll_kw`` for 3x3/7x7, ``tile_ow`` x ``tile_oh`` for 1x1), each candidate
   compiled and timed alone (:func:`time_config`). The winner is timed again against TVM's rule,
   in alternation, and kept only if it beats it by 2 %. Then the winners are timed where they run
   (:func:`fused_kernel_ms`): the model built with them and without, each winner's kernels (the conv
   with the epilogue fused into it) timed in alternation by the debug executor; a winner that is not
   2 % faster there is dropped. A record is never slower than the untuned kernel as measured.
3. **Dense** layers with int8 inputs (TVM's x86 dense templates): a seeded sample of their
   configuration space, TVM's fallback included.

Everything is timed on this host, so the target must run here (:func:`tvm_ext.x86.isa.runs_on_host`).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from ..arm import tuning as arm_tuning
from .. import families
from ..x86 import tuning, int8_conv as x86_int8
from ..core.build import build
from ..x86.isa import isa_class, runs_on_host
from . import _depthwise_task
from ._fused_timing import build_with, fused_kernel_ms

#: The int8 conv templates whose workloads are recorded (x86 and aarch64).
_CONV_TASKS = tuning.CONV_TASKS + arm_tuning.CONV_TASKS

logger = logging.getLogger(__name__)

__all__ = ["Workloads", "TuneResult", "record_workloads", "time_config", "tune_workloads", "tune_model", "busy_note"]

#: Channel blocks tried for the whole model (oc_bn must be a multiple of 16 in TVM's template).
LAYOUT_BLOCKS = (16, 32, 64)


@dataclass
class Workloads:
    """The AutoTVM workloads one build queried."""

    layout: list = field(default_factory=list)  # NCHW int8 conv workloads (AlterOpLayout's query)
    conv: list = field(default_factory=list)  # NCHWc int8 conv workloads (what is compiled)
    dense: list = field(default_factory=list)  # int8 dense workloads
    depthwise: list = field(default_factory=list)  # NCHWc 8-bit depthwise conv workloads


@dataclass
class TuneResult:
    """What :func:`tune_model` did: records written, and what each stage measured."""

    target: str
    records: list  # AutoTVM record lines
    rows: list  # (kind, workload summary, untuned ms, tuned ms, config, workload)
    layout: str  # "TVM's rule" or "block B"
    layout_ms: dict  # candidate -> model ms
    model_ms_untuned: Optional[float] = None
    model_ms_tuned: Optional[float] = None
    seconds: float = 0.0
    budget_hit: bool = False

    def table(self) -> str:
        measured = ", ".join(f"{k}: {v:.2f}" for k, v in self.layout_ms.items())
        lines = [f"target: {self.target}",
                 f"layout: {self.layout}" + (f"  (model ms per candidate: {measured})" if measured else ""),
                 "| kind | workload | untuned ms | tuned ms | tuned / untuned | config |", "|---|---|---|---|---|---|"]
        for kind, desc, base, best, cfg, _wl in self.rows:
            lines.append(f"| {kind} | {desc} | {base:.4f} | {best:.4f} | {best / base:.2f} | {cfg} |")
        if self.rows:
            b, t = sum(r[2] for r in self.rows), sum(r[3] for r in self.rows)
            lines.append(f"| **sum** | {len(self.rows)} workloads | {b:.3f} | {t:.3f} | {t / b:.2f} | |")
        if self.model_ms_untuned and self.model_ms_tuned:
            lines.append(f"model: untuned {self.model_ms_untuned:.2f} ms, tuned {self.model_ms_tuned:.2f} ms "
                         f"({self.model_ms_tuned / self.model_ms_untuned:.2f}x)")
        lines.append(f"{len(self.records)} records in {self.seconds:.0f} s"
                     + (" (budget reached)" if self.budget_hit else ""))
        return "\n".join(lines)


def busy_note(load: Optional[float] = None, cores: Optional[int] = None,
              threads: Optional[int] = None) -> Optional[str]:
    """A warning when other work would share the cores the tuner times on, else ``None``.

    Busy: the 1-minute load average plus TVM's runtime threads exceed the logical cores. (Measured:
    one build beside a one-thread tuner on a 2-core machine made it record configs as 2x faster that
    are 10 % slower timed quietly.) Arguments default to this machine's values.
    """
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # not available on this platform
            return None
    cores = cores or os.cpu_count() or 1
    if threads is None:
        import tvm

        threads = int(tvm.get_global_func("runtime.NumThreads")())
    if load + threads <= cores:
        return None
    return (f"the machine is busy (load average {load:.1f} on {cores} cores, TVM times with {threads} "
            f"thread{'s' if threads > 1 else ''}): timings will be noisy and records may favour slower "
            "configurations; tune while nothing else runs")


def _is_int8(wl) -> bool:
    tensors = [a for a in wl[1:] if isinstance(a, tuple) and a and a[0] == "TENSOR"]
    return len(tensors) >= 2 and tensors[0][2] in ("uint8", "int8") and tensors[1][2] == "int8"


def record_workloads(mod, params=None, target=None, passes=(), records=()) -> Workloads:
    """The int8 conv and dense workloads ``tvm_ext.build(mod, target, params, passes)`` queries.

    ``records`` are answered from (so the ``NCHWc`` workloads of a chosen layout are recorded).
    """
    from tvm import autotvm

    answers = {}
    for inp, _ in records:
        answers[inp.task.workload] = inp.config
    found = Workloads()

    class _Recorder(autotvm.task.DispatchContext):
        def _query_inside(self, target, workload):
            if workload:
                if workload[0] in _CONV_TASKS:
                    bucket = found.conv if len(workload[1][1]) == 5 else found.layout
                    if workload not in bucket:
                        bucket.append(workload)
                elif workload[0] in tuning.DENSE_TASKS and _is_int8(workload) and workload not in found.dense:
                    found.dense.append(workload)
                elif (workload[0] == tuning.DEPTHWISE_TASK and len(workload[1][1]) == 5 and _is_int8(workload)
                      and workload not in found.depthwise):
                    found.depthwise.append(workload)
            return answers.get(workload)  # None: fall through to TVM's own configuration

        def update(self, target, workload, cfg):  # AlterOpLayout registers its NCHWc configs here
            answers[workload] = cfg

    with _Recorder():
        build(mod, target=target, params=params, passes=passes, kernels=True, tuned=False)
    return found


def time_config(task, cfg, target, number: int = 10, repeat: int = 3) -> float:
    """Median seconds of one run of ``task`` built with ``cfg`` (inside ``x86_int8.kernels()``)."""
    import tvm

    with x86_int8.kernels(), target:
        sch, bufs = task.instantiate(cfg)
        func = tvm.build(sch, bufs, target=target)
    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    arrs = []
    for b in bufs:
        shape = [int(d) for d in b.shape]
        arr = rng.integers(0, 100, shape).astype(b.dtype) if "int" in b.dtype else np.zeros(shape, b.dtype)
        arrs.append(tvm.nd.array(arr, dev))
    timer = func.time_evaluator(func.entry_name, dev, number=number, repeat=repeat,
                                min_repeat_ms=5 if number > 1 else 0)
    return float(np.median(timer(*arrs).results))


def _fallback(task):  # pylint: disable=unused-argument
    from tvm import autotvm

    return autotvm.task.space.FallbackConfigEntity()  # the template applies TVM's rule to it


def _conv_candidates(task) -> list:
    """One config per distinct value of the layout-free knobs, with tile_ic/oc = the compiled layout's
    blocks: the data's last axis, and the kernel's axis 5 (``OIHW[ic_bn/4]i[oc_bn]o4i`` for a conv,
    ``[C/b, 1, kh, kw, 1, b]`` for a depthwise conv)."""
    wl = task.workload
    ic_bn, oc_bn = int(wl[1][1][4]), int(wl[2][1][5])
    seen, out = set(), []
    space = task.config_space
    for i in range(len(space)):
        cfg = space.get(i)
        ents = cfg._entity_map  # pylint: disable=protected-access
        if ents["tile_ic"].size[-1] != ic_bn or ents["tile_oc"].size[-1] != oc_bn:
            continue
        key = tuple((n, str(v)) for n, v in ents.items() if n not in ("tile_ic", "tile_oc"))
        if key not in seen:
            seen.add(key)
            out.append(cfg)
    return out


def _paired(task, cfg_a, cfg_b, target, number, repeat, rounds: int = 3):
    """Median seconds of two configs timed in alternation (load on the machine hits both)."""
    a, b = [], []
    for _ in range(rounds):
        a.append(time_config(task, cfg_a, target, number, repeat))
        b.append(time_config(task, cfg_b, target, number, repeat))
    return float(np.median(a)), float(np.median(b))


def _dense_candidates(task, n: int = 16, seed: int = 0) -> list:
    space = task.config_space
    idx = np.random.default_rng(seed).permutation(len(space))[:n]
    return [space.get(int(i)) for i in idx]


def _kind(wl) -> str:
    return "conv" if wl[0] in _CONV_TASKS else "depthwise" if wl[0] == tuning.DEPTHWISE_TASK else "dense"


def _describe(wl) -> str:
    if _kind(wl) != "dense":
        return (f"{_kind(wl)} data {list(wl[1][1])} {wl[1][2]} kernel {list(wl[2][1])} stride {list(wl[3])} "
                f"pad {list(wl[4])}")
    return f"{wl[0]} data {list(wl[1][1])} weight {list(wl[2][1])}"


def _knobs(cfg) -> str:
    ents = getattr(cfg, "_entity_map", {})
    return ", ".join(f"{k}={v}" for k, v in ents.items()) or "TVM's rule"


def tune_workloads(workloads, target, *, deadline: float = float("inf"), progress=None, number: int = 10,
                   repeat: int = 3):
    """Time TVM's rule and every candidate of each workload; records of the winners.

    Returns ``(record lines, rows, budget_hit)``; a workload whose best is TVM's own rule gets no
    record. Stops (keeping what it has) when ``time.monotonic()`` passes ``deadline``.
    """
    from tvm import autotvm

    lines, rows = [], []
    for n, wl in enumerate(workloads):
        if time.monotonic() > deadline:
            return lines, rows, True
        try:
            task = _depthwise_task.create(wl, target)
            cands = _dense_candidates(task) if _kind(wl) == "dense" else _conv_candidates(task)
            base = time_config(task, _fallback(task), target, number, repeat)
        except Exception as err:  # noqa: BLE001  TVM's template cannot describe it (e.g. the output
            # block 8 of x86_int8's narrow_channel_blocks: AutoTVM's int8 conv space admits only
            # multiples of 16): say so, go on
            logger.warning("not tuned (TVM's rule kept): %s: %s: %s", _describe(wl), type(err).__name__,
                           (str(err).strip().splitlines() or [""])[-1])
            continue
        best = (base, None)
        for cfg in cands:
            if time.monotonic() > deadline:
                break
            try:
                # one run first: a candidate far slower than the best so far is not worth timing
                if time_config(task, cfg, target, 1, 1) > 2 * best[0]:
                    continue
                cost = time_config(task, cfg, target, number, repeat)
            except Exception as err:  # an invalid point of TVM's space: skip it, say why
                logger.debug("config %s of %s failed: %s", cfg, wl[0], err)
                continue
            if cost < best[0]:
                best = (cost, cfg)
        if best[1] is not None:
            # confirm against TVM's rule, timed in alternation: one noisy baseline must not pick a loser
            base, cost = _paired(task, _fallback(task), best[1], target, number, repeat)
            best = (cost, best[1]) if cost < base * 0.98 else (base, None)
        if best[1] is not None:
            inp = autotvm.MeasureInput(target, task, best[1])
            lines.append(autotvm.record.encode(inp, autotvm.MeasureResult((best[0],), 0, 0.0, time.time())))
        knobs = _knobs(best[1]) if best[1] else "TVM's rule"
        rows.append((_kind(wl), _describe(wl), base * 1e3, best[0] * 1e3, knobs, wl))
        if progress:
            progress(n + 1, len(workloads), rows[-1])
    return lines, rows, False


def _layout_records(layout_wls, target, block: int) -> list:
    """``NCHW`` records asking AlterOpLayout for ``oc_bn = block`` and ``ic_bn <= block``."""
    from tvm import autotvm

    out = []
    for wl in layout_wls:
        cin, cout = int(wl[1][1][1]), int(wl[2][1][0])
        if cout % block:
            continue
        task = autotvm.task.create(wl[0], args=wl[1:], target=target)
        ic_bn = max((d for d in range(4, min(block, cin) + 1, 4) if cin % d == 0), default=None)
        if ic_bn is None:
            continue
        space = task.config_space
        for i in range(len(space)):
            cfg = space.get(i)
            ents = cfg._entity_map  # pylint: disable=protected-access
            if ents["tile_ic"].size[-1] == ic_bn and ents["tile_oc"].size[-1] == block:
                out.append((autotvm.MeasureInput(target, task, cfg),
                            autotvm.MeasureResult((1.0,), 0, 0.0, time.time())))
                break
    return out


def _model_ms(mod, params, target, passes, records, repeat: int = 20) -> float:
    import tvm
    from tvm.contrib import graph_executor

    lib = build_with(mod, params, target, passes, records)
    gm = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    rng = np.random.default_rng(0)
    bound = set(params or {})
    for p in mod["main"].params:
        if p.name_hint in bound:
            continue
        t = p.checked_type if hasattr(p, "checked_type_") and p.checked_type_ is not None else p.type_annotation
        shape, dtype = [int(d) for d in t.shape], t.dtype
        arr = rng.integers(0, 100, shape).astype(dtype) if "int" in dtype else rng.standard_normal(shape).astype(dtype)
        gm.set_input(p.name_hint, arr)
    timer = gm.module.time_evaluator("run", tvm.cpu(), number=3, repeat=repeat, min_repeat_ms=20)
    return float(np.median(timer().results)) * 1e3


def _confirm_in_model(mod, params, tgt, passes, layout_recs, lines, rows, say, number, repeat):
    """The records of ``lines`` that make their kernels in the model at least 2 % faster
    (:func:`fused_kernel_ms`), and ``rows`` with the others back at TVM's rule."""
    from tvm import autotvm

    recs = [autotvm.record.decode(line) for line in lines]
    untuned = build_with(mod, params, tgt, passes, list(layout_recs))
    tuned = build_with(mod, params, tgt, passes, list(layout_recs) + recs)
    wls = [inp.task.workload for inp, _ in recs]
    ms = fused_kernel_ms({"untuned": untuned, "tuned": tuned}, wls, number=number, repeat=repeat)
    keep, dropped = [], {}
    for line, wl in zip(lines, wls):
        t = ms.get(wl)
        if t is None:  # no kernel of the model reads its tensors: keep what the kernel alone measured
            say(f"in the model: no kernel reads the tensors of {_describe(wl)}; its record is kept as timed alone")
            keep.append(line)
        elif t["tuned"] <= 0.98 * t["untuned"]:
            keep.append(line)
            say(f"in the model: {_describe(wl)}: {t['untuned']:.4f} -> {t['tuned']:.4f} ms, kept")
        else:
            dropped[wl] = t
            say(f"in the model: {_describe(wl)}: {t['untuned']:.4f} -> {t['tuned']:.4f} ms, dropped "
                "(not 2 % faster with its epilogue fused)")
    out_rows = []
    for row in rows:
        kind, desc, base, _best, _cfg, wl = row
        if wl in dropped:
            t = dropped[wl]
            row = (kind, desc, base, base, f"TVM's rule (the tuned config took {t['tuned'] / t['untuned']:.2f}x "
                                            "its time in the model)", wl)
        out_rows.append(row)
    return keep, out_rows


def tune_model(mod, params=None, target=None, passes=(), *, budget_s: float = 600.0,
               layouts: bool = True, progress: Optional[Callable] = None, number: int = 10,
               repeat: int = 3, skip=()) -> TuneResult:
    """Tune ``mod``'s int8 convs, 8-bit depthwise convs and denses as ``tvm_ext.build(mod, target, params,
    passes)`` compiles them with tvm-ext's x86 kernel policy (``kernels=True``), the only builds tuned records
    apply to.

    Parameters
    ----------
    mod, params, target, passes
        As for :func:`tvm_ext.build` (target default: the host CPU).
    budget_s : float
        Wall-clock budget; what was tuned when it runs out is kept.
    layouts : bool
        Run the channel-blocking stage (three or four full-model builds).
    progress : callable, optional
        ``progress(message)`` for each step.
    skip : collection of workloads
        Already tuned (e.g. by an earlier model of the same run): not tuned again.

    Raises
    ------
    ValueError
        The target does not run on this host, or is not an x86 LLVM target.
    """
    from ..x86.target import build_target

    t0 = time.monotonic()
    deadline = t0 + budget_s
    tgt = build_target(target)
    if tgt.kind.name != "llvm" or isa_class(tgt) == "other":
        raise ValueError(f"tvm_ext.tools.tune: '{tgt}' is not an x86 CPU target; only x86 int8 templates are tuned")
    if not runs_on_host(tgt):
        from ..x86.isa import missing_on_host

        raise ValueError(f"tvm_ext.tools.tune: '{tgt}' uses {','.join(missing_on_host(tgt))}, which this CPU lacks; "
                         "tuning times code on this machine")
    say = progress or (lambda msg: logger.info("%s", msg))
    busy = busy_note()
    if busy:
        logger.warning("tvm_ext.tools.tune: %s", busy)
        if progress:
            progress(f"warning: {busy}")
    say(f"recording the int8 workloads tvm_ext.build compiles for {tgt}")
    found = record_workloads(mod, params, tgt, passes)
    t_build = time.monotonic() - t0
    say(f"{len(found.layout)} conv layouts, {len(found.conv)} conv schedules, {len(found.depthwise)} depthwise, "
        f"{len(found.dense)} dense (one build: {t_build:.0f} s)")

    layout_recs: list = []
    layout_ms: dict = {}
    chosen = "TVM's rule"
    base_ms = None
    # the layout stage costs a model build per candidate, the baseline and a re-recording; it runs
    # only when that leaves half of the budget for the kernels
    layout_cost = (len(LAYOUT_BLOCKS) + 2) * t_build * 1.2
    if layouts and found.layout and layout_cost < (deadline - time.monotonic()) / 2:
        base_ms = _model_ms(mod, params, tgt, passes, [])
        layout_ms[chosen] = base_ms
        say(f"model with TVM's layout rule: {base_ms:.2f} ms")
        best = base_ms
        for block in LAYOUT_BLOCKS:
            recs = _layout_records(found.layout, tgt, block)
            if not recs:
                continue
            ms = _model_ms(mod, params, tgt, passes, recs)
            layout_ms[f"block {block}"] = ms
            say(f"model with channel block {block}: {ms:.2f} ms")
            if ms < best * 0.98:  # a layout must win by more than timing noise
                best, chosen, layout_recs = ms, f"block {block}", recs
        if layout_recs:
            found = record_workloads(mod, params, tgt, passes, records=layout_recs)
    elif layouts and found.layout:
        chosen = "TVM's rule (layout stage skipped: budget)"
        say(f"skipping the layout stage: it needs about {layout_cost:.0f} s of builds, "
            f"{deadline - time.monotonic():.0f} s left")

    def step(i, n, row):
        say(f"[{i}/{n}] {row[0]} {row[1]}: {row[2]:.4f} -> {row[3]:.4f} ms ({row[4]})")

    # keep two builds' time for the check in the model, and one for the final check when the layout
    # stage measured a baseline
    reserve = t_build * 1.2 * (3 if base_ms is not None else 2)
    every = found.conv + found.depthwise + found.dense
    todo = [w for w in every if w not in set(skip)]
    if len(todo) < len(every):
        say(f"{len(every) - len(todo)} workloads already tuned in this run")
    lines, rows, hit = tune_workloads(todo, tgt, deadline=deadline - reserve, progress=step,
                                      number=number, repeat=repeat)
    if lines:
        say(f"timing {len(lines)} tuned workload{'s' if len(lines) > 1 else ''} in the model, with and without "
            "the records (two builds)")
        lines, rows = _confirm_in_model(mod, params, tgt, passes, layout_recs, lines, rows, say, number, repeat)
    from tvm import autotvm

    all_lines = [autotvm.record.encode(i, r) for i, r in layout_recs] + lines
    result = TuneResult(str(tgt), all_lines, rows, chosen, layout_ms, budget_hit=hit)
    if base_ms is not None:  # the whole model, untuned vs tuned, as the user will build it
        recs = [autotvm.record.decode(line) for line in all_lines]
        result.model_ms_untuned = base_ms
        result.model_ms_tuned = _model_ms(mod, params, tgt, passes, recs) if recs else base_ms
    result.seconds = time.monotonic() - t0
    return result


def write_records(lines, target, path=None) -> str:
    """Merge ``lines`` into the user's records for ``target`` (newer lines replace older ones)."""
    from pathlib import Path

    from tvm import autotvm

    from ..x86.target import build_target

    tgt = build_target(target)
    out = Path(path) if path else families.for_target(tgt).records_path(tgt)
    out.parent.mkdir(parents=True, exist_ok=True)
    keep = {}
    if out.is_file():
        for line in out.read_text(encoding="utf-8").splitlines():
            if line.strip():
                keep[autotvm.record.decode(line)[0].task.workload] = line
    for line in lines:
        keep[autotvm.record.decode(line)[0].task.workload] = line
    tmp = out.with_suffix(".tmp")
    tmp.write_text("\n".join(keep.values()) + "\n", encoding="utf-8")
    tmp.replace(out)
    return str(out)
