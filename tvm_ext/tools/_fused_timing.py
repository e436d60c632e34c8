"""Timing a conv's kernels where they run: inside a built model, with the epilogue fused into them.

Leaf module of :mod:`tvm_ext.tools.tune`, whose knob search times each conv alone (the AutoTVM task,
without its fused epilogue): :func:`build_with` builds the model with a set of records and no others,
:func:`kernel_nodes` finds the graph executor's nodes that compile a workload (the kernels the kernel
report marks for it), and :func:`fused_kernel_ms` times those kernels in several built models in
alternation with the debug executor.
"""
from __future__ import annotations

import json
import tempfile

import numpy as np

from ..core.build import build
from ..core.report import KernelReport
from ..x86 import tuning

__all__ = ["build_with", "kernel_nodes", "fused_kernel_ms"]


def build_with(mod, params, target, passes, records):
    """``tvm_ext.build`` with tvm-ext's kernels, these records and no others."""
    ctx = tuning.apply(target, records) if records else None
    if ctx is None:
        return build(mod, target=target, params=params, passes=passes, kernels=True, tuned=False)
    with ctx:
        return build(mod, target=target, params=params, passes=passes, kernels=True, tuned=False)


def kernel_nodes(lib, workloads) -> dict:
    """``{workload: [node index]}``: the graph executor's nodes of the kernels that compile each workload in the
    built model ``lib``, as :meth:`tvm_ext.core.report.KernelReport.with_tuned` marks them (the kernels reading
    both its data and its weight tensor). The report lists the ``tvm_op`` nodes in graph order."""
    ops = [i for i, node in enumerate(json.loads(lib.get_graph_json())["nodes"]) if node["op"] == "tvm_op"]
    report = getattr(lib, "kernel_report", None) or KernelReport.from_factory(lib)
    return {wl: [ops[k.index] for k in report.with_tuned([wl]).kernels if k.tuned] for wl in workloads}


def fused_kernel_ms(libs: dict, workloads, *, rounds: int = 3, number: int = 10, repeat: int = 3) -> dict:
    """``{workload: {key: ms}}``: per workload, the summed time of the kernels that compile it in each built
    model of ``libs`` (``{key: factory}``, graph executor), each kernel timed alone by the debug executor
    (the fastest of ``repeat``), the models in alternation, the median of ``rounds``. A workload no
    kernel of some model compiles is left out."""
    import tvm
    from tvm.contrib.debugger import debug_executor

    with tempfile.TemporaryDirectory(prefix="tvm_ext_tune_") as dump:
        mods, nodes = {}, {}
        for key, lib in libs.items():
            m = debug_executor.create(lib.get_graph_json(), lib.get_lib(), tvm.cpu(), dump_root=dump)
            m.set_input(**lib.get_params())
            mods[key] = m
            nodes[key] = kernel_nodes(lib, workloads)
        times: dict = {wl: {key: [] for key in libs} for wl in workloads
                       if all(nodes[key][wl] for key in libs)}
        for _ in range(rounds):
            for wl, per in times.items():
                for key, m in mods.items():
                    per[key].append(sum(min(m.run_individual_node(i, number=number, repeat=repeat).results)
                                        for i in nodes[key][wl]))
    return {wl: {key: float(np.median(v)) * 1e3 for key, v in per.items()} for wl, per in times.items()}
