"""The deployment sub-commands of ``tvm-ext``: ``compile`` (an ONNX model into a library plain TVM
loads) and ``run`` (a library, here, on an OpenCL device or over RPC, with inputs from ``.npy``/``.npz``
files and an optional reference to compare with). The argument parsing they share with the other
commands is in :mod:`tvm_ext.tools._cli_commands`.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from ..errors import UsageError
from ._cli_commands import _compile_target, _load_onnx_module, _parse_shapes, _pass_names, _pipeline_or_passes

__all__ = ["cmd_compile", "cmd_run"]


def cmd_compile(args) -> int:
    from .deploy import DeployError, compile_library
    from ..core.tvm_bugs import UnsupportedByTVM

    out = Path(args.output)
    if out.suffix not in (".tar", ".so"):
        raise UsageError(f"-o {args.output}: the library must end in .tar or .so")
    if not out.parent.is_dir():
        raise UsageError(f"-o {args.output}: no such directory: {out.parent}")
    if args.cross_compiler_options and not args.cross_compiler:
        raise UsageError("--cross-compiler-options needs --cross-compiler")
    if args.cross_compiler and out.suffix != ".so":
        raise UsageError(f"--cross-compiler links a .so; -o {args.output} is a .tar of object files, which the "
                         f"machine that loads it links")
    import shlex

    options = shlex.split(args.cross_compiler_options or "")
    passes = _pipeline_or_passes(args)
    mod, params = _load_onnx_module(args.model, _parse_shapes(args.shape))
    target = _with_host(_compile_target(args.target), args.target_host)
    print(f"compiling {args.model} (pipeline {args.pipeline}"
          f"{', passes ' + ','.join(_pass_names(passes)) if args.pipeline == 'none' and args.passes else ''}) for "
          f"{target or 'this CPU'}: tvm_ext.build, then export_library", flush=True)
    try:
        res = compile_library(mod, params, out, target=target, passes=passes, opt_level=args.opt_level,
                              source=str(args.model), pipeline=args.pipeline, amx=args.amx, cc=args.cross_compiler,
                              cc_options=options)
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


def _with_host(target, host):
    """``--target`` with ``--target-host`` (a device target's host code, as tvmc's ``--target-host``)."""
    if not host:
        return target
    import tvm

    kind = tvm.target.Target(target).kind.name if target else "llvm"
    if kind == "llvm":
        raise UsageError(f"--target-host is for a device target (--target opencl); {target or 'this CPU'} is "
                         "an llvm target, whose code is its own host code")
    if _compile_target(host).split()[0] != "llvm":
        raise UsageError(f"--target-host {host!r}: not an llvm target (the host code runs on a CPU)")
    return tvm.target.Target(target, host=host)


def _load_arrays(text: str, flag: str) -> tuple:
    """``[NAME=]FILE.npy`` -> ``(name or None, {None: array})``; ``FILE.npz`` -> ``(None, {name: array})``."""
    import numpy as np

    name, path = (text.split("=", 1) if "=" in text and not Path(text).exists() else (None, text))
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{flag} {text}: no such file: {path}")
    try:
        arr = np.load(p, allow_pickle=False)
        if not isinstance(arr, np.ndarray):  # an .npz: its arrays by name
            with arr:
                arrays = {key: arr[key] for key in arr.files}
            if name is not None:
                raise UsageError(f"{flag} {text}: a .npz names its arrays itself; give it without NAME=")
            return None, arrays
    except UsageError:
        raise
    except Exception as err:  # ValueError, OSError, pickle refusals
        raise UsageError(f"{flag} {text}: not a .npy or .npz file ({str(err).splitlines()[0]})") from None
    return name, {None: arr}


def _run_inputs(args) -> tuple:
    """``(named, positional)`` from ``-i/--inputs FILE.npz`` (tvmc's form) and ``--input [NAME=]FILE``."""
    named, positional = {}, []
    items = ([("-i/--inputs", args.inputs)] if args.inputs else []) + [("--input", t) for t in args.input or []]
    for flag, item in items:
        if flag == "-i/--inputs" and Path(item).suffix != ".npz":
            raise UsageError(f"-i/--inputs {item}: must be a .npz (one array per input name); give .npy files "
                             f"with --input")
        name, arrays = _load_arrays(item, flag)
        if None in arrays:
            if name is None:
                positional.append(arrays[None])
                continue
            arrays = {name: arrays[None]}
        for key, arr in arrays.items():
            if key in named:
                raise UsageError(f"input {key!r} given twice")
            named[key] = arr
    return named, positional


def _reference_outputs(path: str, feed: dict) -> list:
    """The outputs to compare with: ``output_0, ...`` of a .npz (``run --outputs``), or an ONNX model run
    by ONNX Runtime here on the same inputs, on its exact int8 path (``session.x64quantprecision``): on x86
    CPUs without VNNI its default int8 kernels sum pairs of products in int16 and saturate, which would
    make an exact build look wrong."""
    import numpy as np

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--compare-with {path}: no such file")
    if p.suffix == ".onnx":
        try:
            import onnxruntime as ort

            from .ort_isa import exact_path_model, session_options
        except ImportError:
            raise UsageError("--compare-with MODEL.onnx runs ONNX Runtime, which is not installed") from None
        try:
            sess = ort.InferenceSession(str(exact_path_model(p)), session_options(ort, 0, exact=True),
                                        providers=["CPUExecutionProvider"])
            return [np.asarray(o) for o in sess.run(None, feed)]
        except Exception as err:  # ORT's errors: a model or inputs it cannot run
            raise UsageError(f"--compare-with {path}: ONNX Runtime cannot run it ({str(err).splitlines()[0]})") \
                from None
    if p.suffix != ".npz":
        raise UsageError(f"--compare-with {path}: give a .npz (as --outputs writes it) or an .onnx model")
    with np.load(p, allow_pickle=False) as z:
        keys = sorted((k for k in z.files if re.fullmatch(r"output_\d+", k)), key=lambda k: int(k.split("_")[1]))
        if not keys:
            raise UsageError(f"--compare-with {path}: no arrays named output_0, output_1, ...")
        return [z[k] for k in keys]


def _compare(outputs: list, reference: list, atol: float) -> bool:
    """Print, per output, how far it is from the reference; True when every one is within ``atol``."""
    import numpy as np

    if len(outputs) != len(reference):
        print(f"compare: {len(outputs)} outputs, the reference has {len(reference)}")
        return False
    ok = True
    for i, (out, ref) in enumerate(zip(outputs, reference)):
        if out.shape != ref.shape:
            print(f"compare: output {i}: shape {list(out.shape)}, the reference's {list(ref.shape)}")
            ok = False
            continue
        diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
        worst = float(diff.max()) if diff.size else 0.0
        differ = int(np.count_nonzero(diff > atol))
        print(f"compare: output {i}: max abs diff {worst:g}, {differ} of {diff.size} elements beyond atol {atol:g}")
        ok = ok and differ == 0
    return ok


def cmd_run(args) -> int:
    import numpy as np

    from .deploy import DeployError, run_library

    from . import _remote

    if args.repeat < 0:
        raise UsageError("--repeat must be >= 0")
    if args.atol < 0:
        raise UsageError("--atol must be >= 0")
    named, positional = _run_inputs(args)
    if args.output and Path(args.output).suffix != ".npz":
        raise UsageError(f"-o/--outputs {args.output}: must end in .npz")
    remote = bool(args.rpc or args.rpc_tracker)
    try:
        _remote.check_remote_options(args.rpc, args.rpc_tracker, args.rpc_key)
        if remote:
            from .rpc import run_remote

            res = run_remote(args.library, args.rpc, named, positional, repeat=args.repeat, tracker=args.rpc_tracker,
                             key=args.rpc_key, timeout=args.rpc_timeout)
        else:
            res = run_library(args.library, named, positional, repeat=args.repeat)
    except DeployError as err:
        raise UsageError(str(err)) from None
    where = (f", on the RPC server {res.meta['rpc']}" if args.rpc else f", on {res.meta['rpc']}") if remote else ""
    if remote and res.meta.get("device", "the CPU") != "the CPU":
        where += f" ({res.meta['device']})"
    if not remote and res.meta.get("device", "the CPU") != "the CPU":
        where = f", on {res.meta['device']}"
    print(f"library: {args.library} (target {res.meta['target']}, {res.meta.get('num_kernels', '?')} kernels{where})")
    for i, out in enumerate(res.outputs):
        flat = out.reshape(-1)
        head = np.array2string(flat[:6], precision=4, separator=", ", max_line_width=200)
        more = " ..." if flat.size > 6 else ""
        print(f"output {i}: {out.dtype}{list(out.shape)}  {head}{more}")
    if remote:
        feats = res.meta.get("remote_features")
        print(f"remote CPU features: {' '.join(feats) if feats is not None else '(not read: not checked)'}")
    if res.latency_ms is not None:
        timed = ", timed by the server" if remote else ""
        print(f"latency: {res.latency_ms:.3f} ms (median of {res.repeat} runs{timed})")
    if args.output:
        np.savez(args.output, **{f"output_{i}": o for i, o in enumerate(res.outputs)})
        print(f"wrote {args.output} (output_0..output_{len(res.outputs) - 1})")
    if args.compare_with:
        from .deploy import match_inputs

        feed = match_inputs(res.meta, named, positional)
        if not _compare(res.outputs, _reference_outputs(args.compare_with, feed), args.atol):
            print(f"compare: the outputs differ from {args.compare_with}")
            return 1
        print(f"compare: the outputs match {args.compare_with}")
    return 0
