#!/usr/bin/env python
"""Where tvm-ext's int8 conv kernels spend their time on this host, measured: perf's samples per kernel,
on the dot-product instructions or elsewhere in the kernel (epilogue, outer loops, packing).

``benchmarks/kernel_mca.py --calibrate`` splits a kernel's time with llvm-mca's prediction for its hot
loop; this script measures the same split. It runs a ``benchmarks/layers_vs_peers.py`` build of
tvm-ext (``--build-dir``) in a loop under ``perf record -e cpu-clock`` (a software clock: it works in a
virtual machine without hardware counters, and samples only while the process runs, so other
processes' time slices do not count), maps each sample to its kernel with the library's symbols
(``nm``) and to its instruction (``objdump``), and counts a sample as *dot* when it lands on a
``vpdpbusd``, on a zmm load or broadcast that feeds one, or right after a ``vpdpbusd`` (the sampled
address is often the next instruction). Each kernel's time (``--layers``: the ``--out`` JSON of the
run that built the folder) is split in that proportion. That time is of a warm kernel (the debug
executor runs it once untimed first); at one thread the table adds each kernel *in sequence*: its
share of the library's samples times one run's CPU time (the fastest group of 3 runs, without perf).
With more threads, samples taken while a thread waits at a barrier count as the kernel's.

    python benchmarks/lab/kernel_profile.py --build-dir BUILD --layers layers.json [--seconds 40] [--threads 1]

Needs ``perf`` and ``objdump`` (binutils) on the PATH, and x86 code the host runs.
"""
import argparse
import bisect
import collections
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_LOOP = """
import sys, time, tvm
from pathlib import Path
from tvm.contrib import graph_executor
f, secs = sys.argv[1], float(sys.argv[2])
m = graph_executor.create(Path(f + "/tvm-ext.json").read_text(), tvm.runtime.load_module(f + "/tvm-ext.so"), tvm.cpu())
m.load_params(Path(f + "/tvm-ext.params").read_bytes())
m.run()
t, best = time.time(), float("inf")
while time.time() - t < secs:
    c = time.thread_time()
    for _ in range(3):
        m.run()
    best = min(best, (time.thread_time() - c) / 3 * 1e3)
print(best)
"""
#: Loads that feed a dot product: the kernel vectors and the broadcast data words of a register tile.
_FEEDS = ("vpbroadcastd", "vmovdqa64", "vmovdqu64", "vmovdqu8", "vmovups", "vmovaps")


def _symbols(so):
    """Sorted (address, name) of the library's functions."""
    out = subprocess.run(["nm", "-n", "--defined-only", so], capture_output=True, text=True, check=True).stdout
    return [(int(p[0], 16), p[2]) for p in (line.split() for line in out.splitlines()) if len(p) >= 3 and p[1] in "tT"]


def _instructions(so):
    """{address: instruction text} of the library, and {address: the previous instruction's address}."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", so], capture_output=True, text=True, check=True).stdout
    ins, prev, last = {}, {}, None
    for line in out.splitlines():
        m = re.match(r"^\s+([0-9a-f]+):\s+(.*)$", line)
        if m:
            a = int(m.group(1), 16)
            ins[a], prev[a], last = m.group(2), last, a
    return ins, prev


def is_dot(text: str, previous: str = "") -> bool:
    """A sample at ``text`` (after ``previous``) counts as dot-product work."""
    op = text.split()[0] if text else ""
    if op == "vpdpbusd" or (previous and previous.split()[0] == "vpdpbusd"):
        return True
    return op in _FEEDS and "zmm" in text and "(" in text.split(",")[0]


def profile(build_dir, seconds, threads):
    """``({kernel function: [dot samples, other samples]}, the main thread's CPU ms per run)`` from
    ``perf record`` of the build run in a loop."""
    so = f"{build_dir}/tvm-ext.so"
    data = Path(tempfile.mkdtemp(prefix="tvm_ext_perf_")) / "perf.data"
    env = dict(os.environ, TVM_NUM_THREADS=str(threads))
    run = subprocess.run(["perf", "record", "-q", "-F", "2999", "-e", "cpu-clock", "-o", str(data), sys.executable,
                          "-c", _LOOP, build_dir, str(seconds)], env=env, check=True, capture_output=True, text=True)
    del run  # its CPU time per run includes perf's sampling: timed again without perf below
    plain = subprocess.run([sys.executable, "-c", _LOOP, build_dir, str(min(seconds, 10.0))], env=env, check=True,
                           capture_output=True, text=True)
    per_run_ms = float(plain.stdout.strip().splitlines()[-1])
    report = subprocess.run(["perf", "report", "-i", str(data), "--sort", "dso,symbol", "--stdio", "-q"],
                            capture_output=True, text=True, check=True).stdout
    syms = _symbols(so)
    starts = [a for a, _ in syms]
    ins, prev = _instructions(so)
    per = collections.defaultdict(lambda: [0.0, 0.0])
    for line in report.splitlines():
        p = line.split()
        if len(p) < 4 or not p[1].endswith("tvm-ext.so") or not p[3].startswith("0x"):
            continue
        a = int(p[3], 16)
        i = bisect.bisect_right(starts, a) - 1
        if i < 0:
            continue
        # a kernel's parallel bodies have no symbol of their own: they follow its ``_compute_`` function
        name = re.sub(r"_compute_$", "", syms[i][1])
        per[name][0 if is_dot(ins.get(a, ""), ins.get(prev.get(a), "")) else 1] += float(p[0].rstrip("%"))
    return per, per_run_ms


def _lvp():
    spec = importlib.util.spec_from_file_location("layers_vs_peers", Path(__file__).parents[1] / "layers_vs_peers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def table(rows, per, peak=None, run_ms=None):
    """Markdown rows per conv geometry: layers, GMAC, ms, GMAC/s (and % of ``peak``), dot ms, rest ms;
    with ``run_ms`` (one run's CPU time, one thread) also each geometry's time in sequence: its share
    of the library's samples times ``run_ms`` (the debug executor's ``ms`` is of a warm kernel)."""
    geometry = _lvp()._geometry_tvm
    agg = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
    other = [0.0, 0.0]
    total = sum(sum(v) for v in per.values()) or 1.0
    for r in rows:
        w = next((s for s in r["ins"] if len(s) == 7), None)
        seq = sum(per.get(r["name"], (0.0, 0.0))) / total * (run_ms or 0.0)
        if "conv2d" not in r["name"] or w is None:
            other[0] += r["ms"]
            other[1] += seq
            continue
        o = r["out"]
        macs = o[1] * o[4] * o[2] * o[3] * w[1] * w[4] * w[6] * w[2] * w[3]
        dot, rest = per.get(r["name"], (0.0, 0.0))
        a = agg[geometry(r)]
        a[0] += 1
        a[1] += macs / 1e9
        a[2] += r["ms"]
        a[3] += r["ms"] * (dot / (dot + rest) if dot + rest else 0.0)
        a[4] += seq
    head = ["conv (out, kh, kw, oh, ow)", "n", "GMAC", "ms", "GMAC/s"] + (["% of peak"] if peak else []) + [
        "on dot instructions ms", "rest of the kernel ms"] + (["in sequence ms"] if run_ms else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    tot = [0, 0.0, 0.0, 0.0, 0.0]
    for g, a in sorted(agg.items(), key=lambda kv: -kv[1][2]):
        rate = a[1] / a[2] * 1e3
        lines.append("| " + " | ".join([str(g), str(a[0]), f"{a[1]:.3f}", f"{a[2]:.3f}", f"{rate:.0f}"]
                                       + ([f"{rate / peak * 100:.0f}%"] if peak else [])
                                       + [f"{a[3]:.3f}", f"{a[2] - a[3]:.3f}"]
                                       + ([f"{a[4]:.3f}"] if run_ms else [])) + " |")
        tot = [t + v for t, v in zip(tot, a)]
    rate = tot[1] / tot[2] * 1e3 if tot[2] else 0.0
    lines.append("| " + " | ".join(["all convs", str(tot[0]), f"{tot[1]:.3f}", f"{tot[2]:.3f}", f"{rate:.0f}"]
                                   + ([f"{rate / peak * 100:.0f}%"] if peak else [])
                                   + [f"{tot[3]:.3f}", f"{tot[2] - tot[3]:.3f}"]
                                   + ([f"{tot[4]:.3f}"] if run_ms else [])) + " |")
    lines.append(f"\nother kernels: {other[0]:.3f} ms" + (f" ({other[1]:.3f} in sequence)" if run_ms else ""))
    if run_ms:
        lines.append(f"one run (the main thread's CPU time, fastest group of 3 runs, without perf): {run_ms:.2f} ms")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", required=True, help="a layers_vs_peers.py build folder (tvm-ext.so/json/params)")
    ap.add_argument("--layers", required=True, help="the layers_vs_peers.py --out JSON timed from that folder")
    ap.add_argument("--seconds", type=float, default=40.0, help="how long the model runs under perf")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--peak", type=float, default=None, metavar="GMACS",
                    help="the host's dot-product peak per core x threads, GMAC/s (benchmarks/lab/int8_peak.py)")
    a = ap.parse_args(argv)
    for tool in ("perf", "objdump", "nm"):
        if shutil.which(tool) is None:
            sys.exit(f"kernel_profile: {tool} is not on the PATH (perf: linux-tools; objdump, nm: binutils)")
    if not Path(f"{a.build_dir}/tvm-ext.so").exists():
        sys.exit(f"kernel_profile: no tvm-ext.so in {a.build_dir} (layers_vs_peers.py names its build folder)")
    rows = json.loads(Path(a.layers).read_text())["tvm"]["tvm-ext"]
    per, run_ms = profile(a.build_dir, a.seconds, a.threads)
    print(table(rows, per, a.peak, run_ms if a.threads == 1 else None))


if __name__ == "__main__":
    main()
