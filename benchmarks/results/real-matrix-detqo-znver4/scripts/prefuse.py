"""Dump the module tvm-ext hands to relay.build (start + prefix + before_fuse), no codegen.
usage: prefuse.py MODEL.onnx {tvm|onnxruntime|stock} OUT.txt [target]"""
import sys, logging, contextlib, onnx, tvm
from tvm import relay
import importlib; B = importlib.import_module("tvm_ext.build")
from tvm_ext import pipelines, x86_int8, tuning
from tvm_ext.frontend import from_onnx
from tvm_ext.target import build_target
logging.basicConfig(level=logging.WARNING)
for n in ("WidenInEachReader", "NarrowKernelBoundaries", "FuseWideningIntoPool", "QDQToInteger", "QOperatorToInteger"):
    logging.getLogger("tvm_ext.passes." + n).setLevel(logging.DEBUG)
path, num, out = sys.argv[1:4]
target = sys.argv[4] if len(sys.argv) > 4 else "llvm -mcpu=znver4"
m = onnx.load(path)
shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
mod, params = from_onnx(m, shape={m.graph.input[0].name: shape})
tgt = build_target(target, None)
tgt = tvm.target.Target(tgt, host=tgt)
mod = B._bind_params(B.copy_module(mod), params)
if num == "stock":
    p = None
else:
    p = pipelines.int8(numerics=num)
rq = contextlib.nullcontext()
if p is not None and p.requantize:
    from tvm.relay.qnn.op import requantize_config
    rq = requantize_config(**dict(p.requantize))
with x86_int8.kernels(int8_graph=True), tuning.apply(tgt), rq:
    if p is not None:
        mod = B._run_user_passes(mod, p["start"], tgt, 3, {}, [], [])
    mod, _ = B._run_prefix(mod, tgt, 3, {}, [], [])
    if p is not None:
        mod = B._run_user_passes(mod, p["before_fuse"], tgt, 3, {}, [], [])
    with tgt, tvm.transform.PassContext(opt_level=3):
        fused = relay.transform.FuseOps(fuse_opt_level=2)(relay.transform.InferType()(mod))
open(out, "w").write(mod.astext(show_meta_data=False))
open(out + ".fused", "w").write(fused.astext(show_meta_data=False))
print("wrote", out)
