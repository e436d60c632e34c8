"""Deployment: compile a Relay/ONNX model into a library plain TVM loads, and run such a library.

:func:`compile_library` builds with :func:`tvm_ext.build` (optionally a pipeline or passes) and
writes ``export_library`` output, ``.tar`` or ``.so``: plain TVM loads and runs it without tvm-ext.
Next to it goes a **sidecar** ``<lib>.json`` (inputs, outputs, the target and the host's, the LLVM
features it enables, the library's sha256; written after the library, atomically): it cannot go
inside the ``.tar``, whose every member TVM hands to the linker.

:func:`run_library` links a ``.tar`` in a private temporary directory (:func:`load_library`), where
plain TVM would untar and link beside the file (failing in a read-only folder, racing with another
process). It refuses *before* loading (``DeployError``, a ``ValueError``; the CLI prints one line):
a missing library or sidecar, a sidecar of another file, CPU features this host lacks (executing
would die with SIGILL), an ``opencl`` library where no OpenCL device can run it, inputs of other
names, shapes or dtypes. An ``opencl`` library runs on ``tvm.opencl(0)`` once TVM's OpenCL runtime
plugin is loaded (:func:`tvm_ext.gpu.opencl.load_runtime`). docs/deploy.md has the details.
Nothing here prints; the CLI (:mod:`tvm_ext.tools.cli`) does.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from .._files import sha256_file

logger = logging.getLogger(__name__)

__all__ = ["DeployError", "Compiled", "RunResult", "compile_library", "run_library", "read_sidecar",
           "check_runs_here", "match_inputs", "foreign_arch", "cross_cxx", "sidecar_path", "load_library",
           "SIDECAR_FORMAT"]

#: Version of the sidecar layout (bumped on incompatible changes).
SIDECAR_FORMAT = 1
_SUFFIXES = (".tar", ".so")


class DeployError(ValueError):
    """A deployment request that cannot be honoured (the message is one line, naming the cause)."""


def sidecar_path(lib_path) -> Path:
    """``model.tar`` -> ``model.tar.json``."""
    p = Path(lib_path)
    return p.with_name(p.name + ".json")


@dataclass(frozen=True)
class Compiled:
    """What :func:`compile_library` wrote."""

    path: Path
    sidecar: Path
    target: str
    num_kernels: int
    nbytes: int
    missing_on_host: tuple  # CPU features the target uses and this host lacks (cannot run here)
    cannot_run_here: Optional[str] = None  # why the library cannot run on this host (None: it can)
    report: object = field(repr=False, default=None)  # tvm_ext.core.report.KernelReport
    meta: dict = field(repr=False, default_factory=dict)

    def summary(self) -> str:
        """One line: file, kernels, target, size."""
        return (f"wrote {self.path}: {self.num_kernels} kernels, target {self.target}, "
                f"{self.nbytes / 1e6:.2f} MB (+ {self.sidecar.name})")


@dataclass(frozen=True)
class RunResult:
    """Outputs of :func:`run_library` and, with ``repeat``, the latency of ``run()`` in ms."""

    outputs: list
    latency_ms: Optional[float] = None
    repeat: int = 0
    meta: dict = field(repr=False, default_factory=dict)


def _io_from_graph(graph_json: str, param_names) -> tuple[list, list]:
    graph = json.loads(graph_json)
    nodes, row_ptr = graph["nodes"], graph["node_row_ptr"]
    shapes, dtypes = graph["attrs"]["shape"][1], graph["attrs"]["dltype"][1]
    params = set(param_names)
    inputs = []
    for nid in graph["arg_nodes"]:
        name = nodes[nid]["name"]
        if name in params:
            continue
        e = row_ptr[nid]
        inputs.append({"name": name, "shape": list(shapes[e]), "dtype": dtypes[e]})
    outputs = [{"shape": list(shapes[row_ptr[h[0]] + h[1]]), "dtype": dtypes[row_ptr[h[0]] + h[1]]}
               for h in graph["heads"]]
    return inputs, outputs


def compile_library(mod, params, out, *, target=None, passes=(), at: str = "before_fuse", opt_level: int = 3,
                    source: Optional[str] = None, pipeline: str = "none", amx: bool = False,
                    cc: Optional[str] = None, cc_options: Sequence[str] = ()) -> Compiled:
    """Build ``mod`` with :func:`tvm_ext.build` and export a library plus its sidecar.

    Parameters
    ----------
    mod, params
        The Relay module and its parameters (e.g. from :func:`tvm_ext.core.frontend.from_onnx`).
    out : str or os.PathLike
        ``.tar`` or ``.so``; the sidecar goes to ``<out>.json``. A ``.so`` for another architecture
        (``-mtriple=aarch64-linux-gnu``) is linked with its cross compiler (:func:`cross_cxx`); a
        ``.tar`` holds object files, which the machine that loads it links.
    target : str or tvm.target.Target, optional
        Any LLVM target, also one this host cannot run (``Compiled.missing_on_host`` says so), or
        ``opencl`` (its host code for the host CPU's generic ``llvm``; the library runs where TVM's
        OpenCL runtime finds a device). Default: the host CPU (:func:`tvm_ext.x86.target.build_target`).
    passes, at, opt_level
        Forwarded to :func:`tvm_ext.build` (a pipeline such as :func:`tvm_ext.core.pipelines.int8`
        is a valid ``passes``).
    source, pipeline
        Recorded in the sidecar (model path, pipeline name).
    amx : bool
        Forwarded to :func:`tvm_ext.build` (opt-in AMX int8 tiles on a target that has them) and
        recorded in the sidecar. The target then keeps ``amx-tile``/``amx-int8``, so ``tvm-ext run``
        refuses the library on a host without them; loading it asks Linux for the tile state.
    cc, cc_options : optional
        The compiler that links a ``.so`` (a name on PATH or a path; default: the cross compiler
        for another architecture, the system one for this host's) and its extra options
        (``--cross-compiler`` and ``--cross-compiler-options`` of ``tvm-ext compile``, as in tvmc).

    Returns
    -------
    Compiled

    Raises
    ------
    DeployError
        Bad suffix, missing output folder, a ``.so`` for another architecture without its cross
        compiler on PATH, ``cc`` not found or given for a ``.tar``.
    """
    import tvm

    from .. import __version__
    from ..x86 import isa
    from ..core.build import build
    from ..x86.target import build_target

    out = Path(out)
    if out.suffix not in _SUFFIXES:
        raise DeployError("compile_library: output must end in .tar or .so (export_library decides by suffix); "
                          f"got {out.name}")
    if not out.parent.is_dir():
        raise DeployError(f"compile_library: no such directory: {out.parent}")
    tgt = build_target(target, allow_amx=amx)
    link = {}
    if (cc or cc_options) and out.suffix != ".so":
        raise DeployError(f"compile_library: a compiler links a .so; {out.name} is a .tar of object files, which "
                          f"the machine that loads it links")
    if cc:
        path = shutil.which(cc)
        if path is None:
            raise DeployError(f"compile_library: compiler {cc!r} not found (not on PATH, not an executable file)")
        link = {"cc": path, **({"options": list(cc_options)} if cc_options else {})}
    elif cc_options:
        raise DeployError("compile_library: cc_options needs cc (the compiler they are for)")
    elif out.suffix == ".so" and foreign_arch(tgt):
        cxx = cross_cxx(tgt)
        if cxx is None:
            raise DeployError(f"compile_library: linking a .so for {foreign_arch(tgt)} needs a cross compiler "
                              f"({' or '.join(_cross_cxx_names(tgt))}) on PATH (Debian: g++-aarch64-linux-gnu); "
                              f"or write a .tar, which the machine that loads it links")
        link = {"cc": cxx}
    factory = build(mod, target=tgt, params=params, passes=passes, at=at, opt_level=opt_level, amx=amx)
    factory.export_library(str(out), **link)
    inputs, outputs = _io_from_graph(factory.get_graph_json(), factory.get_params())
    report = factory.kernel_report
    host = tvm.target.Target(str(tgt))
    code_host = _code_host(tgt)
    meta = {
        "format": SIDECAR_FORMAT,
        "library": out.name,
        "sha256": sha256_file(out),
        "source": source,
        "target": str(host),
        **({"target_host": code_host} if code_host else {}),
        "features": sorted(isa.llvm_features(host)),
        "isa_class": isa.isa_class(host),
        "pipeline": pipeline,
        "opt_level": opt_level,
        "amx": bool(amx),
        "inputs": inputs,
        "outputs": outputs,
        "num_kernels": report.num_kernels,
        "tvm_ext": __version__,
        "tvm": tvm.__version__,
    }
    side = sidecar_path(out)
    tmp = side.with_name(side.name + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, side)
    why, missing = _cannot_run(host, code_host)
    if why:
        logger.info("%s cannot run on this host: %s", out, why)
    return Compiled(out, side, str(host), report.num_kernels, out.stat().st_size, missing, why, report, meta)


def read_sidecar(lib_path) -> dict:
    """The sidecar of ``lib_path``, checked against the library (exists, format, sha256).

    Raises
    ------
    DeployError
        Missing library or sidecar, malformed sidecar, sidecar of another file.
    """
    lib = Path(lib_path)
    if not lib.exists():
        raise DeployError(f"no such file: {lib}")
    if lib.is_dir():
        raise DeployError(f"{lib} is a directory, not a TVM library")
    side = sidecar_path(lib)
    if not side.exists():
        raise DeployError(f"{lib}: not a library written by `tvm-ext compile` (no {side.name} next to it, which "
                          f"says the inputs and CPU features the library needs)")
    try:
        meta = json.loads(side.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DeployError(f"{side}: not a tvm-ext sidecar ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != SIDECAR_FORMAT or not isinstance(meta.get("inputs"), list):
        raise DeployError(f"{side}: not a tvm-ext sidecar of format {SIDECAR_FORMAT}")
    if meta.get("sha256") != sha256_file(lib):
        raise DeployError(f"{side} describes another file (sha256 differs from {lib.name}); compile again")
    return meta


def foreign_arch(target) -> Optional[str]:
    """The target's architecture when it is not this host's (``-mtriple``; for a device target, its
    host's), else None.

    :func:`tvm_ext.x86.isa.missing_on_host` compares x86 feature names only: an aarch64 target has
    none of them missing, so the architecture is checked first.
    """
    import tvm
    from tvm.target import codegen

    tgt = target if isinstance(target, tvm.target.Target) else tvm.target.Target(str(target))
    if tgt.kind.name != "llvm" and tgt.host is not None:
        tgt = tgt.host  # a device target (opencl): its host code's architecture
    triple = tgt.attrs.get("mtriple") if tgt.kind.name == "llvm" else None
    if not triple:
        return None
    arch, host = str(triple).split("-")[0], str(codegen.llvm_get_system_triple()).split("-")[0]
    return None if arch == host else str(triple)


def _cross_cxx_names(target) -> list:
    """Cross compiler names for the target's triple: ``<triple>-g++``, then Debian's ``<arch>-linux-gnu-g++``."""
    triple = foreign_arch(target)
    if not triple:
        return []
    names = [f"{triple}-g++", f"{triple.split('-')[0]}-linux-gnu-g++"]
    return list(dict.fromkeys(names))


def cross_cxx(target) -> Optional[str]:
    """The cross compiler on PATH that links libraries for ``target``'s architecture, or None
    (also None for a target of this host's architecture: the system compiler links those)."""
    for name in _cross_cxx_names(target):
        path = shutil.which(name)
        if path:
            return path
    return None


def _code_host(target) -> Optional[str]:
    """The CPU target of the host code of a build for a device target (``opencl``), else None."""
    import tvm

    from .. import families

    tgt = target if isinstance(target, tvm.target.Target) else tvm.target.Target(str(target))
    if tgt.kind.name == "llvm":
        return None
    host = families.build_target(tgt).host
    return str(host) if host is not None else None


def _cannot_run(target, host: Optional[str] = None) -> tuple[Optional[str], tuple]:
    """``(why, missing features)``: why code for ``target`` (its host code for ``host``, a device
    target's) cannot run on this host, or ``(None, ())``. For ``opencl`` this loads TVM's OpenCL
    runtime plugin (:func:`tvm_ext.gpu.opencl.missing`)."""
    import tvm
    from tvm.target import codegen

    from ..x86 import isa

    tgt = tvm.target.Target(str(target))
    if tgt.kind.name == "opencl":
        from ..gpu import opencl

        if host:
            why, missing = _cannot_run(host)
            if why:
                return f"its host code: {why}", missing
        why = opencl.missing()
        return (f"its kernels run on an OpenCL device, and {why}" if why else None), ()
    if tgt.kind.name != "llvm":
        return (f"target kind {tgt.kind.name!r}: tvm-ext run runs LLVM CPU libraries only, and opencl ones on an "
                "OpenCL device"), ()
    arch = foreign_arch(tgt)
    if arch:
        host = str(codegen.llvm_get_system_triple()).split("-")[0]
        return f"architecture {arch.split('-')[0]}, this host is {host}", ()
    missing = tuple(isa.missing_on_host(tgt))
    if missing:
        return (f"needs CPU features this host lacks ({', '.join(missing)}); running it would die with "
                f"SIGILL"), missing
    return None, ()


def check_runs_here(meta: dict) -> None:
    """Raise :class:`DeployError` when the library's target needs CPU features this host lacks, or
    OpenCL kernels no OpenCL device here runs."""
    try:
        why, _missing = _cannot_run(meta["target"], meta.get("target_host"))
    except Exception as err:  # a sidecar target TVM cannot parse
        raise DeployError(f"sidecar target {meta.get('target')!r} is not a valid TVM target ({err})") from None
    if why:
        remedy = ("Run `make gpu-env`, or compile for this CPU (omit --target)" if _kind(meta) == "opencl"
                  else "Compile for this host (omit --target)")
        raise DeployError(f"compiled for {meta['target']}: {why}. {remedy}")


def _kind(meta: dict) -> str:
    return str(meta.get("target", "")).split()[0] if meta.get("target") else ""


def _device(meta: dict, lib):
    """``(device, words)``: where the library's kernels run (``tvm.opencl(0)`` for an ``opencl`` library)."""
    import tvm

    if _kind(meta) != "opencl":
        return tvm.cpu(0), "the CPU"
    from ..gpu import opencl

    if any(m.type_key == "opencl" and not m.is_runnable for m in opencl._walk(lib)):
        raise DeployError("the library's OpenCL module was loaded as source only (TVM's OpenCL runtime was not "
                          "loaded first)")
    return tvm.opencl(0), opencl.describe()


def match_inputs(meta: dict, arrays: Mapping[str, np.ndarray] | None = None,
                 positional: Sequence[np.ndarray] = ()) -> dict:
    """Assign arrays to the library's inputs and check shape and dtype.

    Named arrays go to their input; positional ones fill the remaining inputs in order.
    """
    specs = meta["inputs"]
    names = [s["name"] for s in specs]
    arrays = dict(arrays or {})
    unknown = [n for n in arrays if n not in names]
    if unknown:
        raise DeployError(f"unknown input name(s) {unknown}; the library's inputs are {names}")
    rest = [n for n in names if n not in arrays]
    if len(positional) > len(rest):
        raise DeployError(f"{len(positional)} unnamed input(s) for {len(rest)} remaining input(s) {rest}")
    arrays.update(zip(rest, positional))
    missing = [n for n in names if n not in arrays]
    if missing:
        raise DeployError(f"missing input(s) {missing}; give --input NAME=FILE.npy")
    for s in specs:
        a = np.asarray(arrays[s["name"]])
        if list(a.shape) != list(s["shape"]) or str(a.dtype) != s["dtype"]:
            raise DeployError(f"input {s['name']!r}: got {a.dtype}{list(a.shape)}, the library takes "
                              f"{s['dtype']}{list(s['shape'])}")
    return {s["name"]: np.asarray(arrays[s["name"]]) for s in specs}


def load_library(lib_path):
    """``tvm.runtime.load_module(lib_path)``, writing nothing beside the library.

    A ``.tar`` is untarred and linked (``tvm.contrib.cc.create_shared``, as TVM's loader does) in a
    private temporary directory, removed once the shared object is loaded (the mapping stays).
    """
    import tvm

    from ..x86 import amx

    amx.request_tile_state()  # AMX kernels need Linux's tile permission (asked once; no-op without AMX)
    path = Path(lib_path)
    if path.suffix != ".tar":
        return tvm.runtime.load_module(str(path))
    from tvm.contrib import cc, tar

    tmp = Path(tempfile.mkdtemp(prefix="tvm_ext_load_"))
    try:
        objects = tmp / "objects"
        objects.mkdir()
        tar.untar(str(path), str(objects))
        shared = tmp / (path.name + ".so")
        cc.create_shared(str(shared), sorted(str(p) for p in objects.iterdir()))
        return tvm.runtime.load_module(str(shared))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_library(lib_path, inputs: Mapping[str, np.ndarray] | None = None, positional: Sequence[np.ndarray] = (),
                repeat: int = 0) -> RunResult:
    """Load a library written by :func:`compile_library` with plain TVM and run it once (an ``opencl``
    library on ``tvm.opencl(0)``; ``RunResult.meta["device"]`` says where).

    Parameters
    ----------
    lib_path : str or os.PathLike
    inputs : mapping of str to array, optional
        Inputs by name.
    positional : sequence of arrays
        Inputs for the names not given, in the library's order.
    repeat : int
        When > 0, time ``repeat`` further runs (after the first) and return the median in ms.

    Raises
    ------
    DeployError
        See :func:`read_sidecar`, :func:`check_runs_here`, :func:`match_inputs`; or TVM cannot
        load the file (an ``opencl`` library: or its OpenCL module cannot run).
    """
    from tvm.contrib import graph_executor

    if repeat < 0:
        raise DeployError(f"run_library: repeat must be >= 0, got {repeat}")
    meta = read_sidecar(lib_path)
    check_runs_here(meta)  # before loading: code for missing features must never execute
    feed = match_inputs(meta, inputs, positional)
    try:
        lib = load_library(lib_path)
        factory = lib["default"]
    except Exception as err:  # TVMError, tar/linker errors
        last = [ln for ln in str(err).splitlines() if ln.strip()]
        raise DeployError(f"{lib_path}: not a TVM library ({last[-1] if last else type(err).__name__})") from None
    dev, where = _device(meta, lib)
    meta = {**meta, "device": where}
    gm = graph_executor.GraphModule(factory(dev))
    for name, arr in feed.items():
        gm.set_input(name, arr)
    gm.run()
    outputs = [gm.get_output(i).numpy() for i in range(gm.get_num_outputs())]
    latency = None
    if repeat:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            gm.run()
            times.append((time.perf_counter() - t0) * 1e3)
        latency = statistics.median(times)
    return RunResult(outputs, latency, repeat, meta)
