"""The real models' target matrix: kernels, bytes crossing kernels, crashes, numerics, per variant.

For each real zoo variant (``<model>_int8_<qoperator|qdq>[_s8s8][_perchannel]``) this builds *stock*
(plain ``relay.build`` at the VNNI-masked host target) and *tvm-ext* (``pipelines.int8()`` at its own
target), each in its own child process with the benchmark's build job
(:func:`tvm_ext.tools.bench.run_builds`): a segfault is a table cell. Then both builds and ONNX
Runtime run on the benchmark's inputs and the benchmark's numerics are computed
(:func:`tvm_ext.tools.bench.compare_outputs`). **No latency**: structure and numerics only, checked
against per-variant targets (tvm-ext kernels <= stock, no crash, no int32 crossing, float crossing
only on purpose, bytes <= 0.5x stock, <= 2 output steps from ONNX Runtime, classifier top-1 equal).
The targets, the stock fallback and the options: docs/real-models.md, "How real_matrix.py works".

Usage::

    nice -n 10 .venv/bin/python benchmarks/lab/real_matrix.py [--variants a,b,...] [--out DIR] [--resume]
    .venv/bin/python benchmarks/lab/real_matrix.py --variants a,b --stock-from DIR/matrix.json --out DIR2
    nice -n 10 .venv/bin/python benchmarks/lab/real_matrix.py --numerics onnxruntime \
        --stock-from DIR0/matrix.json --out DIR
    .venv/bin/python benchmarks/lab/real_matrix.py --merge A/matrix.json,B/matrix.json --out DIR

Writes ``DIR/matrix.json`` (after every variant) and ``DIR/matrix.md``; progress through logging.
"""
from __future__ import annotations

import argparse
import collections
import datetime as _dt
import json
import logging
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

logger = logging.getLogger("real_matrix")

#: The variants measured without ``--variants``, cheap builds first: every quantization setting of
#: the PP-OCR classifier, then a sample of the detectors' (each of their builds takes minutes).
DEFAULT_VARIANTS = (
    "ppocr_cls_v2_int8_qoperator", "ppocr_cls_v2_int8_qdq",
    "ppocr_cls_v2_int8_qoperator_s8s8", "ppocr_cls_v2_int8_qdq_s8s8",
    "ppocr_cls_v2_int8_qoperator_perchannel", "ppocr_cls_v2_int8_qdq_perchannel",
    "ppocr_cls_v2_int8_qoperator_s8s8_perchannel", "ppocr_cls_v2_int8_qdq_s8s8_perchannel",
    "ppocr_det_v4_int8_qdq", "ppocr_det_v4_int8_qoperator",
    "yolov8n_int8_qoperator",
    "yolov8n_int8_qdq_s8s8", "yolov8n_int8_qdq_perchannel",
)
NUM_INPUTS = 8
MAX_STEPS = 2.0
MAX_BYTES_RATIO = 0.5


# --- child processes ---------------------------------------------------------------------------
def _child_build(job: dict) -> None:
    """Build entry of a child: the benchmark's build job, plus ``tvm_nopass`` (stock fallback)."""
    from tvm_ext.tools import bench

    if job["pipeline"] != "tvm_nopass":
        return bench.job_main(job)
    out = Path(job["dir"]) / "tvm_nopass.result.json"
    try:
        import tvm
        from tvm import relay

        from tvm_ext.core.build import build

        logging.basicConfig(level=job.get("log_level", logging.WARNING))
        v = bench.load_variant(job["key"], job["small"], job["model_path"])
        t0 = time.perf_counter()
        fac = build(v["mod"], target=tvm.target.Target(job["target"]), params=v["params"], passes=(),
                    allow_vnni=False, tuned=False)
        res = {"build_s": time.perf_counter() - t0, "report": fac.kernel_report.to_dict(), "passes": None}
        d = Path(job["dir"])
        fac.get_lib().export_library(str(d / "tvm_nopass.so"))
        (d / "tvm_nopass.json").write_text(fac.get_graph_json())
        (d / "tvm_nopass.params").write_bytes(relay.save_param_dict(fac.get_params()))
        res.update(lib=str(d / "tvm_nopass.so"), graph=str(d / "tvm_nopass.json"), params=str(d / "tvm_nopass.params"))
    except Exception as err:
        logging.getLogger(__name__).exception("tvm_nopass build failed")
        res = {"error": bench.error_line(err), "error_detail": str(err)[:4000]}
    out.write_text(json.dumps(res, default=str))


def _child_numerics(job: dict) -> None:
    """Numerics entry of a child: every built engine and ONNX Runtime on the benchmark's inputs."""
    from tvm_ext.tools import bench, zoo_real

    out = Path(job["out"])
    try:
        outputs, errors = {}, {}
        xs = zoo_real.images(job["key"], job["n"], seed=1000)
        engines = [bench.LoadedBuild(b).engine(name, job["input_name"]) for name, b in job["built"].items()]
        engines.append(bench.ort_engine(job["onnx_path"], job["input_name"], threads=1))
        for e in engines:
            try:
                outputs[e.name] = [e.call(x) for x in xs]
            except Exception as err:
                errors[e.name] = bench.error_line(err)
        res = bench.compare_outputs(outputs, integer_graph=None)
        res["run_errors"] = errors
    except Exception as err:
        res = {"error": f"{type(err).__name__}: {err}"[:500]}
    out.write_text(json.dumps(res, default=str))


def _run_child(target, job: dict, result_file: Path) -> dict:
    """Run ``target(job)`` in a spawned child; its JSON result, or the crash it died of."""
    from tvm_ext.tools import bench

    result_file.unlink(missing_ok=True)
    p = mp.get_context("spawn").Process(target=target, args=(job,))
    p.start()
    p.join()
    if result_file.is_file():
        return json.loads(result_file.read_text())
    return {"error": bench.crash_text(p.exitcode)}


# --- one variant -------------------------------------------------------------------------------
def _kernel_ops(report: dict) -> collections.Counter:
    return collections.Counter(" ".join(k["ops"]) or k["func_name"] for k in report["kernels"])


def _kernel_structure(report: dict) -> collections.Counter:
    """Kernels by their non-elementwise ops: what a numerics option may not change (its arithmetic may)."""
    from tvm_ext.core.report import op_pattern

    return collections.Counter(" ".join(o for o in k["ops"] if op_pattern(o) > 1) or "(elementwise only)"
                               for k in report["kernels"])


def _wide_int_bytes(report: dict) -> int:
    return sum(b for d, b in report["crossing"]["bytes"].items()
               if d.startswith(("int", "uint")) and d not in ("int8", "uint8"))


def _summary(report: dict) -> dict:
    return {"kernels": report["num_kernels"], "anchors": report["num_anchor_kernels"],
            "crossing_bytes": report["crossing"]["bytes"], "crossing_total": report["crossing"]["total_bytes"],
            "wide_int_bytes": _wide_int_bytes(report),
            "int_crossings": report.get("int_crossings"), "float_crossings": report.get("float_crossings")}


def measure(key: str, *, workdir: Path, n_inputs: int = NUM_INPUTS, stock_target=None, ext_target=None,
            stock_from: dict | None = None, numerics: str = "tvm") -> dict:
    """Build stock and tvm-ext for one variant (child processes), run numerics, check the targets.

    ``stock_from``: this variant's result of an earlier run; its stock build and stock numerics are
    kept (stock TVM does not change with tvm-ext's passes) and only tvm-ext is built again.
    ``numerics``: :func:`tvm_ext.core.pipelines.int8`'s option for the tvm-ext build; when it is not
    ``"tvm"``, the earlier run's tvm-ext build (``stock_from``) is kept as ``int8_default``.
    """
    from tvm_ext.tools import bench, zoo
    from tvm_ext.x86.target import build_target, host_target

    stock_target = str(stock_target or host_target())
    ext_target = str(ext_target or build_target(None))
    t0 = time.perf_counter()
    onnx_path = zoo.onnx_path(key)  # fetches / quantizes on first use (in this process)
    v = bench.load_variant(key, False, None, import_relay=False)
    real = bench.real_variant(v)
    vdir = workdir / key
    vdir.mkdir(parents=True, exist_ok=True)
    res = {"variant": key, "real": real, "onnx": str(onnx_path), "stock_target": stock_target,
           "ext_target": ext_target, "builds": {}, "numerics_option": numerics}
    pipes = (("tvm", stock_target), ("tvm_ext", ext_target)) if stock_from is None else (("tvm_ext", ext_target),)
    jobs = [dict(key=key, small=False, model_path=None, target=t, pipeline=p, dir=str(vdir), tuned=True,
                 log_level=logging.WARNING, **({"numerics": numerics} if p == "tvm_ext" else {}))
            for p, t in pipes]
    logger.info("%s: building %s (child processes)", key, " and ".join(p for p, _ in pipes))
    built = bench.run_builds(jobs, parallel=True, _child=_child_build)
    if stock_from is not None:
        res["stock_kept_from"] = stock_from.get("measured_at", "an earlier run")
        res["stock_relay_build_error"] = stock_from.get("stock_relay_build_error")
        res["builds"].update({n: b for n, b in stock_from["builds"].items() if n != "tvm_ext"})
        stock_name = stock_from["stock"]
        if numerics != "tvm" and "tvm_ext" in stock_from["builds"]:  # the default pipeline's build
            res["builds"]["int8_default"] = stock_from["builds"]["tvm_ext"]
    elif "error" in built["tvm"]:
        logger.warning("%s: stock relay.build failed (%s); stock = tvm_ext.build without passes, VNNI masked",
                       key, built["tvm"]["error"])
        res["stock_relay_build_error"] = built["tvm"]["error"]
        job = dict(jobs[0], pipeline="tvm_nopass")
        built["tvm_nopass"] = _run_child(_child_build, job, vdir / "tvm_nopass.result.json")
    for name, b in built.items():
        res["builds"][name] = ({"error": b["error"]} if "error" in b else
                               {"build_s": b["build_s"], **_summary(b["report"]), "passes": b.get("passes"),
                                "report": b["report"]})
    if stock_from is None:
        stock_name = "tvm" if "error" not in built["tvm"] else "tvm_nopass"
    res["stock"] = stock_name
    ok = {n: b for n, b in built.items() if "error" not in b}
    if ok:
        logger.info("%s: numerics on %d inputs (child process)", key, n_inputs)
        engines = {("tvm" if n == stock_name else n): b for n, b in ok.items() if n in (stock_name, "tvm_ext")}
        job = dict(key=key, n=n_inputs, input_name=v["input_name"], onnx_path=str(onnx_path), built=engines,
                   out=str(vdir / "numerics.json"))
        num = _run_child(_child_numerics, job, vdir / "numerics.json")
        step = (real or {}).get("output_step")
        if step:
            for k in [k for k in num if k.endswith("_max_abs")]:
                num[k.replace("_max_abs", "_max_steps")] = num[k] / step
        if stock_from is not None:  # stock's numerics from the earlier run (same inputs)
            num.update({k: v for k, v in stock_from.get("numerics", {}).items() if k.startswith("tvm_vs_ort")})
            if numerics != "tvm":
                num.update({k.replace("tvm_ext_", "int8_default_", 1): v
                            for k, v in stock_from.get("numerics", {}).items() if k.startswith("tvm_ext_vs_ort")})
        res["numerics"] = num
    st, ex = res["builds"].get(stock_name, {}), res["builds"].get("tvm_ext", {})
    if "kernels" in st and "kernels" in ex:
        a, b = _kernel_ops(st["report"]), _kernel_ops(ex["report"])
        res["kernel_diff"] = {"ext_only": dict((b - a).most_common()), "stock_only": dict((a - b).most_common())}
    dflt = res["builds"].get("int8_default", {})
    if "kernels" in dflt and "kernels" in ex:
        a, b = _kernel_structure(dflt["report"]), _kernel_structure(ex["report"])
        res["kernel_diff_vs_int8"] = {"ext_only": dict((b - a).most_common()), "int8_only": dict((a - b).most_common())}
    res["targets"] = check_targets(res)
    res["wall_s"] = time.perf_counter() - t0
    res["measured_at"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="minutes")
    return res


def _on_purpose(reason: str) -> bool:
    from tvm_ext.core.report import CROSSING_REASONS

    return CROSSING_REASONS.get(reason, (False, ""))[0]


def check_targets(res: dict) -> dict:
    """The matrix's targets for one measured variant: {target: True / False / None (not measured)}."""
    stock, ext = res["builds"].get(res.get("stock", "tvm"), {}), res["builds"].get("tvm_ext", {})
    num = res.get("numerics", {})
    have = "kernels" in stock and "kernels" in ext
    out = {
        "no_crash": "error" not in ext,
        "kernels_le_stock": (ext["kernels"] <= stock["kernels"]) if have else None,
        "no_int32_crossing": (ext["wide_int_bytes"] == 0) if "kernels" in ext else None,
        "bytes_le_half_stock": (ext["crossing_total"] <= MAX_BYTES_RATIO * stock["crossing_total"]) if have else None,
    }
    floats = ext.get("float_crossings")  # float32 crosses only where the graph computes in float on purpose
    out["float_on_purpose_only"] = None if floats is None else all(_on_purpose(c["reason"]) for c in floats)
    steps = num.get("tvm_ext_vs_ort_max_steps")
    out["within_2_steps"] = None if steps is None else steps <= MAX_STEPS
    if (res.get("real") or {}).get("kind") == "classifier" and "tvm_ext_vs_ort_top1" in num:
        out["top1_equal_ort"] = num["tvm_ext_vs_ort_top1"] == num.get("inputs")
    dflt = res["builds"].get("int8_default", {})
    if "kernels" in dflt:  # --numerics: the option must not add kernels to the default pipeline's
        out["kernels_le_int8"] = (ext["kernels"] <= dflt["kernels"]) if "kernels" in ext else None
    return out


# --- rendering ---------------------------------------------------------------------------------
_SHORT = {"float32": "f32", "uint8": "u8", "int8": "i8", "int32": "i32", "int16": "i16", "int64": "i64"}


def _mb_by_dtype(b: dict) -> str:
    if "error" in b:
        return "—"
    parts = ", ".join(f"{_SHORT.get(d, d)} {n / 1e6:.2f}"
                      for d, n in sorted(b["crossing_bytes"].items(), key=lambda kv: -kv[1]))
    return f"{b['crossing_total'] / 1e6:.2f} ({parts})" if parts else "0"


def _kernels(b: dict) -> str:
    return "—" if "error" in b else f"{b['kernels']} / {b['anchors']}"


def _diff_text(res: dict) -> str:
    s = res.get("numerics", {})
    step = (res.get("real") or {}).get("output_step")
    cells = []
    names = ("tvm", "int8_default", "tvm_ext") if "int8_default" in res["builds"] else ("tvm", "tvm_ext")
    for name in names:
        if step and f"{name}_vs_ort_max_steps" in s:
            cells.append(f"{s[f'{name}_vs_ort_max_steps']:.0f}")
        elif f"{name}_vs_ort_max_abs" in s:
            cells.append(f"{s[f'{name}_vs_ort_max_abs']:.3g} abs")
        else:
            cells.append("—")
    return " / ".join(cells)


def render_markdown(results: dict) -> str:
    """The matrix as a Markdown table, then the targets missed and the kernel-list differences."""
    env = results["environment"]
    numerics = env.get("numerics", "tvm")
    ext = "tvm-ext" if numerics == "tvm" else f'tvm-ext `int8(numerics="{numerics}")`'
    with_dflt = any("int8_default" in r.get("builds", {}) for r in results["variants"])
    vs = f"stock / int8() / {ext}" if with_dflt else f"stock / {ext}"
    lines = [f"Measured {env['date']} on {env['cpu']} ({env['cores']} cores, shared); stock `relay.build` at "
             f"`{env['stock_target']}`, tvm-ext at `{env['ext_target']}`; {env['n_inputs']} inputs "
             "(`zoo_real.images(name, n, seed=1000)`); no latency."
             + (" int8(): the tvm-ext build of the `--stock-from` run." if with_dflt else ""), "",
             f"| variant | stock kernels / anchors | {ext} kernels / anchors{' (int8())' if with_dflt else ''} "
             f"| stock MB crossing | {ext} MB crossing "
             f"| bytes vs stock | max diff vs ORT, steps: {vs} | top-1 vs ORT: {vs} | targets missed |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results["variants"]:
        if "unavailable" in r or "failed" in r:
            lines.append(f"| {r['variant']} | {r.get('unavailable') or r.get('failed')} | | | | | | | |")
            continue
        st = r["builds"].get(r["stock"], {})
        ex = r["builds"].get("tvm_ext", {})
        stock_k = _kernels(st) if "error" not in st else f"build fails: {st['error'][:80]}"
        if r["stock"] == "tvm_nopass" and "error" not in st:
            stock_k += " ¹"
        ext_k = _kernels(ex) if "error" not in ex else f"**{ex['error'][:80]}**"
        dflt = r["builds"].get("int8_default")
        if dflt and "kernels" in dflt:
            ext_k += f" ({dflt['kernels']})"
        ratio = (f"{ex['crossing_total'] / st['crossing_total']:.2f}x"
                 if "crossing_total" in st and "crossing_total" in ex and st["crossing_total"] else "—")
        num = r.get("numerics", {})
        names = ("tvm", "int8_default", "tvm_ext") if dflt else ("tvm", "tvm_ext")
        top1 = (" / ".join(str(num.get(f"{n}_vs_ort_top1", "—")) for n in names) + f" of {num.get('inputs')}"
                if (r.get("real") or {}).get("kind") == "classifier" else "")
        missed = [k for k, ok in r["targets"].items() if ok is False]
        lines.append(f"| {r['variant']} | {stock_k} | {ext_k} | {_mb_by_dtype(st)} | {_mb_by_dtype(ex)} | {ratio} "
                     f"| {_diff_text(r)} | {top1} | {', '.join(missed) or 'none'} |")
    if any(r.get("stock") == "tvm_nopass" for r in results["variants"]):
        lines += ["", "¹ stock `relay.build` fails (LLVM 22 verifier); stock = `tvm_ext.build` without passes, "
                  "VNNI masked (the same kernels)."]
    diffs = [r for r in results["variants"]
             if r.get("kernel_diff") and (r["kernel_diff"]["ext_only"] or r["kernel_diff"]["stock_only"])
             and not with_dflt]  # --numerics: the stock differences are those of the int8() run
    if diffs:
        lines += ["", "Kernel-list differences (ops of each kernel; +: only in tvm-ext, -: only in stock):", ""]
        for r in diffs:
            lines.append(f"- `{r['variant']}`:")
            for sign, part in (("+", "ext_only"), ("-", "stock_only")):
                for ops, n in r["kernel_diff"][part].items():
                    lines.append(f"  - {sign}{n} × `{ops}`")
    diffs = [r for r in results["variants"] if any((r.get("kernel_diff_vs_int8") or {}).values())]
    if diffs:
        lines += ["", f"Kernel-list differences to int8(), by each kernel's non-elementwise ops (+: only in {ext}, "
                  "-: only in int8()):", ""]
        for r in diffs:
            lines.append(f"- `{r['variant']}`:")
            for sign, part in (("+", "ext_only"), ("-", "int8_only")):
                for ops, n in r["kernel_diff_vs_int8"][part].items():
                    lines.append(f"  - {sign}{n} × `{ops}`")
    return "\n".join(lines) + "\n"


def merge(paths, out: Path) -> int:
    """Join earlier runs' matrix.json into one (zoo order; a later file wins a variant), targets re-checked."""
    from tvm_ext.tools import zoo_real

    runs = [json.loads(Path(p).read_text()) for p in paths]
    by_key: dict = {}
    for run in runs:
        for r in run["variants"]:
            by_key[r["variant"]] = r
    order = [k for k in zoo_real.list_models() if k in by_key]
    variants = []
    for k in order:
        r = by_key[k]
        if "builds" in r:
            r["targets"] = check_targets(r)
        variants.append(r)
    env = dict(runs[0]["environment"])
    dates = sorted({run["environment"]["date"] for run in runs})
    env["date"] = f"{dates[0]} to {dates[-1]} ({len(runs)} runs merged)" if len(dates) > 1 else dates[0]
    env["merged_from"] = [{"path": str(p), "environment": run["environment"]} for p, run in zip(paths, runs)]
    results = {"environment": env, "variants": variants}
    out.mkdir(parents=True, exist_ok=True)
    (out / "matrix.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "matrix.md").write_text(render_markdown(results))
    print(render_markdown(results))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help="comma-separated real zoo names")
    ap.add_argument("--out", default="matrix-results", help="output directory (matrix.json, matrix.md)")
    ap.add_argument("--inputs", type=int, default=NUM_INPUTS)
    ap.add_argument("--resume", action="store_true", help="keep variants already in DIR/matrix.json")
    ap.add_argument("--stock-from", help="an earlier matrix.json: keep its stock builds, build only tvm-ext")
    ap.add_argument("--numerics", default="tvm", choices=("tvm", "onnxruntime"),
                    help="tvm-ext = pipelines.int8(numerics=...); "
                         "with --stock-from, its tvm-ext build is the int8() reference")
    ap.add_argument("--merge", help="comma-separated matrix.json files of earlier runs: one table, no builds")
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.merge:
        return merge(args.merge.split(","), Path(args.out))
    import tempfile

    from tvm_ext.tools import bench, zoo_real
    from tvm_ext.x86.target import build_target, host_target

    keys = [k.strip() for k in args.variants.split(",") if k.strip()]
    bad = [k for k in keys if not (zoo_real.is_real_model(k) and zoo_real.variant(k).quantized)]
    if bad:
        print(f"real_matrix: not quantized real zoo variants: {', '.join(bad)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stock_t, ext_t = host_target(), build_target(None)
    results = {"environment": {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="minutes"),
                               "cpu": bench.cpu_name(), "cores": os.cpu_count(), "versions": bench.versions(),
                               "stock_target": str(stock_t), "ext_target": str(ext_t), "n_inputs": args.inputs,
                               "numerics": args.numerics,
                               "command": " ".join([Path(sys.argv[0]).name]
                                                   + (argv if argv is not None else sys.argv[1:]))},
               "variants": []}
    done = {}
    if args.resume and (out / "matrix.json").is_file():
        done = {r["variant"]: r for r in json.loads((out / "matrix.json").read_text())["variants"]}
    stock_from = {}
    if args.stock_from:
        stock_from = {r["variant"]: r for r in json.loads(Path(args.stock_from).read_text())["variants"]
                      if "builds" in r}
    with tempfile.TemporaryDirectory(prefix="real_matrix_") as wd:
        for i, key in enumerate(keys):
            if key in done:
                logger.info("[%d/%d] %s: kept from %s", i + 1, len(keys), key, out / "matrix.json")
                results["variants"].append(done[key])
                continue
            logger.info("[%d/%d] %s", i + 1, len(keys), key)
            try:
                r = measure(key, workdir=Path(wd), n_inputs=args.inputs, stock_target=stock_t, ext_target=ext_t,
                            stock_from=stock_from.get(key), numerics=args.numerics)
            except zoo_real.ModelUnavailable as err:
                r = {"variant": key, "unavailable": str(err)}
            except Exception as err:  # one variant failing must not lose the others
                logger.exception("%s failed", key)
                r = {"variant": key, "failed": f"{type(err).__name__}: {err}"[:300]}
            results["variants"].append(r)
            missed = [k for k, ok in r.get("targets", {}).items() if ok is False]
            logger.info("[%d/%d] %s done in %.0f s; targets missed: %s", i + 1, len(keys), key, r.get("wall_s", 0),
                        ", ".join(missed) or "none")
            (out / "matrix.json").write_text(json.dumps(results, indent=1, default=str))
            (out / "matrix.md").write_text(render_markdown(results))
    (out / "matrix.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "matrix.md").write_text(render_markdown(results))
    print(render_markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
