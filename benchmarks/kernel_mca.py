#!/usr/bin/env python
"""Static estimate of tvm-ext's int8 conv and dense kernels on CPU models, with llvm-mca: per kernel, the
hot loop's MACs per cycle and its share of the model's dot-product peak; per model, the whole-model share.

Nothing is executed: every build is cross-compiled for the CPU model's target (tvm_ext.tools.mca,
docs/kernels-static.md).

    python benchmarks/kernel_mca.py                          # ResNet-50's 22 distinct convs, every CPU model
    python benchmarks/kernel_mca.py --cpu znver5 --kernels   # ... and the per-kernel table
    python benchmarks/kernel_mca.py --model resnet50_int8_qdq [--small] --cpu neoverse-n1 --kernels
    python benchmarks/kernel_mca.py --model ppocr_cls_v2_int8_qdq --cpu neoverse-n1 --limits  # what bounds them
    python benchmarks/kernel_mca.py --cpus                   # the CPU models and their peaks
    python benchmarks/kernel_mca.py --model resnet50_int8_qdq --cpu neoverse-v2 --disabled-pass tvm_ext.RoundReciprocal
    python benchmarks/kernel_mca.py --calibrate layers.json --cpu znver5 --peak-gmacs 545 --clock-ghz 4.35

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
    head = ["kernel", "n", "MMAC", "dots / iter", "accumulators", "MACs / iter", "instr / iter", "cycles / iter",
            "MACs / cycle", "% peak", "bound (llvm-mca)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in analysis.kernels:
        name = (labels or {}).get(k.name, k.name.replace("tvmgen_default_fused_", ""))
        name += f" ({k.conv}{', float' if k.kind == 'float' else ''})" if getattr(k, "conv", "") else ""
        if k.mca:
            cells = [name, str(k.launches), f"{k.macs / 1e6:.1f}", _dots(k), str(k.hot.accumulators), str(k.hot.macs),
                     str(k.hot.instructions),
                     f"{k.mca.cycles_per_iteration:.1f}", f"{k.macs_per_cycle:.1f}", _pct(k.share),
                     k.limit or "-"]
        else:
            cells = [name, str(k.launches), f"{k.macs / 1e6:.1f}", "no dot loop"] + ["-"] * 7
        lines.append("| " + " | ".join(cells) + " |")
    return lines


#: The issue's bar for a hot loop: this share of the CPU model's dot-product peak.
AT_PEAK = 0.85


def _limit_key(k) -> str:
    """A kernel's hot-loop limit as a table row's name: the busiest units, dispatch or latency."""
    lim = k.mca.limit
    if lim is None:
        return k.mca.bound or "not read"
    return {"resources": "units " + "/".join(lim.resources), "dispatch": "dispatch", "latency": "latency"}[lim.kind]


def limit_rows(analysis) -> list:
    """Markdown: the kernels whose hot loop is under :data:`AT_PEAK` of the peak, grouped by what bounds the
    loop in llvm-mca's model (:attr:`tvm_ext.tools.mca.KernelEstimate.limit`), with their part of the
    model's predicted cycles and the instructions that load the busiest units (each kernel weighted by
    its predicted cycles); the loops at the bar in one row above them."""
    import collections

    total = analysis.cycles
    groups = collections.defaultdict(list)
    for k in analysis.modelled:
        groups["at " + _pct(AT_PEAK) + " of the peak or more" if k.share >= AT_PEAK else _limit_key(k)].append(k)
    head = ["hot loops (llvm-mca)", "kernels", "MMAC", "% of predicted cycles", "% peak (MAC-weighted)",
            "what loads the busiest units (share of their cycles)", "kernels with spills"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, ks in sorted(groups.items(), key=lambda kv: (not kv[0].startswith("at "),
                                                          -sum(k.cycles for k in kv[1]))):
        cycles = sum(k.cycles for k in ks)
        macs = sum(k.macs * k.launches for k in ks)
        users = collections.Counter()
        for k in ks:
            lim = k.mca.limit
            busy = sum(c for _, c in lim.users) if lim else 0.0
            for m, c in (lim.users if lim else ()):
                users[m] += k.cycles * c / busy if busy else 0.0
        weight = sum(users.values())
        top = (", ".join(f"{m} {_pct(c / weight)}" for m, c in users.most_common(4) if c >= 0.01 * weight)
               if weight else "") or "-"
        spills = sum(1 for k in ks if k.hot.stack_accesses)
        lines.append(f"| {key} | {len(ks)} | {macs / 1e6:.1f} | {_pct(cycles / total)} | "
                     f"{_pct(macs / analysis.peak.macs_per_cycle / cycles)} | {top} | {spills} |")
    return lines


#: A resource-bound loop whose dot instructions take this share of its busiest units' cycles runs its dots
#: at their own form's rate: what keeps it under the peak is the form (or the model's rate for it).
DOTS_OWN_UNITS = 0.8

LIMIT_CLASSES = ("at the bar", "dot form's rate", "units shared", "dispatch", "latency")


def limit_class(k) -> str:
    """One of :data:`LIMIT_CLASSES` for a kernel with a hot loop: at :data:`AT_PEAK` or more; else bound by
    its busiest units where its dots take :data:`DOTS_OWN_UNITS` of their cycles (the dot form's rate) or
    less (units shared with other instructions); else dispatch or latency."""
    lim = k.mca.limit
    if k.share >= AT_PEAK:
        return "at the bar"
    if lim is None:
        return "latency" if k.mca.bound == "dependencies" else "units shared"
    if lim.kind != "resources":
        return lim.kind
    dots = {key.split()[0] for key in k.hot.dots}
    busy = sum(c for _, c in lim.users)
    on_dots = sum(c for m, c in lim.users if m in dots)
    return "dot form's rate" if busy and on_dots >= DOTS_OWN_UNITS * busy else "units shared"


def limit_summary(analysis) -> dict:
    """``{class: share of the predicted cycles}`` over :data:`LIMIT_CLASSES`, with ``"others"``: the
    instructions other than the dots that load the busiest units of the loops under the bar (share of
    those units' cycles, kernels weighted by predicted cycles, most first) and ``"spills"``: kernels
    whose hot loop loads or stores through the stack pointer."""
    import collections

    total = analysis.cycles
    out = dict.fromkeys(LIMIT_CLASSES, 0.0)
    others = collections.Counter()
    busy_cycles = 0.0
    for k in analysis.modelled:
        cls = limit_class(k)
        out[cls] += k.cycles / total
        lim = k.mca.limit
        if cls == "at the bar" or lim is None:
            continue
        dots = {key.split()[0] for key in k.hot.dots}
        busy = sum(c for _, c in lim.users)
        busy_cycles += k.cycles
        for m, c in lim.users:
            if m not in dots and busy:
                others[m] += k.cycles * c / busy
    out["others"] = [(m, c / busy_cycles) for m, c in others.most_common()] if busy_cycles else []
    out["spills"] = sum(1 for k in analysis.modelled if k.hot.stack_accesses)
    return out


def limit_summary_rows(summaries: dict) -> list:
    """Markdown: a row per CPU model (``{cpu: (analysis, limit_summary(analysis))}``), the predicted cycles'
    shares by :func:`limit_class`."""
    head = ["CPU model", "whole model", "loops at 85% or more", "under 85%: dots at their form's rate",
            "under 85%: dot units shared", "under 85%: dispatch", "under 85%: latency",
            "other instructions on the busiest units (under 85%)", "kernels with spills"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cpu, (an, sm) in summaries.items():
        under = 1.0 - sm["at the bar"]
        others = (", ".join(f"{m} {_pct(c)}" for m, c in sm["others"][:4] if c >= 0.01) if under >= 0.01
                  else "") or "-"
        lines.append("| " + " | ".join([cpu, _pct(an.share)] + [_pct(sm[c]) for c in LIMIT_CLASSES]
                                       + [others, str(sm["spills"])]) + " |")
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


def _layers_vs_peers():
    """benchmarks/layers_vs_peers.py as a module (its conv geometry and ONNX shape helpers)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("layers_vs_peers", Path(__file__).with_name("layers_vs_peers.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def calibrate(raw: dict, cpu: str, peak_gmacs: float, clock_ghz: float) -> str:
    """Markdown: per conv geometry, the static estimate next to the measured kernel time and OpenVINO's
    node time, then the end-to-end split. ``raw``: a ``layers_vs_peers.py --out`` JSON of this host.

    Static times, two ways: llvm-mca's cycles at ``clock_ghz`` (the model as is), and MACs / (the hot
    loop's share of the model's rate for its own dot forms x the measured peak ``peak_gmacs`` per core)
    (llvm-mca's share, the host's peak: :attr:`tvm_ext.tools.mca.KernelEstimate.form_share`, which
    differs from the share of the model's peak where the model rates a register-form and a
    memory-form dot apart, as LLVM's Zen 4 model does). Both assume the threads split every kernel evenly.
    """
    import collections

    import tvm_ext
    from tvm_ext.core import pipelines
    from tvm_ext.core.frontend import from_onnx, input_info
    from tvm_ext.tools import mca

    lvp = _layers_vs_peers()
    path, threads, target = raw["model"], raw["threads"], raw["targets"]["tvm-ext"]
    (name, (shape, _)), = input_info(path).items()
    mod, params = from_onnx(path, shape={name: shape})
    factory = tvm_ext.build(mod, target=target, params=params, passes=pipelines.int8())
    an = mca.analyze_factory(factory, cpu)
    rows = raw["tvm"]["tvm-ext"]
    measured = collections.Counter()
    geometry = {}
    for r in rows:
        measured[r["name"]] += r["ms"]
        geometry.setdefault(r["name"], lvp._geometry_tvm(r) if "conv2d" in r["name"] else ("dense",))
    ov = collections.Counter()
    ov_count = collections.Counter()
    for node, (g, _m) in lvp._ort_conv_shapes(path).items():
        ov_count[g] += 1
        if raw.get("openvino") and node in raw["openvino"]:
            ov[g] += raw["openvino"][node]
    per = collections.defaultdict(lambda: collections.Counter())
    shares = collections.defaultdict(list)
    form_shares = collections.defaultdict(list)
    for k in an.kernels:
        g = geometry.get(k.name)
        if g is None:
            raise ValueError(f"kernel {k.name} of the analysed build is not in the timed build: the builds differ")
        d = per[g]
        d["n"] += k.launches
        d["macs"] += k.launches * k.macs
        d["measured"] += measured[k.name]
        if k.mca:
            d["mca_ms"] += k.cycles / (clock_ghz * 1e6) / threads
            d["cal_ms"] += k.launches * k.macs / (k.form_share * peak_gmacs * 1e6) / threads
            shares[g].append(k.share)
            form_shares[g].append(k.form_share)
        else:
            d["unmodelled"] += 1
    head = ["conv (out, kh, kw, oh, ow)", "n", "GMAC", "hot loop % peak (llvm-mca)",
            "hot loop % of its dot forms' rate (llvm-mca)", "static ms: llvm-mca cycles",
            "static ms: forms' share x measured peak", "tvm-ext measured ms", "measured / static", "OpenVINO ms",
            "tvm-ext / OpenVINO"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    tot = collections.Counter()
    for g, d in sorted(per.items(), key=lambda kv: -kv[1]["measured"]):
        for key in ("macs", "measured", "mca_ms", "cal_ms"):
            tot[key] += d[key]
        tot["ov"] += ov.get(g, 0)
        share = "/".join(_pct(x) for x in sorted(set(round(v, 2) for v in shares[g]))) or "no dot loop"
        form_share = "/".join(_pct(x) for x in sorted(set(round(v, 2) for v in form_shares[g]))) or "-"
        cal = f"{d['cal_ms']:.3f}" if not d["unmodelled"] else "-"
        cells = [str(g), str(d["n"]), f"{d['macs'] / 1e9:.3f}", share, form_share,
                 f"{d['mca_ms']:.3f}" if shares[g] else "-",
                 cal, f"{d['measured']:.3f}", f"{d['measured'] / d['cal_ms']:.2f}" if d["cal_ms"] else "-",
                 f"{ov[g]:.3f}" if ov.get(g) else "-", f"{d['measured'] / ov[g]:.2f}" if ov.get(g) else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("| " + " | ".join(["all conv and dense kernels", "", f"{tot['macs'] / 1e9:.3f}", _pct(an.share),
                                     _pct(an.form_share),
                                     f"{tot['mca_ms']:.2f}", f"{tot['cal_ms']:.2f}", f"{tot['measured']:.2f}",
                                     f"{tot['measured'] / tot['cal_ms']:.2f}", f"{tot['ov']:.2f}",
                                     f"{tot['measured'] / tot['ov']:.2f}" if tot["ov"] else "-"]) + " |")
    e2e = raw.get("tvm_end_to_end_ms", {}).get("tvm-ext")
    mac_kernels = {k.name for k in an.kernels}
    other = sum(r["ms"] for r in rows if r["name"] not in mac_kernels)
    kernels_ms = sum(r["ms"] for r in rows)
    split = [("hot loops (static: forms' share x measured peak)", tot["cal_ms"]),
             ("rest of the conv and dense kernels (measured - hot loops)", tot["measured"] - tot["cal_ms"]),
             ("other kernels (measured)", other)]
    if e2e:
        split.append(("between kernels (end to end - sum of kernel times)", e2e - kernels_ms))
    best = raw.get("tvm_end_to_end_min_ms", {}).get("tvm-ext")
    lines += ["", "| part of tvm-ext's end-to-end time | ms | share |", "|---|---|---|"]
    whole = e2e or kernels_ms
    for label, ms in split:
        lines.append(f"| {label} | {ms:.2f} | {_pct(ms / whole)} |")
    how = f"graph executor, {raw.get('stat', 'median')} of the rounds" if e2e else "sum of kernel times"
    lines.append(f"| end to end ({how}) | {whole:.2f} | 100% |")
    if best:
        lines.append(f"| between kernels at the fastest end-to-end round ({best:.2f} ms) | {best - kernels_ms:.2f} "
                     f"| {_pct((best - kernels_ms) / best)} of it |")
    return "\n".join(lines)


def _analyze(mod, params, cpu: str, disabled: list):
    """``mca.analyze``, with the passes named in ``disabled`` left out of the build (``disabled_pass``)."""
    import tvm_ext
    from tvm_ext.core import pipelines
    from tvm_ext.tools import mca

    if not disabled:
        return mca.analyze(mod, params, cpu=cpu)
    factory = tvm_ext.build(mod, target=mca.cpu_model(cpu).target, params=params, passes=pipelines.int8(),
                            disabled_pass=disabled)
    return mca.analyze_factory(factory, cpu)


def main(argv=None):
    from tvm_ext.tools import mca

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="append", choices=list(mca.CPU_MODELS), help="CPU model (repeatable; "
                    "default: all)")
    ap.add_argument("--model", default=CONVS, help=f"{CONVS} (default) or a zoo model name")
    ap.add_argument("--small", action="store_true", help="the zoo model's small variant")
    ap.add_argument("--kernels", action="store_true", help="also print the per-kernel table of each CPU model")
    ap.add_argument("--limits", action="store_true", help="also print, per CPU model, what bounds the hot loops "
                    "under 85%% of the peak (llvm-mca), grouped, with their part of the predicted cycles")
    ap.add_argument("--cpus", action="store_true", help="print the CPU models and their peaks, and stop")
    ap.add_argument("--json", default=None, help="write every analysis here as JSON")
    ap.add_argument("--disabled-pass", action="append", default=[], metavar="NAME",
                    help="build without this pass (repeatable; e.g. tvm_ext.RoundReciprocal, a TIR lowering pass "
                         "of the aarch64 back end), to see what it changes")
    ap.add_argument("--calibrate", default=None, metavar="LAYERS_JSON",
                    help="a benchmarks/layers_vs_peers.py --out JSON of this host: print the static estimate per "
                         "conv next to the measured and OpenVINO times, and the end-to-end split (one --cpu)")
    ap.add_argument("--peak-gmacs", type=float, default=None,
                    help="with --calibrate: the host's measured dot-product peak per core, GMAC/s "
                         "(benchmarks/lab/int8_peak.py)")
    ap.add_argument("--clock-ghz", type=float, default=None, help="with --calibrate: the host's core clock")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("kernel_mca").setLevel(logging.INFO)
    cpus = a.cpu or list(mca.CPU_MODELS)
    try:
        mca.llvm_mca_path()
    except mca.McaError as err:
        sys.exit(f"kernel_mca: {err}")
    if a.calibrate:
        if len(cpus) != 1 or not a.peak_gmacs or not a.clock_ghz:
            sys.exit("kernel_mca: --calibrate takes one --cpu, --peak-gmacs and --clock-ghz")
        print(calibrate(json.loads(Path(a.calibrate).read_text()), cpus[0], a.peak_gmacs, a.clock_ghz))
        return
    if a.cpus:
        print("\n".join(cpus_table(cpus)))
        return
    out = {}
    if a.model == CONVS:
        shapes = mca.resnet50_convs()
        results, summaries = {}, {}
        for c in cpus:
            t = time.perf_counter()
            results[c] = {s: _analyze(mca.single_conv(s), None, c, a.disabled_pass) for s in shapes}
            logger.info("%s: %d convs in %.0f s", c, len(shapes), time.perf_counter() - t)
        print(f"ResNet-50's {len(shapes)} distinct convs after the stem, each built alone (uint8 x int8, bias, "
              "requantize to uint8), % of each CPU model's int8 dot-product peak (llvm-mca):\n")
        print("\n".join(convs_matrix(results, shapes)))
        for c in cpus:
            if a.kernels:
                p = mca.peak(c)
                print(f"\n{c} (peak: {p.form}, {p.macs_per_cycle:.1f} MACs / cycle):\n")
                print("\n".join(kernel_rows(_merged(results[c], shapes), {str(s): str(s) for s in shapes})))
            if a.limits:
                merged = _merged(results[c], shapes)
                print(f"\n{c}: what bounds the hot loops (each conv weighted by how often ResNet-50 has it):\n")
                print("\n".join(limit_rows(merged)))
                summaries[c] = (merged, limit_summary(merged))
            out[c] = {str(s): an.to_dict() for s, an in results[c].items()}
            out[c]["weighted_share"] = _weighted(results[c], shapes)
        if summaries:
            print("\nResNet-50's distinct convs: what bounds the hot loops, share of each CPU model's predicted "
                  "cycles:\n")
            print("\n".join(limit_summary_rows(summaries)))
    else:
        from tvm_ext.tools import zoo

        m = zoo.load(a.model, small=a.small)
        print(f"{a.model}{' (small)' if a.small else ''}: conv and dense kernels, % of each CPU model's int8 "
              "dot-product peak (llvm-mca)\n")
        summaries = {}
        summary = ["| CPU model | peak form | peak MACs / cycle | kernels | whole-model estimate | kernels without "
                   "a dot loop (MMAC) |", "|---|---|---|---|---|---|"]
        for c in cpus:
            t = time.perf_counter()
            an = _analyze(m.mod, m.params, c, a.disabled_pass)
            logger.info("%s: %d conv and dense kernels, whole model %s, in %.0f s", c, len(an.kernels),
                        _pct(an.share), time.perf_counter() - t)
            out[c] = an.to_dict()
            left = sum(k.macs * k.launches for k in an.unmodelled) / 1e6
            summary.append(f"| {c} | {an.peak.form} | {an.peak.macs_per_cycle:.1f} | {len(an.kernels)} | "
                           f"**{_pct(an.share)}** | {len(an.unmodelled)} ({left:.1f}) |")
            if a.kernels:
                print(f"{c} (peak: {an.peak.form}, {an.peak.macs_per_cycle:.1f} MACs / cycle; whole model "
                      f"{_pct(an.share)}):\n")
                print("\n".join(kernel_rows(an)) + "\n")
            if a.limits:
                print(f"{c}: what bounds the hot loops (whole model {_pct(an.share)}):\n")
                print("\n".join(limit_rows(an)) + "\n")
                summaries[c] = (an, limit_summary(an))
        print("\n".join(summary))
        if summaries:
            print(f"\n{a.model}: what bounds the hot loops, share of each CPU model's predicted cycles:\n")
            print("\n".join(limit_summary_rows(summaries)))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


def _merged(per_shape: dict, shapes: dict):
    """The single-conv builds' kernels as one :class:`tvm_ext.tools.mca.Analysis`, each kernel named by its conv
    shape and launched as often as ResNet-50 has that conv."""
    from tvm_ext.tools import mca

    rows = []
    for s, an in per_shape.items():
        ks = [mca.KernelEstimate(str(s), k.macs, shapes[s], k.hot, k.mca, k.peak, cpu=an.cpu) for k in an.kernels]
        rows.append(mca.Analysis(an.cpu, an.peak, ks))
    merged = rows[0]
    for r in rows[1:]:
        merged = merged.merge(r)
    return merged


if __name__ == "__main__":
    main()
