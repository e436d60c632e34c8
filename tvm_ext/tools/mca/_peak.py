"""A CPU model's int8 dot-product peak, measured with llvm-mca.

The peak of one form is a loop of :data:`COPIES` independent copies of the instruction (each into its
own accumulator, all reading the same two source registers, so neither loads nor a dependency chain
limit it), written :data:`UNROLL` times so that the loop's counter and branch cost under 0.3%;
MACs per cycle = copies x unroll x MACs per instruction / the
predicted cycles per iteration. A CPU model's peak is the best of its ``peak_forms``
(:mod:`tvm_ext.tools.mca._cpus`). x86 forms come with a memory source too (``... mem``: the kernels'
dots read the kernel vector or the broadcast data word from memory), because a scheduling model may
rate the two differently: LLVM 22's Zen 4 model gives the register form of ``vpdpbusd`` two cycles
and the memory form one, so a peak of the register form alone would put kernels above 100%.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from . import _asm, _cpus, _llvm_mca

__all__ = ["COPIES", "Peak", "FORMS", "peak", "form_peak"]

COPIES = 12
UNROLL = 4

_X86_LOOP = "\n".join(["{body}", "addq $1, %rax", "cmpq %rdx, %rax", "jne .Lpeak"])
_ARM_LOOP = "\n".join(["{body}", "add x0, x0, #1", "cmp x0, x1", "b.ne .Lpeak"])

#: form -> (instruction template with {i} the accumulator, loop template)
FORMS = {
    "vpdpbusd zmm": ("vpdpbusd %zmm30, %zmm31, %zmm{i}", _X86_LOOP),
    "vpdpbusd zmm mem": ("vpdpbusd (%rsi){{1to16}}, %zmm31, %zmm{i}", _X86_LOOP),
    "vpdpbusd ymm": ("vpdpbusd %ymm14, %ymm15, %ymm{i}", _X86_LOOP),
    "vpmaddwd ymm": ("vpmaddwd %ymm14, %ymm15, %ymm{i}", _X86_LOOP),
    "vpmaddwd ymm mem": ("vpmaddwd (%rsi), %ymm15, %ymm{i}", _X86_LOOP),
    "vpmaddubsw ymm": ("vpmaddubsw %ymm14, %ymm15, %ymm{i}", _X86_LOOP),
    "sdot": ("sdot v{i}.4s, v30.16b, v31.16b", _ARM_LOOP),
    "smmla": ("smmla v{i}.4s, v30.16b, v31.16b", _ARM_LOOP),
    "smull .8h": ("smull v{i}.8h, v30.8b, v31.8b", _ARM_LOOP),
    "smlal .4s": ("smlal v{i}.4s, v30.4h, v31.4h", _ARM_LOOP),
}


@dataclass(frozen=True)
class Peak:
    form: str
    macs_per_cycle: float
    cycles_per_iteration: float


def loop_text(form: str) -> str:
    """The assembly of the peak loop of ``form``."""
    ins, loop = FORMS[form]
    body = "\n".join(ins.format(i=i) for _ in range(UNROLL) for i in range(COPIES))
    return ".Lpeak:\n" + loop.format(body=body) + "\n"


@functools.lru_cache(maxsize=None)
def form_peak(cpu: str, form: str) -> Peak:
    """The peak of one ``form`` on CPU model ``cpu``."""
    m = _cpus.cpu_model(cpu)
    text = loop_text(form)
    body = [i for i in _asm.parse(".type f,@function\n" + text)["f"] if i.mnemonic]
    _count, macs = _asm.dot_macs(body)
    res = _llvm_mca.run(text, m.triple, m.mcpu, m.mattr)
    return Peak(form, macs / res.cycles_per_iteration, res.cycles_per_iteration)


def peak(cpu: str) -> Peak:
    """The int8 peak of CPU model ``cpu``: the best of its peak forms."""
    return max((form_peak(cpu, f) for f in _cpus.cpu_model(cpu).peak_forms), key=lambda p: p.macs_per_cycle)
