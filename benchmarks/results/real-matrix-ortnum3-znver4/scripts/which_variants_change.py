"""For every real zoo variant: does QuantizeWeightsAsOnnxRuntime change the start stage of int8(numerics="onnxruntime")?"""
import glob, logging, sys, onnx, tvm
from tvm import relay
from tvm_ext import pipelines
from tvm_ext.frontend import from_onnx
logging.basicConfig(level=logging.WARNING)
logging.getLogger("tvm_ext.passes.QuantizeWeightsAsOnnxRuntime").setLevel(logging.INFO)
for p in sorted(glob.glob(__import__('os').path.expanduser('~/.cache/tvm_ext/zoo/real/*_int8_*.onnx'))):
    m = onnx.load(p)
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    mod, params = from_onnx(m, shape={m.graph.input[0].name: shape})
    mod = relay.transform.InferType()(mod)
    start = pipelines.int8(numerics="onnxruntime").start
    with tvm.transform.PassContext(opt_level=3):
        a = start(mod)
    with tvm.transform.PassContext(opt_level=3, disabled_pass=["QuantizeWeightsAsOnnxRuntime"]):
        b = start(mod)
    print(p.split('/')[-1], 'changed' if not tvm.ir.structural_equal(a, b) else 'unchanged', flush=True)
