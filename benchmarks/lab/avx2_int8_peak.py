#!/usr/bin/env python
"""The machine's ceiling for AVX2 int8 convolutions: multiply-accumulates per second per core.

Every AVX2 int8 convolution here (stock TVM's, tvm-ext's, ONNX Runtime's MLAS) multiplies uint8
by int8 with the same three instructions per 32 products:

    vpmaddubsw  (u8 x s8 pairs -> saturated int16)
    vpmaddwd    (int16 pairs x 1 -> int32)
    vpaddd      (accumulate)

Two of the three run on the multiply pipes, so that sequence has a fixed peak per core and clock.
This script compiles a micro-kernel with ``gcc -O2 -mavx2`` (12 independent accumulators, as a
register tile has; once with register operands only, once with a vector load and four broadcast
loads per 12 products, as a GEMM micro-kernel has), runs it on each core alone and on all cores
at once (``taskset``), and prints GMAC/s. Given a model's multiply-accumulates (``--gmac``; int8
ResNet-50 at 224x224: 4.089) it prints the lowest latency any kernel using that sequence can
reach: the model's MACs at the best rate measured (either form), with nothing else taking time.

    python benchmarks/lab/avx2_int8_peak.py [--gmac 4.089] [--iters 100000000] [--rounds 3]

Needs gcc and an AVX2 CPU (it says so and exits otherwise). The code runs in a child process.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
/* acc += vpmaddwd(vpmaddubsw(x, y), ones): 32 u8 x s8 products into 8 int32 lanes */
#define M(c, x, y) c = _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), ones));
#define TILE(a0, a1, a2, a3, b0, b1, b2) \
  M(c0, a0, b0) M(c1, a0, b1) M(c2, a0, b2) M(c3, a1, b0) M(c4, a1, b1) M(c5, a1, b2) \
  M(c6, a2, b0) M(c7, a2, b1) M(c8, a2, b2) M(c9, a3, b0) M(c10, a3, b1) M(c11, a3, b2)
#define SUM() _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)), \
  _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c4, c5), _mm256_add_epi32(c6, c7)), \
  _mm256_add_epi32(_mm256_add_epi32(c8, c9), _mm256_add_epi32(c10, c11))))
__attribute__((noinline)) static __m256i registers(long n, __m256i a, __m256i b) {
  __m256i ones = _mm256_set1_epi16(1);
  __m256i c0 = a, c1 = b, c2 = a, c3 = b, c4 = a, c5 = b, c6 = a, c7 = b, c8 = a, c9 = b, c10 = a, c11 = b;
  __m256i b0 = b, b1 = _mm256_add_epi8(b, a), b2 = _mm256_sub_epi8(b, a);
  __m256i a0 = a, a1 = _mm256_add_epi8(a, ones), a2 = _mm256_sub_epi8(a, ones), a3 = _mm256_xor_si256(a, b);
  for (long i = 0; i < n; i++) {
    /* opaque operands: the products cannot be hoisted out of the loop */
    __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(b0), "+x"(b1), "+x"(b2));
    TILE(a0, a1, a2, a3, b0, b1, b2)
  }
  return SUM();
}
__attribute__((noinline)) static __m256i loads(long n, const int8_t *w, const uint8_t *x) {
  __m256i ones = _mm256_set1_epi16(1);
  __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0, c8 = c0,
          c9 = c0, c10 = c0, c11 = c0;
  for (long i = 0; i < n; i++) {
    long o = i & 63; /* 6 KB of weights, 1 KB of activations: L1-resident */
    __m256i b0 = _mm256_loadu_si256((const __m256i *)(w + o * 96));
    __m256i b1 = _mm256_loadu_si256((const __m256i *)(w + o * 96 + 32));
    __m256i b2 = _mm256_loadu_si256((const __m256i *)(w + o * 96 + 64));
    __m256i a0 = _mm256_set1_epi32(*(const int *)(x + o * 16)), a1 = _mm256_set1_epi32(*(const int *)(x + o * 16 + 4));
    __m256i a2 = _mm256_set1_epi32(*(const int *)(x + o * 16 + 8)),
            a3 = _mm256_set1_epi32(*(const int *)(x + o * 16 + 12));
    TILE(a0, a1, a2, a3, b0, b1, b2)
  }
  return SUM();
}
int main(int argc, char **argv) {
  long n = atol(argv[1]);
  int rounds = atoi(argv[2]);
  static int8_t w[64 * 96 + 64];
  static uint8_t x[64 * 16 + 64];
  for (int i = 0; i < (int)sizeof w; i++) w[i] = (int8_t)(i * 7);
  for (int i = 0; i < (int)sizeof x; i++) x[i] = (uint8_t)(i * 13);
  volatile int sink;
  double macs = (double)n * 12 * 32;
  for (int r = 0; r < rounds; r++) {
    double t = now();
    __m256i s = registers(n, _mm256_set1_epi8(3), _mm256_set1_epi8(5));
    t = now() - t;
    sink = _mm256_extract_epi32(s, 0);
    printf("registers %.3f\n", macs / t * 1e-9);
    t = now();
    s = loads(n, w, x);
    t = now() - t;
    sink = _mm256_extract_epi32(s, 0);
    printf("loads %.3f\n", macs / t * 1e-9);
  }
  (void)sink;
  return 0;
}
"""


def _cpus():
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def _has_avx2() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return " avx2" in f.read()
    except OSError:
        return False


def _parse(out: str) -> dict:
    rates = {"registers": [], "loads": []}
    for kind, val in re.findall(r"^(registers|loads) ([0-9.]+)$", out, re.M):
        rates[kind].append(float(val))
    return rates


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gmac", type=float, default=4.089,
                    help="the model's multiply-accumulates, in 1e9 (default: int8 ResNet-50, 4.089)")
    ap.add_argument("--iters", type=int, default=100_000_000, help="loop iterations per measurement")
    ap.add_argument("--rounds", type=int, default=3, help="measurements per core (the best is kept)")
    args = ap.parse_args(argv)
    if not _has_avx2():
        sys.exit("avx2_int8_peak: this CPU has no AVX2")
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        sys.exit("avx2_int8_peak: needs gcc (or cc) to compile the micro-kernel")
    taskset = shutil.which("taskset")
    with tempfile.TemporaryDirectory(prefix="avx2_peak_") as tmp:
        src, exe = os.path.join(tmp, "peak.c"), os.path.join(tmp, "peak")
        with open(src, "w") as f:
            f.write(SOURCE)
        subprocess.run([gcc, "-O2", "-mavx2", src, "-o", exe], check=True)
        cmd = [exe, str(args.iters), str(args.rounds)]

        def pinned(cpu):
            return ([taskset, "-c", str(cpu)] if taskset else []) + cmd

        rows = []
        for cpu in _cpus():
            out = subprocess.run(pinned(cpu), capture_output=True, text=True, check=True).stdout
            rows.append((f"core {cpu} alone", [_parse(out)]))
        procs = [subprocess.Popen(pinned(c), stdout=subprocess.PIPE, text=True) for c in _cpus()]
        rows.append((f"all {len(procs)} cores at once (per core)", [_parse(p.communicate()[0]) for p in procs]))
    print(f"| run | registers only, GMAC/s per core | with loads, GMAC/s per core | {args.gmac:g} GMAC at the "
          f"best rate: 1 core / all cores |")
    print("|---|---|---|---|")
    for label, parsed in rows:
        reg = [max(p["registers"]) for p in parsed]
        ld = [max(p["loads"]) for p in parsed]
        best = [max(r, v) for r, v in zip(reg, ld)]
        print(f"| {label} | {' / '.join(f'{r:.1f}' for r in reg)} | {' / '.join(f'{v:.1f}' for v in ld)} | "
              f"{args.gmac / best[0] * 1e3:.1f} ms / {args.gmac / sum(best) * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()
