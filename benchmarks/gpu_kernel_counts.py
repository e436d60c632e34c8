#!/usr/bin/env python
"""Kernels and bytes crossing kernels at ``opencl``, stock TVM against tvm-ext's int8 pipeline.

For each zoo model (full size unless ``--small``) this builds, each in a spawned child process (a
build that aborts or hangs is a table cell, not the end of the run), compile only, no device:

- stock: ``tvm_ext.build(m.mod, target="opencl", params=m.params, passes=())``;
- tvm-ext: the same with ``passes=pipelines.int8()``;
- x86: tvm-ext at ``--x86-target`` (default ``llvm -mcpu=x86-64-v3``), for what crosses there;
  with ``--x86 when-needed`` (the default) only when a tensor wider than 8 bits crosses tvm-ext's
  kernels at ``opencl`` (otherwise only 8-bit tensors cross there, whatever x86 does).

It prints a Markdown table (kernels, launched kernels: ``lib.kernel_report.num_launched_kernels``,
crossing bytes by dtype), then one line per float or wider-than-8-bit tensor that crosses tvm-ext's
kernels at ``opencl`` (with ``report``'s reason) and the same at x86, and the cells where tvm-ext
has more kernels or bytes than stock. Progress goes through logging.

    python benchmarks/gpu_kernel_counts.py [--models a,b,...] [--small] [--json OUT.json] [--resume]
                                           [--x86 when-needed|always|never] [--x86-target T]
                                           [--timeout SECONDS]

``--json`` keeps every build's result (written after each build); ``--resume`` skips the builds
already in it. Results stay where the user writes them; docs/gpu.md keeps the current table.
"""
from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOPHUB_LOCATION", "NONE")
logger = logging.getLogger("gpu_kernel_counts")

#: Cheap builds first: the ResNet-50s, the PP-OCR classifier, then the detectors.
DEFAULT_MODELS = (
    "resnet50_int8_qoperator", "resnet50_int8_qdq", "resnet50_int8_relay",
    "ppocr_cls_v2_int8_qdq", "ppocr_cls_v2_int8_qoperator",
    "ppocr_det_v4_int8_qdq", "ppocr_det_v4_int8_qoperator",
    "yolov8n_int8_qdq", "yolov8n_int8_qoperator",
)
#: Build configurations: name -> (target option, whether the int8 pipeline runs).
CONFIGS = {"stock": ("opencl", False), "ext": ("opencl", True), "x86": ("x86", True)}


def _child(job: dict, out: str) -> None:
    """Build one (model, configuration) and write its kernel report (or the error) to ``out``."""
    logging.basicConfig(level=logging.WARNING)
    try:
        import tvm_ext
        from tvm_ext.core import pipelines
        from tvm_ext.tools import zoo

        m = zoo.load(job["model"], small=job["small"])
        t0 = time.perf_counter()
        lib = tvm_ext.build(m.mod, target=job["target"], params=m.params,
                            passes=pipelines.int8() if job["int8"] else ())
        rep = lib.kernel_report
        res = {"build_s": round(time.perf_counter() - t0, 1), "kernels": rep.num_kernels,
               "launched": rep.num_launched_kernels, "bytes": {d: int(b) for d, b in rep.crossing.nbytes.items()},
               "crossings": [c.to_dict() for c in rep.float_crossings() + rep.int_crossings()]}
    except Exception as err:  # a build error is a result of the benchmark
        res = {"error": f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}"[:300]}
    Path(out).write_text(json.dumps(res))


def build_in_child(job: dict, timeout: float) -> dict:
    """``_child(job)`` in a spawned process; its result, or how the process ended."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "result.json"
        p = mp.get_context("spawn").Process(target=_child, args=(job, str(out)))
        p.start()
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join()
            return {"error": f"timeout after {timeout:.0f} s"}
        if out.is_file():
            return json.loads(out.read_text())
        return {"error": f"child process ended with exit code {p.exitcode}"}


def _bytes_text(res: dict) -> str:
    if "error" in res:
        return f"error: {res['error']}"
    parts = sorted(res["bytes"].items(), key=lambda kv: -kv[1])
    return " + ".join(f"{d} {_size(b)}" for d, b in parts) or "none"


def _size(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n:,} bytes"


def _kernels_text(res: dict) -> str:
    return "error" if "error" in res else f"{res['kernels']} ({res['launched']})"


def _wide(res: dict) -> list:
    """Float and wider-than-8-bit crossings of one build: ``dtype shape reason (kernel -> readers)``."""
    return [f"{c['dtype']}{c['shape']} {c['reason']} (kernel {c['producer']} -> {c['readers']})"
            for c in res.get("crossings", ())]


def _wider(res: dict) -> bool:
    """Whether a tensor wider than 8 bits crosses the kernels of a build (or the build failed)."""
    return "error" in res or any(d not in ("int8", "uint8") for d in res["bytes"])


def render(results: dict, models, x86_target: str | None) -> str:
    """The Markdown table and the notes on tvm-ext's worse cells and wide crossings."""
    head = ("| model | stock: kernels (launched) | stock: crossing bytes | tvm-ext int8: kernels (launched) "
            "| tvm-ext int8: crossing bytes |" + (" tvm-ext int8 at x86: crossing bytes |" if x86_target else ""))
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    notes = []
    for name in models:
        r = results.get(name, {})
        st, ex, x86 = r.get("stock", {"error": "not run"}), r.get("ext", {"error": "not run"}), r.get("x86")
        row = f"| `{name}` | {_kernels_text(st)} | {_bytes_text(st)} | {_kernels_text(ex)} | {_bytes_text(ex)} |"
        if x86_target:
            row += f" {_bytes_text(x86) if x86 else 'not run' if 'error' in ex else 'not built: 8-bit only'} |"
        lines.append(row)
        if "error" in st or "error" in ex:
            continue
        if ex["launched"] > st["launched"]:
            notes.append(f"{name}: tvm-ext launches more kernels than stock "
                         f"({_kernels_text(ex)} > {_kernels_text(st)})")
        elif ex["kernels"] > st["kernels"]:
            notes.append(f"{name}: tvm-ext has more kernels than stock ({_kernels_text(ex)} > {_kernels_text(st)}), "
                         "the extra ones reshape-only __nop kernels (not launched)")
        if sum(ex["bytes"].values()) > sum(st["bytes"].values()):
            notes.append(f"{name}: tvm-ext moves more bytes than stock ({_bytes_text(ex)} > {_bytes_text(st)})")
        for dtype, b in ex["bytes"].items():
            if dtype in ("int8", "uint8"):
                continue
            at_x86 = (x86 or {}).get("bytes", {}).get(dtype)
            notes.append(f"{name}: {dtype} {_size(b)} crosses at opencl (x86: "
                         f"{_size(at_x86) if at_x86 else 'none' if x86 and 'error' not in x86 else 'not measured'})")
        for w in _wide(ex):
            notes.append(f"{name} opencl: {w}")
        for w in _wide(x86 or {}):
            notes.append(f"{name} x86: {w}")
    return "\n".join(lines + ([""] + [f"- {n}" for n in notes] if notes else []))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated zoo names")
    ap.add_argument("--small", action="store_true", help="the small ResNet-50 variants")
    ap.add_argument("--x86-target", default="llvm -mcpu=x86-64-v3")
    ap.add_argument("--x86", choices=("when-needed", "always", "never"), default="when-needed",
                    help="build tvm-ext at --x86-target: when a wider tensor crosses at opencl, always, never")
    ap.add_argument("--json", help="write every build's result here (after each build)")
    ap.add_argument("--resume", action="store_true", help="skip builds already in --json")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per build")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    models = [m for m in args.models.split(",") if m]
    x86_target = None if args.x86 == "never" else args.x86_target
    results: dict = {}
    if args.resume and args.json and Path(args.json).is_file():
        results = json.loads(Path(args.json).read_text())
    for name in models:
        for cfg, (where, int8) in CONFIGS.items():
            if cfg == "x86" and (not x86_target or args.x86 == "when-needed" and not _wider(results[name]["ext"])):
                continue
            if cfg in results.get(name, {}) and "error" not in results[name][cfg]:
                continue
            target = "opencl" if where == "opencl" else x86_target
            logger.info("%s: building %s at %s", name, "int8()" if int8 else "stock", target)
            res = build_in_child({"model": name, "small": args.small, "target": target, "int8": int8}, args.timeout)
            done = res.get("error") or f"{_kernels_text(res)} kernels, {_bytes_text(res)}, {res['build_s']} s"
            logger.info("%s %s: %s", name, cfg, done)
            results.setdefault(name, {})[cfg] = res
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1))
    print(render(results, models, x86_target))
    return 0


if __name__ == "__main__":
    sys.exit(main())
