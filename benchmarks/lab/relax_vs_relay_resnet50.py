"""Float ResNet-50 (zoo): Relay + tvm-ext's tables versus Relax + the same tables.

Builds the zoo's ``resnet50_fp32`` four ways on the host target, in this process, one after the
other: Relay stock (``tvm_ext.build``), Relay + ``FuseByPattern(GENERIC)``, Relax stock
(``tvm_ext.relax.build``: FoldConstant, LegalizeOps, FuseOps, FuseTIR) and Relax +
``tvm_ext.relax.FuseByPattern(GENERIC)`` (the same table, translated). Prints one Markdown table:
kernels, anchors, tensors/MB crossing kernels by dtype, build time, latency (median and IQR of
``--repeat`` timed runs after one warm-up, ``time_evaluator`` with number=1) and the max abs
difference of the logits from Relay stock on one seeded input.

    .venv/bin/python benchmarks/lab/relax_vs_relay_resnet50.py            # full size (minutes)
    .venv/bin/python benchmarks/lab/relax_vs_relay_resnet50.py --small    # smoke run
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import numpy as np


def _latency(timer_result) -> tuple:
    a = np.asarray(timer_result.results) * 1e3
    return float(np.median(a)), float(np.percentile(a, 25)), float(np.percentile(a, 75))


def _crossing(report) -> str:
    by = ", ".join(f"{d} {b / 1e6:.1f}" for d, b in sorted(report.crossing.nbytes.items()))
    return f"{report.crossing.total_bytes / 1e6:.1f} MB ({by})"


def run(small: bool, repeat: int, relax_repeat: int, threads: int) -> list:
    os.environ["TVM_NUM_THREADS"] = str(threads)
    import tvm
    from tvm import relax
    from tvm.contrib import graph_executor

    import tvm_ext
    import tvm_ext.relax as tr
    from tvm_ext.tools import zoo
    from tvm_ext.passes import FuseByPattern
    from tvm_ext.patterns import GENERIC
    from tvm_ext.x86.target import host_target

    target = host_target()
    dev = tvm.cpu()
    path = zoo.onnx_path("resnet50_fp32", small=small)
    x = zoo.sample_input("resnet50_fp32", small=small)
    zm = zoo.load("resnet50_fp32", small=small)
    rmod = tr.from_onnx(path)
    rows, ref = [], None
    for ir, label, make in (
        ("relay", "stock", lambda: []),
        ("relay", "+ tables (FuseByPattern(GENERIC))", lambda: [FuseByPattern(GENERIC)]),
        ("relax", "stock", lambda: []),
        ("relax", "+ tables (relax.FuseByPattern(GENERIC))", lambda: [tr.FuseByPattern(GENERIC)]),
    ):
        passes = make()
        logging.info("building %s %s ...", ir, label)
        t0 = time.perf_counter()
        if ir == "relay":
            lib = tvm_ext.build(zm.mod, target=target, params=zm.params, passes=passes)
            build_s = time.perf_counter() - t0
            report = lib.kernel_report
            gm = graph_executor.GraphModule(lib["default"](dev))
            gm.set_input(zm.input_name, tvm.nd.array(x))
            gm.run()
            out = gm.get_output(0).numpy()
            timer = gm.module.time_evaluator("run", dev, number=1, repeat=repeat, min_repeat_ms=0)
        else:
            ex = tr.build(rmod, target=target, passes=passes)
            build_s = time.perf_counter() - t0
            report = ex.kernel_report
            vm = relax.VirtualMachine(ex, dev)
            arg = tvm.nd.array(x)
            out = vm["main"](arg)
            out = (out if isinstance(out, tvm.nd.NDArray) else out[0]).numpy()
            vm.set_input("main", arg)
            timer = vm.time_evaluator("invoke_stateful", dev, number=1, repeat=relax_repeat, min_repeat_ms=0)
        if ref is None:
            ref = out
        timer_args = ("main",) if ir == "relax" else ()
        timer(*timer_args)  # warm-up
        med, q1, q3 = _latency(timer(*timer_args))
        matched = dict(getattr(passes[0], "last_counts", {})) if (passes and ir == "relax") else None
        rows.append({
            "ir": ir, "pipeline": label, "kernels": report.num_kernels, "anchors": report.num_anchor_kernels,
            "tensors_crossing": report.crossing.total_count, "bytes_crossing": report.crossing.to_dict()["bytes"],
            "crossing_text": _crossing(report), "build_s": round(build_s, 1),
            "latency_ms": [round(med, 2), round(q1, 2), round(q3, 2)],
            "max_abs_vs_relay_stock": float(np.max(np.abs(out - ref))), "relax_matches": matched,
        })
        logging.info("%s %s: %s, %.2f ms", ir, label, report.summary(), med)
    return rows


def conv_probe(repeat: int, relax_repeat: int) -> dict:
    """One ResNet-50 stage-1 3x3 conv (64->64, 56x56, + bias + relu), Relay vs Relax, same target.

    Isolates what limits Relax: the same op compiled by Relay (TOPI's x86 conv2d schedule, after
    AlterOpLayout to NCHWc) and by Relax (LegalizeOps' TOPI compute, no schedule).
    """
    import tvm
    from tvm import relax, relay
    from tvm.contrib import graph_executor
    from tvm.script import relax as R  # noqa: F401

    import tvm_ext
    import tvm_ext.relax as tr
    from tvm_ext.x86.target import host_target

    target, dev = host_target(), tvm.cpu()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 64, 56, 56)).astype("float32")
    w = (rng.standard_normal((64, 64, 3, 3)) * 0.05).astype("float32")
    b = rng.standard_normal((64,)).astype("float32")
    xv = relay.var("x", shape=x.shape)
    body = relay.nn.relu(relay.nn.bias_add(
        relay.nn.conv2d(xv, relay.const(w), padding=(1, 1), channels=64, kernel_size=(3, 3)), relay.const(b)))
    lib = tvm_ext.build(tvm.IRModule.from_expr(relay.Function([xv], body)), target=target)
    gm = graph_executor.GraphModule(lib["default"](dev))
    gm.set_input("x", tvm.nd.array(x))
    gm.run()
    ref = gm.get_output(0).numpy()
    t = gm.module.time_evaluator("run", dev, number=1, repeat=repeat)
    t()
    relay_ms = _latency(t())[0]

    bb = relax.BlockBuilder()
    xr = relax.Var("x", relax.TensorStructInfo(x.shape, "float32"))
    with bb.function("main", [xr]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(xr, relax.const(w), padding=[1, 1, 1, 1]))
            o = bb.emit_output(relax.op.nn.relu(relax.op.add(c, relax.const(b.reshape(1, 64, 1, 1)))))
        bb.emit_func_output(o)
    ex = tr.build(bb.get(), target=target)
    vm = relax.VirtualMachine(ex, dev)
    arg = tvm.nd.array(x)
    out = vm["main"](arg).numpy()
    vm.set_input("main", arg)
    t = vm.time_evaluator("invoke_stateful", dev, number=1, repeat=relax_repeat)
    t("main")
    relax_ms = _latency(t("main"))[0]
    return {"relay_ms": relay_ms, "relax_ms": relax_ms, "relay_kernels": lib.kernel_report.num_kernels,
            "relax_kernels": ex.kernel_report.num_kernels, "max_abs": float(np.max(np.abs(out - ref))), "out": out}


def tuned_conv_probe(trials: int, relax_repeat: int, work_dir: str) -> dict:
    """The probe conv on Relax after ``trials`` MetaSchedule trials (replay-trace, no cost model).

    Shows whether schedules (not the IR or the fusion) are what Relax lacks on CPU.
    """
    import tvm
    from tvm import meta_schedule as ms
    from tvm import relax, tir

    import tvm_ext.relax as tr
    from tvm_ext.x86.target import host_target

    target = tvm.target.Target(f"{host_target()} -num-cores {os.cpu_count()}")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 64, 56, 56)).astype("float32")
    w = (rng.standard_normal((64, 64, 3, 3)) * 0.05).astype("float32")
    b = rng.standard_normal((1, 64, 1, 1)).astype("float32")
    bb = relax.BlockBuilder()
    xr = relax.Var("x", relax.TensorStructInfo(x.shape, "float32"))
    with bb.function("main", [xr]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(xr, relax.const(w), padding=[1, 1, 1, 1]))
            o = bb.emit_output(relax.op.nn.relu(relax.op.add(c, relax.const(b))))
        bb.emit_func_output(o)
    lowered, _ = tr.lower(bb.get())
    tir_mod = tvm.IRModule({gv: f for gv, f in lowered.functions.items() if isinstance(f, tir.PrimFunc)})
    t0 = time.perf_counter()
    db = ms.tir_integration.tune_tir(tir_mod, target, work_dir, max_trials_global=trials, num_trials_per_iter=16,
                                     strategy="replay-trace", cost_model="random", num_tuning_cores=os.cpu_count())
    tune_s = time.perf_counter() - t0
    with db, target, tvm.transform.PassContext(opt_level=3):
        applied = relax.transform.MetaScheduleApplyDatabase(work_dir)(lowered)
    ex = relax.build(applied, target=target)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    arg = tvm.nd.array(x)
    out = vm["main"](arg).numpy()
    vm.set_input("main", arg)
    t = vm.time_evaluator("invoke_stateful", tvm.cpu(), number=1, repeat=relax_repeat)
    t("main")
    return {"trials": trials, "tune_s": round(tune_s, 1), "relax_tuned_ms": _latency(t("main"))[0], "out": out}


def render(rows, meta) -> str:
    base = next(r for r in rows if r["ir"] == "relay" and "tables" in r["pipeline"])
    lines = [
        f"- model: zoo resnet50_fp32{' (small)' if meta['small'] else ''}; target `{meta['target']}`; "
        f"{meta['threads']} TVM threads; {meta['date']}",
        f"- latency: median (IQR) of {meta['repeat']} (Relay) / {meta['relax_repeat']} (Relax) timed runs "
        "after one warm-up",
        "",
        "| IR | pipeline | kernels | anchors | tensors crossing | MB crossing | build s | latency ms "
        "| vs Relay + tables | max abs vs Relay stock |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        med, q1, q3 = r["latency_ms"]
        lines.append(
            f"| {r['ir']} | {r['pipeline']} | {r['kernels']} | {r['anchors']} | {r['tensors_crossing']} | "
            f"{r['crossing_text']} | {r['build_s']} | {med:.2f} ({q1:.2f}–{q3:.2f}) | "
            f"{med / base['latency_ms'][0]:.2f}× | {r['max_abs_vs_relay_stock']:.2e} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="small zoo variant (smoke run)")
    ap.add_argument("--repeat", type=int, default=30, help="timed runs for Relay (default 30)")
    ap.add_argument("--relax-repeat", type=int, default=5,
                    help="timed runs for Relax (default 5: its kernels are slow)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tune-trials", type=int, default=0,
                    help="also tune the probe conv on Relax with this many MetaSchedule trials (0: skip)")
    ap.add_argument("--probe-only", action="store_true", help="only the one-conv probes (no ResNet-50 builds)")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for name in ("autotvm", "te_compiler", "tvm_ext.relax.FuseByPattern", "tvm_ext.passes.FuseByPattern"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from tvm_ext.x86.target import host_target

    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    rows = [] if args.probe_only else run(args.small, args.repeat, args.relax_repeat, args.threads)
    probe = conv_probe(args.repeat, args.relax_repeat)
    probe_out = probe.pop("out")
    tuned = None
    if args.tune_trials:
        import tempfile

        with tempfile.TemporaryDirectory() as work_dir:
            tuned = tuned_conv_probe(args.tune_trials, args.repeat, work_dir)
        diff = float(np.max(np.abs(tuned.pop("out") - probe_out)))
        tuned["max_abs_vs_untuned"] = diff
    meta = {"small": args.small, "target": str(host_target()), "threads": args.threads, "repeat": args.repeat,
            "relax_repeat": args.relax_repeat, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if rows:
        print(render(rows, meta))
        print()
    print(f"One 3x3 conv + bias + relu (64->64, 56x56), same target: Relay {probe['relay_ms']:.2f} ms "
          f"({probe['relay_kernels']} kernel), Relax {probe['relax_ms']:.2f} ms ({probe['relax_kernels']} kernel), "
          f"{probe['relax_ms'] / probe['relay_ms']:.1f}x; max abs diff {probe['max_abs']:.1e}")
    if tuned:
        print(f"The same conv on Relax after {tuned['trials']} MetaSchedule trials ({tuned['tune_s']} s of tuning): "
              f"{tuned['relax_tuned_ms']:.2f} ms ({tuned['relax_tuned_ms'] / probe['relay_ms']:.2f}x Relay); "
              f"max abs diff from untuned {tuned['max_abs_vs_untuned']:.1e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows, "conv_probe": probe, "tuned_conv_probe": tuned}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
