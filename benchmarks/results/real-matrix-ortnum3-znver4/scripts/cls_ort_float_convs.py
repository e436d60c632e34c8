"""PP-OCR cls QDQ S8S8 per-channel: the convs ONNX Runtime runs in float32 (its own optimized graph), and how
their quantized outputs compare with exact arithmetic and with a sequential-FMA float emulation.

Measurement record (2026-11-24, Zen 4, onnxruntime 1.32.0). Run from the repository root with the venv:
    .venv/bin/python benchmarks/results/real-matrix-ortnum3-znver4/scripts/cls_ort_float_convs.py
"""
import os
import numpy as np, onnx, onnxruntime as ort
from onnx import numpy_helper, helper
from tvm_ext import zoo_real
OPT = "/tmp/cls_s8s8pc_ort_optimized.onnx"
P = [str(p) for p in __import__("pathlib").Path(os.path.expanduser("~/.cache/tvm_ext/zoo/real")).glob(
    "ppocr_cls_v2_int8_qdq_s8s8_perchannel-*.onnx")][0]
_so = ort.SessionOptions(); _so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
_so.intra_op_num_threads = 1; _so.optimized_model_filepath = OPT
ort.InferenceSession(P, _so, providers=["CPUExecutionProvider"])
opt = onnx.load(OPT)
I = {i.name: numpy_helper.to_array(i) for i in opt.graph.initializer}
prod = {o: n for n in opt.graph.node for o in n.output}
cons = {}
for n in opt.graph.node:
    for i in n.input: cons.setdefault(i, []).append(n)
convs = [n for n in opt.graph.node if n.op_type == 'Conv']
want = []
info = []
for c in convs:
    xdq, wdq = prod[c.input[0]], prod[c.input[1]]
    bdq = prod.get(c.input[2]) if len(c.input) > 2 else None
    q = cons[c.output[0]]
    if len(q) != 1 or q[0].op_type != 'QuantizeLinear': print('skip', c.name, [n.op_type for n in q]); continue
    q = q[0]
    want += [(xdq.input[0], I[xdq.input[2]].dtype), (q.output[0], I[q.input[2]].dtype)]
    info.append((c, xdq, wdq, bdq, q))
m = onnx.ModelProto(); m.CopyFrom(opt)
have = {o.name for o in m.graph.output}
for w, dt in dict.fromkeys(want):
    if w not in have: m.graph.output.append(helper.make_tensor_value_info(w, helper.np_dtype_to_tensor_dtype(dt), None))
so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL; so.intra_op_num_threads = 1
s = ort.InferenceSession(m.SerializeToString(), so, providers=['CPUExecutionProvider'])
so2 = ort.SessionOptions(); so2.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL; so2.intra_op_num_threads = 1
p = P
plain = ort.InferenceSession(p, so2, providers=['CPUExecutionProvider'])
xs = zoo_real.images('ppocr_cls_v2_int8_qdq_s8s8_perchannel', 8, seed=1000)
names = [o.name for o in s.get_outputs()]
outs = [dict(zip(names, s.run(None, {'x': x}))) for x in xs]
print('final equal to plain ORT:', all(np.array_equal(o[names[0]], plain.run(None, {'x': x})[0]) for o, x in zip(outs, xs)))
def conv(x, W, st, pads, g):
    N, C, H, Wd = x.shape; O, Cg, kh, kw = W.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    Ho = (H + pads[0] + pads[2] - kh) // st[0] + 1; Wo = (Wd + pads[1] + pads[3] - kw) // st[1] + 1
    out = np.zeros((N, O, Ho, Wo), np.int64); og = O // g
    for gi in range(g):
        xs_ = xp[:, gi * Cg:(gi + 1) * Cg]
        for i in range(kh):
            for j in range(kw):
                patch = xs_[:, :, i:i + st[0] * Ho:st[0], j:j + st[1] * Wo:st[1]]
                out[:, gi * og:(gi + 1) * og] += np.einsum('nchw,oc->nohw', patch, W[gi * og:(gi + 1) * og, :, i, j])
    return out
tot_mis = 0; tot_el = 0
for c, xdq, wdq, bdq, q in info:
    sx, zx = np.float32(I[xdq.input[1]]), int(I[xdq.input[2]])
    W = I[wdq.input[0]].astype(np.int64); sw = I[wdq.input[1]].astype(np.float32)
    B = I[bdq.input[0]].astype(np.int64) if bdq is not None else np.zeros(W.shape[0], np.int64)
    sy, zy = np.float32(I[q.input[1]]), int(I[q.input[2]])
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in c.attribute}
    g = attrs.get('group', 1); pads = attrs.get('pads', [0, 0, 0, 0]); st = attrs.get('strides', [1, 1])
    mis = 0; el = 0; mis_sfma = 0
    for o in outs:
        x = o[xdq.input[0]].astype(np.int64) - zx  # N C H W
        acc = conv(x, W, st, pads, g) + B[None, :, None, None]
        ratio = (np.float32(sx) * sw / sy).astype(np.float32)
        lo, hi = (0, 255) if I[q.input[2]].dtype == np.uint8 else (-128, 127)
        r = np.clip(np.rint((acc.astype(np.float32) * ratio[None, :, None, None]).astype(np.float32)) + zy, lo, hi)
        R = o[q.output[0]].astype(np.int64)
        mis += int((r != R).sum()); el += R.size
    tot_mis += mis; tot_el += el
    print(f'{c.name:8s} group {g:3d} W {tuple(W.shape)} integer-exact vs ORT float path: {mis} of {el} levels differ')
print('total', tot_mis, tot_el)

print('--- sequential-FMA float emulation of the 1x1 convs ORT runs in float')
for c, xdq, wdq, bdq, q in info:
    W = I[wdq.input[0]]
    if W.shape[2:] != (1, 1) or c.name not in ('Conv@16', 'Conv@42', 'Conv@9', 'Conv@17'): continue
    sx, zx = np.float32(I[xdq.input[1]]), int(I[xdq.input[2]])
    sw = I[wdq.input[1]].astype(np.float32); zw = I[wdq.input[2]].astype(np.int64)
    Wf = ((W.astype(np.int64) - zw[:, None, None, None]).astype(np.float32) * sw[:, None, None, None]).astype(np.float32)[:, :, 0, 0]
    sb = I[bdq.input[1]].astype(np.float32)
    Bf = (I[bdq.input[0]].astype(np.int64).astype(np.float32) * sb).astype(np.float32)
    sy, zy = np.float32(I[q.input[1]]), int(I[q.input[2]])
    lo, hi = (0, 255) if I[q.input[2]].dtype == np.uint8 else (-128, 127)
    res = {}
    for o in outs:
        xf = ((o[xdq.input[0]].astype(np.int64) - zx).astype(np.float32) * sx).astype(np.float32)  # N C H W
        R = o[q.output[0]].astype(np.int64)
        for name in ('fma_bias_last', 'fma_bias_first', 'mul_add_bias_last', 'exact'):
            if name == 'exact':
                y = (np.einsum('nchw,oc->nohw', xf.astype(np.float64), Wf.astype(np.float64)) + Bf[None, :, None, None]).astype(np.float32)
            else:
                acc = np.zeros((xf.shape[0], Wf.shape[0]) + xf.shape[2:], np.float32)
                if name == 'fma_bias_first': acc += Bf[None, :, None, None]
                for k in range(Wf.shape[1]):
                    p = xf[:, k][:, None].astype(np.float64) * Wf[:, k][None, :, None, None].astype(np.float64)
                    if name.startswith('fma'):
                        acc = (p + acc.astype(np.float64)).astype(np.float32)
                    else:
                        acc = (p.astype(np.float32) + acc).astype(np.float32)
                y = acc if name == 'fma_bias_first' else (acc + Bf[None, :, None, None]).astype(np.float32)
            r = np.clip(np.rint((y / sy).astype(np.float32)) + zy, lo, hi)
            res[name] = res.get(name, 0) + int((r != R).sum())
    print(c.name, res)
