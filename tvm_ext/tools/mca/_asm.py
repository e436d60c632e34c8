"""Hot-loop extraction from LLVM's assembly text (x86-64 AT&T syntax and AArch64).

Design note
-----------
A *kernel* is one fused Relay function: TVM emits ``<kernel>`` (argument unpacking),
``<kernel>_compute_`` and, for parallel loops, ``.L__tvm_parallel_lambda.N`` functions that follow
their ``_compute_`` function in the file. Each of those functions belongs to the kernel of the last
``tvmgen_*`` function before it.

A *loop* is a backward branch: a branch instruction whose target label lies earlier in the same
function; its body is the text from that label to the branch, inclusive (LLVM lays a loop out as one
contiguous run of blocks with its latch at the bottom).

*Dot instructions* are the int8 multiply-accumulate forms of :data:`DOT_FORMS`, each with the number of
multiply-accumulates (MACs) one instruction does at its register width or vector arrangement.
``vpmaddwd`` counts only in a loop without ``vpmaddubsw``: next to ``vpmaddubsw`` it sums the int16
pair products with ones (no new products).

Depthwise and float convs count differently (:func:`dot_macs`' ``kind``), and in a kernel with
``vpdpbusd`` the int16-pair forms are epilogue, not dots: docs/kernels-static.md, "How it works".

The *hot loop* of a kernel: among its loops that hold dot instructions and contain no smaller loop that
holds any (or whose own dots outweigh those nested loops' :data:`OUTER_OVER_NESTED` times), the one
with the most MACs per iteration; on a tie, the one with fewer instructions.
"""
from __future__ import annotations

import collections
import dataclasses
import re
from dataclasses import dataclass, field

__all__ = ["DOT_FORMS", "FLOAT_FORMS", "Instruction", "Loop", "HotLoop", "parse", "kernels", "loops", "hot_loop",
           "dot_macs", "depthwise_taps"]

_LABEL = re.compile(r"^([.\w$]+):")
_TYPE = re.compile(r"^\s*\.type\s+([.\w$]+),\s*@function")
_LAMBDA = ".L__tvm_parallel_lambda"
_X86_WIDTH = {"zmm": 512, "ymm": 256, "xmm": 128}
# aarch64 arrangement of the destination -> lanes
_ARM_LANES = re.compile(r"v\d+\.(\d+)([bhsd])")


def _x86_bits(operands: str) -> int:
    """Register width of an AT&T instruction's destination (its last operand)."""
    last = operands.rsplit(",", 1)[-1].strip()
    m = re.match(r"%([xyz]mm)\d+", last)
    return _X86_WIDTH[m.group(1)] if m else 0


def _arm_dest(operands: str) -> tuple:
    """(lanes, element letter) of an AArch64 vector instruction's destination, (0, "") if scalar."""
    m = _ARM_LANES.match(operands.strip())
    return (int(m.group(1)), m.group(2)) if m else (0, "")


def _bytes_x86(ops):  # one byte product per byte of the destination (vpdpbusd, vpmaddubsw)
    return _x86_bits(ops) // 8


def _words_x86(ops):  # one int16 product per 16 bits (vpmaddwd, vpdpwssd)
    return _x86_bits(ops) // 16


def _arm_dot(ops):  # sdot v.4s: 4 lanes x 4 byte products
    lanes, elem = _arm_dest(ops)
    return lanes * 4 if elem == "s" else 0


def _arm_mmla(ops):  # smmla v.4s: a 2x8 by 8x2 matrix product, 32 products
    lanes, elem = _arm_dest(ops)
    return 32 if (lanes, elem) == (4, "s") else 0


def _arm_widening(ops):
    """smull/smlal: one product per destination lane of 16 (from 8-bit) or 32 bits (from 16-bit);
    64-bit destinations (int32 x int32, e.g. requantize arithmetic) are not int8 work."""
    lanes, elem = _arm_dest(ops)
    return lanes if elem in ("h", "s") else 0


#: mnemonic -> MACs per instruction from its operand text.
DOT_FORMS = {
    "vpdpbusd": _bytes_x86, "vpdpbusds": _bytes_x86, "vpmaddubsw": _bytes_x86,
    "vpmaddwd": _words_x86, "vpdpwssd": _words_x86, "vpdpwssds": _words_x86,
    "sdot": _arm_dot, "udot": _arm_dot, "usdot": _arm_dot, "sudot": _arm_dot,
    "smmla": _arm_mmla, "ummla": _arm_mmla, "usmmla": _arm_mmla,
    "smull": _arm_widening, "smull2": _arm_widening, "umull": _arm_widening, "umull2": _arm_widening,
    "smlal": _arm_widening, "smlal2": _arm_widening, "umlal": _arm_widening, "umlal2": _arm_widening,
}


def _lanes_x86(ops):  # one float32 product per 32-bit lane (vfmadd*ps)
    return _x86_bits(ops) // 32


def _arm_fmla(ops):  # fmla v.4s: one product per 32-bit lane
    lanes, elem = _arm_dest(ops)
    return lanes if elem == "s" else 0


#: Float32 multiply-adds, counted only in float conv kernels (``kind="float"``).
FLOAT_FORMS = {f"vfmadd{order}ps": _lanes_x86 for order in ("132", "213", "231")}
FLOAT_FORMS.update({"fmla": _arm_fmla})
#: int16-pair multiplies that a depthwise kernel fills with one product per 32-bit lane.
_PAIR_FORMS = ("vpmaddwd", "vpdpwssd", "vpdpwssds")


@dataclass(frozen=True)
class Instruction:
    """One line of assembly: a label (``label`` set) or an instruction (``mnemonic`` set)."""

    text: str
    mnemonic: str = ""
    operands: str = ""
    label: str = ""

    @property
    def branch_target(self) -> str:
        """The label a branch jumps to, "" for other instructions."""
        m = self.mnemonic
        if m.startswith("j") or m in ("b", "cbz", "cbnz", "tbz", "tbnz") or m.startswith("b."):
            last = self.operands.rsplit(",", 1)[-1].strip()
            return last if last.startswith(".L") else ""
        return ""


@dataclass(frozen=True)
class Loop:
    """Instructions ``[start, end]`` of a function (the label line to the backward branch)."""

    function: str
    start: int
    end: int

    def contains(self, other: "Loop") -> bool:
        """Whether ``other`` is a different loop nested in this one."""
        return (self.function == other.function and self.start <= other.start and other.end <= self.end
                and (self.start, self.end) != (other.start, other.end))


#: A memory operand addressed from the stack pointer (AArch64 ``[sp, #16]``, x86-64 ``-64(%rsp)``).
_STACK = re.compile(r"\[sp[],]|\(%rsp[),]")


@dataclass(frozen=True)
class HotLoop:
    """A kernel's hot loop: its instructions and the dot instructions in it."""

    kernel: str
    function: str
    body: tuple  # instruction texts, labels and directives removed
    dots: dict = field(default_factory=dict)  # "mnemonic width" -> count
    macs: int = 0  # multiply-accumulates per iteration
    accumulators: int = 0  # distinct registers the dot instructions write
    memory_dots: dict = field(default_factory=dict)  # "mnemonic width" -> count of those with a memory source

    @property
    def instructions(self) -> int:
        return len(self.body)

    @property
    def text(self) -> str:
        return "\n".join(self.body) + "\n"

    @property
    def stack_accesses(self) -> int:
        """Instructions that load or store through the stack pointer: register spills and their reloads."""
        return sum(1 for line in self.body if _STACK.search(line))


def _strip_comment(line: str, x86: bool) -> str:
    for mark in ("//", "#") if x86 else ("//",):  # "#" is AArch64's immediate prefix
        i = line.find(mark)
        if i >= 0:
            line = line[:i]
    return line.rstrip()


def parse(asm: str) -> dict:
    """``{function name: [Instruction, ...]}`` from an assembly listing, in file order.

    The syntax is x86-64 AT&T when the listing names a ``%`` register, AArch64 otherwise.
    """
    x86 = "%" in asm
    funcs: dict = {}
    current = None
    for raw in asm.splitlines():
        m = _TYPE.match(raw)
        if m:
            current = funcs.setdefault(m.group(1), [])
            continue
        if current is None:
            continue
        line = _strip_comment(raw, x86)
        if not line.strip():
            continue
        lab = _LABEL.match(line)
        if lab:
            current.append(Instruction(line, label=lab.group(1)))
            continue
        s = line.strip()
        if s.startswith("."):
            continue  # a directive
        words = s.split(None, 1)
        while words[0].startswith("{") and len(words) > 1:  # an encoding choice ({vex}, {evex}): not the mnemonic
            words = words[1].split(None, 1)
        mnemonic, *operands = words
        current.append(Instruction(s, mnemonic.lower(), operands[0].strip() if operands else ""))
    return funcs


def kernels(funcs: dict) -> dict:
    """``{kernel name: [function name, ...]}``: each function under the last ``tvmgen_*`` function before it."""
    out: dict = {}
    owner = None
    for name in funcs:
        if name.startswith(_LAMBDA):
            if owner is not None:
                out[owner].append(name)
            continue
        if not name.startswith("tvmgen_"):
            owner = None
            continue
        owner = name[: -len("_compute_")] if name.endswith("_compute_") else name
        out.setdefault(owner, []).append(name)
    return out


def loops(name: str, instrs: list) -> list:
    """The backward branches of one function as :class:`Loop`."""
    where = {ins.label: i for i, ins in enumerate(instrs) if ins.label}
    out = []
    for i, ins in enumerate(instrs):
        target = ins.mnemonic and ins.branch_target
        if target and target in where and where[target] <= i:
            out.append(Loop(name, where[target], i))
    return out


def _forms(kind: str) -> dict:
    if kind not in ("", "depthwise", "float", "vnni"):
        raise ValueError(f"kind must be '', 'depthwise', 'float' or 'vnni', got {kind!r}")
    if kind == "vnni":
        return {m: f for m, f in DOT_FORMS.items() if m not in _PAIR_FORMS}
    return {**DOT_FORMS, **FLOAT_FORMS} if kind == "float" else DOT_FORMS


def dot_macs(instrs, kind: str = "") -> tuple:
    """``(Counter of "mnemonic width", MACs)`` of the dot instructions in ``instrs`` of a kernel whose
    conv is of ``kind`` (module note): "", "depthwise", "float" or "vnni" (a kernel with ``vpdpbusd``,
    whose int16-pair forms do not count)."""
    mnemonics = {i.mnemonic for i in instrs}
    forms = _forms(kind)
    count, macs = collections.Counter(), 0
    for ins in instrs:
        form = forms.get(ins.mnemonic)
        if form is None or (ins.mnemonic == "vpmaddwd" and "vpmaddubsw" in mnemonics):
            continue
        n = form(ins.operands)
        if kind == "depthwise" and ins.mnemonic in _PAIR_FORMS:
            n //= 2
        if n:
            count[f"{ins.mnemonic} {_width(ins)}"] += 1
            macs += n
    return count, macs


def _width(ins: Instruction) -> str:
    if ins.mnemonic.startswith("vp"):
        return {512: "zmm", 256: "ymm", 128: "xmm"}.get(_x86_bits(ins.operands), "?")
    lanes, elem = _arm_dest(ins.operands)
    return f".{lanes}{elem}"


#: A loop holding dot loops is the hot loop's candidate too when its own dots (outside them) do at least
#: this many times their MACs per iteration: a tile loop whose conv reduction is unrolled, with an
#: epilogue loop nested in it (a hard-swish's int16 multiply at x86-64-v3, where ``vpmaddwd`` is also
#: the dot). A reduction loop nested in a tile loop with a few peeled dots stays the hot one.
OUTER_OVER_NESTED = 8


def hot_loop(kernel: str, funcs: dict, names, kind: str = "") -> HotLoop | None:
    """The hot loop of ``kernel`` (module note; ``kind`` as :func:`dot_macs`), or None when none of its
    loops holds a dot instruction."""
    found = []
    forms = _forms(kind)
    if kind == "" and any(i.mnemonic in ("vpdpbusd", "vpdpbusds") for n in names for i in funcs[n]):
        kind = "vnni"  # the int16-pair forms of a VNNI kernel are epilogue multiplies
        forms = _forms(kind)
    for name in names:
        instrs = funcs[name]
        with_dots = []
        for lp in loops(name, instrs):
            body = [i for i in instrs[lp.start: lp.end + 1] if i.mnemonic]
            if dot_macs(body, kind)[1]:
                with_dots.append((lp, body))
        for lp, body in with_dots:
            nested = [g for g, _ in with_dots if lp.contains(g)]
            own = [i for k, i in enumerate(instrs[lp.start: lp.end + 1], lp.start)
                   if i.mnemonic and not any(g.start <= k <= g.end for g in nested)]
            count, macs = dot_macs(own, kind)
            nested_macs = sum(dot_macs(b, kind)[1] for g, b in with_dots if g in nested)
            if macs and (not nested or macs >= OUTER_OVER_NESTED * nested_macs):
                found.append((lp, body, own, count, macs))
    if not found:
        return None
    lp, body, own, count, macs = max(found, key=lambda f: (f[4], -len(f[1])))
    dots = [i for i in own if i.mnemonic in forms and forms[i.mnemonic](i.operands)]
    acc = {_destination(i) for i in dots}
    memory = collections.Counter(f"{i.mnemonic} {_width(i)}" for i in dots if "(" in i.operands)
    return HotLoop(kernel, lp.function, tuple(i.text for i in body), dict(count), macs, len(acc), dict(memory))


#: Dots of 4 bytes per 32-bit lane: in a depthwise kernel, 4 adjacent taps of one channel per lane.
_TAP_DOTS = ("sdot", "udot", "usdot", "sudot", "vpdpbusd")
#: 32-bit lanes of an x86 register
_X86_LANES = {"zmm": 16, "ymm": 8, "xmm": 4}


def depthwise_taps(hot: HotLoop, kernel_width: int, dots_per_row: int = 0) -> HotLoop:
    """``hot`` of a depthwise kernel whose 4-byte dots multiply ``kernel_width`` taps of a kernel row in
    ``dots_per_row`` dots per output (``ceil(kw / 4)`` when 0: groups of 4 taps, the last one's ends zero):
    each dot credited with the products that carry a weight (``kw`` of ``4 x dots_per_row``: 12 of 16 for a
    3x3 in one dot, 6 of 16 in two, 10 for a 5x5 in two)."""
    tap_dots = {form: n for form, n in hot.dots.items() if form.split()[0] in _TAP_DOTS}
    if not tap_dots or kernel_width <= 0:
        return hot
    padded = 4 * (dots_per_row or -(-kernel_width // 4))
    full = sum(n * 4 * (_X86_LANES.get(form.split()[-1]) or _arm_dest(f"v0{form.split()[-1]}")[0])
               for form, n in tap_dots.items())
    return dataclasses.replace(hot, macs=hot.macs - full + round(full * kernel_width / padded))


def _destination(ins: Instruction) -> str:
    """The register an instruction writes: AT&T's last operand, AArch64's first (arrangement dropped)."""
    ops = [o.strip() for o in ins.operands.split(",")]
    return (ops[-1] if ins.mnemonic.startswith("vp") else ops[0].split(".")[0]) if ops else ""
