"""Tune the int8 conv schedules of the zoo's int8 ResNet-50s for this CPU; write tvm_ext/tuned/.

    python benchmarks/tune_int8.py [--small] [--variants qoperator,qdq,relay]

Records the NCHWc int8 conv workloads that ``tvm_ext.build(..., passes=pipelines.int8())``
compiles for the host target (VNNI kept, see tvm_ext.x86_int8), times every candidate schedule of
each (tvm_ext.tuning), and writes the best as AutoTVM records to
``tvm_ext/tuned/x86_int8_<mcpu>.log``, which ``tvm_ext.build`` applies on the same CPU. Prints a
table: per workload, TVM's untuned rule vs the best candidate.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="small zoo models (smoke run)")
    ap.add_argument("--variants", default="qoperator,qdq,relay")
    ap.add_argument("--out", default=None, help="records file (default: tvm_ext/tuned/x86_int8_<mcpu>.log)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("autotvm").setLevel(logging.ERROR)

    from tvm import autotvm

    from tvm_ext import bench, pipelines, tuning, x86_int8, zoo
    from tvm_ext.target import build_target

    target = build_target()
    print(f"target: {target}", flush=True)
    workloads = []
    for key in args.variants.split(","):
        name = bench.VARIANTS[key.strip()][0]
        m = zoo.load(name, small=args.small)
        t0 = time.perf_counter()
        for wl in tuning.record_workloads(m.mod, m.params, target, pipelines.int8()):
            if wl not in workloads:
                workloads.append(wl)
        print(f"{name}: workloads recorded in {time.perf_counter() - t0:.0f} s; {len(workloads)} distinct so far",
              flush=True)

    def untuned_ms(wl):
        task = autotvm.task.create(tuning.TASK, args=wl[1:], target=target)
        with x86_int8.kernels():
            return tuning.time_config(task, autotvm.task.space.FallbackConfigEntity(), target) * 1e3

    rows = []

    def progress(i, n, wl, best):
        base = untuned_ms(wl)
        knobs = {k: str(v) for k, v in best[1]._entity_map.items() if k not in ("tile_ic", "tile_oc")}
        rows.append((wl, base, best[0] * 1e3, knobs))
        print(f"[{i}/{n}] data {wl[1][1]} kernel {wl[2][1][2:4]} stride {wl[3]} pad {wl[4]}: "
              f"untuned {base:.3f} ms, tuned {best[0] * 1e3:.3f} ms {knobs}", flush=True)

    lines = tuning.tune(workloads, target, progress=progress)
    out = args.out or str(tuning.records_path(target))
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    tot_b = sum(r[1] for r in rows)
    tot_t = sum(r[2] for r in rows)
    print(f"\nwrote {len(lines)} records to {out}")
    print(f"sum over distinct workloads: untuned {tot_b:.2f} ms, tuned {tot_t:.2f} ms ({tot_t / tot_b:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
