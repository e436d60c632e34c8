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

This package prints (it is ``tvm-ext bench``); the progress bar goes to stderr. ``_run`` is the entry
point, ``_variant`` benchmarks one variant, ``_jobs`` loads and builds variants in child processes,
``_measure`` times engines and compares their outputs, ``_peers`` picks ONNX Runtime and OpenVINO,
``_real`` reads real models' output steps, ``_environment`` records the host and versions,
``_render`` writes ``results.md`` and the chart, ``_board`` runs builds on a remote board.
"""
from __future__ import annotations

from ._environment import cpu_name, opencl_device_text, source_commit, versions
from ._jobs import EXACT_TARGET, NUM_CHECK_INPUTS, VARIANTS, LoadedBuild, crash_text, error_line, job_main, \
    load_variant, run_builds
from ._measure import Engine, Progress, compare_outputs, ort_engine
from ._peers import openvino_peer, ort_peer
from ._real import real_variant, real_variants
from ._render import render_markdown
from ._run import run
from ._variant import RATIO_PAIRS, bench_variant

# private helpers that tests and benchmarks/ reach through the package
from ._peers import _openvino_engines as _openvino_engines
from ._real import _output_step as _output_step
from ._variant import _ratios as _ratios

#: The public API: ``tvm-ext bench`` (:func:`run`) and the pieces ``benchmarks/`` builds its own studies from
#: (load a variant, build it in child processes, load a build back, run ONNX Runtime, compare outputs, record
#: the environment).
__all__ = ["run", "bench_variant", "VARIANTS", "NUM_CHECK_INPUTS", "real_variants", "render_markdown", "ort_peer",
           "openvino_peer", "real_variant", "cpu_name", "versions", "load_variant", "run_builds", "job_main",
           "LoadedBuild", "error_line", "crash_text", "Engine", "ort_engine", "compare_outputs", "EXACT_TARGET",
           "Progress", "RATIO_PAIRS", "opencl_device_text", "source_commit"]
