"""Build one real zoo variant with pipelines.int8(numerics=...), timing every pass (instrument) to a log."""
import logging, sys, time
import tvm
from tvm.ir.instrument import pass_instrument

key, numerics, logpath = sys.argv[1], sys.argv[2], sys.argv[3]
f = open(logpath, "w", buffering=1)

@pass_instrument
class Timer:
    def __init__(self):
        self.stack = []
    def run_before_pass(self, mod, info):
        self.stack.append((info.name, time.perf_counter()))
    def run_after_pass(self, mod, info):
        name, t0 = self.stack.pop()
        dt = time.perf_counter() - t0
        if dt > 0.5:
            f.write(f"{time.strftime('%H:%M:%S')} depth={len(self.stack)} {name} {dt:.2f}s\n")

logging.basicConfig(level=logging.INFO, stream=f, format="%(asctime)s %(name)s %(message)s")
from tvm_ext import bench, pipelines
from tvm_ext.build import build
from tvm_ext.target import build_target
v = bench._load_variant(key, False, None)
t0 = time.perf_counter()
fac = build(v["mod"], target=build_target(None), params=v["params"], passes=pipelines.int8(numerics=numerics),
            tuned=True, instruments=[Timer()])
f.write(f"TOTAL build {time.perf_counter() - t0:.1f}s kernels {fac.kernel_report.num_kernels}\n")
