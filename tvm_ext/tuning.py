"""Tuned schedules for x86 int8 convolutions, shipped per CPU and applied by ``tvm_ext.build``.

Design note
-----------
TVM's untuned x86 int8 conv (``conv2d_NCHWc_int8.x86``) picks its schedule knobs by a fixed rule:
``tile_ow`` = the largest divisor of the output width up to 31, ``unroll_kw`` off, ``tile_oh`` 1.
Measured on Zen 4 with VNNI, other values run 5-20 % faster on several ResNet-50 convolutions
(1x1, 64->256 channels at 56x56: 0.19 -> 0.15 ms). This module

* **records** the int8 conv workloads a build compiles (:func:`record_workloads`: the ``NCHWc``
  workloads *after* tvm-ext's passes, so ``FoldPadIntoConv``'s folded padding is part of the key);
* **tunes** each by exhaustive search over the knobs that change the generated code for a fixed
  data layout (``tile_ow`` x ``unroll_kw`` for 3x3/7x7, ``tile_ow`` x ``tile_oh`` for 1x1;
  ``tile_ic``/``tile_oc`` are fixed by the layout AlterOpLayout already chose), timing each
  candidate with TVM's ``time_evaluator`` (:func:`tune`);
* writes AutoTVM records to ``tvm_ext/tuned/x86_int8_<mcpu>[_novnni].log``, shipped with the
  package, and :func:`apply` makes ``tvm_ext.build`` use the records whose target has the same
  ``-mcpu`` and VNNI setting as the build (other CPUs: TVM's rule, unchanged).

Layouts are not tuned: AlterOpLayout's own query (the ``NCHW`` workload) is not in the records,
so the data layout stays TVM's. Tuned records win over the configuration AlterOpLayout registers
for the ``NCHWc`` workload (same layout, TVM's schedule rule). Schedules do not change results:
integer accumulation is exact for any loop order, and the benchmark checks tvm-ext bit for bit
against stock TVM at the same target.

Regenerate with ``python benchmarks/tune_int8.py`` (about 10 minutes on 2 cores).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["TASK", "record_workloads", "time_config", "tune", "records_path", "load_records", "apply"]

TASK = "conv2d_NCHWc_int8.x86"
TUNED_DIR = Path(__file__).parent / "tuned"


def _target_key(target) -> tuple[str, bool]:
    from . import x86_int8

    return str(target.attrs.get("mcpu", "")), x86_int8.vnni_ready(target)


def records_path(target) -> Path:
    """Where the records for ``target``'s CPU (and VNNI setting) live."""
    mcpu, vnni = _target_key(target)
    return TUNED_DIR / f"x86_int8_{mcpu or 'generic'}{'' if vnni else '_novnni'}.log"


def record_workloads(mod, params=None, target=None, passes=()) -> list:
    """The ``NCHWc`` int8 conv workloads ``tvm_ext.build(mod, target, params, passes)`` compiles."""
    from tvm import autotvm

    from .build import build

    class _Recorder(autotvm.task.DispatchContext):
        def __init__(self):
            super().__init__()
            self.workloads: list = []

        def _query_inside(self, target, workload):
            if workload and workload[0] == TASK and len(workload[1][1]) == 5 and workload not in self.workloads:
                self.workloads.append(workload)
            return None  # fall through: TVM's own configuration

        def update(self, target, workload, cfg):  # AlterOpLayout registers its NCHWc configs here
            self._old_ctx.update(target, workload, cfg)

    rec = _Recorder()
    with rec:
        build(mod, target=target, params=params, passes=passes, tuned=False)
    return rec.workloads


def _candidates(task) -> list:
    """One config per distinct value of the layout-independent knobs, with tile_ic/oc = layout."""
    wl = task.workload
    ic_bn = int(wl[1][1][4])
    oc_bn = int(wl[2][1][5])  # kernel OIHW[ic_bn/4]i[oc_bn]o4i
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


def time_config(task, cfg, target, number: int = 20, repeat: int = 5) -> float:
    """Median seconds of one run of ``task`` built with ``cfg`` (call inside ``x86_int8.kernels()``)."""
    import numpy as np
    import tvm

    with target:
        sch, bufs = task.instantiate(cfg)
        func = tvm.build(sch, bufs, target=target)
    dev = tvm.cpu()
    arrs = [tvm.nd.array(np.zeros([int(d) for d in b.shape], b.dtype), dev) for b in bufs]
    return float(np.median(func.time_evaluator(func.entry_name, dev, number=number, repeat=repeat)(*arrs).results))


def tune(workloads, target, number: int = 20, repeat: int = 5, progress=None) -> list[str]:
    """Time every candidate of every workload; the best of each as AutoTVM record lines."""
    from tvm import autotvm

    from . import x86_int8

    lines = []
    with x86_int8.kernels():
        for n, wl in enumerate(workloads):
            task = autotvm.task.create(TASK, args=wl[1:], target=target)
            best = None
            for cfg in _candidates(task):
                cost = time_config(task, cfg, target, number, repeat)
                if best is None or cost < best[0]:
                    best = (cost, cfg)
            if best is None:
                logger.warning("no candidate configuration for %s", wl)
                continue
            inp = autotvm.MeasureInput(target, task, best[1])
            res = autotvm.MeasureResult((best[0],), 0, 0.0, time.time())
            lines.append(autotvm.record.encode(inp, res))
            if progress:
                progress(n + 1, len(workloads), wl, best)
    return lines


def load_records(target) -> list:
    """The shipped records for ``target`` (empty when none match its CPU and VNNI setting)."""
    from tvm import autotvm

    path = records_path(target)
    if not path.is_file():
        return []
    key = _target_key(target)
    return [(inp, res) for inp, res in autotvm.record.load_from_file(str(path)) if _target_key(inp.target) == key]


def _tuned_first(records):
    """An ApplyHistoryBest whose records win over configurations registered with ``update``."""
    from tvm import autotvm

    class _TunedFirst(autotvm.task.ApplyHistoryBest):
        def _query_inside(self, target, workload):
            for k in target.keys:
                hit = self.best_by_targetkey.get((k, workload))
                if hit is not None:
                    return hit[0].config
            return super()._query_inside(target, workload)

    return _TunedFirst(records)


def apply(target):
    """A context manager applying the shipped records for ``target``, or a no-op one."""
    import contextlib

    recs = load_records(target) if target.kind.name == "llvm" else []
    if not recs:
        return contextlib.nullcontext()
    logger.debug("applying %d tuned int8 conv schedules from %s", len(recs), records_path(target))
    return _tuned_first(recs)
