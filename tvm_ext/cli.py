"""The ``tvm-ext`` command line.

Sub-commands: ``report`` (kernel report of an ONNX model), ``passes`` (registered passes),
``patterns`` (pattern tables), ``zoo`` (write the built-in model zoo), ``bench`` (the int8
ResNet-50 benchmark). User errors (missing file, non-ONNX file, unknown pass, bad option) print
one line on stderr and exit with code 2. Printing happens here only; the library logs.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

__all__ = ["main"]


class UsageError(Exception):
    """A user mistake: printed as one line, exit code 2."""


def _parse_shapes(items) -> dict:
    shapes = {}
    for item in items or []:
        if "=" not in item:
            raise UsageError(f"--shape expects NAME=D1,D2,...; got {item!r}")
        name, dims = item.split("=", 1)
        try:
            shapes[name] = tuple(int(d) for d in dims.split(",") if d)
        except ValueError:
            raise UsageError(f"--shape {item!r}: dimensions must be integers") from None
    return shapes


def parse_pass_list(text: str | None) -> list:
    """``"A,B"`` -> pass objects from the registry (UsageError for unknown names / missing args)."""
    from .registry import UnknownPassError, get_pass

    passes = []
    for name in [n.strip() for n in (text or "").split(",") if n.strip()]:
        try:
            spec = get_pass(name)
        except UnknownPassError as err:
            raise UsageError(str(err)) from None
        if spec.needs_args:
            raise UsageError(f"pass {name!r} needs arguments and cannot be used from --passes; use the Python API")
        passes.append(spec.factory())
    return passes


def _load_onnx_module(path: str, shapes: dict):
    from .frontend import from_onnx

    p = Path(path)
    if not p.exists():
        raise UsageError(f"no such file: {path}")
    if p.is_dir():
        raise UsageError(f"{path} is a directory, not an ONNX model")
    try:
        return from_onnx(p, shape=shapes or None)
    except (FileNotFoundError, ValueError) as err:
        raise UsageError(str(err).splitlines()[0]) from None


def _resolve_target(text: str | None):
    from .target import host_target, safe_target

    from .tvm_bugs import UnsupportedByTVM, check_target

    if not text:
        return host_target()
    try:
        check_target(text)  # before safe_target: an unknown -mtriple crashes LLVM's feature query
        return safe_target(text)
    except UnsupportedByTVM as err:
        raise UsageError(f"bad --target {text!r}: {err}") from None
    except Exception as err:  # TVM raises TVMError/ValueError for malformed targets
        raise UsageError(f"bad --target {text!r}: {str(err).splitlines()[-1]}") from None


def cmd_report(args) -> int:
    from .build import build

    passes = parse_pass_list(args.passes)
    mod, params = _load_onnx_module(args.model, _parse_shapes(args.shape))
    target = _resolve_target(args.target)
    from .tvm_bugs import UnsupportedByTVM

    try:
        factory = build(mod, target=target, params=params, passes=passes, at=args.at, opt_level=args.opt_level)
    except UnsupportedByTVM as err:
        raise UsageError(str(err)) from None
    report = factory.kernel_report
    if args.json:
        out = {"model": str(args.model), "target": str(target), "opt_level": args.opt_level,
               "passes": [p.info.name for p in passes], **report.to_dict()}
        print(json.dumps(out, indent=2))
    else:
        print(f"model:  {args.model}")
        print(f"target: {target}")
        print(f"passes: {', '.join(p.info.name for p in passes) or '(none)'} (at {args.at}), opt_level {args.opt_level}")
        print()
        print(report.table(max_kernels=None if args.all else 40))
    return 0


def cmd_passes(args) -> int:
    from .registry import list_passes

    specs = list_passes()
    width = max((len(s.name) for s in specs), default=0)
    for s in specs:
        extra = " (needs arguments)" if s.needs_args else ""
        print(f"{s.name.ljust(width)}  {s.summary}{extra}")
    return 0


def cmd_patterns(args) -> int:
    try:
        from .patterns import list_tables
    except ImportError as err:
        raise UsageError(f"pattern tables are not available: {err}") from None
    for table, entries in list_tables().items():
        print(f"{table}:")
        for entry in entries:
            if isinstance(entry, (tuple, list)):
                print(f"  {entry[0]:<40} {entry[1] if len(entry) > 1 else ''}")
            else:
                print(f"  {entry}")
    return 0


def cmd_zoo(args) -> int:
    from . import zoo

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a directory")
    paths = zoo.write_zoo(out, small=args.small)
    for p in paths:
        print(p)
    return 0


def cmd_bench(args) -> int:
    from .bench import run_from_args

    return run_from_args(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tvm-ext", description="Relay passes, pattern tables and kernel reports on TVM 0.19.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("report", help="build an ONNX model with TVM and print its kernel report",
                       description="Build an ONNX model with tvm_ext.build and print kernels, anchors and the "
                                   "tensors crossing kernel boundaries by dtype.")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--target", help="TVM target (default: the host CPU, VNNI masked on LLVM 22)")
    p.add_argument("--opt-level", type=int, default=3, choices=range(0, 5), metavar="N", help="PassContext opt_level (default 3)")
    p.add_argument("--passes", help="comma-separated tvm-ext passes to run (see `tvm-ext passes`)")
    p.add_argument("--at", choices=["before_fuse", "start"], default="before_fuse", help="where the passes run (default before_fuse)")
    p.add_argument("--shape", action="append", metavar="NAME=D1,D2,..", help="input shape for dynamic inputs (repeatable)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--all", action="store_true", help="list every kernel (default: the first 40)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("passes", help="list registered tvm-ext passes", description="List registered tvm-ext passes with one-line docs.")
    p.set_defaults(func=cmd_passes)

    p = sub.add_parser("patterns", help="list pattern tables and their entries", description="List pattern tables and entries.")
    p.set_defaults(func=cmd_patterns)

    p = sub.add_parser("zoo", help="write the built-in model zoo to a folder",
                       description="Generate (or copy from the cache) the built-in ResNet-50 models: fp32 ONNX, int8 "
                                   "QOperator and QDQ ONNX, and the relay.quantize module.")
    p.add_argument("--out", default="zoo", help="output folder (default ./zoo)")
    p.add_argument("--small", action="store_true", help="the small variants used by the tests")
    p.set_defaults(func=cmd_zoo)

    p = sub.add_parser("bench", help="run the int8 ResNet-50 benchmark",
                       description="Kernels, bytes between kernels, latency and numerics of int8 ResNet-50 under stock "
                                   "TVM, TVM + tvm-ext and ONNX Runtime.")
    p.add_argument("--variants", help="comma-separated: qoperator,qdq,relay (default all)")
    p.add_argument("--model", help="benchmark this ONNX model instead of the zoo")
    p.add_argument("--target", help="TVM target (default: the host CPU, VNNI masked)")
    p.add_argument("--repeat", type=int, default=30, help="timed runs per engine (default 30)")
    p.add_argument("--threads", type=int, default=2, help="threads for TVM and ONNX Runtime (default 2)")
    p.add_argument("--out", default="bench-results", help="output folder (default ./bench-results)")
    p.add_argument("--small", action="store_true", help="small ResNet variants (smoke test)")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if args.verbose < 2:
        logging.getLogger("autotvm").setLevel(logging.ERROR)
        logging.getLogger("te_compiler").setLevel(logging.WARNING)
    try:
        return args.func(args)
    except UsageError as err:
        print(f"tvm-ext {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
