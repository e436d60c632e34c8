"""One variant benchmarked: its builds (stock, tvm-ext, the exact reference) in child processes, its
peers, the numerics on seeded inputs, the interleaved timing and the latency ratios."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from . import _jobs
from ._jobs import EXACT_TARGET, NUM_CHECK_INPUTS, VARIANTS, LoadedBuild, _is_integer_graph, load_variant
from ._measure import _inputs, _interleaved_timing, _latency, compare_outputs, ort_engine
from ._peers import _openvino_engines
from ._real import _output_step, real_variant


def bench_variant(key, *, target, small, model_path, repeat, threads, progress, workdir, parallel=True,
                  ext_target=None, tuned: bool = True, compare_untuned: bool = False,
                  numerics: str = "tvm", ort_package=None, ort_exact: bool = False,
                  openvino_isa: Optional[str] = None, board=None) -> dict:
    """Build, check and time one variant; returns its results dict (errors recorded, not raised).

    ``target`` is stock TVM's target (what plain relay.build survives); ``ext_target`` is
    tvm-ext's (default: the same). When they differ, stock TVM is also built at ``ext_target``
    (``tvm_same``, with only the VNNI operand types fixed), compared but not a reference.
    An integer graph is also built at plain ``llvm`` (``exact``): exact integer arithmetic, the
    reference of the numerics; it is not timed.
    ``compare_untuned`` adds tvm-ext without tuning records (``tvm_ext_untuned``) to the same run.
    ``numerics`` is :func:`tvm_ext.core.pipelines.int8`'s (``"onnxruntime"``: round as ONNX Runtime does).
    ``ort_package``: run ONNX Runtime from this package directory in a child process (see
    :func:`ort_peer`); None: the installed one, in this process; ``ort_exact``: also time it on its
    exact int8 path (``onnxruntime_exact``). ONNX models also run in OpenVINO
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
    built = _jobs.run_builds(jobs, parallel)
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
        for name, exact in [("onnxruntime", False)] + ([("onnxruntime_exact", True)] if ort_exact else []):
            try:
                engines.append(ort_engine(v["onnx_path"], v["input_name"], threads, ort_package, exact=exact))
            except Exception as err:
                res["pipelines"][name] = {"error": f"{type(err).__name__}: {err}"}
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
    ("tvm_ext", "onnxruntime_exact"),
    ("openvino", "onnxruntime"),
    ("tvm_ext", "openvino"), ("tvm_ext", "openvino_isa"), ("openvino_isa", "openvino"),
    ("tvm_ext", "tvm_ext_saturating"),
)


def _ratios(pipelines: dict) -> dict:
    lat = {k: (p.get("latency") or {}).get("median_ms") for k, p in pipelines.items()}
    return {f"{a}/{b}": lat[a] / lat[b] for a, b in RATIO_PAIRS if lat.get(a) and lat.get(b)}
