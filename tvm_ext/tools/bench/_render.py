"""The benchmark's results rendered: ``results.md`` (tables and notes) and ``chart.png``."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import numpy as np

from ._jobs import EXACT_TARGET
from ._measure import QUIET_MAX_SECONDS, UNTIMED_CALLS

logger = logging.getLogger(__name__)


def _mb(nbytes) -> str:
    return f"{nbytes / 1e6:.1f}"


def _crossing_text(report) -> str:
    c = report["crossing"]
    parts = ", ".join(f"{d} {_mb(b)}" for d, b in sorted(c["bytes"].items(), key=lambda kv: -kv[1]))
    return f"{_mb(c['total_bytes'])} MB ({parts})" if parts else "0 MB"


def _tuning_text(env: dict, results: dict) -> str:
    tun = env.get("tuning") or {}
    if not tun.get("enabled", True):
        return "tvm-ext tuning records: off (`--untuned`)"
    recs = tun.get("records") or {}
    per = []
    for v in results["variants"]:
        rep = ((v["pipelines"].get("tvm_ext") or {}).get("report") or {})
        if "num_tuned_kernels" in rep:
            per.append(f"{v['label'].split(' ')[0]} {rep['num_tuned_kernels']}")
    src = ", ".join(f"{k} {r['count']}" for k, r in recs.items()) or "none"
    return f"tvm-ext tuning records: {src}; tuned kernels: {', '.join(per) or 'none'}"


def _ort_isa_text(env: dict) -> str:
    peer = env.get("onnxruntime_isa")
    if not peer:  # a results file without ONNX Runtime's ISA (older format)
        return "- ONNX Runtime kernels: the host's (not recorded)"
    if env.get("rpc"):  # on a board: not run
        return f"- ONNX Runtime: {peer['note']}"
    which = "AVX2" if peer["isa"] == "avx2" else "the host's"
    return f"- ONNX Runtime kernels: {which} ({peer['note']})"


#: The main table's rows per variant, in order: results key, label.
ENGINE_LABELS = (
    ("tvm", "TVM stock"), ("tvm_same", "TVM stock @ tvm-ext target"), ("tvm_ext_untuned", "TVM + tvm-ext, untuned"),
    ("tvm_ext", "TVM + tvm-ext"),
    ("tvm_ext_saturating", "TVM + tvm-ext with TVM's saturating `vpmaddubsw` (inexact: what exactness costs)"),
    ("onnxruntime", "ONNX Runtime"),
    ("onnxruntime_exact", "ONNX Runtime, exact int8 path (`session.x64quantprecision`)"), ("openvino", "OpenVINO"),
    ("openvino_isa", "OpenVINO @ tvm-ext's ISA"), ("exact", "exact reference (plain `llvm`)"),
)


def _exact_label(p: dict) -> str:
    """The exact reference's row label: which graph it is, and whether float layers make it inexact."""
    n = p.get("float_anchors") or 0
    graph = ("" if p.get("exact_graph") != "tvm-ext pipeline" else
             ", tvm-ext's graph" if n else ", tvm-ext's integer graph")
    if n:
        return f"plain `llvm` reference{graph} ({n} float conv/dense: exact in the integer layers only)"
    return f"exact reference (plain `llvm`{graph})"


def _openvino_isa_text(env: dict) -> str:
    peer = env.get("openvino_isa")
    if not peer:  # a results file without it (older format)
        return "- OpenVINO kernels: the host's (not recorded)"
    return f"- OpenVINO{'' if env.get('rpc') else ' kernels'}: {peer['note']}"


def _settle_text(env: dict, results: dict) -> str:
    stats = [v["timing"] for v in results["variants"] if (v.get("timing") or {}).get("settle_s")]
    if not stats:
        return "- between engines: a settle pause and untimed calls (waits not recorded)"
    worst = max(s["settle_s"]["max"] for s in stats)
    med = float(np.median([s["settle_s"]["median"] for s in stats]))
    loud = sum(s["not_quiet"] for s in stats)
    return (f"- between engines: wait until the benchmark's processes are idle (median {med:.2f} s, max {worst:.2f} s"
            f"{f'; {loud} waits gave up after {QUIET_MAX_SECONDS:.0f} s' if loud else ''}), then "
            f"{UNTIMED_CALLS} untimed calls; engine order rotates every round")


def _openvino_kernel_lines(results: dict) -> list:
    """Which convolution kernels OpenVINO chose, per variant and cap (its runtime model's layers)."""
    rows = []
    for v in results["variants"]:
        for key in ("openvino", "openvino_isa"):
            prims = (v["pipelines"].get(key) or {}).get("conv_primitives")
            if prims:
                cap = v["pipelines"][key].get("onednn_max_cpu_isa")
                kinds = ", ".join(f"`{k}` {n}" for k, n in sorted(prims.items(), key=lambda kv: -kv[1]))
                rows.append(f"- {v['label']}, OpenVINO{f' @ {cap}' if cap else ''}: {kinds}")
    return ["", "OpenVINO's convolution kernels (its runtime model):", "", *rows] if rows else []


def _board_lines(env: dict) -> list:
    """Where the engines ran, for a run on a remote board (``tvm-ext bench --rpc``); none otherwise."""
    rpc = env.get("rpc")
    if not rpc:
        return []
    where = (f"a board with key `{rpc['key']}` from the TVM RPC tracker {rpc['address']}" if rpc.get("key")
             else f"the TVM RPC server {rpc['address']}")
    lines = [f"- run on {where}: stock TVM and tvm-ext cross-compiled here, run and "
             "timed there by its `time_evaluator`; the exact reference runs here"]
    if rpc.get("features"):
        lines.append(f"- the board's CPU features (its `getauxval(AT_HWCAP)`, as `/proc/cpuinfo` names them): "
                     f"{' '.join(rpc['features'])}")
    if rpc.get("emulated"):
        lines.append(f"- **under emulation ({rpc['emulated']})**: the latencies are the emulator's, not the "
                     "speed of an ARM board; kernels, bytes and numerics are the board's")
    return lines


def render_markdown(results: dict) -> str:
    """The results table (and the environment it was measured in) as Markdown."""
    env = results["environment"]
    real = any("real" in v for v in results["variants"])
    title = (f"# {'Real models, int8' if real else 'int8 ResNet-50'}: TVM {env['versions'].get('tvm')} stock vs "
             "tvm-ext vs ONNX Runtime vs OpenVINO")
    lines = [
        title,
        "",
        f"- date: {env['date']}; CPU: {env['cpu']}" + (f" ({env['cores']} cores)" if env.get("cores") else "")
        + f"; threads: {env['threads']} per engine"
        + (f" (TVM_THREAD_POOL_SPIN_COUNT={env['tvm_thread_pool_spin_count']})"
           if env.get("tvm_thread_pool_spin_count") else ""),
        *([f"- commit: {env['commit'] or 'not a git checkout'}; command: `{env['command']}`"] if "commit" in env
          else []),
        *_board_lines(env),
        *([f"- device (stock TVM and tvm-ext): {env['device']}"] if env.get("device") else []),
        f"- stock TVM target: `{env['target']}`",
        f"- tvm-ext target: `{env.get('ext_target', env['target'])}`"
        + (" (stock TVM at this target, with only the VNNI operand types fixed, is compared: "
           "`TVM stock @ tvm-ext target`)" if env.get("ext_target", env["target"]) != env["target"] else ""),
        f"- numerics reference (`exact`): `relay.build` at plain `{EXACT_TARGET}` (no -mcpu: no int8 SIMD, exact "
        "integer arithmetic) of the integer graph: as imported (QOperator), or after tvm-ext's pipeline with TVM's "
        "own kernels (QDQ, whose convolutions are float until then); stock TVM and OpenVINO are compared with it",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v),
        f"- latency: median (IQR) of {env['repeat']} interleaved timed runs after warm-up",
        f"- tvm-ext pipeline: `pipelines.int8(numerics=\"{env.get('numerics', 'tvm')}\")`",
        f"- int8 ISA: stock `{(env.get('target_info') or {}).get('isa', '?')}`, "
        f"tvm-ext `{(env.get('ext_target_info') or {}).get('isa', '?')}`; " + _tuning_text(env, results),
        _ort_isa_text(env),
        _openvino_isa_text(env),
        _settle_text(env, results),
        "",
    ]
    caps = sorted({p["onednn_max_cpu_isa"] for v in results["variants"] for k, p in v["pipelines"].items()
                   if k == "openvino_isa" and p.get("onednn_max_cpu_isa")})
    peers = [("tvm", "vs stock"), ("onnxruntime", "vs ORT"), ("openvino", "vs OpenVINO")]
    if any("onnxruntime_exact" in v["pipelines"] for v in results["variants"]):
        peers.insert(2, ("onnxruntime_exact", "vs ORT exact"))
    if caps:
        peers.append(("openvino_isa", f"vs OpenVINO @ {'/'.join(caps)}"))
    head = ["variant", "pipeline", "kernels", "anchors", "non-anchor", "tensors crossing", "MB crossing (by dtype)",
            "build s", "latency ms"] + [h for _, h in peers]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def row(*cells):
        cells = list(cells) + [""] * (len(head) - len(cells))
        return "|" + "|".join(f" {c} " if str(c) else " " for c in cells) + "|"

    for v in results["variants"]:
        lat_of = {k: ((v["pipelines"].get(k) or {}).get("latency") or {}).get("median_ms") for k, _ in peers}
        if "unavailable" in v:
            lines.append(row(v["label"], "—", f"unavailable: {v['unavailable']}"))
        for key, label in ENGINE_LABELS:
            p = v["pipelines"].get(key)
            if p is None:
                continue
            if key == "openvino_isa":
                label = f"OpenVINO @ {p.get('onednn_max_cpu_isa', '?')}"
            if key == "exact":
                label = _exact_label(p)
            if "skipped" in p:
                lines.append(row(v["label"], label, p["skipped"]))
                continue
            if "error" in p and "latency" not in p:
                lines.append(row(v["label"], label, f"error: {p['error']}"))
                continue
            lat = p.get("latency") or {}
            med = lat.get("median_ms")
            lat_s = (f"{med:.2f} ({lat['p25_ms']:.2f}–{lat['p75_ms']:.2f})" if med else
                     "not timed" if key == "exact" else "—")
            vs = [f"{med / lat_of[k]:.2f}×" if med and lat_of[k] and key != k else "" for k, _ in peers]
            rep = p.get("report")
            if p.get("workaround"):  # stock failed LLVM's verifier and was built again (see _build_job)
                label += f" (`{p['workaround']}`)"
            if rep:
                lines.append(row(v["label"], label, rep["num_kernels"], rep["num_anchor_kernels"],
                                 rep["num_non_anchor_kernels"], rep["crossing"]["total_count"], _crossing_text(rep),
                                 f"{p['build_s']:.1f}", lat_s, *vs))
            else:
                lines.append(row(v["label"], label, "", "", "", "", "", "", lat_s, *vs))
    lines += _openvino_kernel_lines(results)
    if real:
        lines += _real_numerics_lines(results)
    else:
        lines += _numerics_lines(results)
    tuned_exact = [(v["label"], v.get("numerics", {}).get("tuned_vs_untuned_bit_exact")) for v in results["variants"]]
    if any(e is not None for _, e in tuned_exact):
        lines += ["", "tvm-ext tuned vs untuned: " + "; ".join(
            f"{label} {'bit-exact' if e else 'DIFFERENT'}" for label, e in tuned_exact if e is not None)]
    explained = {f"{v['label']} / {label}": v["pipelines"][key]["explain"] for v in results["variants"]
                 for key, label in (("tvm", "TVM stock"), ("tvm_ext", "TVM + tvm-ext"))
                 if (v["pipelines"].get(key) or {}).get("explain")}
    if explained:
        from ...core.explain import summary_markdown

        lines += ["",
                  "Why the kernel boundaries are there (`tvm_ext.explain`: FuseOps' reason per crossing tensor):", "",
                  summary_markdown(explained).rstrip("\n")]
    return "\n".join(lines) + "\n"


def _vs_ort_text(n: dict, name: str) -> str:
    if f"{name}_vs_ort_max_abs" not in n:
        return "—"
    text = f"{n[f'{name}_vs_ort_max_abs']:.4g}"
    if f"{name}_vs_ort_max_steps" in n:
        text += f" ({n[f'{name}_vs_ort_max_steps']:.1f} steps)"
    return text


def _real_numerics_lines(results: dict) -> list:
    """Numerics of real models: max |diff| against ONNX Runtime in output quantization steps."""
    k_inputs = max((v.get("numerics", {}).get("inputs", 0) for v in results["variants"]), default=0)
    lines = ["", f"Numerics over {k_inputs} seeded synthetic images (normalised as each model's package does; "
             "`tvm_ext.tools.zoo_real.images`). Differences to ONNX Runtime are max |diff| over all outputs, "
             "and in output quantization steps (the scale of the tensor feeding the final DequantizeLinear) "
             "where the output is "
             "quantized; top-1 agreement for classifiers only.", "",
             "| variant | kind | output step | tvm-ext vs exact | stock vs exact | tvm-ext vs stock | stock vs ORT "
             "| tvm-ext vs ORT | OpenVINO vs ORT | top-1 with ORT (stock / tvm-ext / OpenVINO) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    notes = {}
    for v in results["variants"]:
        n, r = v.get("numerics", {}), v.get("real", {})
        k = n.get("inputs", 0)
        step = f"{r['output_step']:.4g}" if r.get("output_step") else "float output"
        if not r.get("output_step"):
            notes[r.get("model")] = r.get("float_head_reason") or r.get("step_note", "")
        top1 = ("—" if r.get("kind") != "classifier" else
                " / ".join(_top1_text(n, name, k) for name in ("tvm", "tvm_ext", "openvino")))
        lines.append(f"| {v['label']} | {r.get('kind', '')} | {step} | {_vs_exact_text(n, 'tvm_ext')} | "
                     f"{_stock_vs_exact_text(n)} | {_ext_vs_stock_text(n)} | {_vs_ort_text(n, 'tvm')} | "
                     f"{_vs_ort_text(n, 'tvm_ext')} | {_vs_ort_text(n, 'openvino')} | {top1} |")
    for model, why in notes.items():
        lines.append(f"\n{model}: float output, differences are absolute: {why}.")
    return lines


def _vs_exact_text(n: dict, name: str) -> str:
    """``"exact"``, or how many outputs differ from the exact reference and by how much."""
    if f"{name}_vs_exact_differ" not in n:
        return "—"
    differ = n[f"{name}_vs_exact_differ"]
    if not differ:
        return "exact"
    text = f"{differ}/{n['exact_outputs']} differ, max {n[f'{name}_vs_exact_max_abs']:.4g}"
    if f"{name}_vs_exact_max_steps" in n:
        text += f" ({n[f'{name}_vs_exact_max_steps']:.1f} steps)"
    return text


def _stock_vs_exact_text(n: dict) -> str:
    text = _vs_exact_text(n, "tvm")
    if "tvm_same_vs_exact_differ" in n:
        text += f"; @ tvm-ext target: {_vs_exact_text(n, 'tvm_same')}"
    return text


def _ext_vs_stock_text(n: dict) -> str:
    if "ext_vs_same_target_bit_exact" in n:  # stock at tvm-ext's own target shares its instructions
        return ("bit-exact" if n["ext_vs_same_target_bit_exact"] else
                f"max abs {n['ext_vs_same_target_max_abs']:.4g}") + " (stock @ tvm-ext target)"
    if "ext_vs_stock_max_abs" not in n:
        return "—"
    return "bit-exact" if n.get("ext_vs_stock_bit_exact") else f"max abs {n['ext_vs_stock_max_abs']:.4g}"


def _numerics_lines(results: dict) -> list:
    lines = ["", "Numerics over seeded inputs. Against the exact reference: outputs that differ (of all outputs "
             "over all inputs) and the largest difference (in output quantization steps where the model's output "
             "is a DequantizeLinear); stock TVM and OpenVINO are compared, not references.", "",
             "| variant | tvm-ext vs exact | stock vs exact | tvm-ext vs stock | stock vs ORT max abs "
             "| tvm-ext vs ORT max abs | OpenVINO vs ORT max abs "
             "| top-1 agreement with ORT (stock / tvm-ext / OpenVINO) |",
             "|---|---|---|---|---|---|---|---|"]
    for v in results["variants"]:
        n = v.get("numerics", {})
        k = n.get("inputs", 0)
        top1 = (" / ".join(_top1_text(n, name, k) for name in ("tvm", "tvm_ext", "openvino"))
                if any(f"{name}_vs_ort_top1" in n for name in ("tvm", "tvm_ext")) else "—")
        lines.append(f"| {v['label']} | {_vs_exact_text(n, 'tvm_ext')} | {_stock_vs_exact_text(n)} | "
                     f"{_ext_vs_stock_text(n)} | {_vs_ort_text(n, 'tvm')} | {_vs_ort_text(n, 'tvm_ext')} | "
                     f"{_vs_ort_text(n, 'openvino')} | {top1} |")
    inexact = [(v["label"], v["pipelines"]["exact"]["float_anchors"]) for v in results["variants"]
               if (v["pipelines"].get("exact") or {}).get("float_anchors")]
    for label, count in inexact:
        lines.append(f"\n{label}: the reference keeps {count} convolution/dense layer(s) in float; differences "
                     "from it include float rounding.")
    lines += _exactness_cost_lines(results)
    return lines


def _exactness_cost_lines(results: dict) -> list:
    """Per variant built both ways: what TVM's saturating vpmaddubsw gets wrong, and what the exact
    kernels cost in latency (``tvm_ext_saturating``; only on instruction sets without VNNI)."""
    lines = []
    for v in results["variants"]:
        n, ratio = v.get("numerics", {}), (v.get("ratios") or {}).get("tvm_ext/tvm_ext_saturating")
        if "tvm_ext_saturating_vs_exact_differ" not in n and ratio is None:
            continue
        wrong = (f"{n['tvm_ext_saturating_vs_exact_differ']}/{n.get('exact_outputs', '?')} outputs differ from "
                 f"exact, max {n['tvm_ext_saturating_vs_exact_max_abs']:.4g}"
                 if "tvm_ext_saturating_vs_exact_differ" in n else "numerics not compared")
        cost = f"exact tvm-ext takes {ratio:.2f}× its time" if ratio else "not timed"
        lines.append(f"\n{v['label']}: with TVM's saturating `vpmaddubsw`, {wrong}; {cost}.")
    return lines


def _top1_text(n: dict, name: str, k: int) -> str:
    if f"{name}_vs_ort_top1" not in n:
        return "—"
    text = f"{n[f'{name}_vs_ort_top1']}/{k}"
    ties = n.get(f"{name}_vs_ort_top1_within_tolerance", 0)
    return text + (f" ({ties} flip{'s' if ties > 1 else ''} within tolerance)" if ties else "")


#: The chart's third panel: tvm-ext's median latency over each peer's (lower is better).
CHART_RATIOS = (("tvm", "stock"), ("onnxruntime", "ONNX Runtime"), ("onnxruntime_exact", "ONNX Runtime, exact path"),
                ("openvino", "OpenVINO"),
                ("openvino_isa", "OpenVINO @ tvm-ext's ISA"))


def _chart_ratios(results: dict) -> dict:
    """``{peer label: [tvm-ext / peer per variant, None where not timed]}`` for peers timed in any variant."""
    out = {}
    for key, label in CHART_RATIOS:
        vals = [(v.get("ratios") or {}).get(f"tvm_ext/{key}") for v in results["variants"]]
        if any(r is not None for r in vals):
            caps = {(v["pipelines"].get(key) or {}).get("onednn_max_cpu_isa") for v in results["variants"]} - {None}
            out[f"OpenVINO @ {'/'.join(sorted(caps))}" if caps else label] = vals
    return out


def _chart(results: dict, path: Path) -> Optional[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: no chart")
        return None
    labels = [v["label"] for v in results["variants"]]
    keys = [("tvm", "TVM stock"), ("tvm_ext", "TVM + tvm-ext"), ("onnxruntime", "ONNX Runtime"),
            ("onnxruntime_exact", "ONNX Runtime, exact path"), ("openvino", "OpenVINO"),
            ("openvino_isa", "OpenVINO @ tvm-ext's ISA")]
    keys = [(k, n) for k, n in keys if any((v["pipelines"].get(k) or {}).get("latency") or
                                           (v["pipelines"].get(k) or {}).get("report") for v in results["variants"])]
    real = any("real" in v for v in results["variants"])
    ratios = _chart_ratios(results)
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(max(15, 3 * len(labels)), 4.5))
    x = np.arange(len(labels))
    width = 0.8 / max(len(keys), 1)
    for i, (k, name) in enumerate(keys):
        kern = [((v["pipelines"].get(k) or {}).get("report") or {}).get("num_kernels") for v in results["variants"]]
        lat = [(((v["pipelines"].get(k) or {}).get("latency")) or {}).get("median_ms") for v in results["variants"]]
        off = (i - (len(keys) - 1) / 2) * width
        if any(n is not None for n in kern):
            bars = ax1.bar(x + off, [np.nan if n is None else n for n in kern], width, label=name)
            ax1.bar_label(bars, labels=["" if n is None else str(n) for n in kern], fontsize=7)
        bars = ax2.bar(x + off, [np.nan if t is None else t for t in lat], width, label=name)
        ax2.bar_label(bars, labels=["" if t is None else f"{t:.1f}" for t in lat], fontsize=7)
    rwidth = 0.8 / max(len(ratios), 1)
    for i, (name, vals) in enumerate(ratios.items()):
        bars = ax3.bar(x + (i - (len(ratios) - 1) / 2) * rwidth, [np.nan if r is None else r for r in vals], rwidth,
                       label=f"tvm-ext / {name}")
        ax3.bar_label(bars, labels=["" if r is None else f"{r:.2f}" for r in vals], fontsize=7)
    ax3.axhline(1.0, color="grey", linewidth=0.8)
    for ax, title in ((ax1, "kernels"), (ax2, "latency, ms (median)"), (ax3, "tvm-ext / peer (lower: tvm-ext faster)")):
        ax.set_xticks(x, labels, fontsize=8, rotation=20 if real else 0, ha="right" if real else "center")
        ax.set_title(title)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    env = results["environment"]
    what = "int8 real models" if real else "int8 ResNet-50"
    pocl = " (OpenCL on PoCL: a correctness run, not GPU speed)" if "PoCL" in env.get("device", "") else ""
    fig.suptitle(f"{what} on {env['cpu']}, {env['threads']} threads, target {env['target']}{pocl}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
