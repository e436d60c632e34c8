"""One model at one commit, in the child process: loaded, built and run with the commit's code, its
kernel report, assembly hashes per function, params digest and outputs on seeded inputs recorded."""
from __future__ import annotations

import hashlib
import logging
import re
import time
from pathlib import Path

logger = logging.getLogger("compare_commits")

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
