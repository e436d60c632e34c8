"""Usage: after `ort_layerwise.py ppocr_cls_v2_int8_qdq_s8s8_perchannel --engines ort --ort-reference optimized --out /tmp/lw_cls_opt`
and cls_ort_float_convs.py: the keep-float variant (23 ORT-float convs in float, no FoldScaleAxis) on the exposed
model, per tensor against ORT's optimized graph."""
import sys, numpy as np, onnx
import tvm_ext
from tvm_ext import pipelines
from tvm_ext.frontend import from_onnx
from tvm.contrib import graph_executor
import tvm
import tvm_ext.passes.qdq_to_integer as q2i
FLOAT = {n.name for n in onnx.load('/tmp/cls_s8s8pc_ort_optimized.onnx').graph.node if n.op_type == 'Conv'}
def span_name(call):
    s = call.span
    return s.source_name.name.split(':')[0] if s is not None and s.source_name is not None else ''
q2i._padded_int8_conv = lambda call: span_name(call) in FLOAT
model = onnx.load('/tmp/lw_cls_opt/exposed.onnx')
mod, params = from_onnx(model, shape={'x': [1, 3, 48, 192]})
lib = tvm_ext.build(mod, params=params, passes=pipelines.int8(numerics="onnxruntime"),
                    disabled_pass=["FoldScaleAxis", "ForwardFoldScaleAxis", "BackwardFoldScaleAxis"])
gm = graph_executor.GraphModule(lib["default"](tvm.cpu()))
xs = np.load('/tmp/lw_cls_opt/xs.npz')['xs']
names = [o.name for o in model.graph.output]
got = {n: [] for n in names}
for x in xs:
    gm.set_input('x', x); gm.run()
    for i, n in enumerate(names): got[n].append(gm.get_output(i).numpy())
ref = np.load('/tmp/lw_cls_opt/ort.npz')
for n in names[1:]:
    if n in ref.files:
        a = ref[n].astype(int); b = np.stack(got[n]).reshape(a.shape).astype(int)
        d = np.abs(a - b)
        if d.max(): print(n[:50], 'max', d.max(), 'n', int((d > 0).sum()))
print('kernels', lib.kernel_report.num_kernels)
