#!/usr/bin/env python
"""Per convolution: TVM's kernel time (stock and tvm-ext) next to ONNX Runtime's and OpenVINO's time
for the same layer, and each engine's fraction of the instruction set's multiply-accumulate peak.

Where tvm-ext does not reach a peer on a CPU class, this is the per-kernel profile that says which
convolutions, and how far each is from the peer's time for the same layer. It builds an int8 ONNX
model with plain ``relay.build`` and with ``tvm_ext.build(..., passes=pipelines.int8())``, times every
kernel with TVM's debug executor, every ONNX Runtime node with its profiler and every OpenVINO node
with its performance counters, matches convolutions by geometry and prints a markdown table with
each row's multiply-accumulates; with ``--peak`` (GMAC/s per core, from ``benchmarks/lab/int8_peak.py``)
each engine's rate as a fraction of that peak times the threads. How layers are matched and which
instruction set each engine runs: docs/benchmarks.md, "How layers_vs_peers.py works".

    python benchmarks/layers_vs_peers.py [--variant qoperator|qdq|MODEL.onnx] [--target "llvm -mcpu=x86-64-v3"]
                                         [--threads 2] [--repeat 7] [--ort-isa auto|host]
                                         [--openvino-isa auto|host] [--peak GMACS]
                                         [--out layers.json] [--stat median|min]

``--out`` also records each pipeline's end-to-end time (graph executor, the same libraries), which
``benchmarks/kernel_mca.py --calibrate`` splits into hot loops, the rest of each conv, other kernels and
the time between kernels.
"""
import argparse
import collections
import json
import logging
import multiprocessing as mp
import os
import re
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TOPHUB_LOCATION", "NONE")

logger = logging.getLogger("layers_vs_peers")


def _build(args):
    """Child process: build ``pipeline`` ("stock" | "tvm-ext") and export lib/graph/params into ``out``."""
    path, pipeline, target, out = args
    import tvm
    from tvm import relay

    from tvm_ext.core import pipelines
    from tvm_ext.core.build import build, copy_module
    from tvm_ext.core.frontend import from_onnx, input_info

    logging.getLogger("autotvm").setLevel(logging.ERROR)
    (name, (shape, _)), = input_info(path).items()
    mod, params = from_onnx(path, shape={name: shape})
    tgt = tvm.target.Target(target)
    if pipeline == "stock":
        with tvm.transform.PassContext(opt_level=3):
            fac = relay.build(copy_module(mod), target=tgt, params=params)
    else:
        fac = build(mod, target=tgt, params=params, passes=pipelines.int8())
    fac.get_lib().export_library(f"{out}/{pipeline}.so")
    Path(f"{out}/{pipeline}.json").write_text(fac.get_graph_json())
    Path(f"{out}/{pipeline}.params").write_bytes(relay.save_param_dict(fac.get_params()))


def tvm_kernel_times(folder, pipelines_, repeat, stat=None):
    """Median ms per kernel (debug executor; pipelines timed in alternation), with shapes."""
    import numpy as np
    import tvm
    from tvm import relay
    from tvm.contrib.debugger import debug_executor

    mods = {}
    for p in pipelines_:
        graph = Path(f"{folder}/{p}.json").read_text()
        params = Path(f"{folder}/{p}.params").read_bytes()
        m = debug_executor.create(graph, tvm.runtime.load_module(f"{folder}/{p}.so"), tvm.cpu(),
                                  dump_root=tempfile.mkdtemp(prefix="tvm_ext_dbg_"))
        m.load_params(params)
        g = json.loads(graph)
        names = set(relay.load_param_dict(params))
        for i in g["arg_nodes"]:
            n = g["nodes"][i]["name"]
            if n not in names:
                a = m.get_input(n)
                m.set_input(n, np.random.default_rng(0).uniform(-1, 1, a.shape).astype(a.dtype))
        mods[p] = (m, g)
    samples = {p: [] for p in pipelines_}
    for r in range(repeat):
        logger.info("TVM kernel timing round %d/%d", r + 1, repeat)
        for p, (m, _g) in mods.items():
            samples[p].append(np.array(m.run_individual(number=3, repeat=1))[:, 0])
    out = {}
    for p, (_m, g) in mods.items():
        t = (stat or np.median)(np.stack(samples[p]), axis=0) * 1e3
        full = len(t) == len(g["nodes"])
        shapes, rows, k = g["attrs"]["shape"][1], [], 0
        for i, nd in enumerate(g["nodes"]):
            if nd["op"] != "tvm_op":
                continue
            ins = [shapes[g["node_row_ptr"][a[0]] + a[1]] for a in nd["inputs"]]
            rows.append({"name": nd["attrs"]["func_name"], "ms": float(t[i if full else k]),
                         "out": shapes[g["node_row_ptr"][i]], "ins": ins})
            k += 1
        out[p] = rows
    return out


def tvm_end_to_end_times(folder, pipelines_, repeat, stat=None):
    """``({pipeline: ms}, {pipeline: fastest ms})`` per whole run (graph executor, the same libraries;
    pipelines timed in alternation): the median of the rounds, or their ``stat``, and the fastest round
    (the least disturbed on a busy machine)."""
    import numpy as np
    import tvm
    from tvm.contrib import graph_executor

    mods = {}
    for p in pipelines_:
        m = graph_executor.create(Path(f"{folder}/{p}.json").read_text(),
                                  tvm.runtime.load_module(f"{folder}/{p}.so"), tvm.cpu())
        m.load_params(Path(f"{folder}/{p}.params").read_bytes())
        mods[p] = m
    samples = {p: [] for p in pipelines_}
    for _ in range(repeat):
        for p, m in mods.items():
            samples[p].append(m.module.time_evaluator("run", tvm.cpu(), number=5, repeat=1)().mean * 1e3)
    return ({p: float((stat or np.median)(v)) for p, v in samples.items()},
            {p: float(np.min(v)) for p, v in samples.items()})


def ort_node_times(path, threads, runs=40):
    """Median ms per ONNX Runtime node (its profiler), first 5 runs dropped."""
    import numpy as np
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.enable_profiling = True
    so.intra_op_num_threads = threads
    so.profile_file_prefix = str(Path(tempfile.mkdtemp(prefix="tvm_ext_ort_")) / "prof")
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    x = np.random.default_rng(0).uniform(-1, 1, [d if isinstance(d, int) else 1 for d in inp.shape])
    for _ in range(runs):
        sess.run(None, {inp.name: x.astype(np.float32)})
    per = collections.defaultdict(list)
    for e in json.loads(Path(sess.end_profiling()).read_text()):
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per[_onnx_name(e["name"][: -len("_kernel_time")])].append(e["dur"])
    return {n: float(np.median(v[5:])) / 1e3 for n, v in per.items()}


def ort_node_times_in(package_dir, path, threads):
    """:func:`ort_node_times` in a child process importing onnxruntime from ``package_dir``."""
    import subprocess

    from tvm_ext.tools.ort_isa import child_env

    res = subprocess.run([sys.executable, __file__, "--ort-times-of", path, "--threads", str(threads)],
                         capture_output=True, text=True, env=child_env(package_dir))
    if res.returncode != 0:
        sys.exit(f"layers_vs_peers: the ONNX Runtime child failed (exit {res.returncode}): {res.stderr[-500:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def openvino_node_times_in(cap, path, threads, conv_names, stat=None):
    """:func:`tvm_ext.tools.openvino_peer.node_times` in a child process whose oneDNN dispatches to at most ``cap``
    (``ONEDNN_MAX_CPU_ISA``, read once when the library loads, so never in this process)."""
    import subprocess

    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": cap}
    cmd = [sys.executable, __file__, "--openvino-times-of", path, "--threads", str(threads),
           "--stat", "min" if stat is not None else "median", "--openvino-convs", ",".join(sorted(conv_names))]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        sys.exit(f"layers_vs_peers: the OpenVINO child ({cap}) failed (exit {res.returncode}): {res.stderr[-500:]}")
    return tuple(json.loads(res.stdout.strip().splitlines()[-1]))


def _onnx_name(ort_name: str) -> str:
    """The ONNX node name behind an ONNX Runtime node: its NHWC transformer renames ``conv1_quant``
    to ``conv1_quant_token_1``."""
    return re.sub(r"_token_\d+$", "", ort_name)


def _geometry_tvm(row):
    """(out ch, kh, kw, out h, out w) of a conv kernel from its graph shapes (NCHW or NCHWc).

    The weight is the kernel's rank-6/7 input (NCHWc: ``OIHW..``) or, for a plain NCHW conv, the
    rank-4 input after the data; a fused kernel may list a residual operand before either.
    """
    o = row["out"]
    co = o[1] * o[4] if len(o) == 5 else o[1]
    ins = row["ins"]
    w = next((s for s in ins if len(s) in (6, 7)), None)
    if w is None:
        four = [s for s in ins if len(s) == 4]
        w = four[1] if len(four) > 1 else None
    if w is None:
        return None
    return (co, w[2], w[3], o[2], o[3])


def _ort_conv_geometry(path):
    """{ONNX node name: (out ch, kh, kw, out h, out w)} for the model's convolutions."""
    return {name: geometry for name, (geometry, _macs) in _ort_conv_shapes(path).items()}


def _ort_conv_shapes(path):
    """{ONNX node name: ((out ch, kh, kw, out h, out w), multiply-accumulates)} for the model's convolutions.

    Output shapes come from one ONNX Runtime run with every conv output added as a graph output
    (ONNX shape inference stops at the first com.microsoft contrib op of a QOperator model).
    """
    import numpy as np
    import onnx
    import onnxruntime as ort

    m = onnx.load(path)
    inits = {t.name: t for t in m.graph.initializer}
    # a QDQ conv's weight is a DequantizeLinear of the int8 initializer
    dequantized = {n.output[0]: n.input[0] for n in m.graph.node
                   if n.op_type == "DequantizeLinear" and n.input[0] in inits}
    convs = {}
    for n in m.graph.node:
        w = {"QLinearConv": 3, "ConvInteger": 1, "Conv": 1}.get(n.op_type)
        weight = None if w is None else dequantized.get(n.input[w], n.input[w])
        if weight in inits:
            convs[n.name] = (n, list(inits[weight].dims))
    existing = {o.name for o in m.graph.output}
    for n, _ in convs.values():
        if n.output[0] not in existing:
            if n.op_type == "QLinearConv":
                elem = (inits[n.input[7]].data_type if len(n.input) > 7 and n.input[7] in inits
                        else onnx.TensorProto.UINT8)
            else:
                elem = onnx.TensorProto.INT32 if n.op_type == "ConvInteger" else onnx.TensorProto.FLOAT
            m.graph.output.append(onnx.helper.make_tensor_value_info(n.output[0], elem, None))
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    x = np.zeros([d if isinstance(d, int) else 1 for d in inp.shape], np.float32)
    outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {inp.name: x})))
    shapes = {}
    for name, (n, W) in convs.items():
        oh, ow = outs[n.output[0]].shape[2:4]
        # W is (out, in / groups, kh, kw): each output value takes in / groups x kh x kw products
        shapes[name] = ((W[0], W[2], W[3], oh, ow), int(W[0] * W[1] * W[2] * W[3] * oh * ow))
    return shapes


def table(tvm_rows, peer_times, shapes, peak=None, threads=1):
    """Markdown rows per conv geometry: count, multiply-accumulates, TVM ms per pipeline, each peer's
    ms, tvm-ext over each peer; with ``peak`` (GMAC/s per core), each engine's fraction of ``peak x
    threads``; and totals. ``peer_times``: ``{peer: {ONNX node: ms}}`` (peers that did not run are
    left out); ``shapes``: :func:`_ort_conv_shapes`."""
    per = {p: collections.defaultdict(list) for p in tvm_rows}
    for p, rows in tvm_rows.items():
        for r in rows:
            if "conv2d" in r["name"] and _geometry_tvm(r) is not None:
                per[p][_geometry_tvm(r)].append(r["ms"])
    macs, count = collections.Counter(), collections.Counter()
    for g, m in shapes.values():
        macs[g] += m
        count[g] += 1
    peers = {name: collections.defaultdict(list) for name in peer_times}
    for name, times in peer_times.items():
        times = {_onnx_name(n): v for n, v in times.items()}
        for node, (g, _m) in shapes.items():
            if node in times:
                peers[name][g].append(times[node])
    pipes, names = list(tvm_rows), list(peer_times)
    ours = "tvm-ext" if "tvm-ext" in pipes else pipes[-1]
    first = names[0] if names else None
    keys = sorted(set(macs).union(*[set(v) for v in per.values()]),
                  key=lambda k: -sum(peers[first].get(k, [0])) if first else -macs[k])
    engines = pipes + names
    head = (["conv (out, kh, kw, oh, ow)", "n", "GMAC"] + [f"{e} ms" for e in engines]
            + [f"{ours} / {n}" for n in names] + ([f"{e} % peak" for e in [ours] + names] if peak else []))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    tot = collections.Counter()

    def pct(ms, gmac):
        return f"{gmac / (ms * 1e-3) / (peak * threads) * 100:.0f}" if ms else "-"

    for k in keys:
        t = {p: sum(per[p].get(k, [])) for p in pipes}
        t.update({n: sum(peers[n].get(k, [])) for n in names})
        gmac = macs[k] / 1e9
        for e in engines:
            tot[e] += t[e]
        tot["gmac"] += gmac
        cells = ([str(k), str(count[k]), f"{gmac:.3f}"] + [f"{t[e]:.3f}" for e in engines]
                 + [f"{t[ours] / t[n]:.2f}" if t[n] else "-" for n in names]
                 + ([pct(t[e], gmac) for e in [ours] + names] if peak else []))
        lines.append("| " + " | ".join(cells) + " |")
    cells = (["all convolutions", "", f"{tot['gmac']:.3f}"] + [f"{tot[e]:.2f}" for e in engines]
             + [f"{tot[ours] / tot[n]:.2f}" if tot[n] else "-" for n in names]
             + ([pct(tot[e], tot["gmac"]) for e in [ours] + names] if peak else []))
    lines.append("| " + " | ".join(cells) + " |")
    other = {p: sum(r["ms"] for r in rows if "conv2d" not in r["name"]) for p, rows in tvm_rows.items()}
    cells = ["everything else (TVM)", "", ""] + [f"{other[p]:.2f}" for p in pipes] + [""] * (len(head) - 3 - len(pipes))
    lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def over_passes(passes, stat):
    """``(tvm rows, end to end, fastest end to end, ORT, OpenVINO)`` of several timing passes: each kernel's,
    node's and pipeline's ``stat`` over the passes that timed it (``numpy.min`` or ``numpy.median``; the
    fastest end to end: the least over the passes). OpenVINO stays None where it did not run."""
    import numpy as np

    def merge(dicts, how=stat):
        dicts = [d for d in dicts if d]
        return {k: float(how([d[k] for d in dicts if k in d])) for k in dicts[0]} if dicts else None

    rows = {p: [dict(r, ms=float(stat([pas[0][p][i]["ms"] for pas in passes]))) for i, r in enumerate(first)]
            for p, first in passes[0][0].items()}
    return (rows, merge([pas[1] for pas in passes]), merge([pas[2] for pas in passes], np.min),
            merge([pas[3] for pas in passes]), merge([pas[4] for pas in passes]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", default="qoperator", help="qoperator | qdq | path to an int8 ONNX model")
    ap.add_argument("--target", default=None, help="TVM target (default: the host); stock TVM builds it with VNNI "
                    "masked (plain relay.build aborts on TVM 0.19's VNNI intrinsic), tvm-ext as tvm_ext.build does")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=7, help="debug-executor rounds per pipeline")
    ap.add_argument("--out", default=None, help="also write the raw times as JSON here")
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="TVM kernel, end-to-end and OpenVINO node times: the median of the rounds, or the "
                         "fastest (the least disturbed on a machine others are using)")
    ap.add_argument("--table-from", default=None, help="print the table of an earlier --out JSON (no builds)")
    from tvm_ext.tools.ort_isa import ORT_ISA_CHOICES

    ap.add_argument("--ort-isa", choices=ORT_ISA_CHOICES, default="auto",
                    help="auto: ONNX Runtime at the target's ISA where it can be masked (AVX2 on an AVX-512 host); "
                         "host: the installed ONNX Runtime")
    ap.add_argument("--openvino-isa", choices=("auto", "host"), default="auto",
                    help="auto: OpenVINO capped at tvm-ext's ISA class where the host's is above it "
                         "(ONEDNN_MAX_CPU_ISA in a child process, as tvm-ext bench does); host: the host's ISA")
    ap.add_argument("--peak", type=float, default=None, metavar="GMACS",
                    help="the instruction set's multiply-accumulate peak per core, GMAC/s "
                         "(benchmarks/lab/int8_peak.py): adds each engine's fraction of peak x threads")
    ap.add_argument("--pipelines", default="stock,tvm-ext",
                    help="the TVM pipelines built and timed, comma-separated: stock, tvm-ext or both (default)")
    ap.add_argument("--openvino-sessions", type=int, default=1,
                    help="with --stat min: compile and time OpenVINO this many times, each node's fastest over all "
                         "(on a busy machine one session's fastest still varies)")
    ap.add_argument("--passes", type=int, default=1,
                    help="time every engine this many times in turn (TVM, ONNX Runtime, OpenVINO), each time's "
                         "--stat over the passes: on a machine with slow phases, every engine meets them")
    ap.add_argument("--build-dir", default=None,
                    help="time the libraries an earlier run built there (its log names the folder) instead of "
                         "building them again")
    ap.add_argument("--ort-times-of", default=None, help=argparse.SUPPRESS)  # the child of ort_node_times_in
    ap.add_argument("--openvino-times-of", default=None, help=argparse.SUPPRESS)  # openvino_node_times_in's child
    ap.add_argument("--openvino-convs", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.ort_times_of:
        print(json.dumps(ort_node_times(a.ort_times_of, a.threads)))
        return
    if a.openvino_times_of:
        import numpy as np

        convs = set(filter(None, a.openvino_convs.split(",")))
        stat = np.min if a.stat == "min" else None
        from tvm_ext.tools.openvino_peer import node_times

        print(json.dumps(node_times(a.openvino_times_of, a.threads, convs, stat=stat)))
        return
    pipes = [p.strip() for p in a.pipelines.split(",") if p.strip()]
    if not pipes or set(pipes) - {"stock", "tvm-ext"}:
        ap.error(f"--pipelines takes stock, tvm-ext or both, got {a.pipelines!r}")
    if a.passes < 1 or a.repeat < 1:
        ap.error(f"--passes and --repeat take at least 1, got {a.passes} and {a.repeat}")
    if a.table_from:
        from tvm_ext.tools import zoo

        raw = json.loads(Path(a.table_from).read_text())
        path = raw.get("model") or str(zoo.onnx_path(f"resnet50_int8_{a.variant}"))
        peers = {"ORT": raw["ort"], **({"OpenVINO": raw["openvino"]} if raw.get("openvino") else {})}
        print(table(raw["tvm"], peers, _ort_conv_shapes(path), a.peak, raw.get("threads", a.threads)))
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    os.environ["TVM_NUM_THREADS"] = str(a.threads)
    from tvm_ext.tools.bench._measure import SPIN_COUNT

    # TVM's workers spin between kernels as in tvm-ext bench: a worker that went to sleep between two
    # kernels would add its wake-up to the next kernel's time
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", SPIN_COUNT)
    from tvm_ext.tools import zoo
    from tvm_ext.x86.isa import isa_class, host_features
    from tvm_ext.x86.target import build_target, host_target, safe_target

    path = a.variant if a.variant.endswith(".onnx") else str(zoo.onnx_path(f"resnet50_int8_{a.variant}"))
    # as tvm-ext bench: stock at what plain relay.build survives, tvm-ext at what tvm_ext.build compiles for
    targets = {"stock": str(safe_target(a.target) if a.target else host_target()),
               "tvm-ext": str(build_target(a.target))}
    target = targets["tvm-ext"]
    targets = {p: t for p, t in targets.items() if p in pipes}
    folder = a.build_dir or tempfile.mkdtemp(prefix="tvm_ext_layers_")
    ctx = mp.get_context("spawn")
    for p in pipes if not a.build_dir else ():
        logger.info("building %s for %s into %s", p, targets[p], folder)
        proc = ctx.Process(target=_build, args=((path, p, targets[p], folder),))
        proc.start()
        proc.join()
        if proc.exitcode != 0:
            sys.exit(f"layers_vs_peers: the {p} build failed (exit code {proc.exitcode})")
    missing = [p for p in pipes if not Path(f"{folder}/{p}.so").exists()]
    if missing:
        sys.exit(f"layers_vs_peers: no {', '.join(missing)} library in {folder}")
    import numpy as np

    stat = np.min if a.stat == "min" else None
    from tvm_ext.tools.bench import ort_peer

    peer = ort_peer(target, a.ort_isa)
    shapes = _ort_conv_shapes(path)
    import time

    import tvm

    from tvm_ext.tools.openvino_peer import host_level, node_times, onednn_isa_cap

    feats = host_features()
    host_isa = host_level(feats)
    cap = onednn_isa_cap(isa_class(tvm.target.Target(target)), feats) if a.openvino_isa == "auto" else None

    def ov_session():
        if cap:
            return openvino_node_times_in(cap, path, a.threads, set(shapes), stat=stat)
        return node_times(path, a.threads, set(shapes), stat=stat)

    passes = []
    for i in range(a.passes):  # every engine once per pass, so a slow phase of the machine reaches them all
        logger.info("timing pass %d/%d: TVM kernels and end to end", i + 1, a.passes)
        if i:
            time.sleep(1.0)  # the peers' threads settle before TVM is timed again
        rows = tvm_kernel_times(folder, pipes, a.repeat, stat)
        e2e, e2e_min = tvm_end_to_end_times(folder, pipes, a.repeat, stat)
        time.sleep(1.0)  # TVM's workers stop spinning (about 0.55 s at SPIN_COUNT) before the peers are timed
        logger.info("ONNX Runtime node timing (%s)", peer["note"])
        ort = ort_node_times_in(peer["package"], path, a.threads) if peer["package"] \
            else ort_node_times(path, a.threads)
        logger.info("OpenVINO node timing (%s)", f"ONEDNN_MAX_CPU_ISA={cap}" if cap else "the host's ISA")
        ov_times, ov_kernels, ov_note = ov_session()
        for _ in range(a.openvino_sessions - 1 if ov_times and a.stat == "min" else 0):
            more, _k, _n = ov_session()
            ov_times = {n: min(v, more.get(n, v)) for n, v in ov_times.items()}
        passes.append((rows, e2e, e2e_min, ort, ov_times))
    rows, end_to_end, end_to_end_min, ort, ov_times = over_passes(passes, stat or np.median)
    ort_isa = "avx2 (AVX-512 masked: tvm_ext.tools.ort_isa)" if peer["package"] else f"the host's ISA ({host_isa})"
    ov_kinds = collections.Counter((ov_kernels or {}).values())
    ov_said = f"OpenVINO {ov_note}"
    if ov_times:
        kinds = ", ".join(f"`{k}` {n}" for k, n in ov_kinds.most_common())
        runs_at = f"at most {cap} (ONEDNN_MAX_CPU_ISA; the host: {host_isa})" if cap else f"the host's ISA ({host_isa})"
        ov_said = f"OpenVINO runs {runs_at}; kernels: {kinds}"
    peak = f"; peak {a.peak:g} GMAC/s per core x {a.threads}" if a.peak else ""
    isas = "; ".join(f"{p} `{t}` (ISA {isa_class(tvm.target.Target(t))})" for p, t in targets.items())
    stat_said = "medians" if a.stat == "median" else "fastest"
    print(f"model: {Path(path).name}; {isas}; "
          f"ONNX Runtime runs {ort_isa}; {ov_said}; {a.threads} threads "
          f"(TVM_THREAD_POOL_SPIN_COUNT={os.environ['TVM_THREAD_POOL_SPIN_COUNT']}); "
          f"{stat_said} of {a.repeat} rounds{peak}{f' and of {a.passes} passes' if a.passes > 1 else ''}\n")
    peers = {"ORT": ort, **({"OpenVINO": ov_times} if ov_times else {})}
    print(table(rows, peers, shapes, a.peak, a.threads))
    if a.out:
        Path(a.out).write_text(json.dumps({"model": path, "targets": targets, "threads": a.threads, "tvm": rows,
                                           "tvm_end_to_end_ms": end_to_end, "tvm_end_to_end_min_ms": end_to_end_min,
                                           "stat": a.stat,
                                           "ort": ort, "onnxruntime_isa": peer, "openvino": ov_times,
                                           "openvino_kernels": ov_kernels, "openvino_note": ov_note,
                                           "openvino_isa_cap": cap}, indent=1))

if __name__ == "__main__":
    main()
