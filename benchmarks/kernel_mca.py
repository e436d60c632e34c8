#!/usr/bin/env python
"""Static estimate of tvm-ext's int8 conv and dense kernels on CPU models, with llvm-mca: per kernel, the
hot loop's MACs per cycle and its share of the model's dot-product peak; per model, the whole-model share.

Nothing is executed: every build is cross-compiled for the CPU model's target (tvm_ext.tools.mca,
docs/kernels-static.md).

    python benchmarks/kernel_mca.py                          # ResNet-50's 22 distinct convs, every CPU model
    python benchmarks/kernel_mca.py --cpu znver5 --kernels   # ... and the per-kernel table
    python benchmarks/kernel_mca.py --model resnet50_int8_qdq [--small] --cpu neoverse-n1 --kernels
    python benchmarks/kernel_mca.py --cpus                   # the CPU models and their peaks

``--model resnet50-convs`` (the default) builds each distinct conv of ResNet-50 after the stem alone
(uint8 x int8, bias, requantize to uint8) and weights it by how often ResNet-50 has it; a zoo name
(``tvm_ext.tools.zoo.list_models("all")``) builds the whole model and analyses its conv and dense kernels.
"""
import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TOPHUB_LOCATION", "NONE")

logger = logging.getLogger("kernel_mca")

CONVS = "resnet50-convs"


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _dots(k) -> str:
    return ", ".join(f"{n} {form}" for form, n in sorted(k.hot.dots.items())) if k.hot else "-"


def kernel_rows(analysis, labels=None) -> list:
    """Markdown rows per kernel of one :class:`tvm_ext.tools.mca.Analysis`."""
    head = ["kernel", "n", "MMAC", "dots / iter", "MACs / iter", "instr / iter", "cycles / iter",
            "MACs / cycle", "% peak", "bound"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in analysis.kernels:
        name = (labels or {}).get(k.name, k.name.replace("tvmgen_default_fused_", ""))
        if k.mca:
            cells = [name, str(k.launches), f"{k.macs / 1e6:.1f}", _dots(k), str(k.hot.macs), str(k.hot.instructions),
                     f"{k.mca.cycles_per_iteration:.1f}", f"{k.macs_per_cycle:.1f}", _pct(k.share),
                     k.mca.bound or "-"]
        else:
            cells = [name, str(k.launches), f"{k.macs / 1e6:.1f}", "no int8 dot loop"] + ["-"] * 6
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def convs_matrix(results: dict, shapes: dict) -> list:
    """Markdown: a row per conv shape, a column per CPU model (% of peak), the MAC-weighted share last."""
    cpus = list(results)
    head = ["conv", "n", "GMAC"] + cpus
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s, n in shapes.items():
        cells = [str(s), str(n), f"{s.macs * n / 1e9:.3f}"]
        for c in cpus:
            k = results[c][s]
            cells.append(_pct(k.share) if k.modelled else "no dot loop")
        lines.append("| " + " | ".join(cells) + " |")
    total = ["**MAC-weighted**", str(sum(shapes.values())), f"{sum(s.macs * n for s, n in shapes.items()) / 1e9:.3f}"]
    total += [f"**{_pct(_weighted(results[c], shapes))}**" for c in cpus]
    lines.append("| " + " | ".join(total) + " |")
    return lines


def _weighted(per_shape: dict, shapes: dict) -> float:
    """Cycles at the peak over predicted cycles, each shape counted as often as the model has it."""
    peak_cycles = cycles = 0.0
    for s, n in shapes.items():
        a = per_shape[s]
        peak_cycles += n * a.peak_cycles
        cycles += n * a.cycles
    return peak_cycles / cycles if cycles else 0.0


def cpus_table(names) -> list:
    from tvm_ext.tools import mca

    lines = ["| CPU model | TVM target | llvm-mca | peak form | peak MACs / cycle | note |",
             "|---|---|---|---|---|---|"]
    for n in names:
        m, p = mca.cpu_model(n), mca.peak(n)
        mc = f"-mcpu={m.mcpu}" + (f" -mattr={m.mattr}" if m.mattr else "")
        lines.append(f"| {n} | `{m.target}` | `{mc}` | {p.form} | {p.macs_per_cycle:.1f} | {m.note} |")
    return lines


def main(argv=None):
    from tvm_ext.tools import mca

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="append", choices=list(mca.CPU_MODELS), help="CPU model (repeatable; "
                    "default: all)")
    ap.add_argument("--model", default=CONVS, help=f"{CONVS} (default) or a zoo model name")
    ap.add_argument("--small", action="store_true", help="the zoo model's small variant")
    ap.add_argument("--kernels", action="store_true", help="also print the per-kernel table of each CPU model")
    ap.add_argument("--cpus", action="store_true", help="print the CPU models and their peaks, and stop")
    ap.add_argument("--json", default=None, help="write every analysis here as JSON")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("kernel_mca").setLevel(logging.INFO)
    cpus = a.cpu or list(mca.CPU_MODELS)
    try:
        mca.llvm_mca_path()
    except mca.McaError as err:
        sys.exit(f"kernel_mca: {err}")
    if a.cpus:
        print("\n".join(cpus_table(cpus)))
        return
    out = {}
    if a.model == CONVS:
        shapes = mca.resnet50_convs()
        results = {}
        for c in cpus:
            t = time.perf_counter()
            results[c] = mca.analyze_convs(c, shapes)
            logger.info("%s: %d convs in %.0f s", c, len(shapes), time.perf_counter() - t)
        print(f"ResNet-50's {len(shapes)} distinct convs after the stem, each built alone (uint8 x int8, bias, "
              "requantize to uint8), % of each CPU model's int8 dot-product peak (llvm-mca):\n")
        print("\n".join(convs_matrix(results, shapes)))
        for c in cpus:
            if a.kernels:
                p = mca.peak(c)
                print(f"\n{c} (peak: {p.form}, {p.macs_per_cycle:.1f} MACs / cycle):\n")
                print("\n".join(_conv_kernel_rows(results[c], shapes)))
            out[c] = {str(s): an.to_dict() for s, an in results[c].items()}
            out[c]["weighted_share"] = _weighted(results[c], shapes)
    else:
        from tvm_ext.tools import zoo

        m = zoo.load(a.model, small=a.small)
        print(f"{a.model}{' (small)' if a.small else ''}: conv and dense kernels, % of each CPU model's int8 "
              "dot-product peak (llvm-mca)\n")
        summary = ["| CPU model | peak form | peak MACs / cycle | kernels | whole-model estimate | GMAC without "
                   "a dot loop |", "|---|---|---|---|---|---|"]
        for c in cpus:
            an = mca.analyze(m.mod, m.params, cpu=c)
            out[c] = an.to_dict()
            left = sum(k.macs * k.launches for k in an.unmodelled) / 1e9
            summary.append(f"| {c} | {an.peak.form} | {an.peak.macs_per_cycle:.1f} | {len(an.kernels)} | "
                           f"**{_pct(an.share)}** | {left:.3f} |")
            if a.kernels:
                print(f"{c} (peak: {an.peak.form}, {an.peak.macs_per_cycle:.1f} MACs / cycle; whole model "
                      f"{_pct(an.share)}):\n")
                print("\n".join(kernel_rows(an)) + "\n")
        print("\n".join(summary))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


def _conv_kernel_rows(per_shape: dict, shapes: dict) -> list:
    """Per-kernel rows of the single-conv builds, labelled by conv shape, with ResNet-50's count as n."""
    from tvm_ext.tools import mca

    rows = []
    for s, an in per_shape.items():
        ks = [mca.KernelEstimate(str(s), k.macs, shapes[s], k.hot, k.mca, k.peak) for k in an.kernels]
        rows.append(mca.Analysis(an.cpu, an.peak, ks))
    merged = rows[0]
    for r in rows[1:]:
        merged = merged.merge(r)
    return kernel_rows(merged, {str(s): str(s) for s in shapes})


if __name__ == "__main__":
    main()
