"""uint8 x int8 dense on AMX tiles against the same dense on AVX-512 VNNI, on a host with AMX.

Each shape is built twice with ``tvm_ext.build`` at the host target (the default): with ``amx=True`` (TVM's AMX dense
schedule, ``tdpbusd`` tiles configured by ``tvm_ext.x86.amx.ConfigureTiles``) and without (the VNNI
dense). Both outputs must equal numpy's int64 product before anything is timed. The two libraries are
then timed in alternation (``--rounds`` rounds of ``--number`` runs each, the order swapped every
round), and the table gives the median per run, the int8 multiply-adds per second and the ratio.

Usage (the machine quiet; TVM's threads from TVM_NUM_THREADS, default all cores)::

    python benchmarks/lab/amx_dense.py [--shapes 128x768x768,...] [--rounds 15] [--number 20]

A host without AMX, or whose kernel does not grant the tile state, exits with the reason.
The results are in docs/x86-kernels.md ("AMX int8 tiles").
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

# M x K x N: square products, a BERT-large-like layer at 128 tokens (1024 wide, 4096 inner), and
# ResNet-50's classifier at batch 64 (1000 outputs padded to 1024). Shapes that TVM's untuned AMX schedule
# does not cover (tvm_ext.x86.amx.tile_schedules: M and N multiples of 32, K of 128, its splits exact)
# take the VNNI dense with amx=True too; their row says so.
DEFAULT_SHAPES = "256x256x256,512x512x512,1024x1024x1024,128x1024x4096,128x4096x1024,64x2048x1024"


def _parse(shapes: str) -> list[tuple[int, int, int]]:
    out = []
    for item in shapes.split(","):
        try:
            m, k, n = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise SystemExit(f"amx_dense: shape {item!r} is not MxKxN") from None
        out.append((m, k, n))
    return out


def _dense(m, k, n, rng):
    import tvm
    from tvm import relay

    x = relay.var("x", shape=(m, k), dtype="uint8")
    w = rng.integers(-128, 128, (n, k)).astype("int8")
    y = relay.nn.dense(x, relay.const(w), out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([x], y)), w


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated MxKxN (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=15, help="alternating rounds (default 15)")
    ap.add_argument("--number", type=int, default=20, help="runs per library per round (default 20)")
    args = ap.parse_args(argv)

    import numpy as np
    import tvm
    from tvm.contrib import graph_executor

    import tvm_ext
    from tvm_ext.x86 import amx

    if not amx.host_has_amx():
        print("amx_dense: this host has no AMX (CPUID)", file=sys.stderr)
        return 2
    granted, reason = amx.request_tile_state()
    if not granted:
        print(f"amx_dense: the host has AMX but no tile state: {reason}", file=sys.stderr)
        return 2

    rng = np.random.default_rng(0)
    import os

    print(f"host target: {tvm_ext.host_target()} (AMX kept with amx=True); "
          f"TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS', '(all cores)')}")
    rows, skipped = [], []
    for m, k, n in _parse(args.shapes):
        mod, w = _dense(m, k, n, rng)
        data = rng.integers(0, 256, (m, k)).astype("uint8")
        ref = data.astype("int64") @ w.astype("int64").T
        runners = {}
        for name, use_amx in (("amx", True), ("vnni", False)):
            print(f"  {m}x{k}x{n}: building {name}", file=sys.stderr)
            lib = tvm_ext.build(mod, amx=use_amx)  # the host target
            has_tiles = "tdpbusd" in lib.get_lib().get_source("asm")
            if has_tiles and not use_amx:
                raise SystemExit(f"amx_dense: {m}x{k}x{n}: tile code without amx=True")
            if use_amx and not has_tiles:
                print(f"  {m}x{k}x{n}: no tile code with amx=True (the shape does not fit TVM's AMX "
                      "schedule); not timed", file=sys.stderr)
                skipped.append((m, k, n))
                break
            g = graph_executor.GraphModule(lib["default"](tvm.cpu()))
            g.set_input("x", data)
            g.run()
            if not np.array_equal(g.get_output(0).numpy(), ref):
                raise SystemExit(f"amx_dense: {m}x{k}x{n} {name} build differs from numpy")
            runners[name] = g
        if len(runners) < 2:
            continue
        times = {name: [] for name in runners}
        for r in range(args.rounds):
            for name in (("amx", "vnni") if r % 2 == 0 else ("vnni", "amx")):
                g = runners[name]
                g.run()  # untimed: the other library ran last
                t0 = time.perf_counter()
                for _ in range(args.number):
                    g.run()
                times[name].append((time.perf_counter() - t0) / args.number)
        med = {name: statistics.median(v) for name, v in times.items()}
        rows.append((m, k, n, med["amx"], med["vnni"]))

    print()
    print("| M x K x N | AMX us | AMX GMAC/s | VNNI us | VNNI GMAC/s | VNNI / AMX |")
    print("|---|---|---|---|---|---|")
    for m, k, n, ta, tv in rows:
        macs = m * k * n
        print(f"| {m} x {k} x {n} | {ta * 1e6:.1f} | {macs / ta / 1e9:.0f} | {tv * 1e6:.1f} | "
              f"{macs / tv / 1e9:.0f} | {tv / ta:.2f}x |")
    for m, k, n in skipped:
        print(f"| {m} x {k} x {n} | not AMX: TVM's AMX schedule does not cover the shape | | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
