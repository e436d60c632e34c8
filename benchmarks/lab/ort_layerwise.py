"""Where do TVM's outputs first depart from ONNX Runtime's? Layer-by-layer comparison.

Not a test: a measurement tool for the numerics of real int8 models. Every 8-bit tensor
of a quantized ONNX model (QOperator: every node output; QDQ: every QuantizeLinear output) is
exposed as a graph output; ONNX Runtime and a TVM build run the same inputs; for each tensor, in
topological order, the difference is printed in quantization levels (the tensor's own step).

Usage (each engine runs in its own child process: a crash of the LLVM assertions build or of
libtvm.so does not take the tool down)::

    python benchmarks/lab/ort_layerwise.py MODEL --engines ort,stock-llvm,stock-host,tvm-ext \
        [--inputs 8] [--small] [--ort-exact] [--config relay.qnn.requantize_rounding=TONEAREST] [--out DIR]

MODEL is a zoo name (``resnet50_int8_qoperator`` with ``--small``, ``ppocr_cls_v2_int8_qdq``, ...)
or an ONNX file. Engines: ``ort`` (ONNX Runtime; ``--ort-exact``, ``--ort-reference optimized``),
``stock-llvm``, ``stock-host``, ``tvm-ext``, ``tvm-ext-int8``, ``stock-llvm-rhe``, ``tvm-ext-rhe``,
``tvm-ext-ortnum``, ``tvm-ext-int8-ort``: what each one builds is in docs/numerics.md,
"ort_layerwise.py's engines".
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


# --- the model with its 8-bit tensors exposed ---------------------------------------------------
def _load_model(name: str, small: bool):
    import onnx

    if os.path.exists(name):
        return onnx.load(name), None
    from tvm_ext.tools import zoo, zoo_real

    if zoo_real.is_real_model(name):
        path = zoo.onnx_path(name)
    else:
        path = zoo.onnx_path(name, small)
    return onnx.load(str(path)), name


def _tensor_info(model):
    """name -> (elem_type, producer op, index of producer); scales of 8-bit tensors."""
    import onnx
    from onnx import numpy_helper

    inferred = onnx.shape_inference.infer_shapes(model)
    types = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]:
        types[vi.name] = vi.type.tensor_type.elem_type
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant":
            inits[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    # ONNX shape inference does not type com.microsoft ops (QLinearAdd, QGemm, ...) or what follows
    zp_input = {"QuantizeLinear": 2, "QLinearConv": 7, "QLinearAdd": 7, "QLinearMul": 7, "QGemm": 8,
                "QLinearGlobalAveragePool": 4, "QLinearSigmoid": 4, "QLinearLeakyRelu": 4, "QLinearSoftmax": 4,
                "QLinearAveragePool": 4, "QLinearConcat": 1}
    for n in model.graph.node:
        if not n.output or n.output[0] in types:
            continue
        k = zp_input.get(n.op_type)
        if k is not None and len(n.input) > k and n.input[k] in inits:
            types[n.output[0]] = onnx.helper.np_dtype_to_tensor_dtype(inits[n.input[k]].dtype)
        elif n.op_type == "DequantizeLinear":
            types[n.output[0]] = onnx.TensorProto.FLOAT
        elif n.op_type in ("MaxPool", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Relu") \
                and n.input[0] in types:
            types[n.output[0]] = types[n.input[0]]
    scales = {}

    def scalar(name):
        v = inits.get(name)
        return None if v is None or v.size != 1 else float(v.ravel()[0])

    for n in model.graph.node:
        ins = list(n.input)
        if n.op_type in ("QuantizeLinear",):
            scales[n.output[0]] = scalar(ins[1])
        elif n.op_type == "DequantizeLinear":
            scales.setdefault(ins[0], scalar(ins[1]))
        elif n.op_type == "QLinearConv":
            scales.setdefault(ins[0], scalar(ins[1]))
            scales[n.output[0]] = scalar(ins[6])
        elif n.op_type in ("QLinearAdd", "QLinearMul"):
            scales.setdefault(ins[0], scalar(ins[1]))
            scales.setdefault(ins[3], scalar(ins[4]))
            scales[n.output[0]] = scalar(ins[6])
        elif n.op_type in ("QLinearGlobalAveragePool", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax",
                           "QLinearAveragePool"):
            scales.setdefault(ins[0], scalar(ins[1]))
            scales[n.output[0]] = scalar(ins[3])
        elif n.op_type == "QGemm":
            scales.setdefault(ins[0], scalar(ins[1]))
            if len(ins) > 7 and ins[7]:
                scales[n.output[0]] = scalar(ins[7])
        elif n.op_type == "QLinearConcat":
            scales[n.output[0]] = scalar(ins[0])
    return types, scales


def expose(model, which: str = "auto"):
    """A copy of ``model`` whose 8-bit tensors (and graph outputs) are all graph outputs.

    ``which``: ``"q"`` QuantizeLinear outputs only (QDQ models: exposing DQ or float tensors
    would stop ONNX Runtime's QDQ fusions and change what it computes), ``"all8"`` every 8-bit node
    output (QOperator models), ``"auto"`` picks by the presence of QLinear/QGemm ops.
    """
    import onnx

    types, scales = _tensor_info(model)
    qop = any(n.op_type.startswith("QLinear") or n.op_type == "QGemm" for n in model.graph.node)
    if which == "auto":
        which = "all8" if qop else "q"
    eight = (onnx.TensorProto.UINT8, onnx.TensorProto.INT8)
    outs = [o.name for o in model.graph.output]
    order = []
    for idx, n in enumerate(model.graph.node):
        if which == "q" and n.op_type != "QuantizeLinear":
            continue
        for o in n.output:
            if o and types.get(o) in eight and o not in outs:
                order.append((o, n.op_type, n.name or f"node{idx}", idx))
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for o, *_ in order:
        m.graph.output.append(onnx.helper.make_tensor_value_info(o, types[o], None))
    # the exposed tensors each exposed tensor is computed from (through unexposed float tensors)
    producer = {o: n for n in model.graph.node for o in n.output}
    exposed = {o for o, *_ in order} | {i.name for i in model.graph.input}

    def sources(name):
        found, stack, seen = set(), [name], set()
        while stack:
            t = stack.pop()
            n = producer.get(t)
            if n is None:
                continue
            for i in n.input:
                if not i or i in seen:
                    continue
                seen.add(i)
                if i in exposed:
                    found.add(i)
                elif i in producer:
                    stack.append(i)
        return sorted(found)

    meta = [dict(name=o, op=op, node=node, index=idx, scale=scales.get(o), sources=sources(o))
            for o, op, node, idx in order]
    return m, meta


# --- inputs ---------------------------------------------------------------------------------------
def inputs_for(model_name, model, n):
    from tvm_ext.tools import zoo_real

    if model_name and zoo_real.is_real_model(model_name):
        return zoo_real.images(model_name, n, seed=1000)  # what `tvm-ext bench` uses
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return [np.random.default_rng(1000 + s).standard_normal(shape).astype("float32") for s in range(n)]


# --- engines (child process) ----------------------------------------------------------------------
def run_engine(engine: str, model_path: str, xs_path: str, out_path: str, config: dict) -> dict:
    import onnx

    model = onnx.load(model_path)
    xs = np.load(xs_path)["xs"]
    in_name = model.graph.input[0].name
    out_names = [o.name for o in model.graph.output]
    t0 = time.perf_counter()
    info = {}
    if engine in ("ort", "ort-exact"):
        import onnxruntime as ort

        so = _ort_options(engine.endswith("-exact"))
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
        results = [sess.run(None, {in_name: x}) for x in xs]
    elif engine in ("ort-opt", "ort-opt-exact"):  # ORT's own optimized graph of plain.onnx, the exposed names
        out_names, results = _run_ort_optimized(model, Path(model_path).parent, in_name, xs,
                                                engine.endswith("-exact"))
    else:
        import tvm
        from tvm import relay
        from tvm.contrib import graph_executor

        import tvm_ext
        from tvm_ext.core import pipelines
        from tvm_ext.core.frontend import from_onnx
        from tvm_ext.x86.target import host_target

        base = engine
        cfg = dict(config)
        rq = {k: cfg.pop(k) for k in ("rounding", "compute_dtype") if k in cfg}
        mod, params = from_onnx(model, shape={in_name: list(xs.shape[1:])})
        rq_scope = relay.qnn.op.requantize_config(**rq) if rq else contextlib.nullcontext()
        rq_scope.__enter__()
        if base in ("stock-llvm", "stock-host"):
            tgt = "llvm" if base == "stock-llvm" else host_target()
            with tvm.transform.PassContext(opt_level=3, config=cfg):
                lib = relay.build(mod, target=tgt, params=params)
        elif base == "tvm-ext":
            lib = tvm_ext.build(mod, params=params, config=cfg)
        elif base == "stock-llvm-rhe":  # tvm_ext.build with no passes is plain relay.build (tested)
            from tvm_ext.passes import RoundHalfToEven

            lib = tvm_ext.build(mod, target="llvm", params=params, passes=[RoundHalfToEven()], config=cfg)
        elif base == "tvm-ext-rhe":
            from tvm_ext.passes import RoundHalfToEven

            lib = tvm_ext.build(mod, params=params, passes=[RoundHalfToEven()], config=cfg)
        elif base == "tvm-ext-int8":
            lib = tvm_ext.build(mod, params=params, passes=pipelines.int8(), config=cfg)
        elif base == "tvm-ext-ortnum":
            lib = tvm_ext.build(mod, params=params, passes=pipelines.onnxruntime_numerics(), config=cfg)
        elif base == "tvm-ext-int8-ort":
            lib = tvm_ext.build(mod, params=params, passes=pipelines.int8(numerics="onnxruntime"), config=cfg)
        else:
            raise SystemExit(f"unknown engine {engine!r}")
        rq_scope.__exit__(None, None, None)
        info["build_s"] = time.perf_counter() - t0
        gm = graph_executor.GraphModule(lib["default"](tvm.cpu()))
        results = []
        for x in xs:
            gm.set_input(in_name, x)
            gm.run()
            results.append([gm.get_output(i).numpy() for i in range(gm.get_num_outputs())])
    arrays = {}
    for k, name in enumerate(out_names):
        arrays[name] = np.stack([r[k] for r in results])
    np.savez(out_path, **arrays)
    info["s"] = time.perf_counter() - t0
    return info


def _drop_per_tensor_axis(model) -> int:
    """ORT's optimizer writes an ``axis`` attribute on per-tensor (De)QuantizeLinear nodes even in an
    opset < 13 model, which ORT then refuses to load ("Unrecognized attribute: axis"; PP-OCRv4 det
    QDQ S8S8). With a one-element scale the attribute means nothing: drop it. Returns how many."""
    import numpy as np
    from onnx import numpy_helper

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    if opset >= 13:
        return 0
    sizes = {t.name: int(np.prod(t.dims)) for t in model.graph.initializer}
    sizes.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t).size for n in model.graph.node
                  if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"})
    dropped = 0
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and node.domain in ("", "ai.onnx"):
            keep = [a for a in node.attribute if a.name != "axis" or sizes.get(node.input[1]) != 1]
            if len(keep) != len(node.attribute):
                del node.attribute[:]
                node.attribute.extend(keep)
                dropped += 1
    return dropped


def _ort_options(exact: bool):
    """One-thread session options; ``exact``: ONNX Runtime's exact int8 path (``session.x64quantprecision``)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    if exact:
        so.add_session_config_entry("session.x64quantprecision", "1")
    return so


def _run_ort_optimized(exposed, out: Path, in_name: str, xs, exact: bool = False):
    import onnx
    import onnxruntime as ort

    so = _ort_options(exact)
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(out / "ort_optimized.onnx")
    ort.InferenceSession(str(out / "plain.onnx"), so, providers=["CPUExecutionProvider"])
    opt = onnx.load(str(out / "ort_optimized.onnx"))
    _drop_per_tensor_axis(opt)
    produced = {o for n in opt.graph.node for o in n.output}
    have = {o.name for o in opt.graph.output}
    for o in exposed.graph.output:
        if o.name in produced and o.name not in have:
            opt.graph.output.append(onnx.helper.make_tensor_value_info(o.name, o.type.tensor_type.elem_type, None))
    so = _ort_options(exact)
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(opt.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return [o.name for o in opt.graph.output], [sess.run(None, {in_name: x}) for x in xs]


def _child(engine, model_path, xs_path, out_path, config, log):
    cmd = [sys.executable, __file__, "--child", engine, model_path, xs_path, out_path, json.dumps(config)]
    with open(log, "w") as fh:
        p = subprocess.run(["nice", "-n", "10", *cmd], stdout=fh, stderr=subprocess.STDOUT, check=False)
    if p.returncode != 0:
        return {"error": f"exit {p.returncode} (see {log})"}
    return {"ok": True}


# --- comparison -----------------------------------------------------------------------------------
def compare(meta, final_name, final_step, ref: dict, got: dict) -> list:
    rows = []
    names = [*[m["name"] for m in meta], final_name]
    metas = {m["name"]: m for m in meta}
    for name in names:
        if name not in ref:  # --ort-reference optimized: ORT's optimizer renamed or removed it
            m = metas.get(name, {"op": "output", "node": ""})
            rows.append(dict(name=name, op=m["op"], node=m["node"], scale=m.get("scale"), dtype="-", local=False,
                             max_steps=None, max_abs=None, frac_differ=0.0, mean_abs=0.0, missing=True))
            continue
        a, b = ref[name], got[name]
        m = metas.get(name, {"op": "output", "node": "", "scale": final_step})
        if a.dtype in (np.uint8, np.int8):
            d = np.abs(a.astype(np.int32) - b.astype(np.int32))
            steps = float(d.max())
        else:
            d = np.abs(a.astype(np.float64) - b.astype(np.float64))
            steps = float(d.max() / m["scale"]) if m.get("scale") else None
        srcs = m.get("sources", [])
        # graph inputs (not in got) are equal by construction; a source ORT's optimizer removed is unknown
        local = bool(srcs) and all((t in ref and np.array_equal(ref[t], got[t])) if t in got else True for t in srcs)
        rows.append(dict(name=name, op=m["op"], node=m["node"], scale=m.get("scale"), dtype=str(a.dtype), local=local,
                         max_steps=steps, max_abs=float(d.max()) if a.dtype.kind == "f" else None,
                         frac_differ=float((d > 0).mean()), mean_abs=float(d.mean())))
    return rows


def top1(ref, got):
    return int(sum(int(np.argmax(a) == np.argmax(b)) for a, b in zip(ref, got)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--engines", default="ort,stock-llvm")
    ap.add_argument("--inputs", type=int, default=8)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--expose", default="auto", choices=("auto", "q", "all8", "none"))
    ap.add_argument("--config", action="append", default=[],
                    help="PassContext config KEY=VALUE; rounding=... and compute_dtype=... go to requantize_config")
    ap.add_argument("--out", default=None)
    ap.add_argument("--show", type=int, default=40, help="rows of the per-tensor table to print")
    ap.add_argument("--ort-reference", default="exposed", choices=("exposed", "optimized"),
                    help="ORT's per-tensor values: from the exposed model, or from ORT's own optimized graph "
                         "(fusions as in the plain session; QDQ models)")
    ap.add_argument("--ort-exact", action="store_true",
                    help="ORT on its exact int8 path (session.x64quantprecision): no saturated int16 pair sums "
                         "on CPUs without VNNI")
    args = ap.parse_args(argv)
    import onnx

    model, zname = _load_model(args.model, args.small)
    tag = (zname or Path(args.model).stem) + ("_small" if args.small else "")
    out = Path(args.out or f"/tmp/ort_layerwise/{tag}")
    out.mkdir(parents=True, exist_ok=True)
    if args.expose == "none":
        exposed, meta = model, []
    else:
        exposed, meta = expose(model, args.expose)
    mpath = out / "exposed.onnx"
    onnx.save(exposed, str(mpath))
    onnx.save(model, str(out / "plain.onnx"))
    xs = np.stack(inputs_for(zname, model, args.inputs))
    np.savez(out / "xs.npz", xs=xs)
    config = {}
    for kv in args.config:
        k, v = kv.split("=", 1)
        config[k] = v
    final = model.graph.output[0].name
    from tvm_ext.tools.bench import _output_step  # pylint: disable=protected-access

    final_step = _output_step(out / "plain.onnx").get("output_step")
    engines = args.engines.split(",")
    results = {}
    for e in ["ort", *[e for e in engines if e != "ort"]]:
        t0 = time.perf_counter()
        tag_e = e + ("" if not config else "_" + "_".join(f"{k.split('.')[-1]}-{v}" for k, v in config.items()))
        child_e = "ort-opt" if e == "ort" and args.ort_reference == "optimized" else e
        if e == "ort" and args.ort_exact:
            child_e += "-exact"
        r = _child(child_e, str(mpath), str(out / "xs.npz"), str(out / f"{tag_e}.npz"), config if e != "ort" else {},
                   str(out / f"{tag_e}.log"))
        print(f"[{e}] {r} in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
        results[e] = (tag_e, r)
    # ONNX Runtime with nothing exposed: the exposed outputs must not change what it computes
    _child("ort-exact" if args.ort_exact else "ort", str(out / "plain.onnx"), str(out / "xs.npz"),
           str(out / "ort_plain.npz"), {}, str(out / "ort_plain.log"))
    ref = dict(np.load(out / "ort.npz"))
    plain = dict(np.load(out / "ort_plain.npz"))
    same = np.array_equal(plain[final], ref[final])
    print(f"ORT final output unchanged by exposing {len(meta)} tensors: {same}"
          + (f" (reference: ORT's optimized graph, {sum(m['name'] in ref for m in meta)} of the tensors in it)"
             if args.ort_reference == "optimized" else ""))
    summary = {"model": tag, "inputs": int(len(xs)), "output_step": final_step, "exposed": len(meta),
               "ort_reference": args.ort_reference, "ort_exact": args.ort_exact,
               "ort_unchanged_by_exposing": bool(same), "engines": {}}
    for e in engines:
        if e == "ort":
            continue
        tag_e, r = results[e]
        if "error" in r:
            print(f"\n== {e}: {r['error']}")
            summary["engines"][e] = r
            continue
        got = dict(np.load(out / f"{tag_e}.npz"))
        rows = compare(meta, final, final_step, ref, got)
        fin = rows[-1]
        t1 = top1(plain[final].reshape(len(xs), -1), got[final].reshape(len(xs), -1))
        steps = "-" if fin["max_steps"] is None else f"{fin['max_steps']:.1f}"
        print(f"\n== {e} vs ORT: output max {steps} steps (abs {fin['max_abs']}), top-1 {t1}/{len(xs)} "
              "(top-1: classifiers only)")
        first = next((r for r in rows if r["max_steps"]), None)
        print(f"   first tensor that differs: {first['name'] if first else None} ({first['op'] if first else ''})")
        local = [r for r in rows if r["max_steps"] and r.get("local")]
        print("   tensors that differ although every input they are computed from equals ORT's (local): "
              + (", ".join(f"{r['name']} ({r['op']}, {r['max_steps']:.0f} steps, {100 * r['frac_differ']:.3f}%)"
                           for r in local) or "none"))
        print(f"   {'#':>3} {'op':<26} {'tensor':<40} {'max':>6} {'%diff':>7} {'mean':>7}")
        shown = 0
        for i, row in enumerate(rows):
            if shown >= args.show:
                break
            if row["max_steps"] or i == len(rows) - 1:
                ms = "-" if row["max_steps"] is None else f"{row['max_steps']:.1f}"
                print(f"   {i:>3} {row['op']:<26} {row['name'][:40]:<40} {ms:>6} {100 * row['frac_differ']:>6.2f}% "
                      f"{row['mean_abs']:>7.4f}{'  local' if row.get('local') else ''}")
                shown += 1
        summary["engines"][e] = {"rows": rows, "top1": t1, "output_max_steps": fin["max_steps"]}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\nwrote {out / 'summary.json'}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, eng, mp, xp, op, cfg = sys.argv
        print(run_engine(eng, mp, xp, op, json.loads(cfg)))
    else:
        main()
