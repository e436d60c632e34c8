#!/usr/bin/env python
"""PP-OCR cls v2's depthwise convs alone on aarch64 CPU models in llvm-mca: tvm_ext.arm.depthwise_dot's
dot over 4 taps against TVM's depthwise compute (the policy's ``depthwise_dot`` off), compile only.

Each conv of :data:`SHAPES` (the shapes of benchmarks/lab/depthwise_tap_groups.py) is built as
``layout_transform -> contrib_depthwise_conv2d_nchwc (int8 x int8) -> a shift-and-clip requantize ->
layout_transform``, in the channel block of the class (NCHW8c at +i8mm, NCHW4c at +dotprod), and its
hot loop analysed as ``benchmarks/kernel_mca.py`` does (a 4-tap dot credited with the taps that carry a
weight). ``--model`` instead runs kernel_mca's whole-model analysis of PP-OCR cls v2 with both forms.

    python benchmarks/lab/arm_depthwise_dot.py --cpu neoverse-n1 --cpu neoverse-v2 [--model [--json PREFIX]]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

os.environ.setdefault("TOPHUB_LOCATION", "NONE")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

#: PP-OCR cls v2's depthwise convs: (channels, input height, width, k, strides)
SHAPES = [(8, 24, 96, 3, (2, 1)), (24, 12, 96, 3, (2, 1)), (32, 6, 96, 3, (1, 1)), (32, 6, 96, 5, (2, 1)),
          (88, 3, 96, 5, (1, 1)), (40, 3, 96, 5, (1, 1)), (48, 3, 96, 5, (1, 1)), (104, 3, 96, 5, (2, 1)),
          (200, 2, 96, 5, (1, 1))]


def _policy(on: bool):
    """Switch the aarch64 policy's ``depthwise_dot`` for this process."""
    from tvm_ext.arm import int8_policy

    for cls, p in list(int8_policy._BY_CLASS.items()):  # pylint: disable=protected-access
        int8_policy._BY_CLASS[cls] = dataclasses.replace(p, depthwise_dot=on and cls != "aarch64_neon")


def _conv(c, h, w, k, strides, block):
    import tvm
    from tvm import relay

    x = relay.var("x", shape=(1, c, h, w), dtype="int8")
    wt = np.random.default_rng(c).integers(-128, 128, (c // block, 1, k, k, 1, block)).astype("int8")
    y = relay.layout_transform(x, "NCHW", f"NCHW{block}c")
    y = relay.nn.contrib_depthwise_conv2d_nchwc(
        y, relay.const(wt), strides=strides, padding=(k // 2, k // 2), channels=c, groups=c, kernel_size=(k, k),
        data_layout=f"NCHW{block}c", kernel_layout=f"OIHW1i{block}o", out_layout=f"NCHW{block}c", out_dtype="int32")
    y = relay.cast(relay.clip(relay.right_shift(y + relay.const(1000), relay.const(7)), -128, 127), "int8")
    return tvm.IRModule.from_expr(relay.Function([x], relay.layout_transform(y, f"NCHW{block}c", "NCHW")))


def shapes(cpu: str) -> list:
    """Per shape: ``(shape, TVM's KernelEstimate, depthwise_dot's KernelEstimate)``."""
    import tvm

    import tvm_ext
    from tvm_ext.arm.isa import isa_class
    from tvm_ext.tools import mca

    model = mca.cpu_model(cpu)
    block = 8 if isa_class(tvm.target.Target(model.target)) == "aarch64_i8mm" else 4
    rows = []
    for shape in SHAPES:
        found = []
        for on in (False, True):
            _policy(on)
            factory = tvm_ext.build(_conv(*shape, block), target=model.target, kernels=True)
            found.append(next(k for k in mca.analyze_factory(factory, cpu).kernels if k.kind == "depthwise"))
        rows.append((shape, *found))
    _policy(True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="append", required=True)
    ap.add_argument("--model", action="store_true", help="PP-OCR cls v2 whole, kernel_mca's table per form")
    ap.add_argument("--json", default=None, help="with --model: kernel_mca's JSON to <this>.off.json and .on.json")
    args = ap.parse_args(argv)
    if args.model:
        from kernel_mca import main as kernel_mca

        for on in (False, True):
            _policy(on)
            form = "on" if on else "off"
            print(f"## depthwise_dot {form}")
            out = ["--json", f"{args.json}.{form}.json"] if args.json else []
            kernel_mca(["--model", "ppocr_cls_v2_int8_qdq", "--kernels"] + [f"--cpu={c}" for c in args.cpu] + out)
        return 0
    for cpu in args.cpu:
        print(f"\n{cpu}: % of the peak (MACs / cycle; instructions and cycles per iteration)\n")
        print("| depthwise conv (channels, input, k, strides) | TVM | depthwise_dot | dots / iter |")
        print("|---|---|---|---|")
        tot = {0: [0, 0.0], 1: [0, 0.0]}
        for shape, *ks in shapes(cpu):
            cells = []
            for i, k in enumerate(ks):
                if not k.mca:
                    cells.append("no dot loop")
                    continue
                cells.append(f"{100 * k.share:.0f}% ({k.macs_per_cycle:.1f}; {k.hot.instructions}, "
                             f"{k.mca.cycles_per_iteration:.1f})")
                tot[i][0] += k.macs
                tot[i][1] += k.cycles
            print(f"| {shape} | {cells[0]} | {cells[1]} | {ks[1].hot.dots if ks[1].hot else '-'} |")
        peak = ks[0].peak.macs_per_cycle
        share = [tot[i][0] / peak / tot[i][1] if tot[i][1] else 0 for i in (0, 1)]
        print(f"| all (MAC-weighted) | {100 * share[0]:.1f}% | {100 * share[1]:.1f}% | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
