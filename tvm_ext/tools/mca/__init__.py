"""Static analysis of tvm-ext's int8 kernels with LLVM's machine-code analyser, on CPU models at hand or not.

:func:`analyze` builds a Relay module with ``tvm_ext.build(..., passes=pipelines.int8())`` for a CPU
model's target (cross-compiled; nothing is executed), takes the generated assembly, finds each
conv and dense kernel's hot loop (:mod:`._asm`: the innermost loop with the most int8 dot-product
MACs), predicts its cycles per iteration with ``llvm-mca -mcpu=<model>`` (:mod:`._llvm_mca`) and
compares its MACs per cycle with the model's dot-product peak (:mod:`._peak`). The whole-model
estimate sums, over kernels, MACs / predicted MACs per cycle, against the same MACs at the peak.

What llvm-mca cannot see (docs/kernels-static.md): caches and memory bandwidth (every load hits L1),
the loops around the hot loop, tile edges, threads, and every kernel that is not a conv or a dense.

    from tvm_ext.tools import mca
    a = mca.analyze(mod, params, cpu="neoverse-n1")
    a.share          # whole-model estimate: fraction of the peak
    a.kernels[0]     # per kernel: MACs, hot loop, cycles per iteration, MACs per cycle, share
"""
from __future__ import annotations

import collections
import json
import logging
from dataclasses import dataclass, field
from typing import Optional

from . import _asm, _llvm_mca, _macs, _peak
from ._cpus import CPU_MODELS, CpuModel, cpu_model
from ._graphs import ConvShape, resnet50_convs, single_conv
from ._llvm_mca import McaError, McaResult, llvm_mca_path
from ._peak import Peak, peak

logger = logging.getLogger(__name__)

__all__ = ["analyze", "analyze_factory", "analyze_convs", "Analysis", "KernelEstimate", "CPU_MODELS", "CpuModel",
           "cpu_model", "ConvShape", "resnet50_convs", "single_conv", "McaError", "McaResult", "llvm_mca_path",
           "Peak", "peak"]


@dataclass(frozen=True)
class KernelEstimate:
    """One conv or dense kernel: its MACs per launch, launches, hot loop and llvm-mca's prediction."""

    name: str
    macs: int
    launches: int
    hot: Optional[_asm.HotLoop]
    mca: Optional[McaResult]
    peak: Peak
    kind: str = ""  # "depthwise", "float" or "" (tvm_ext.tools.mca._macs.kind)
    conv: str = ""  # the kernel's conv or dense in words (tvm_ext.tools.mca._macs.describe)
    cpu: str = ""  # the CPU model the prediction is for

    @property
    def macs_per_cycle(self) -> float:
        return self.hot.macs / self.mca.cycles_per_iteration if self.mca else 0.0

    @property
    def share(self) -> float:
        """Predicted MACs per cycle over the CPU model's peak (0 without a hot loop)."""
        return self.macs_per_cycle / self.peak.macs_per_cycle

    @property
    def form_share(self) -> float:
        """The hot loop's dot instructions at the CPU model's rate for their own forms (register or memory
        source: :data:`tvm_ext.tools.mca._peak.FORMS`) over its predicted cycles, in MACs as :attr:`share`
        counts them; :attr:`share` on aarch64 models (their dots have no memory form) and where the model
        has no peak loop of one of the loop's forms.

        Where a model rates the forms alike this is :attr:`share`. LLVM 22's Zen 4 model gives a
        register-form ``vpdpbusd zmm`` half the memory form's rate, and the real Zen 4 runs both at the
        memory form's (docs/kernels-static.md): there a register-form loop's :attr:`share` reads about
        half of this, and this times the host's measured peak is what the loop should take.
        """
        if not self.mca:
            return 0.0
        if not self.cpu or not cpu_model(self.cpu).triple.startswith("x86_64"):
            return self.share
        per_loop = _peak.COPIES * _peak.UNROLL
        cycles = raw_macs = 0.0
        for key, n in self.hot.dots.items():
            memory = self.hot.memory_dots.get(key, 0)
            for form, count in ((key, n - memory), (f"{key} mem", memory)):
                if not count:
                    continue
                if form not in _peak.FORMS:
                    return self.share
                p = _peak.form_peak(self.cpu, form)
                cycles += count * p.cycles_per_iteration / per_loop
                raw_macs += count * p.macs_per_cycle * p.cycles_per_iteration / per_loop
        return cycles / self.mca.cycles_per_iteration * self.hot.macs / raw_macs

    @property
    def limit(self) -> str:
        """What bounds the hot loop in llvm-mca's model, with its figures per iteration
        (:class:`tvm_ext.tools.mca._llvm_mca.Limit`), and its register spills; "" without a hot loop."""
        if not self.mca:
            return ""
        text = str(self.mca.limit) if self.mca.limit else self.mca.bound
        spills = self.hot.stack_accesses
        return text + (f"; {spills} stack loads/stores (spills)" if spills else "")

    @property
    def cycles(self) -> float:
        """Predicted cycles of all launches' MACs at the hot loop's rate (inf without one)."""
        return self.launches * self.macs / self.macs_per_cycle if self.mca else float("inf")

    def to_dict(self) -> dict:
        d = {"name": self.name, "macs": self.macs, "launches": self.launches, "kind": self.kind, "conv": self.conv}
        if self.hot:
            d.update(dots=self.hot.dots, accumulators=self.hot.accumulators,
                     macs_per_iteration=self.hot.macs, instructions=self.hot.instructions,
                     cycles_per_iteration=self.mca.cycles_per_iteration, macs_per_cycle=self.macs_per_cycle,
                     share=self.share, form_share=self.form_share, bound=self.mca.bound, limit=self.limit,
                     limit_kind=self.mca.limit.kind if self.mca.limit else "",
                     limit_users=list(self.mca.limit.users) if self.mca.limit else [], function=self.hot.function)
        return d


@dataclass
class Analysis:
    """The kernels of one build on one CPU model, and the whole-model estimate."""

    cpu: str
    peak: Peak
    kernels: list = field(default_factory=list)

    @property
    def modelled(self) -> list:
        """The kernels with a hot loop."""
        return [k for k in self.kernels if k.mca]

    @property
    def unmodelled(self) -> list:
        """Conv and dense kernels without an int8 dot-product loop (e.g. a float stem)."""
        return [k for k in self.kernels if not k.mca]

    @property
    def macs(self) -> int:
        return sum(k.macs * k.launches for k in self.modelled)

    @property
    def cycles(self) -> float:
        """Sum over modelled kernels of MACs / predicted MACs per cycle."""
        return sum(k.cycles for k in self.modelled)

    @property
    def form_share(self) -> float:
        """Whole-model estimate with each kernel's :attr:`KernelEstimate.form_share` (MAC-weighted harmonic
        mean, as :attr:`share`)."""
        at_form_rate = sum(k.launches * k.macs / k.form_share for k in self.modelled)
        return self.macs / at_form_rate if at_form_rate else 0.0

    @property
    def peak_cycles(self) -> float:
        return self.macs / self.peak.macs_per_cycle

    @property
    def share(self) -> float:
        """Whole-model estimate: cycles at the peak over predicted cycles (MAC-weighted harmonic share)."""
        return self.peak_cycles / self.cycles if self.cycles else 0.0

    def merge(self, other: "Analysis") -> "Analysis":
        if other.cpu != self.cpu:
            raise ValueError(f"cannot merge analyses of {self.cpu} and {other.cpu}")
        return Analysis(self.cpu, self.peak, self.kernels + other.kernels)

    def to_dict(self) -> dict:
        return {"cpu": self.cpu, "peak_form": self.peak.form, "peak_macs_per_cycle": self.peak.macs_per_cycle,
                "share": self.share, "macs": self.macs, "cycles": self.cycles,
                "kernels": [k.to_dict() for k in self.kernels]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)


def _assembly(factory) -> str:
    lib = factory.get_lib()
    for m in [lib, *lib.imported_modules]:
        if m.type_key == "llvm":
            return m.get_source("asm")
    raise ValueError(f"no LLVM module in the build (modules: {[m.type_key for m in [lib, *lib.imported_modules]]})")


def _kernel_funcs(factory) -> dict:
    out = {}
    for name, info in (getattr(factory, "function_metadata", None) or {}).items():
        for _target, func in info.relay_primfuncs.items():
            out[str(name)] = func
            break
    return out


def _depthwise_row(func, model) -> tuple:
    """``(kernel width, dots per output and kernel row)`` of a depthwise kernel built for ``model``: x86's
    tap forms (:func:`tvm_ext.x86.depthwise_taps.dots_per_kernel_row`), else groups of 4 taps (0)."""
    import tvm

    from ...x86 import depthwise_taps

    kw, sw, out_w = _macs.kernel_row(func)
    if kw <= 0 or not model.triple.startswith("x86_64"):
        return kw, 0
    return kw, depthwise_taps.dots_per_kernel_row(kw, sw, out_w, tvm.target.Target(model.target))


def analyze_factory(factory, cpu: str) -> Analysis:
    """:class:`Analysis` of a built module (``tvm_ext.build``'s result for ``cpu_model(cpu).target``)."""
    model = cpu_model(cpu)
    graph = json.loads(factory.get_graph_json())
    launches = collections.Counter(n["attrs"]["func_name"] for n in graph["nodes"] if n["op"] == "tvm_op")
    funcs = _asm.parse(_assembly(factory))
    by_kernel = _asm.kernels(funcs)
    relay_funcs = _kernel_funcs(factory)
    top = peak(cpu)
    out = Analysis(cpu, top)
    for name, n in launches.items():
        macs = _macs.macs(relay_funcs[name]) if name in relay_funcs else 0
        if not macs:
            continue
        kind = _macs.kind(relay_funcs[name])
        hot = _asm.hot_loop(name, funcs, by_kernel.get(name, []), kind)
        if hot is not None and kind == "depthwise":  # a dot over 4 taps: the products with a weight
            hot = _asm.depthwise_taps(hot, *_depthwise_row(relay_funcs[name], model))
        res = _llvm_mca.run(hot.text, model.triple, model.mcpu, model.mattr) if hot else None
        if hot is None:
            logger.info("%s: no int8 dot-product loop in %s", cpu, name)
        out.kernels.append(KernelEstimate(name, macs, n, hot, res, top, kind, _macs.describe(relay_funcs[name]), cpu))
    return out


def analyze(mod, params=None, cpu: str = "znver5") -> Analysis:
    """Build ``mod`` with the int8 pipeline for CPU model ``cpu`` (compile only) and analyse its kernels.

    Parameters
    ----------
    mod : tvm.IRModule
        An int8 Relay module (e.g. ``tvm_ext.tools.zoo.load(name).mod``).
    params : dict, optional
        Its weights.
    cpu : str
        A name of :data:`CPU_MODELS`.

    Returns
    -------
    Analysis

    Raises
    ------
    ValueError
        An unknown CPU model.
    McaError
        llvm-mca is missing or rejects a loop.
    """
    import tvm_ext
    from tvm_ext.core import pipelines

    model = cpu_model(cpu)
    llvm_mca_path()  # fail before the build when llvm-mca is missing
    factory = tvm_ext.build(mod, target=model.target, params=params, passes=pipelines.int8())
    return analyze_factory(factory, cpu)


def analyze_convs(cpu: str, shapes) -> dict:
    """``{ConvShape: Analysis}``: each shape built and analysed alone as :func:`single_conv`."""
    return {s: analyze(single_conv(s), cpu=cpu) for s in shapes}
