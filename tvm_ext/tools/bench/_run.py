"""``tvm-ext bench``'s entry point: the targets and peers chosen, the environment recorded, every
variant benchmarked, and ``results.json``, ``results.md`` and ``chart.png`` written."""
from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import platform
from pathlib import Path
from typing import Optional

from . import _render
from ._environment import _command_line, cpu_name, opencl_device_text, source_commit, versions
from ._measure import Progress, _set_tvm_threads
from ._peers import openvino_peer, ort_peer
from ._render import render_markdown
from ._variant import bench_variant

logger = logging.getLogger(__name__)


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
                                  ort_package=peer["package"], ort_exact=bool(peer.get("exact")),
                                  openvino_isa=ov_peer["cap"], board=board))
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
