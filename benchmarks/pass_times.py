#!/usr/bin/env python
"""Where a build's compile time goes: every pass of one ``tvm_ext.build``, timed.

Builds one model with :func:`tvm_ext.build` (the int8 pipeline by default) under a pass
instrument that times every pass run, nested ones included (a ``Sequential``'s passes, the
passes of relay.build's prefix, the nested builds some passes and QNN legalizations run), and
prints a Markdown table per pass name: how often it ran, its time including nested passes
(``total s``) and without them (``self s``), and its longest single run. Passes whose total is
under ``--min-seconds`` are left out of the table; the last line gives the whole build's time,
the part of it no pass accounts for (LLVM code generation, tvm_ext.build's own work) and the
kernel count. Use it to find the pass that makes a model slow to compile.

    python benchmarks/pass_times.py MODEL [--pipeline int8|none] [--numerics tvm|onnxruntime]
                                    [--target T] [--small] [--shape NAME=D1,D2,..]
                                    [--min-seconds 0.5] [--json OUT.json]

MODEL is an ONNX file or a zoo name (``tvm-ext zoo --list``; ``--small`` for the small ResNet-50
variants). The build runs in this process.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("TOPHUB_LOCATION", "NONE")


def _load(model: str, small: bool, shapes: dict):
    """(mod, params) of an ONNX file or a zoo model."""
    if model.endswith(".onnx") or Path(model).exists():
        from tvm_ext.core.frontend import from_onnx

        return from_onnx(model, shape=shapes or None)
    from tvm_ext.tools import zoo

    m = zoo.load(model, small=small)
    return m.mod, m.params


def _parse_shapes(items) -> dict:
    shapes = {}
    for item in items or ():
        name, _, dims = item.partition("=")
        if not dims:
            raise SystemExit(f"pass_times.py: --shape {item!r}: expected NAME=D1,D2,..")
        shapes[name] = [int(d) for d in dims.split(",")]
    return shapes


def _timer():
    """A pass instrument recording (name, depth, inclusive s, self s) of every pass run."""
    from tvm.ir.instrument import pass_instrument

    @pass_instrument
    class PassTimer:
        def __init__(self):
            self.runs = []
            self._stack = []  # [name, start, seconds spent in nested passes]

        def run_before_pass(self, mod, info):
            self._stack.append([info.name, time.perf_counter(), 0.0])

        def run_after_pass(self, mod, info):
            name, start, nested = self._stack.pop()
            seconds = time.perf_counter() - start
            if self._stack:
                self._stack[-1][2] += seconds
            self.runs.append((name, len(self._stack), seconds, seconds - nested))

    return PassTimer()


def summarize(runs) -> list[dict]:
    """Per pass name: runs, total (inclusive) s, self s, longest run; the largest total first."""
    by_name = defaultdict(lambda: {"runs": 0, "total_s": 0.0, "self_s": 0.0, "max_s": 0.0})
    for name, _depth, seconds, own in runs:
        row = by_name[name]
        row["runs"] += 1
        row["total_s"] += seconds
        row["self_s"] += own
        row["max_s"] = max(row["max_s"], seconds)
    return sorted(({"pass": k, **v} for k, v in by_name.items()), key=lambda r: -r["total_s"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="an .onnx file or a zoo model name")
    ap.add_argument("--pipeline", choices=("int8", "none"), default="int8")
    ap.add_argument("--numerics", choices=("tvm", "onnxruntime"), default="tvm",
                    help="with --pipeline int8: pipelines.int8(numerics=...)")
    ap.add_argument("--target", default=None, help="TVM target (default: the host CPU)")
    ap.add_argument("--small", action="store_true", help="the small zoo variant")
    ap.add_argument("--shape", action="append", metavar="NAME=D1,D2,..", help="input shape (repeatable)")
    ap.add_argument("--min-seconds", type=float, default=0.5, help="leave out passes under this total")
    ap.add_argument("--json", metavar="OUT.json", help="also write every pass run and the table")
    args = ap.parse_args(argv)

    import tvm_ext
    from tvm_ext.core import pipelines

    mod, params = _load(args.model, args.small, _parse_shapes(args.shape))
    passes = pipelines.int8(numerics=args.numerics) if args.pipeline == "int8" else ()
    timer = _timer()
    start = time.perf_counter()
    lib = tvm_ext.build(mod, target=args.target, params=params, passes=passes, instruments=[timer])
    build_s = time.perf_counter() - start
    rows = summarize(timer.runs)
    kernels = lib.kernel_report.num_kernels

    print(f"# pass times: {args.model} (pipeline {args.pipeline}"
          + (f", numerics {args.numerics}" if args.pipeline == "int8" else "") + ")")
    print()
    print("| pass | runs | total s | self s | longest s |")
    print("|---|---|---|---|---|")
    for r in rows:
        if r["total_s"] >= args.min_seconds:
            print(f"| {r['pass']} | {r['runs']} | {r['total_s']:.2f} | {r['self_s']:.2f} | {r['max_s']:.2f} |")
    print()
    outside = build_s - sum(s for _n, depth, s, _own in timer.runs if depth == 0)
    print(f"build: {build_s:.1f} s ({outside:.1f} s outside any pass: code generation, "
          f"tvm_ext.build's own work), {kernels} kernels, {len(timer.runs)} pass runs ({len(rows)} distinct passes)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "model": args.model, "pipeline": args.pipeline, "numerics": args.numerics,
            "target": str(args.target), "build_s": build_s, "kernels": kernels, "passes": rows,
            "runs": [{"pass": n, "depth": d, "s": s, "self_s": own} for n, d, s, own in timer.runs],
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
