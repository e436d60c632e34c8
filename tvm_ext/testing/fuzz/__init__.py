"""Differential fuzzing of tvm-ext's passes, ``pipelines.int8()`` and ``tvm_ext.build``.

Design note
-----------
One module per responsibility, each importing only the ones before it:

* :mod:`.grammar`: a graph as data, :class:`Spec` (seed, layout, input, steps, variant), and the
  ``hypothesis`` strategy :func:`graph_specs` that draws it; :func:`generate` for a seed.
* :mod:`.steps` and :mod:`.builder`: :func:`build_graph` turns a spec into a type-inferred Relay
  module, deterministically; every step list builds a well-typed graph. The grammar covers what
  the passes rewrite and what quantized CNNs contain (docs/fuzzing.md lists it).
* :mod:`.execution`: what the oracle compiles for (``target``, default the host CPU) and where it
  runs it: here, on a TVM RPC server for another architecture (``rpc``), or not at all (compiled
  only, with the reason). The exact integer reference is always built for and run on this host.
* :mod:`.oracle`: :func:`check_graph`, per registered pass (:data:`PASSES`) at stages ``start``
  and ``before_fuse``, plus ``pipelines.int8()`` and ``tvm_ext.build``: no exception, the input
  unchanged, well formed, idempotent, control flow left alone, the same outputs as the build
  without the pass, and exact integer arithmetic for ``tvm_ext.build`` itself.
* :mod:`.runner`: :func:`run` checks specs in child processes (a crash or hang is a failure of
  that graph), shrinks failures (:func:`shrink`), writes them (:func:`load_failure` reads them
  back for regression tests) and adds up a :class:`Summary`; :func:`main` is
  ``python -m tvm_ext.testing.fuzz`` (``make fuzz``).
"""
from __future__ import annotations

from .builder import GeneratorError, build_graph
from .execution import NUM_INPUTS, compiled_only_reason
from .grammar import VARIANTS, Spec, generate, graph_specs
from .compare import FLOAT_ATOL, FLOAT_RTOL, QDQ_STEPS, compare_outputs
from .oracle import PASSES, Failure, GraphResult, check_graph, check_spec
from .runner import (GRAPH_TIMEOUT, Summary, check_spec_isolated, load_failure, main, run, run_specs, shrink,
                     write_failure)

__all__ = [
    "Spec",
    "graph_specs",
    "generate",
    "build_graph",
    "check_graph",
    "check_spec",
    "compare_outputs",
    "run",
    "run_specs",
    "check_spec_isolated",
    "shrink",
    "write_failure",
    "Summary",
    "load_failure",
    "PASSES",
    "main",
    "Failure",
    "GraphResult",
    "GeneratorError",
    "compiled_only_reason",
    "VARIANTS",
    "NUM_INPUTS",
    "FLOAT_RTOL",
    "FLOAT_ATOL",
    "QDQ_STEPS",
    "GRAPH_TIMEOUT",
]
