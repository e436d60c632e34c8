"""Usage (repository root): .venv/bin/python .../cls_tvm_float_convs.py [--no-fold-scale-axis] [--fast-math-contract]

Does TVM's float conv (dequantize -> conv2d -> bias_add -> quantize) reproduce ORT's float path on the
convs ORT keeps in float in PP-OCR cls QDQ S8S8 per-channel? Inputs/outputs from ORT's own optimized graph."""
import numpy as np, onnx
from onnx import numpy_helper
import os, sys
_here = os.path.dirname(os.path.abspath(__file__))
exec(open(os.path.join(_here, "cls_ort_float_convs.py")).read().split("tot_mis = 0")[0].split("def conv(")[0])
NO_FSA = "--no-fold-scale-axis" in sys.argv
CONTRACT = "--fast-math-contract" in sys.argv
import tvm
from tvm import relay
import tvm_ext
from tvm_ext import pipelines
from tvm_ext.testing import run_module
for c, xdq, wdq, bdq, q in info:
    W = I[wdq.input[0]]
    sx, zx = np.float32(I[xdq.input[1]]), int(I[xdq.input[2]])
    sw = I[wdq.input[1]].astype(np.float32); zw = I[wdq.input[2]].astype(np.int64)
    sb = I[bdq.input[1]].astype(np.float32); Bq = I[bdq.input[0]].astype(np.int32)
    sy, zy = np.float32(I[q.input[1]]), int(I[q.input[2]])
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in c.attribute}
    g = attrs.get('group', 1); pads = attrs.get('pads', [0, 0, 0, 0]); st = attrs.get('strides', [1, 1])
    xin = outs[0][xdq.input[0]]
    xdt = str(xin.dtype); ydt = str(I[q.input[2]].dtype)
    x = relay.var('x', shape=xin.shape, dtype=xdt)
    d = relay.qnn.op.dequantize(x, relay.const(sx), relay.const(zx))
    wd = relay.qnn.op.dequantize(relay.const(W), relay.const(sw), relay.const(zw.astype('int32')), axis=0)
    bd = relay.qnn.op.dequantize(relay.const(Bq), relay.const(sb), relay.const(np.zeros(len(sb), 'int32')), axis=0)
    y = relay.nn.conv2d(d, wd, strides=st, padding=pads, groups=g, channels=W.shape[0], kernel_size=W.shape[2:])
    y = relay.nn.bias_add(y, bd)
    out = relay.qnn.op.quantize(y, relay.const(sy), relay.const(zy), out_dtype=ydt)
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], out)))
    from tvm_ext.target import host_target
    tgt = str(host_target()) + (" -fast-math-contract" if CONTRACT else "")
    dis = ["FoldScaleAxis", "ForwardFoldScaleAxis", "BackwardFoldScaleAxis"] if NO_FSA else []
    lib = tvm_ext.build(mod, target=tgt, passes=pipelines.onnxruntime_numerics(), disabled_pass=dis)
    mis = 0; el = 0
    for o in outs:
        got = run_module(lib, {'x': o[xdq.input[0]]})[0]
        mis += int((got != o[q.output[0]]).sum()); el += got.size
    print(f'{c.name:8s} group {g:3d} W {tuple(W.shape)} TVM float conv vs ORT float path: {mis} of {el} levels differ', flush=True)
