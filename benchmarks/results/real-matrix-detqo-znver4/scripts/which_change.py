"""For each model: does this branch's before_fuse stage (WidenInEachReader sweeping to a fixed point,
DequantizeInConvTranspose) change the module tvm_ext.build hands to relay.build, against the
previous behaviour (one WidenInEachReader sweep, no DequantizeInConvTranspose)? Both pipelines.
Start stage and prefix run once per model and pipeline (neither change touches them)."""
import importlib, logging, sys, time, tvm
from tvm import relay
import tvm_ext, tvm_ext.zoo
from tvm_ext import pipelines, x86_int8, tuning
from tvm_ext.target import build_target
B = importlib.import_module("tvm_ext.build")
W = importlib.import_module("tvm_ext.passes.widen_in_each_reader")
logging.basicConfig(level=logging.WARNING)
target = sys.argv[1]
names = sys.argv[2].split(",")
nums = sys.argv[3].split(",") if len(sys.argv) > 3 else ["tvm", "onnxruntime"]
tgt = build_target(target, None); tgt = tvm.target.Target(tgt, host=tgt)
new_run = W._run
for name in names:
    m = tvm_ext.zoo.load(name)
    for num in nums:
        t0 = time.time()
        p = pipelines.int8(numerics=num)
        import contextlib
        rq = contextlib.nullcontext()
        if p.requantize:
            from tvm.relay.qnn.op import requantize_config
            rq = requantize_config(**dict(p.requantize))
        with x86_int8.kernels(int8_graph=True), tuning.apply(tgt), rq:
            mod = B._bind_params(B.copy_module(m.mod), m.params)
            mod = B._run_user_passes(mod, p["start"], tgt, 3, {}, [], [])
            mod, _ = B._run_prefix(mod, tgt, 3, {}, [], [])
            a = B._run_user_passes(mod, pipelines.int8(numerics=num)["before_fuse"], tgt, 3, {}, [], [])
            W._run = W._sweep
            try:
                b = B._run_user_passes(mod, pipelines.int8(numerics=num)["before_fuse"], tgt, 3, {},
                                       ["DequantizeInConvTranspose"], [])
            finally:
                W._run = new_run
        print(name, num, "unchanged" if tvm.ir.structural_equal(a, b) else "CHANGED", f"{time.time()-t0:.0f}s", flush=True)
