#!/usr/bin/env python
"""The machine's ceiling for x86 int8 convolutions: multiply-accumulates per second per core.

An int8 convolution multiplies uint8 activations by int8 weights with one of three instruction
sequences, each with a fixed peak per core and clock: ``avx2`` (``vpmaddubsw`` + ``vpmaddwd`` +
``vpaddd`` per 32 products: TVM's kernels without VNNI, which saturate), ``avx2_exact`` (``vpmaddwd`` +
``vpaddd`` per 16 products of int16 pairs: tvm-ext's exact path) or ``avx512_vnni`` (one ``vpdpbusd``
per 64 products). This script compiles a micro-kernel for the chosen sequence with ``gcc -O2`` and runs it
on each core alone and on all cores at once (``taskset``), *registers only* and *with loads* (a
convolution's register tile), and prints GMAC/s. Given a model's multiply-accumulates (``--gmac``;
int8 ResNet-50 at 224x224: 4.089) it prints the lowest latency any kernel using that sequence can
reach. The sequences and the two forms in detail: docs/benchmarks.md, "How lab/int8_peak.py
works".

    python benchmarks/lab/int8_peak.py [--isa avx2|avx2_exact|avx512_vnni] [--gmac 4.089] [--iters 100000000] \
        [--rounds 3]

``--isa`` defaults to ``avx512_vnni`` where the host has it, else ``avx2``. It needs gcc and a CPU
with the instruction set (it says so and exits otherwise). The code runs in a child process.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

_AVX2_BODY = r"""
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
/* P(x, y): PRODUCTS products into 8 int32 lanes (defined before this body). Six accumulators, each
   adding two products' sum per step: 6 + 4 + 3 operand registers + temporaries fit AVX2's 16 ymm registers
   (a tile of 12 accumulators spills), and an accumulator's chain is one vpaddd, not a multiply's latency. */
#define M2(c, x0, x1, y) c = _mm256_add_epi32(c, _mm256_add_epi32(P(x0, y), P(x1, y)));
#define TILE(a0, a1, a2, a3, b0, b1, b2) \
  M2(c0, a0, a1, b0) M2(c1, a0, a1, b1) M2(c2, a0, a1, b2) M2(c3, a2, a3, b0) M2(c4, a2, a3, b1) M2(c5, a2, a3, b2)
#define SUM() _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)), \
  _mm256_add_epi32(c4, c5))
__attribute__((noinline)) static __m256i registers(long n, __m256i a, __m256i b) {
  __m256i ones = _mm256_set1_epi16(1);
  __m256i c0 = a, c1 = b, c2 = a, c3 = b, c4 = a, c5 = b;
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
  __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
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
  double macs = (double)n * 12 * PRODUCTS;
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


VNNI_SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
/* acc += vpdpbusd(x, y): 64 u8 x s8 products into 16 int32 lanes. Written as asm: with the intrinsic
   gcc 12 -O2 stores every accumulator to the stack in each iteration of the 24-accumulator loop. */
#define M(c, x, y) __asm__("vpdpbusd %2, %1, %0" : "+v"(c) : "v"(x), "v"(y));
#define TILE12(a0, a1, a2, a3, b0, b1, b2) \
  M(c0, a0, b0) M(c1, a0, b1) M(c2, a0, b2) M(c3, a1, b0) M(c4, a1, b1) M(c5, a1, b2) \
  M(c6, a2, b0) M(c7, a2, b1) M(c8, a2, b2) M(c9, a3, b0) M(c10, a3, b1) M(c11, a3, b2)
#define ROW(r, a) M(c##r##0, a, b0) M(c##r##1, a, b1) M(c##r##2, a, b2) M(c##r##3, a, b3)
#define ADD(x, y) _mm512_add_epi32(x, y)
__attribute__((noinline)) static __m512i registers(long n, __m512i a, __m512i b) {
  __m512i c0 = a, c1 = b, c2 = a, c3 = b, c4 = a, c5 = b, c6 = a, c7 = b, c8 = a, c9 = b, c10 = a, c11 = b;
  __m512i b0 = b, b1 = _mm512_add_epi8(b, a), b2 = _mm512_sub_epi8(b, a);
  __m512i a0 = a, a1 = _mm512_add_epi8(a, b), a2 = _mm512_sub_epi8(a, b1), a3 = _mm512_xor_si512(a, b);
  for (long i = 0; i < n; i++) {
    /* opaque operands: the products cannot be hoisted out of the loop */
    __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(b0), "+v"(b1), "+v"(b2));
    TILE12(a0, a1, a2, a3, b0, b1, b2)
  }
  return ADD(ADD(ADD(ADD(c0, c1), ADD(c2, c3)), ADD(ADD(c4, c5), ADD(c6, c7))), ADD(ADD(c8, c9), ADD(c10, c11)));
}
__attribute__((noinline)) static __m512i loads(long n, const int8_t *w, const uint8_t *x) {
  __m512i z = _mm512_setzero_si512();
  __m512i c00 = z, c01 = z, c02 = z, c03 = z, c10 = z, c11 = z, c12 = z, c13 = z, c20 = z, c21 = z, c22 = z, c23 = z,
          c30 = z, c31 = z, c32 = z, c33 = z, c40 = z, c41 = z, c42 = z, c43 = z, c50 = z, c51 = z, c52 = z, c53 = z;
  for (long i = 0; i < n; i++) {
    long o = i & 15; /* 4 KB of weights, 384 bytes of activations: L1-resident */
    __m512i b0 = _mm512_loadu_si512((const void *)(w + o * 256));
    __m512i b1 = _mm512_loadu_si512((const void *)(w + o * 256 + 64));
    __m512i b2 = _mm512_loadu_si512((const void *)(w + o * 256 + 128));
    __m512i b3 = _mm512_loadu_si512((const void *)(w + o * 256 + 192));
    const int *xa = (const int *)(x + o * 24);
    ROW(0, _mm512_set1_epi32(xa[0])) ROW(1, _mm512_set1_epi32(xa[1])) ROW(2, _mm512_set1_epi32(xa[2]))
    ROW(3, _mm512_set1_epi32(xa[3])) ROW(4, _mm512_set1_epi32(xa[4])) ROW(5, _mm512_set1_epi32(xa[5]))
  }
  return ADD(ADD(ADD(ADD(c00, c01), ADD(c02, c03)), ADD(ADD(c10, c11), ADD(c12, c13))),
             ADD(ADD(ADD(ADD(c20, c21), ADD(c22, c23)), ADD(ADD(c30, c31), ADD(c32, c33))),
                 ADD(ADD(ADD(c40, c41), ADD(c42, c43)), ADD(ADD(c50, c51), ADD(c52, c53)))));
}
int main(int argc, char **argv) {
  long n = atol(argv[1]);
  int rounds = atoi(argv[2]);
  static int8_t w[16 * 256 + 64];
  static uint8_t x[16 * 24 + 64];
  for (int i = 0; i < (int)sizeof w; i++) w[i] = (int8_t)(i * 7);
  for (int i = 0; i < (int)sizeof x; i++) x[i] = (uint8_t)(i * 13);
  volatile int sink;
  for (int r = 0; r < rounds; r++) {
    double t = now();
    __m512i s = registers(n, _mm512_set1_epi8(3), _mm512_set1_epi8(5));
    t = now() - t;
    sink = _mm_cvtsi128_si32(_mm512_castsi512_si128(s));
    printf("registers %.3f\n", (double)n * 12 * 64 / t * 1e-9);
    t = now();
    s = loads(n, w, x);
    t = now() - t;
    sink = _mm_cvtsi128_si32(_mm512_castsi512_si128(s));
    printf("loads %.3f\n", (double)n * 24 * 64 / t * 1e-9);
  }
  (void)sink;
  return 0;
}
"""

#: TVM's AVX2 form: ``vpmaddwd(vpmaddubsw(x, y), ones)``, 32 u8 x s8 products (saturating int16 pair sums).
AVX2_SOURCE = ("#define P(x, y) _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), ones)\n#define PRODUCTS 32\n"
               + _AVX2_BODY)
#: tvm-ext's exact AVX2 path: ``vpmaddwd`` of int16 pairs (the uint8 data and the int8 weights widened, two
#: products per int32 lane, no saturation), 16 products; the same tile and loads as ``avx2``.
AVX2_EXACT_SOURCE = "#define P(x, y) _mm256_madd_epi16(x, y)\n#define PRODUCTS 16\n" + _AVX2_BODY

#: Per instruction set: the micro-kernel, gcc's flags, and the /proc/cpuinfo flags it needs.
KERNELS = {
    "avx2": (AVX2_SOURCE, ["-mavx2"], ("avx2",)),
    "avx2_exact": (AVX2_EXACT_SOURCE, ["-mavx2"], ("avx2",)),
    "avx512_vnni": (VNNI_SOURCE, ["-mavx512f", "-mavx512bw", "-mavx512vnni"], ("avx512f", "avx512bw", "avx512_vnni")),
}


def _cpus():
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        return set()
    return set(line.split(":", 1)[-1].split())


def _parse(out: str) -> dict:
    rates = {"registers": [], "loads": []}
    for kind, val in re.findall(r"^(registers|loads) ([0-9.]+)$", out, re.M):
        rates[kind].append(float(val))
    return rates


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--isa", choices=sorted(KERNELS), default=None,
                    help="the instruction sequence (default: avx512_vnni where the host has it, else avx2)")
    ap.add_argument("--gmac", type=float, default=4.089,
                    help="the model's multiply-accumulates, in 1e9 (default: int8 ResNet-50, 4.089)")
    ap.add_argument("--iters", type=int, default=100_000_000, help="loop iterations per measurement")
    ap.add_argument("--rounds", type=int, default=3, help="measurements per core (the best is kept)")
    args = ap.parse_args(argv)
    flags = _cpu_flags()
    isa = args.isa or ("avx512_vnni" if set(KERNELS["avx512_vnni"][2]) <= flags else "avx2")
    source, cflags, needs = KERNELS[isa]
    missing = [f for f in needs if f not in flags]
    if missing:
        sys.exit(f"int8_peak: this CPU has no {', '.join(missing)}: the {isa} micro-kernel cannot run here")
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        sys.exit("int8_peak: needs gcc (or cc) to compile the micro-kernel")
    taskset = shutil.which("taskset")
    with tempfile.TemporaryDirectory(prefix="int8_peak_") as tmp:
        src, exe = os.path.join(tmp, "peak.c"), os.path.join(tmp, "peak")
        with open(src, "w") as f:
            f.write(source)
        subprocess.run([gcc, "-O2", *cflags, src, "-o", exe], check=True)
        cmd = [exe, str(args.iters), str(args.rounds)]

        def pinned(cpu):
            return ([taskset, "-c", str(cpu)] if taskset else []) + cmd

        rows = []
        for cpu in _cpus():
            out = subprocess.run(pinned(cpu), capture_output=True, text=True, check=True).stdout
            rows.append((f"core {cpu} alone", [_parse(out)]))
        procs = [subprocess.Popen(pinned(c), stdout=subprocess.PIPE, text=True) for c in _cpus()]
        rows.append((f"all {len(procs)} cores at once (per core)", [_parse(p.communicate()[0]) for p in procs]))
    print(f"{isa} micro-kernel\n")
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
