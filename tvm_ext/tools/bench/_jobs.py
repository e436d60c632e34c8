"""The benchmark's models and builds: a variant loaded from the zoo or a file, each build job in its own
child process (a crash is a result), and a build loaded back as an engine."""
from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Optional

from ._measure import Engine

logger = logging.getLogger(__name__)

#: The benchmark's ResNet-50 variants: key -> (zoo name, label).


VARIANTS = {
    "qoperator": ("resnet50_int8_qoperator", "(a) ONNX int8 QOperator"),
    "qdq": ("resnet50_int8_qdq", "(b) ONNX int8 QDQ"),
    "relay": ("resnet50_int8_relay", "(c) relay.quantize"),
}
#: seeded inputs every build's outputs are compared on
NUM_CHECK_INPUTS = 8

#: The exact reference's target: no -mcpu, so LLVM emits no int8 SIMD (TVM's x86 int8 schedules
#: need SSSE3 or later) and every integer product and sum is exact.
EXACT_TARGET = "llvm"


# --- one variant -----------------------------------------------------------------------------
def load_variant(key: str, small: bool, model_path: Optional[str], import_relay: bool = True):
    """The variant's model; ``import_relay=False`` for a zoo ONNX model: paths and input only (no
    Relay import in the parent process, which takes minutes for the real models; the builds
    import it in their child processes)."""
    from .. import zoo
    from ...core.frontend import from_onnx, input_info

    if model_path:
        info = input_info(model_path)
        if len(info) != 1:
            raise ValueError(f"{model_path}: the benchmark needs a model with one input, found {list(info)}")
        (name, (shape, dtype)), = info.items()
        mod, params = from_onnx(model_path, shape={name: shape})
        return dict(label=Path(model_path).name, mod=mod, params=params, input_name=name,
                    input_shape=tuple(shape), input_dtype=dtype, onnx_path=Path(model_path))
    if key not in VARIANTS:  # any zoo name, e.g. a real model "yolov8n_int8_qdq"
        if not import_relay:
            path = zoo.onnx_path(key)
            (name, (shape, dtype)), = input_info(str(path)).items()
            return dict(label=key, mod=None, params=None, input_name=name, input_shape=tuple(shape),
                        input_dtype=dtype, onnx_path=path, zoo_name=key)
        m = zoo.load(key)
        return dict(label=key, mod=m.mod, params=m.params, input_name=m.input_name, input_shape=tuple(m.input_shape),
                    input_dtype=m.input_dtype, onnx_path=m.onnx_path, zoo_name=key)
    zname, label = VARIANTS[key]
    m = zoo.load(zname, small=small)
    return dict(label=label + (" small" if small else ""), mod=m.mod, params=m.params, input_name=m.input_name,
                input_shape=tuple(m.input_shape), input_dtype=m.input_dtype, onnx_path=m.onnx_path)


#: Op names of the convolution and matrix-product families, in any layout AlterOpLayout gives them
#: (``nn.contrib_conv2d_NCHWc``, ``nn.contrib_dense_pack``, ...).
_ANCHOR_FAMILIES = ("conv", "dense", "matmul")


def _float_anchors(mod) -> int:
    """How many convolutions and dense layers compute in float (inside fused groups too), before or
    after relay.build's prefix (NCHWc and packed forms count)."""
    from tvm import relay

    found = []

    def visit(node):
        name = getattr(getattr(node, "op", None), "name", "") if isinstance(node, relay.Call) else ""
        if name.startswith("nn.") and "weight_transform" not in name and any(f in name for f in _ANCHOR_FAMILIES):
            if str(node.checked_type.dtype).startswith("float"):
                found.append(name)

    m = relay.transform.InferType()(mod)
    relay.analysis.post_order_visit(m["main"], visit)
    return len(found)


def _is_integer_graph(mod) -> bool:
    """True when the model computes in integers (no float conv/dense), so bit-exactness applies."""
    return _float_anchors(mod) <= 1  # relay.quantize keeps the first conv in float


def _build_job(job: dict) -> dict:
    """Build one pipeline in a worker process; returns paths of the exported module + report.

    Run in a separate process so the two builds of a variant use both cores (TVM's compiler is
    single-threaded) and a failing build cannot take the benchmark down.
    """
    import tvm
    from tvm import relay

    from ...core import pipelines, tvm_bugs
    from ...x86 import exact_record, int8_conv as x86_int8
    from ...core.build import build, copy_module
    from ...core.report import KernelReport

    logging.basicConfig(level=job.get("log_level", logging.WARNING))
    logging.getLogger("autotvm").setLevel(logging.ERROR)
    v = load_variant(job["key"], job["small"], job["model_path"])
    target = tvm.target.Target(job["target"])  # already resolved by run(): stock or tvm-ext target
    t0 = time.perf_counter()
    workaround = None
    from ...core.explain import FuseOpsInput

    fuse_input = FuseOpsInput()  # the module FuseOps sees, for the explainer summary
    # "exact": relay.build at plain `llvm` (no -mcpu): no int8 SIMD, so integer arithmetic is exact;
    # the reference the other builds are compared with. An integer graph as imported (QOperator,
    # relay.quantize) is built as stock builds it; a QDQ graph computes convolutions in float until
    # tvm-ext's pipeline makes them integer, so its reference is that integer graph, built with
    # TVM's own kernels (tvm-ext's kernel policy off)
    exact_graph, float_anchors = None, None
    if job["pipeline"] == "exact":
        float_anchors = _float_anchors(v["mod"])
        exact_graph = "imported" if float_anchors == 0 else "tvm-ext pipeline"
    if job["pipeline"] in ("tvm", "tvm_same") or exact_graph == "imported":
        # "tvm_same": stock relay.build at tvm-ext's target, with only x86_int8's vnni_operand_types
        # (TVM's own VNNI intrinsic aborts under LLVM 22): the bit-exactness reference for a VNNI build
        def stock_build(config):
            fix = x86_int8.kernels(schedule=False) if job["pipeline"] == "tvm_same" else contextlib.nullcontext()
            with fix, tvm.transform.PassContext(opt_level=3, config=config, instruments=[fuse_input.make()]):
                return relay.build(copy_module(v["mod"]), target=target, params=v["params"])

        try:
            fac = stock_build({})
        except tvm.TVMError as err:
            if not tvm_bugs.is_llvm_debug_info_error(err):
                raise
            # TVM 0.19 + LLVM 22 (tvm_bugs.is_llvm_debug_info_error): the same workaround as
            # tvm_ext.build's, TIR CSE off; the kernels and their schedules stay stock TVM's
            workaround = f"{tvm_bugs.NO_TIR_CSE}=True"
            logging.getLogger(__name__).warning("%s: stock relay.build failed LLVM's verifier (TVM 0.19 debug "
                                                "info with LLVM 22); building again with %s", job["key"], workaround)
            fac = stock_build({tvm_bugs.NO_TIR_CSE: True})
        report, passes = KernelReport.from_factory(fac).to_dict(), None
    else:
        pipe = pipelines.int8(numerics=job.get("numerics", "tvm"))  # "onnxruntime": benchmarks/lab/real_matrix.py
        own_kernels = {"kernels": False, "tuned": False} if exact_graph else {"tuned": job.get("tuned", True)}
        # "tvm_ext_saturating": TVM's saturating vpmaddubsw kept everywhere, to show what exactness costs
        form = exact_record.saturating() if job["pipeline"] == "tvm_ext_saturating" else contextlib.nullcontext()
        with form:
            fac = build(v["mod"], target=target, params=v["params"], passes=pipe, instruments=[fuse_input.make()],
                        **own_kernels)
        if exact_graph:  # a layer still in float is not exact at plain llvm either: the table says so
            float_anchors = _float_anchors(fac.tvm_ext_module)
        report, passes = fac.kernel_report.to_dict(), pipe.pass_names()
    build_s = time.perf_counter() - t0
    explained = None if job["pipeline"] == "exact" else _explain_summary(fuse_input, target)
    out = Path(job["dir"])
    # a build for a remote board: object files, linked by the parent with the cross compiler (or by the board)
    lib_path = out / f"{job['pipeline']}{'.tar' if job.get('remote') else '.so'}"
    fac.get_lib().export_library(str(lib_path))
    (out / f"{job['pipeline']}.json").write_text(fac.get_graph_json())
    (out / f"{job['pipeline']}.params").write_bytes(relay.save_param_dict(fac.get_params()))
    return {"build_s": build_s, "report": report, "passes": passes, "explain": explained, "lib": str(lib_path),
            "exact_graph": exact_graph, "float_anchors": float_anchors,
            "graph": str(out / f"{job['pipeline']}.json"), "params": str(out / f"{job['pipeline']}.params"),
            "workaround": workaround, "target_kind": target.kind.name}


def _explain_summary(fuse_input, target):
    """Non-anchor kernels and crossing bytes by reason (tvm_ext.explain) of the module FuseOps saw."""
    from ...core.explain import explain_prefused, summary_dict

    if fuse_input.module is None:
        return None
    try:
        return summary_dict(explain_prefused(fuse_input.module, target))
    except Exception as err:  # the benchmark must not fail on its explanation
        logger.warning("explain summary failed: %s", err)
        return None


class LoadedBuild:
    """A module exported by :func:`_build_job`, loaded back for the graph executor: on the CPU, or
    for an ``opencl`` build on ``tvm.opencl(0)`` (TVM's OpenCL runtime plugin is loaded first, so its
    loader builds the OpenCL module; the build's child process never needs it)."""

    def __init__(self, built: dict):
        import tvm
        from tvm import relay

        self.device = tvm.cpu()
        if built.get("target_kind") == "opencl":
            from ...gpu import opencl

            why = opencl.missing()
            if why:
                raise RuntimeError(f"an opencl build runs on an OpenCL device: {why}")
            self.device = tvm.opencl(0)
        self.lib = tvm.runtime.load_module(built["lib"])
        self.graph = Path(built["graph"]).read_text()
        self.params = relay.load_param_dict(Path(built["params"]).read_bytes())

    def engine(self, name, input_name):
        import tvm
        from tvm.contrib import graph_executor

        gm = graph_executor.create(self.graph, self.lib, self.device)
        gm.load_params(tvm.runtime.save_param_dict(self.params))

        def call(x):
            gm.set_input(input_name, x)
            gm.run()
            return gm.get_output(0).numpy()

        return Engine(name, call)


def job_main(job: dict) -> None:
    """Child-process entry: run :func:`_build_job`, write its result (or error) as JSON."""
    out = Path(job["dir"]) / f"{job['pipeline']}.result.json"
    try:
        res = _build_job(job)
    except Exception as err:
        logging.getLogger(__name__).exception("%s build failed", job["pipeline"])
        res = {"error": error_line(err), "error_detail": str(err)[:4000]}
    out.write_text(json.dumps(res, default=str))


def error_line(err: Exception) -> str:
    """One line for the table: the first line naming the error (TVM puts it first, LLVM's IR dump last)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    named = [ln for ln in lines if any(w in ln for w in ("Error", "error:", "Check failed", "Assert", "failed"))]
    text = (named or lines or [""])[0]
    return f"{type(err).__name__}: {text[:300]}"


def crash_text(exitcode: int) -> str:
    """One line for a child process that died without a result: its exit code or signal."""
    import signal

    if exitcode < 0:
        try:
            return f"crashed (signal {-exitcode}, {signal.Signals(-exitcode).name})"
        except ValueError:
            return f"crashed (signal {-exitcode})"
    return f"crashed (exit code {exitcode}, no result)"


def run_builds(jobs, parallel: bool, _child=None):
    """Run build jobs, each in its own child process (all at once when ``parallel``).

    {pipeline: result or {"error": ...}}. A child killed by a signal (a segfault or an LLVM
    assertion in a real model's build) is reported as ``"crashed (signal N, SIGSEGV)"`` for that
    pipeline only; the other builds and the benchmark go on. ``parallel=False`` runs the jobs in
    this process, one after the other (no crash isolation). ``_child`` replaces the child's
    entry point (tests).
    """
    import multiprocessing as mp

    results = {}
    if parallel:
        ctx = mp.get_context("spawn")
        procs = {}
        for job in jobs:
            Path(job["dir"], f"{job['pipeline']}.result.json").unlink(missing_ok=True)
            procs[job["pipeline"]] = p = ctx.Process(target=_child or job_main, args=(job,),
                                                     name=f"build-{job['pipeline']}")
            p.start()
        for job in jobs:
            name = job["pipeline"]
            procs[name].join()
            res_file = Path(job["dir"], f"{name}.result.json")
            if res_file.is_file():
                results[name] = json.loads(res_file.read_text())
            else:
                results[name] = {"error": crash_text(procs[name].exitcode)}
            if "error" in results[name]:
                logger.error("%s build failed: %s", name, results[name]["error"])
    else:
        for job in jobs:
            try:
                results[job["pipeline"]] = _build_job(job)
            except Exception as err:
                logger.exception("%s build failed", job["pipeline"])
                results[job["pipeline"]] = {
                    "error": f"{type(err).__name__}: {str(err).splitlines()[-1] if str(err) else ''}"}
    return results
