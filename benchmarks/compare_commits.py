#!/usr/bin/env python
"""Show that two commits build the same kernels, bytes, code and outputs for the same models.

    python benchmarks/compare_commits.py BASE HEAD
        [--models resnet50_int8_qdq,resnet50_int8_qoperator,ppocr_cls_v2_int8_qdq,ppocr_det_v4_int8_qoperator]
        [--small] [--target "llvm -mcpu=x86-64-v3"] [--pipeline int8|none] [--seeds 0,1,2]
        [--ignore KIND,..] [--out DIR] [--repo PATH]

Each commit (any git revision; the caller's uncommitted changes are never part of it) is checked out
in a temporary ``git worktree``. For each model a child process imports that commit's ``tvm_ext``
(:mod:`_commits.tree`), builds the model with ``tvm_ext.build(..., passes=pipelines.int8())`` and
records its kernel report, the assembly hash of every function, the params and, when the code runs
on this host, the outputs on seeded inputs (:mod:`_commits.child`; HEAD runs on BASE's saved
inputs). The two results of each model are compared (:mod:`_commits.diff`): a table to stdout, every
difference below it, naming the model and kernel. What is recorded and compared, and how a commit's
code is imported: docs/benchmarks.md, "How compare_commits.py works".

Exit status: 0 when every model is identical, 1 when any differs, 2 when a model could not be
built or run at one commit, or took longer than ``--timeout`` seconds (or a usage error). Progress
is logged to stderr. Everything runs one child at a time (two-core machines are shared).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _commits.child import MODULE_TAIL, _child_build, function_hashes
from _commits.diff import KINDS, Difference, compare_results, summary_row, table
from _commits.tree import PACKAGE, modules_outside, package_dirs, use_tree

#: What tests and other scripts use: the parts' public names and this script's own.
__all__ = ["MODULE_TAIL", "function_hashes", "KINDS", "Difference", "compare_results", "summary_row", "table",
           "PACKAGE", "modules_outside", "package_dirs", "use_tree", "resolve_commit", "worktree", "child_main",
           "main", "DEFAULT_MODELS", "DEFAULT_TARGET"]

logger = logging.getLogger("compare_commits")

DEFAULT_MODELS = ("resnet50_int8_qdq", "resnet50_int8_qoperator", "ppocr_cls_v2_int8_qdq",
                  "ppocr_det_v4_int8_qoperator")
DEFAULT_TARGET = "llvm -mcpu=x86-64-v3"
_RESULT = "result.json"


def child_main(argv) -> int:
    """``compare_commits.py _child``: one model at one commit, result.json in the current folder."""
    ap = argparse.ArgumentParser(prog="compare_commits.py _child")
    ap.add_argument("--tree", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--model")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--pipeline", choices=("int8", "none"), default="int8")
    ap.add_argument("--seeds", type=_int_list, default=[0, 1, 2])
    ap.add_argument("--inputs-from")
    ap.add_argument("--no-code", dest="code", action="store_false", help="no assembly hashes")
    ap.add_argument("--probe", action="store_true", help="only import the package and print where from (JSON)")
    args = ap.parse_args(argv)
    # TVM logs every strategy choice at INFO: only this script's progress and others' warnings
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s [{args.label}] %(message)s", datefmt="%H:%M:%S")
    logger.setLevel(logging.INFO)
    os.environ.setdefault("TOPHUB_LOCATION", "NONE")
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if p and Path(p).resolve() != Path(here)]
    tree = Path(args.tree).resolve()
    mapping = use_tree(tree)
    if args.probe:
        import tvm_ext  # noqa: F401

        for name in sorted(mapping):
            importlib.import_module(name)
        print(json.dumps({"mapping": {k: str(v) for k, v in mapping.items()},
                          "files": {k: sys.modules[k].__file__ for k in sorted(mapping)},
                          "outside": modules_outside(tree)}))
        return 0
    result = {"label": args.label, "model": args.model, "small": args.small, "target": args.target,
              "pipeline": args.pipeline, "seeds": args.seeds, "error": None}
    try:
        result.update(_child_build(args))
        leaked = modules_outside(tree)
        if leaked:
            raise ImportError(f"modules imported from outside the worktree {tree}: {', '.join(leaked)}")
    except Exception as err:
        logger.exception("%s failed", args.model)
        result["error"] = f"{type(err).__name__}: {err}".splitlines()[0][:500]
    Path(_RESULT).write_text(json.dumps(result, indent=1))
    return 0 if result["error"] is None else 2


def _git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def resolve_commit(repo, rev: str) -> str:
    """The full hash of ``rev`` in ``repo`` (ValueError naming ``rev`` when it is no commit)."""
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        raise ValueError(f"compare_commits: {rev!r} is not a commit of {repo}") from None


@contextlib.contextmanager
def worktree(repo, commit: str, parent_dir):
    """A detached ``git worktree`` of ``commit`` under ``parent_dir``, removed (and pruned) on exit."""
    path = Path(parent_dir) / f"wt-{commit[:12]}"
    t0 = time.perf_counter()
    _git(repo, "worktree", "add", "--detach", "--quiet", str(path), commit)
    logger.info("worktree of %s at %s (%.1f s)", commit[:12], path, time.perf_counter() - t0)
    try:
        yield path
    finally:
        try:
            _git(repo, "worktree", "remove", "--force", str(path))
        except subprocess.CalledProcessError as err:
            logger.warning("git worktree remove %s failed (%s); deleting it and pruning", path, err.stderr.strip())
            shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(subprocess.CalledProcessError):
            _git(repo, "worktree", "prune")


def _int_list(text: str) -> list:
    return [int(x) for x in text.split(",") if x.strip()]


def _run_child(tree, label: str, model: str, args, out_dir: Path, inputs_from=None) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "_child", "--tree", str(tree), "--label", label,
           "--model", model, "--target", args.target, "--pipeline", args.pipeline,
           "--seeds", ",".join(map(str, args.seeds))]
    if args.small:
        cmd.append("--small")
    if inputs_from:
        cmd += ["--inputs-from", str(inputs_from)]
    if "code" in args.ignore_kinds:
        cmd.append("--no-code")
    (out_dir / _RESULT).unlink(missing_ok=True)  # a result left by an earlier run is not this one's
    env = dict(os.environ, TOPHUB_LOCATION=os.environ.get("TOPHUB_LOCATION", "NONE"),
               TVM_NUM_THREADS=os.environ.get("TVM_NUM_THREADS", "1"))
    t0 = time.perf_counter()
    logger.info("[%s] %s: building in a child process", label, model)
    res_file = out_dir / _RESULT
    try:
        proc = subprocess.run(cmd, check=False, cwd=out_dir, env=env, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        result = {"model": model, "error": f"no result within --timeout {args.timeout:g} s (child killed)"}
    else:
        if res_file.exists():
            result = json.loads(res_file.read_text())
        else:
            result = {"model": model, "error": f"child process exited with {proc.returncode} without a result"}
    logger.info("[%s] %s: %s in %.0f s", label, model, "failed" if result.get("error") else "done",
                time.perf_counter() - t0)
    return result


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["_child"]:
        return child_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Exit status: 0 identical, 1 a difference, 2 a model failed at a commit.")
    ap.add_argument("base", help="git revision of the reference (e.g. a commit hash)")
    ap.add_argument("head", help="git revision compared with it (e.g. HEAD)")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS),
                    help="comma-separated zoo names (tvm_ext.tools.zoo.list_models('all'))")
    ap.add_argument("--small", action="store_true", help="the small variants of the zoo ResNets")
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--pipeline", choices=("int8", "none"), default="int8",
                    help="int8: passes=tvm_ext.core.pipelines.int8(); none: tvm_ext.build without passes")
    ap.add_argument("--seeds", type=_int_list, default=[0, 1, 2], help="seeds of the inputs (comma-separated)")
    ap.add_argument("--ignore", default="", help=f"kinds of difference left out: {', '.join(KINDS)}")
    ap.add_argument("--out", help="keep results here (default: a temporary folder, removed)")
    ap.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]), help="the git repository")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per child process")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    ignore = args.ignore_kinds = [k.strip() for k in args.ignore.split(",") if k.strip()]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(ignore) - set(KINDS))
    if unknown:
        ap.error(f"--ignore {','.join(unknown)}: known kinds are {', '.join(KINDS)}")
    try:
        commits = {"base": resolve_commit(args.repo, args.base), "head": resolve_commit(args.repo, args.head)}
    except ValueError as err:
        ap.error(str(err))

    tmp = Path(tempfile.mkdtemp(prefix="compare_commits-"))
    out = Path(args.out).resolve() if args.out else tmp / "results"
    start = time.perf_counter()
    rows, all_diffs, failed = [], [], False
    try:
        with contextlib.ExitStack() as stack:
            trees = {}
            for sha in commits.values():
                if sha not in trees:
                    trees[sha] = stack.enter_context(worktree(args.repo, sha, tmp))
            run = f"{args.pipeline}{'-small' if args.small else ''}"
            dirs = {side: out / f"{side}-{sha[:12]}-{run}" for side, sha in commits.items()}
            for n, model in enumerate(models, 1):
                logger.info("model %d/%d: %s (%.0f s elapsed)", n, len(models), model, time.perf_counter() - start)
                base_dir, head_dir = dirs["base"] / model, dirs["head"] / model
                base = _run_child(trees[commits["base"]], f"base {commits['base'][:12]}", model, args, base_dir)
                head = _run_child(trees[commits["head"]], f"head {commits['head'][:12]}", model, args, head_dir,
                                  inputs_from=base_dir / "inputs" if base.get("runs") else None)
                diffs = compare_results(base, head, base_dir, head_dir, ignore=ignore)
                failed |= any(d.kind == "error" for d in diffs)
                rows.append(summary_row(base, head, diffs))
                all_diffs += diffs
                logger.info("%s: %s", model, "identical" if not diffs else f"{len(diffs)} differences")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the worktrees are gone; results too unless --out
    print(f"base {commits['base'][:12]} ({args.base})  head {commits['head'][:12]} ({args.head})  "
          f"target {args.target!r}  pipeline {args.pipeline}  small {args.small}  seeds {args.seeds}")
    print()
    print(table(rows))
    if all_diffs:
        print()
        print("differences:")
        for d in all_diffs:
            print(f"- {d}")
    if ignore:
        print(f"\nignored kinds: {', '.join(ignore)}")
    if args.out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "comparison.json").write_text(json.dumps({
            "commits": commits, "revisions": {"base": args.base, "head": args.head}, "target": args.target,
            "pipeline": args.pipeline, "small": args.small, "seeds": args.seeds, "ignore": ignore,
            "rows": rows, "differences": [dataclasses.asdict(d) for d in all_diffs]}, indent=1))
        print(f"\nresults in {out}")
    logger.info("finished in %.0f s", time.perf_counter() - start)
    return 2 if failed else (1 if all_diffs else 0)


if __name__ == "__main__":
    sys.exit(main())
