"""Usage (repository root): .venv/bin/python .../cls_keep_ort_float_convs.py {base|keepfloat|keepfloat_nofsa}
(needs /tmp/cls_s8s8pc_ort_optimized.onnx from cls_ort_float_convs.py)

Experiment: PP-OCR cls QDQ S8S8 per-channel with int8(numerics="onnxruntime"), but the convs ORT runs in
float (its optimized graph) kept in float by QDQToInteger, and FoldScaleAxis off. Output steps vs plain ORT."""
import sys, json, numpy as np, onnx, onnxruntime as ort
import tvm
import tvm_ext
from tvm_ext import pipelines, zoo_real
from tvm_ext.frontend import from_onnx
from tvm_ext.testing import run_module
import tvm_ext.passes.qdq_to_integer as q2i
name = 'ppocr_cls_v2_int8_qdq_s8s8_perchannel'
import os, pathlib
p = str(next(pathlib.Path(os.path.expanduser('~/.cache/tvm_ext/zoo/real')).glob('ppocr_cls_v2_int8_qdq_s8s8_perchannel-*.onnx')))
FLOAT = {n.name for n in onnx.load('/tmp/cls_s8s8pc_ort_optimized.onnx').graph.node if n.op_type == 'Conv'}
mode = sys.argv[1]
def span_name(call):
    s = call.span
    return s.source_name.name.split(':')[0] if s is not None and s.source_name is not None else ''
seen = []
if mode != 'base':
    def keep(call):
        k = span_name(call) in FLOAT
        if k: seen.append(span_name(call))
        return k
    q2i._padded_int8_conv = keep
model = onnx.load(p)
mod, params = from_onnx(model, shape={'x': [1, 3, 48, 192]})
dis = ["FoldScaleAxis", "ForwardFoldScaleAxis", "BackwardFoldScaleAxis"] if mode == 'keepfloat_nofsa' else []
lib = tvm_ext.build(mod, params=params, passes=pipelines.int8(numerics="onnxruntime"), disabled_pass=dis)
print('kept float', len(set(seen)), sorted(set(seen))[:5])
so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL; so.intra_op_num_threads = 1
s = ort.InferenceSession(p, so, providers=['CPUExecutionProvider'])
xs = zoo_real.images(name, 8, seed=1000)
d = []; top = 0
for x in xs:
    a = s.run(None, {'x': x})[0]; b = run_module(lib, {'x': x})[0]
    d.append(np.abs(a.astype(np.float64) - b).max()); top += int(a.argmax() == b.argmax())
from tvm_ext.bench import _output_step
step = _output_step(p).get('output_step')
r = lib.kernel_report
print(json.dumps(dict(mode=mode, max_steps=float(max(d) / step), top1=top, kernels=r.num_kernels,
                      mb=r.crossing.total_bytes / 1e6, by_dtype={k: v / 1e6 for k, v in r.crossing.nbytes.items()})))
