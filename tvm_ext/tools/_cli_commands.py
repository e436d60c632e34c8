"""The ``tvm-ext`` sub-commands, one ``cmd_<name>(args) -> int`` each, and the argument parsing they share
(:mod:`tvm_ext.tools.cli` builds the parser and dispatches). They print their results; a user error is
a :class:`~tvm_ext.errors.UsageError`, which :func:`tvm_ext.tools.cli.main` prints as one line.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

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
    from . import _remote
    from .deploy import DeployError

    remote = bool(args.rpc or args.rpc_tracker)
    try:
        _remote.check_remote_options(args.rpc, args.rpc_tracker, args.rpc_key)
        _remote.check_remote_target(_compile_target(args.target), remote)
        for address in (args.rpc, args.rpc_tracker):
            if address:
                _remote.parse_address(address)
    except DeployError as err:
        raise UsageError(str(err)) from None
    stock = _resolve_target(args.target)
    if args.rpc:
        print(f"board: TVM RPC server {args.rpc}", flush=True)
    elif args.rpc_tracker:
        print(f"board: a board with key {args.rpc_key!r} from the TVM RPC tracker {args.rpc_tracker}", flush=True)
    print(f"stock target: {stock}", flush=True)
    print(f"tvm-ext target: {build_target(args.target)}", flush=True)
    if remote:
        print(f"threads: the board's TVM runtime's; repeat {args.repeat}", flush=True)
    else:
        print(f"threads: {args.threads} per engine (TVM_NUM_THREADS, ORT intra-op, OpenVINO inference threads), "
              f"repeat {args.repeat}", flush=True)
    try:
        results = run(variants, model=args.model, target=args.target, repeat=args.repeat, threads=args.threads,
                      out=args.out, small=args.small, tuned=not args.untuned,
                      compare_untuned=args.compare_untuned, numerics=args.numerics, ort_isa=args.ort_isa,
                      rpc=args.rpc, tracker=args.rpc_tracker, key=args.rpc_key, timeout=args.rpc_timeout)
    except ValueError as err:  # DeployError is one
        raise UsageError(str(err).splitlines()[0]) from None
    print()
    print(render_markdown(results))
    print(f"wrote {Path(args.out) / 'results.json'}, results.md, chart.png")
    return 0


def cmd_tune(args) -> int:
    from ..core import pipelines
    from . import _remote
    from .deploy import DeployError
    from .tune import tune_model, write_records

    if bool(args.model) == bool(args.zoo):
        raise UsageError("give one ONNX model, or --zoo for the benchmark models")
    if args.budget <= 0:
        raise UsageError("--budget must be positive (minutes)")
    if args.trials_per_conv is not None and args.trials_per_conv < 0:
        raise UsageError("--trials-per-conv must be >= 0")
    remote = bool(args.rpc or args.rpc_tracker)
    target = _tvm_ext_target(args.target)
    try:
        _remote.check_remote_options(args.rpc, args.rpc_tracker, args.rpc_key)
        _remote.check_remote_target(target if args.target else None, remote)
        if remote:
            from .tune_remote import Boards

            # the boards end their sessions a little after the budget: a kernel hanging there cannot hold the run
            boards = Boards.open(rpc=args.rpc, tracker=args.rpc_tracker, key=args.rpc_key, timeout=args.rpc_timeout,
                                 session_timeout=args.budget * 60 + 2 * args.rpc_timeout, target=target)
    except DeployError as err:
        raise UsageError(str(err)) from None
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
    where = f", timed on {boards.where}" if remote else ""
    print(f"tuning for {target} ({len(models)} model(s), budget {args.budget:g} min{where})", flush=True)
    if remote and boards.emulated:
        print(f"the remote is emulated ({boards.emulated}): its timings are not the speed of a board", flush=True)
    lines, written, done = [], None, []
    for _i, (name, mod, params) in enumerate(models):
        print(f"== {name}", flush=True)
        say = lambda msg: print("  " + msg, flush=True)  # noqa: E731
        try:
            if remote:
                from .tune_remote import tune_model_remote

                res = tune_model_remote(mod, params, target, passes, boards, budget_s=args.budget * 60 / len(models),
                                        trials=args.trials_per_conv, progress=say, skip=done)
            else:
                res = tune_model(mod, params, target, passes, budget_s=args.budget * 60 / len(models),
                                 layouts=not args.no_layouts, progress=say, skip=done)
        except ValueError as err:  # DeployError is one
            raise UsageError(str(err).splitlines()[0]) from None
        print(res.table(), flush=True)
        lines += res.records
        done += [r[5] for r in res.rows]
        written = write_records(lines, target, args.output)  # after each model: an interrupted run keeps its work
    on = "for this target's boards" if remote else "on this CPU"
    print(f"wrote {len(lines)} records to {written}; tvm_ext.build applies them {on}", flush=True)
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
    """``--target`` for compile: any valid LLVM target (also one this host cannot run), or ``opencl``."""
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
