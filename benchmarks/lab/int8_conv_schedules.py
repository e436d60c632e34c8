#!/usr/bin/env python
"""Per-ISA measurement behind tvm_ext.x86.int8_policy.policy: TVM's int8 conv schedule vs per-row vs per-tile.

For each instruction-set class this host can execute (AVX2 as -mcpu=x86-64-v3, AVX-512
without VNNI as x86-64-v4, AVX-512 VNNI as x86-64-v4 + avx512vnni: vendor-neutral CPU levels),
builds ResNet-50's int8 convolutions (uint8 x int8 -> int32, requantize epilogue, as the int8
pipeline compiles them) with TVM's own schedules, with the per-row schedule (3x3/7x7 only) and
with the per-tile schedules (3x3/7x7 and 1x1) of
tvm_ext.x86.int8_conv, checks that the three give the same outputs, and prints the median time of
each (timed in alternation; one thread unless TVM_NUM_THREADS says otherwise). For 1x1 convs the
per-row column compiles TVM's 1x1 schedule again: its ratio shows the noise.

    python benchmarks/lab/int8_conv_schedules.py [--repeat 20] [--isa avx2,avx512,avx512_vnni]
"""
import argparse
import os
import sys

os.environ.setdefault("TVM_NUM_THREADS", "1")
os.environ.setdefault("TOPHUB_LOCATION", "NONE")

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relay  # noqa: E402
from tvm.contrib import graph_executor  # noqa: E402

from tvm_ext.x86 import int8_conv as x86_int8  # noqa: E402
from tvm_ext.x86.isa import runs_on_host  # noqa: E402

TARGETS = {
    "avx2": "llvm -mcpu=x86-64-v3",
    "avx512": "llvm -mcpu=x86-64-v4",
    "avx512_vnni": "llvm -mcpu=x86-64-v4 -mattr=+avx512vnni",
}
# (in channels, out channels, size, kernel, stride): ResNet-50's 3x3 convs, and 1x1s as a control
SHAPES = [
    (64, 64, 56, 3, 1), (128, 128, 28, 3, 1), (256, 256, 14, 3, 1), (512, 512, 7, 3, 1),
    (128, 128, 56, 3, 2), (256, 256, 28, 3, 2), (512, 512, 14, 3, 2), (4, 64, 224, 7, 2),
    (64, 256, 56, 1, 1), (256, 64, 56, 1, 1), (512, 128, 28, 1, 1), (1024, 256, 14, 1, 1),
]
# kernels(schedule=...): TVM's 3x3/7x7 schedule, epilogue_per_row, per_tile_accumulators
SCHEDULES = (False, "per_row", "per_tile")


def conv_epilogue(cin, cout, size, k, stride, seed=0):
    rng = np.random.default_rng(seed)
    x = relay.var("x", shape=(1, cin, size, size), dtype="uint8")
    w = relay.const(rng.integers(-128, 128, (cout, cin, k, k)).astype("int8"))
    y = relay.nn.conv2d(x, w, strides=stride, padding=k // 2, channels=cout, kernel_size=k, out_dtype="int32")
    y = relay.add(y, relay.const(rng.integers(-1000, 1000, (cout, 1, 1)).astype("int32")))
    y = relay.cast(y, "float32") * relay.const((rng.random((cout, 1, 1)) * 1e-3).astype("float32"))
    y = relay.cast(relay.clip(relay.cast(relay.floor(y + relay.const(0.5)), "int32"), 0, 255), "uint8")
    return tvm.IRModule.from_expr(relay.Function([x], y))


def _timer(mod, target, schedule):
    with x86_int8.kernels(schedule=schedule), tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target)
    m = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    shape = [int(d) for d in mod["main"].params[0].type_annotation.shape]
    m.set_input("x", np.random.default_rng(1).integers(0, 256, shape).astype("uint8"))
    m.run()
    return m.module.time_evaluator("run", tvm.cpu(), number=5, repeat=1, min_repeat_ms=20), m.get_output(0).numpy()


def time_ms(mod, target, repeat):
    """Median ms of each of SCHEDULES, timed in alternation (other load hits all of them)."""
    built = [_timer(mod, target, sch) for sch in SCHEDULES]
    if any(not np.array_equal(built[0][1], out) for _, out in built[1:]):
        raise AssertionError(f"schedules disagree on {target}: the per-row / per-tile schedules must be bit-identical")
    times = [[] for _ in built]
    for _ in range(repeat):
        for i, (timer, _) in enumerate(built):
            times[i].append(timer().mean)
    return [float(np.median(t)) * 1e3 for t in times]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--isa", default=",".join(TARGETS))
    args = ap.parse_args(argv)
    print(f"threads: {os.environ['TVM_NUM_THREADS']}; times: median ms of {args.repeat} alternating rounds; "
          "1x1 convs: the per-row column is TVM's 1x1 schedule again (the noise)")
    print("| isa | conv (cin->cout, size, k, stride) | TVM schedule ms | per-row ms | per-tile ms "
          "| per-row / TVM | per-tile / TVM |")
    print("|---|---|---|---|---|---|---|")
    for isa in args.isa.split(","):
        target = TARGETS[isa]
        if not runs_on_host(target):
            print(f"| {isa} | skipped: the host cannot execute '{target}' | | | | | |")
            continue
        tot = [0.0] * len(SCHEDULES)
        tot1 = [0.0] * len(SCHEDULES)
        for shape in SHAPES:
            mod = conv_epilogue(*shape)
            t = time_ms(mod, target, args.repeat)
            if shape[3] != 1:
                tot = [a + b for a, b in zip(tot, t)]
            else:
                tot1 = [a + b for a, b in zip(tot1, t)]
            print(f"| {isa} | {shape[0]}->{shape[1]}, {shape[2]}x{shape[2]}, {shape[3]}x{shape[3]}, s{shape[4]} "
                  f"| {t[0]:.3f} | {t[1]:.3f} | {t[2]:.3f} | {t[1] / t[0]:.2f} | {t[2] / t[0]:.2f} |", flush=True)
        print(f"| {isa} | **sum of 3x3 and 7x7** | {tot[0]:.3f} | {tot[1]:.3f} | {tot[2]:.3f} "
              f"| {tot[1] / tot[0]:.2f} | {tot[2] / tot[0]:.2f} |", flush=True)
        print(f"| {isa} | **sum of 1x1** | {tot1[0]:.3f} | {tot1[1]:.3f} | {tot1[2]:.3f} "
              f"| {tot1[1] / tot1[0]:.2f} | {tot1[2] / tot1[0]:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
