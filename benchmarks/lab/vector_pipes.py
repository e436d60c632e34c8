#!/usr/bin/env python
"""What an int8 conv epilogue costs next to its dot products on this host's AVX-512 vector pipes.

An int8 conv's output vector of 16 channels over a 64-channel reduction takes 16 ``vpdpbusd zmm``;
its epilogue adds integer multiplies (``vpmuldq`` for the requantize's 64-bit products, ``vpmulld``
for a residual add's) and ALU operations (adds, shifts, min/max, blends). This script times loops
of such mixes, every instruction independent of the others across iterations (no dependency chain
longer than one iteration, no loads), so each row is the throughput of the mix alone: which
instructions share a pipe with the dot product and which run beside it. Each loop is basic ``asm``
compiled by gcc; cycles come from the host's clock, measured first with a chain of dependent
``add`` instructions (one cycle each). docs/kernels-static.md has the results per CPU.

    python benchmarks/lab/vector_pipes.py [--iters 50000000] [--rounds 3]

Needs gcc and AVX-512 VNNI (it says so and exits otherwise); the code runs in a child process.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

_SOURCES = "%zmm16,%zmm17"  # the two operands every product reads


#: Accumulators of the dot products: 14 chains, more than latency x issue rate on every AVX-512 VNNI core
#: (Intel issues two ``vpdpbusd zmm`` per cycle at latency 5: 8 chains would time the latency).
_ACCUMULATORS = (0, 1, 2, 3, 4, 5, 6, 7, 26, 27, 28, 29, 30, 31)


def _dots(n: int) -> list:
    """``n`` dot products spread over :data:`_ACCUMULATORS`."""
    return [f"vpdpbusd {_SOURCES},%zmm{_ACCUMULATORS[i % len(_ACCUMULATORS)]}" for i in range(n)]


def _multiplies(kinds) -> list:
    """One multiply per kind, each into its own register (8-11)."""
    return [f"{k} {_SOURCES.split(',')[0]},%zmm{8 + i},%zmm{8 + i}" for i, k in enumerate(kinds)]


#: ALU operations of an epilogue (bias and zero-point adds, rounding shifts, clip, the even/odd blend)
_ALU = ("vpaddd %zmm16,{r},{r}", "vpmaxsd %zmm16,{r},{r}", "vpsrad $3,{r},{r}", "vpaddq %zmm16,{r},{r}",
        "vpminsd %zmm16,{r},{r}", "vpsraq $7,{r},{r}", "vpsrlq $32,{r},{r}", "vmovdqa32 %zmm16,{r}{{%k1}}")
_ALU_REGS = (12, 13, 14, 15, 18, 19, 20, 21, 22, 23, 24, 25)


def _alu(n: int) -> list:
    return [_ALU[i % len(_ALU)].format(r=f"%zmm{_ALU_REGS[i % len(_ALU_REGS)]}") for i in range(n)]


#: (label, instructions per iteration): ordered as the docs' table reads
MIXES = (
    ("16 vpdpbusd", _dots(16)),
    ("8 vpmulld", _multiplies(["vpmulld"] * 4) * 2),
    ("8 vpmuldq", _multiplies(["vpmuldq"] * 4) * 2),
    ("8 vpmaddwd", _multiplies(["vpmaddwd"] * 4) * 2),
    ("16 ALU", _alu(16)),
    ("16 vpdpbusd + 2 vpmuldq (a requantize's multiplies)", _dots(16) + _multiplies(["vpmuldq"] * 2)),
    ("16 vpdpbusd + 2 vpmuldq + 2 vpmulld (+ a residual add's)",
     _dots(16) + _multiplies(["vpmuldq", "vpmuldq", "vpmulld", "vpmulld"])),
    ("16 vpdpbusd + 16 ALU", _dots(16) + _alu(16)),
    ("16 vpdpbusd + 24 ALU", _dots(16) + _alu(24)),
    ("16 vpdpbusd + 32 ALU", _dots(16) + _alu(32)),
    ("16 vpdpbusd + 2 vpmuldq + 9 ALU (a plain conv's epilogue)",
     _dots(16) + _multiplies(["vpmuldq", "vpmuldq"]) + _alu(9)),
    ("16 vpdpbusd + 2 vpmuldq + 2 vpmulld + 17 ALU (a residual conv's epilogue)",
     _dots(16) + _multiplies(["vpmuldq", "vpmuldq", "vpmulld", "vpmulld"]) + _alu(17)),
)

_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static double best(double a, double b) { return a < b ? a : b; }
int main(int argc, char **argv) {
  long n = atol(argv[1]); int rounds = atoi(argv[2]);
  double t, clock_s = 1e30;
  __asm__ volatile("movl $0x5555, %%eax\n kmovw %%eax, %%k1" ::: "eax");
  /* 8 dependent register adds per iteration: 8 cycles. Register operands, not immediates: cores from
     Golden Cove on fold chains of immediate adds at rename and run several per cycle. */
  for (int r = 0; r < rounds; r++) {
    long x = 0, one = 1; t = now();
    for (long i = 0; i < n; i++) __asm__ volatile("add %1,%0\n add %1,%0\n add %1,%0\n add %1,%0\n"
                                                  "add %1,%0\n add %1,%0\n add %1,%0\n add %1,%0" : "+r"(x) : "r"(one));
    clock_s = best(clock_s, (now() - t) / (8.0 * n));
  }
  printf("ghz %.4f\n", 1e-9 / clock_s);
@LOOPS@
  return 0;
}
"""

_LOOP = r"""  { double s = 1e30; for (int r = 0; r < rounds; r++) { t = now();
      for (long i = 0; i < n; i++) __asm__ volatile(@BODY@);
      s = best(s, now() - t); }
    printf("mix @INDEX@ %.4f\n", s / clock_s / n); }
"""


def program() -> str:
    """The C source timing every mix of :data:`MIXES`."""
    loops = []
    for i, (_label, instrs) in enumerate(MIXES):
        body = " ".join(f'"{ins}\\n"' for ins in instrs)
        loops.append(_LOOP.replace("@BODY@", body).replace("@INDEX@", str(i)))
    return _PROGRAM.replace("@LOOPS@", "".join(loops))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=50_000_000, help="loop iterations per measurement")
    ap.add_argument("--rounds", type=int, default=3, help="measurements per mix (the fastest is kept)")
    args = ap.parse_args(argv)
    from tvm_ext.x86.isa import host_features  # LLVM's view of this CPU (CPUID, XGETBV)

    missing = [f for f in ("avx512f", "avx512vnni") if f not in host_features()]
    if missing:
        sys.exit(f"vector_pipes: this CPU has no {', '.join(missing)}: the mixes cannot run here")
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        sys.exit("vector_pipes: needs gcc (or cc) to compile the loops")
    with tempfile.TemporaryDirectory(prefix="vector_pipes_") as tmp:
        src, exe = os.path.join(tmp, "pipes.c"), os.path.join(tmp, "pipes")
        with open(src, "w") as f:
            f.write(program())
        subprocess.run([gcc, "-O2", src, "-o", exe], check=True)
        out = subprocess.run([exe, str(args.iters), str(args.rounds)], capture_output=True, text=True,
                             check=True).stdout
    ghz = float(re.search(r"^ghz ([0-9.]+)$", out, re.M).group(1))
    cycles = {int(i): float(c) for i, c in re.findall(r"^mix (\d+) ([0-9.]+)$", out, re.M)}
    print(f"clock {ghz:.2f} GHz (dependent register adds)\n")
    print("| instructions per iteration | cycles per iteration |")
    print("|---|---|")
    for i, (label, _instrs) in enumerate(MIXES):
        print(f"| {label} | {cycles[i]:.2f} |")


if __name__ == "__main__":
    main()
