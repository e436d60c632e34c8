#!/usr/bin/env python
"""Show that two commits build the same kernels, bytes, code and outputs for the same models.

    python benchmarks/compare_commits.py BASE HEAD
        [--models resnet50_int8_qdq,resnet50_int8_qoperator,ppocr_cls_v2_int8_qdq,ppocr_det_v4_int8_qoperator]
        [--small] [--target "llvm -mcpu=x86-64-v3"] [--pipeline int8|none] [--seeds 0,1,2]
        [--ignore KIND,..] [--out DIR] [--repo PATH]

For each commit (BASE and HEAD are any git revisions; the caller's uncommitted changes are never
part of them) a ``git worktree`` of that commit is made in a temporary directory, so the caller's
checkout is never touched, and removed at the end. For each model a child process imports the
commit's ``tvm_ext``, loads the model with ``tvm_ext.tools.zoo.load(name, small=...)`` (``--small``
applies to the zoo ResNets, the real models have no small variant), builds it with
``tvm_ext.build(mod, target, params, passes=tvm_ext.core.pipelines.int8())`` (``--pipeline none``:
no passes) and records, in ``<out>/{base,head}-<sha>-<pipeline>[-small]/<model>/result.json``:

* the kernel report (``factory.kernel_report.to_dict()``, what ``tvm-ext report --json`` prints):
  every kernel's name, ops, anchor, input and output tensors and tuned flag; the bytes crossing
  between kernels, entering and leaving the graph, by dtype;
* the generated code: the assembly of every function, its local labels renumbered so that a
  function's hash does not depend on where the other functions sit in the module (LLVM generates
  the listing again, a fraction of the build time: ``--ignore code`` skips it);
* digests of the model as loaded (ONNX file, Relay structural hash) and of the built params;
* when code for the target runs on this host (``tvm_ext.x86.isa.runs_on_host``), the outputs on
  seeded inputs (``tvm_ext.tools.zoo.sample_input``), saved as ``.npy``. HEAD runs on BASE's saved
  inputs, so both commits see the very same arrays.

How a commit's code is imported: the package may map subpackages to other folders
(``tvm_ext.passes`` -> ``passes/`` through ``[tool.setuptools] package-dir``), so a plain
PYTHONPATH does not work, and ``pip install --target`` needs a newer setuptools (from the
network) than the venv has. The child reads the worktree's ``pyproject.toml`` (explicit
``packages`` with ``package-dir``, or ``packages.find``; a ``src/`` or flat layout without either)
and puts a finder first on ``sys.meta_path`` that maps each package to its folder in the
worktree; the venv's editable-install finder of the caller's checkout is removed, and after the
run every imported ``tvm_ext`` module must come from the worktree, or the model's result is an
error. TVM and the other dependencies come from the running interpreter's environment.

Then the two results of each model are compared (:func:`compare_results`): the same number of
kernels, per kernel the same name, ops, anchor, tensors and tuned flag, the same bytes by dtype,
the same crossing reasons, the same code per function, the same model and params, and
bit-identical outputs. A table (model, kernels, crossing bytes, code and outputs identical) goes
to stdout with every difference below it, naming the model and kernel. ``--ignore`` leaves out
kinds of difference (``code``, ``tuned``, ``model``, ...: see :data:`KINDS`).

Exit status: 0 when every model is identical, 1 when any differs, 2 when a model could not be
built or run at one commit, or took longer than ``--timeout`` seconds (or a usage error). Progress
is logged to stderr. Everything runs one child at a time (two-core machines are shared).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fnmatch
import hashlib
import importlib.abc
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

logger = logging.getLogger("compare_commits")

DEFAULT_MODELS = ("resnet50_int8_qdq", "resnet50_int8_qoperator", "ppocr_cls_v2_int8_qdq",
                  "ppocr_det_v4_int8_qoperator")
DEFAULT_TARGET = "llvm -mcpu=x86-64-v3"
PACKAGE = "tvm_ext"

#: Kinds of difference :func:`compare_results` reports (``--ignore`` takes these names).
KINDS = {
    "error": "the model could not be loaded, built or run at one commit",
    "model": "the model as loaded differs (ONNX file or Relay module), so nothing else is comparable",
    "kernel count": "a different number of kernels",
    "kernel": "a kernel's name, ops, anchor or tensors differ",
    "tuned": "a kernel compiled from a tuning record at one commit only",
    "bytes": "bytes (or tensors) by dtype crossing between kernels, entering or leaving the graph",
    "crossings": "the reasons float or int32 tensors cross between kernels",
    "code": "the assembly of a function, or the built params, differ",
    "outputs": "outputs not bit-identical",
}
_RESULT = "result.json"


# --------------------------------------------------------------------------- #
# a commit's code: package layout from pyproject.toml, and a finder for it
# --------------------------------------------------------------------------- #
def _setup_py_mapped(path: Path) -> dict:
    """The ``MAPPED = {package: folder}`` literal of a ``setup.py`` (read, never run); {} without one."""
    import ast

    for node in ast.parse(path.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign)
                                                                        and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "MAPPED" and node.value is not None:
            return dict(ast.literal_eval(node.value))
    return {}


def package_dirs(root, package: str = PACKAGE) -> dict:
    """``{package name: folder}`` of ``package`` and its subpackages in the source tree ``root``.

    Only packages whose folder is not the one Python's own search would find under their parent
    need an entry, but every package the project declares is listed. Read from ``pyproject.toml``:
    ``[tool.setuptools] packages`` (a list, or ``{find = {where, include, exclude}}``) and
    ``package-dir`` (``""`` is the root of all packages), or the literal ``MAPPED = {name: folder}``
    of a ``setup.py`` that discovers the rest; without them, ``src/<package>`` or ``<package>``.

    Raises
    ------
    FileNotFoundError
        No folder of ``package`` with an ``__init__.py`` was found.
    """
    import tomllib

    root = Path(root)
    cfg = {}
    if (root / "pyproject.toml").exists():
        cfg = tomllib.loads((root / "pyproject.toml").read_text()).get("tool", {}).get("setuptools", {})
    pkg_dir = {k: v for k, v in (cfg.get("package-dir") or {}).items()}
    if not pkg_dir and (root / "setup.py").exists():
        pkg_dir = _setup_py_mapped(root / "setup.py")
    base = root / pkg_dir.get("", "")
    declared = cfg.get("packages")
    names: list = []
    if isinstance(declared, list):
        names = list(declared)
    elif isinstance(declared, dict) and "find" in declared:
        find = declared["find"] or {}
        include, exclude = find.get("include", ["*"]), find.get("exclude", [])
        for where in find.get("where", ["."]):
            top = root / where
            for init in sorted(top.rglob("__init__.py")):
                name = ".".join(init.parent.relative_to(top).parts)
                if name and any(fnmatch.fnmatch(name, p) for p in include) and not any(
                        fnmatch.fnmatch(name, p) for p in exclude):
                    names.append(name)
                    pkg_dir.setdefault(name, str(init.parent.relative_to(root)))
    if not names:
        names = [n for n in pkg_dir if n]
    mapping: dict = {}
    for name in sorted(n for n in names if n == package or n.startswith(package + ".")):
        parent, _, leaf = name.rpartition(".")
        if name in pkg_dir:
            mapping[name] = root / pkg_dir[name]
        elif parent in mapping:
            mapping[name] = mapping[parent] / leaf
        else:
            mapping[name] = base.joinpath(*name.split("."))
    if package not in mapping:
        for cand in (base / package, root / "src" / package, root / package):
            if (cand / "__init__.py").exists():
                mapping[package] = cand
                break
    if package not in mapping or not (mapping[package] / "__init__.py").exists():
        raise FileNotFoundError(f"compare_commits: no package {package!r} with an __init__.py under {root} "
                                f"(pyproject.toml [tool.setuptools] packages/package-dir, src/ or flat layout)")
    return {k: v.resolve() for k, v in mapping.items() if (v / "__init__.py").exists()}


class _TreeFinder(importlib.abc.MetaPathFinder):
    """Finds the packages of :func:`package_dirs` in their folders; submodules follow ``__path__``."""

    def __init__(self, mapping: dict):
        self.mapping = mapping

    def find_spec(self, fullname, path=None, target=None):
        folder = self.mapping.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(fullname, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


def use_tree(root, package: str = PACKAGE) -> dict:
    """Make ``import package`` in this process load the source tree ``root``; returns the mapping.

    Editable-install finders (``__editable__*``, such as the caller's checkout installed with
    ``pip install -e``) are removed from ``sys.meta_path``, and a finder for ``root``'s packages
    goes first. Must run before ``package`` is imported.
    """
    if package in sys.modules:
        raise RuntimeError(f"compare_commits: {package} is already imported from "
                           f"{getattr(sys.modules[package], '__file__', '?')}")
    mapping = package_dirs(root, package)
    sys.meta_path[:] = [f for f in sys.meta_path
                        if not str(getattr(f, "__module__", "") or getattr(type(f), "__module__", "")).startswith(
                            "__editable__")]
    sys.meta_path.insert(0, _TreeFinder(mapping))
    return mapping


def modules_outside(root, package: str = PACKAGE) -> list:
    """Imported modules of ``package`` whose file is not under ``root`` (should be none)."""
    root = Path(root).resolve()
    out = []
    for name, module in list(sys.modules.items()):
        if name != package and not name.startswith(package + "."):
            continue
        f = getattr(module, "__file__", None)
        if f and not Path(f).resolve().is_relative_to(root):
            out.append(f"{name} ({f})")
    return sorted(out)


# --------------------------------------------------------------------------- #
# child process: one model at one commit
# --------------------------------------------------------------------------- #
_LABEL = re.compile(r"\.L[\w.$]+")
#: Key of :func:`function_hashes` for the text after the last function (debug info, strings).
MODULE_TAIL = "(after the last function)"


def function_hashes(asm: str) -> dict:
    """``{function name: sha256}`` of an assembly listing, one entry per global function.

    A function's text runs from its ``.type NAME,@function`` line to its ``.size NAME, ...`` line,
    preceded by what LLVM emits between the previous function and it (its constant pools, the
    section switch). Local functions (TVM's ``.L__tvm_parallel_lambda.N``, emitted right after the
    function that launches them) belong to the global function before them, with their constant
    pools. What follows the last function (debug info, strings) is :data:`MODULE_TAIL`. Local
    labels (``.LBB12_3``, ``.Ltmp40``, ``.LCPI7_0``: numbered across the whole module) are
    renumbered in order of first appearance inside each entry, so a function's hash does not
    change when others are added or removed before it.
    """
    chunks: dict = {}
    pending: list = []  # text between two functions: it belongs to the next one
    owner, open_fn, last_global = None, None, None
    for line in asm.splitlines():
        s = line.strip()
        if s.startswith(".type") and s.endswith("@function"):
            fn = s[len(".type"):].strip().rsplit(",", 1)[0].strip()
            if not fn.startswith(".L"):
                owner = last_global = fn
                chunks[fn] = []
            else:
                owner = last_global if last_global is not None else MODULE_TAIL
                chunks.setdefault(owner, [])
            chunks[owner] += pending
            pending, open_fn = [], fn
            chunks[owner].append(line)
        elif open_fn is not None:
            chunks[owner].append(line)
            if s.startswith(".size") and s[len(".size"):].strip().split(",", 1)[0].strip() == open_fn:
                open_fn = None
        else:
            pending.append(line)
    if pending:
        chunks.setdefault(MODULE_TAIL, []).extend(pending)
    return {name: hashlib.sha256(_renumber_labels("\n".join(lines)).encode()).hexdigest()
            for name, lines in chunks.items()}


def _renumber_labels(text: str) -> str:
    """``text`` with its local labels renamed ``.L0``, ``.L1``, ... in order of first appearance."""
    labels: dict = {}
    return _LABEL.sub(lambda m: labels.setdefault(m.group(0), f".L{len(labels)}"), text)


def _sha256_arrays(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _commit_module(path: str):
    """The commit's module ``tvm_ext.<path>`` (``"tools.zoo"``), or, in a commit whose modules sit at
    the top of the package, ``tvm_ext.<last part>`` (``tvm_ext.zoo``)."""
    import importlib

    try:
        return importlib.import_module(f"tvm_ext.{path}")
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith(f"tvm_ext.{path.split('.')[0]}"):
            raise
    return importlib.import_module(f"tvm_ext.{path.rsplit('.', 1)[-1]}")


def _child_build(args) -> dict:
    """Load, build and run one model with the commit's code (the import finder is in place)."""
    import numpy as np

    import tvm_ext

    zoo = _commit_module("tools.zoo")

    result: dict = {"tvm_ext": str(Path(tvm_ext.__file__).parent)}
    small = bool(args.small) and args.model.removesuffix("_small") in zoo.list_models()
    t0 = time.perf_counter()
    m = zoo.load(args.model, small=small)
    result["model"] = m.name
    import tvm

    result["tvm_version"] = tvm.__version__
    onnx_path = getattr(m, "onnx_path", None)
    result["model_digest"] = {
        "onnx_sha256": hashlib.sha256(Path(onnx_path).read_bytes()).hexdigest() if onnx_path else None,
        "relay_structural_hash": str(tvm.ir.structural_hash(m.mod)),
    }
    load_s = time.perf_counter() - t0
    logger.info("loaded %s in %.1f s", m.name, load_s)

    if args.pipeline == "int8":
        passes = _commit_module("core.pipelines").int8()
    else:
        passes = ()
    t0 = time.perf_counter()
    lib = tvm_ext.build(m.mod, args.target, m.params, passes=passes)
    build_s = time.perf_counter() - t0
    report = lib.kernel_report
    result["report"] = report.to_dict()
    logger.info("built %s in %.1f s: %d kernels", m.name, build_s, report.num_kernels)
    result["build_target"] = str(getattr(lib, "target", ""))  # recorded, not compared
    if args.code:  # LLVM generates the assembly listing again: a fraction of the build's time
        result["code"] = {"functions": function_hashes(lib.get_lib().get_source("asm"))}
    else:
        result["code"] = None
    params = lib.get_params()
    result["params_sha256"] = _sha256_arrays(params[k].numpy() for k in sorted(params))

    runs = _commit_module("x86.isa").runs_on_host(args.target)
    result["runs_on_host"] = bool(runs)
    result["runs"] = None
    run_s = 0.0
    if runs:
        from tvm.contrib import graph_executor

        gm = graph_executor.GraphModule(lib["default"](tvm.cpu()))
        in_dir, out_dir = Path("inputs"), Path("outputs")
        in_dir.mkdir(exist_ok=True)
        out_dir.mkdir(exist_ok=True)
        result["runs"] = []
        for seed in args.seeds:
            inputs = _inputs(args, m, seed, zoo)
            t0 = time.perf_counter()
            gm.set_input(**inputs)
            gm.run()
            outs = [gm.get_output(i).numpy() for i in range(gm.get_num_outputs())]
            run_s += time.perf_counter() - t0
            files = []
            for name, arr in inputs.items():
                np.save(in_dir / f"seed{seed}_{name}.npy", arr)
            for i, arr in enumerate(outs):
                np.save(out_dir / f"seed{seed}_out{i}.npy", arr)
                files.append(f"outputs/seed{seed}_out{i}.npy")
            result["runs"].append({
                "seed": seed, "inputs_sha256": _sha256_arrays(inputs[k] for k in sorted(inputs)),
                "outputs": [{"file": f, "shape": list(a.shape), "dtype": str(a.dtype), "sha256": _sha256_arrays([a])}
                            for f, a in zip(files, outs)],
            })
        logger.info("ran %s on %d seeded inputs in %.3f s", m.name, len(args.seeds), run_s)
    else:
        logger.info("%s: code for %r does not run on this host; outputs not compared", m.name, args.target)
    result["seconds"] = {"load": load_s, "build": build_s, "run": run_s}
    return result


def _inputs(args, m, seed: int, zoo) -> dict:
    """``{input name: array}``: BASE's saved arrays when given (``--inputs-from``), else seeded ones."""
    import numpy as np

    if args.inputs_from:
        f = Path(args.inputs_from) / f"seed{seed}_{m.input_name}.npy"
        if not f.exists():
            raise FileNotFoundError(f"no saved input {f} (the other commit's run of {m.name})")
        arr = np.load(f)
        if tuple(arr.shape) != tuple(m.input_shape) or str(arr.dtype) != m.input_dtype:
            raise ValueError(f"saved input {f} is {arr.dtype}{list(arr.shape)}, the model takes "
                             f"{m.input_dtype}{list(m.input_shape)}")
        return {m.input_name: arr}
    if hasattr(zoo, "sample_input"):
        return {m.input_name: np.asarray(zoo.sample_input(m, seed=seed))}
    return {m.input_name: np.random.default_rng(seed).standard_normal(m.input_shape).astype(m.input_dtype)}


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


# --------------------------------------------------------------------------- #
# comparison (pure: two result dicts in, a list of differences out)
# --------------------------------------------------------------------------- #
@dataclasses.dataclass(frozen=True)
class Difference:
    """One way a model's results differ between the two commits."""

    model: str
    kind: str  # a key of KINDS
    detail: str

    def __str__(self) -> str:
        return f"{self.model}: {self.kind}: {self.detail}"


_KERNEL_FIELDS = ("name", "func_name", "ops", "anchor", "inputs", "outputs")


def _kernel_label(k: dict) -> str:
    return f"kernel {k.get('index')} {k.get('func_name') or k.get('name')}"


def _short(value, n: int = 160) -> str:
    s = json.dumps(value) if not isinstance(value, str) else value
    return s if len(s) <= n else s[: n - 3] + "..."


def _compare_kernels(model: str, bk: list, hk: list) -> list:
    diffs = []
    if len(bk) != len(hk):
        diffs.append(Difference(model, "kernel count", f"{len(bk)} -> {len(hk)}"))
        bnames = [k.get("func_name") for k in bk]
        hnames = [k.get("func_name") for k in hk]
        for name in sorted(set(bnames) | set(hnames)):
            nb, nh = bnames.count(name), hnames.count(name)
            if nb != nh:
                k = (bk[bnames.index(name)] if nb else hk[hnames.index(name)])
                diffs.append(Difference(model, "kernel", f"{name} (ops {_short(k.get('ops'))}): {nb} in base, "
                                                          f"{nh} in head"))
        return diffs
    for b, h in zip(bk, hk):
        for field in _KERNEL_FIELDS:
            if field in b and field in h and b[field] != h[field]:
                diffs.append(Difference(model, "kernel", f"{_kernel_label(b)}: {field} {_short(b[field])} -> "
                                                          f"{_short(h[field])}"))
        if "tuned" in b and "tuned" in h and b["tuned"] != h["tuned"]:
            diffs.append(Difference(model, "tuned", f"{_kernel_label(b)}: tuned {b['tuned']} -> {h['tuned']}"))
    return diffs


def _compare_traffic(model: str, where: str, b: dict, h: dict) -> list:
    diffs = []
    for field in ("bytes", "count"):
        bd, hd = (b or {}).get(field, {}), (h or {}).get(field, {})
        for dtype in sorted(set(bd) | set(hd)):
            if bd.get(dtype, 0) != hd.get(dtype, 0):
                diffs.append(Difference(model, "bytes", f"{where} {field} {dtype}: {bd.get(dtype, 0)} -> "
                                                         f"{hd.get(dtype, 0)}"))
    return diffs


def _compare_code(model: str, b: dict, h: dict, kernels: list) -> list:
    bf, hf = (b.get("code") or {}).get("functions", {}), (h.get("code") or {}).get("functions", {})
    if not bf or not hf:
        return []
    names = [k.get("func_name") for k in kernels]

    def owner(fn):  # the kernel a function belongs to (its compute function, its parallel lambdas)
        best = max((n for n in names if n and (fn == n or fn.startswith(n + "_compute_"))), key=len, default=None)
        return f" (kernel {best})" if best and best != fn else ""

    diffs = []
    for fn in sorted((set(bf) | set(hf)) - {MODULE_TAIL}):
        if fn not in bf or fn not in hf:
            side = "head" if fn in hf else "base"
            diffs.append(Difference(model, "code", f"function {fn}{owner(fn)} only in {side}"))
        elif bf[fn] != hf[fn]:
            diffs.append(Difference(model, "code", f"function {fn}{owner(fn)}: assembly differs"))
    if not diffs and bf.get(MODULE_TAIL) != hf.get(MODULE_TAIL):  # debug info follows every function's code
        diffs.append(Difference(model, "code", f"assembly {MODULE_TAIL} differs"))
    if b.get("params_sha256") and h.get("params_sha256") and b["params_sha256"] != h["params_sha256"]:
        diffs.append(Difference(model, "code", "built params differ"))
    return diffs


def _compare_runs(model: str, b: dict, h: dict, base_dir=None, head_dir=None) -> list:
    br, hr = b.get("runs"), h.get("runs")
    if br is None or hr is None:
        return []
    diffs = []
    hmap = {r["seed"]: r for r in hr}
    for rb in br:
        rh = hmap.get(rb["seed"])
        if rh is None:
            diffs.append(Difference(model, "outputs", f"seed {rb['seed']}: not run at head"))
            continue
        if rb.get("inputs_sha256") != rh.get("inputs_sha256"):
            diffs.append(Difference(model, "outputs", f"seed {rb['seed']}: the inputs differ"))
        ob, oh = rb["outputs"], rh["outputs"]
        if len(ob) != len(oh):
            diffs.append(Difference(model, "outputs", f"seed {rb['seed']}: {len(ob)} -> {len(oh)} outputs"))
            continue
        for i, (xb, xh) in enumerate(zip(ob, oh)):
            if (xb["shape"], xb["dtype"]) != (xh["shape"], xh["dtype"]):
                diffs.append(Difference(model, "outputs", f"seed {rb['seed']} output {i}: {xb['dtype']}{xb['shape']} "
                                                           f"-> {xh['dtype']}{xh['shape']}"))
            elif xb["sha256"] != xh["sha256"]:
                diffs.append(Difference(model, "outputs", f"seed {rb['seed']} output {i}: not bit-identical"
                                                           + _max_diff(base_dir, head_dir, xb["file"], xh["file"])))
    return diffs


def _max_diff(base_dir, head_dir, fb, fh) -> str:
    """`` (max |diff| x, n of m elements differ)`` from the saved arrays, or ``""`` without them."""
    if base_dir is None or head_dir is None:
        return ""
    try:
        import numpy as np

        a, b = np.load(Path(base_dir) / fb), np.load(Path(head_dir) / fh)
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
        return f" (max |diff| {np.nanmax(d):.6g}, {int(np.count_nonzero(a != b))} of {a.size} elements differ)"
    except (OSError, ValueError) as err:  # the hashes already say they differ
        return f" (arrays not readable: {err})"


def compare_results(base: dict, head: dict, base_dir=None, head_dir=None, ignore=()) -> list:
    """Every difference between two ``result.json`` dicts of the same model, as :class:`Difference`.

    ``base_dir``/``head_dir`` (the folders of the results) let an output difference say how large
    it is. ``ignore``: kinds (keys of :data:`KINDS`) left out. An empty list means identical.
    """
    unknown = set(ignore) - set(KINDS)
    if unknown:
        raise ValueError(f"compare_results: unknown kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    model = base.get("model") or head.get("model") or "?"
    if base.get("error") or head.get("error"):
        diffs = [Difference(model, "error", f"{side}: {r['error']}") for side, r in (("base", base), ("head", head))
                 if r.get("error")]
        return [d for d in diffs if d.kind not in ignore]
    diffs = []
    bm, hm = base.get("model_digest") or {}, head.get("model_digest") or {}
    for key in sorted(set(bm) & set(hm)):
        if bm[key] != hm[key]:
            diffs.append(Difference(model, "model", f"{key} {_short(bm[key], 20)} -> {_short(hm[key], 20)}"))
    br, hr = base["report"], head["report"]
    bk, hk = br.get("kernels") or [], hr.get("kernels") or []
    if br.get("num_kernels", len(bk)) != hr.get("num_kernels", len(hk)) and len(bk) == len(hk):
        diffs.append(Difference(model, "kernel count", f"{br.get('num_kernels')} -> {hr.get('num_kernels')}"))
    diffs += _compare_kernels(model, bk, hk)
    for where in ("crossing", "inputs", "outputs"):
        diffs += _compare_traffic(model, where, br.get(where), hr.get(where))
    for key in ("float_crossings", "int_crossings"):
        if key in br and key in hr and br[key] != hr[key]:
            nb, nh = len(br[key] or []), len(hr[key] or [])
            diffs.append(Difference(model, "crossings", f"{key}: {nb} -> {nh} entries, "
                                                        f"{'contents differ' if nb == nh else 'counts differ'}"))
    diffs += _compare_code(model, base, head, bk)
    diffs += _compare_runs(model, base, head, base_dir, head_dir)
    return [d for d in diffs if d.kind not in ignore]


def summary_row(base: dict, head: dict, diffs: list) -> dict:
    """One table row: kernels, crossing bytes, code and outputs identical, for two results."""

    def kernels(r):
        return "error" if r.get("error") else str(r["report"].get("num_kernels"))

    def nbytes(r):
        return "error" if r.get("error") else str(r["report"].get("crossing", {}).get("total_bytes"))

    kinds = {d.kind for d in diffs}
    failed = base.get("error") or head.get("error")
    ran = not failed and base.get("runs") is not None and head.get("runs") is not None
    return {
        "model": base.get("model") or head.get("model"),
        "kernels": f"{kernels(base)} / {kernels(head)}",
        "bytes": f"{nbytes(base)} / {nbytes(head)}",
        "code": "-" if failed or not (base.get("code") and head.get("code")) else ("n" if "code" in kinds else "y"),
        "outputs": "-" if not ran else ("n" if "outputs" in kinds else "y"),
        "differences": len(diffs),
    }


def table(rows: list) -> str:
    """Markdown table of :func:`summary_row` rows."""
    lines = [("| model | kernels base / head | crossing bytes base / head | code identical | outputs identical "
              "| differences |"), "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['kernels']} | {r['bytes']} | {r['code']} | {r['outputs']} "
                     f"| {r['differences']} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- #
# parent: worktrees, children, table
# --------------------------------------------------------------------------- #
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
