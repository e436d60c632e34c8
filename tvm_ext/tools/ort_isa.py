"""ONNX Runtime restricted to AVX2 on an AVX-512 host: the benchmark's peer at the target's ISA.

MLAS picks its kernels from the host's CPUID and XCR0 and has no switch to restrict them, so on an
AVX-512 VNNI host it runs ``vpdpbusd`` zmm kernels whatever TVM's target is. Every AVX-512 check of
MLAS and ONNX Runtime reads XCR0 with ``xgetbv``: :func:`masked_package` makes a copy of the
installed ``onnxruntime`` whose ``xgetbv`` instructions are replaced by ``push 7; pop rax`` (same
length: XCR0 = x87 | SSE | AVX), which dispatches as on an AVX2-only CPU. The copy is made once per
onnxruntime version (``$TVM_EXT_CACHE/ort-avx2/``), never touches the installed package, and is
only imported in a child process (:class:`ChildSession`).

AVX-VNNI (Alder Lake, Sapphire Rapids, Zen 5) needs no state beyond AVX's, so it cannot be hidden
this way: :func:`mask_unavailable_reason` says so and :func:`masked_package` raises
:class:`OrtIsaError` before copying. :func:`probe` checks which int8 kernel family an ORT runs by
numerics (``MatMulInteger`` of 255 by 127 over 64 terms is exact with VNNI and saturates with
``vpmaddubsw``). docs/benchmarks.md ("ONNX Runtime on AVX2 from an AVX-512 host") has the details.
ONNX Runtime's exact int8 path (``session.x64quantprecision``) fails to load a model whose int8
initializers are shared between nodes; :func:`exact_path_model` gives it a copy where they are not.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from ._child import PipeChild

logger = logging.getLogger(__name__)

__all__ = ["OrtIsaError", "masked_package", "mask_unavailable_reason", "probe", "ChildSession", "child_env",
           "session_options", "exact_path_model", "ORT_ISA_CHOICES", "XGETBV", "REPLACEMENT"]

#: Which ONNX Runtime a benchmark compares with (``tvm_ext.tools.bench.ort_peer``): ``auto`` masks
#: AVX-512 for an AVX2 target on an AVX-512 host, ``host`` always runs the installed one.
ORT_ISA_CHOICES = ("auto", "host")

#: ``xgetbv`` (reads XCR[ecx] into edx:eax).
XGETBV = b"\x0f\x01\xd0"
#: ``push 7; pop rax``: rax = 7 (x87 | SSE | AVX state), same length.
REPLACEMENT = b"\x6a\x07\x58"

PROBE_TERMS = 64
PROBE_EXACT = 255 * 127 * PROBE_TERMS          # int32 accumulation (VNNI)
PROBE_SATURATED = 32767 * (PROBE_TERMS // 2)   # int16-saturated byte pairs (vpmaddubsw)


class OrtIsaError(RuntimeError):
    """ONNX Runtime cannot be restricted to AVX2 here (the message says why)."""


def _cache_root() -> Path:
    root = os.environ.get("TVM_EXT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tvm-ext")
    return Path(root)


def child_env(package_dir: Optional[Path]) -> dict:
    """This process's environment with ``package_dir`` (if any) first on ``PYTHONPATH``."""
    env = dict(os.environ)
    if package_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(package_dir)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def session_options(ort, threads: int, exact: bool = False):
    """The benchmark's ONNX Runtime session options (``ort`` is the imported onnxruntime module);
    ``exact``: ONNX Runtime's exact int8 path (``session.x64quantprecision``: no int16-saturating
    ``vpmaddubsw`` pair sums on CPUs without VNNI).

    Self-contained: its source also runs in :class:`ChildSession`'s child process.
    """
    so = ort.SessionOptions()
    if exact:
        so.add_session_config_entry("session.x64quantprecision", "1")
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return so


def exact_path_model(path) -> Path:
    """``path``, or a copy of the ONNX model where no int8 initializer feeds two node inputs.

    On CPUs without VNNI the exact path converts int8 weights and their zero points to uint8 in place,
    one node at a time; ONNX Runtime 1.32 fails on the second reader of a shared one ("AddInitializedOrtValue
    Attempt to replace the existing tensor"), and quantizers share zero points. The copy gives each reader
    its own (same values, so the same results); it is kept in ``$TVM_EXT_CACHE/exact-models/`` under the
    model's hash. A model with external data is returned as it is (with a warning): its tensors are named
    by paths relative to the model's folder, which a copy elsewhere would lose.
    """
    import collections

    import onnx

    path = Path(path)
    data = path.read_bytes()
    model = onnx.load_from_string(data)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer if t.data_type == onnx.TensorProto.INT8}
    readers = collections.Counter(name for node in graph.node for name in node.input if name in inits)
    shared = {name for name, n in readers.items() if n > 1}
    if not shared:
        return path
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in graph.initializer):
        logger.warning("ort_isa: %s shares int8 initializers (%s) and keeps its tensors in external files; "
                       "ONNX Runtime's exact path may fail to load it", path, ", ".join(sorted(shared)))
        return path
    dest = _cache_root() / "exact-models" / f"{hashlib.sha256(data).hexdigest()[:24]}.onnx"
    if dest.is_file():
        return dest
    for i, node in enumerate(graph.node):
        for k, name in enumerate(node.input):
            if name in shared:
                copy = graph.initializer.add()
                copy.CopyFrom(inits[name])
                copy.name = node.input[k] = f"{name}.reader{i}_{k}"
    nested = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node
                 for a in n.attribute)
    outputs = {o.name for o in graph.output}
    if not nested:  # an If or Loop body may read an outer initializer by name: keep them all then
        keep = [t for t in graph.initializer if t.name not in shared or t.name in outputs]
        del graph.initializer[:]
        graph.initializer.extend(keep)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(model.SerializeToString())
    tmp.replace(dest)
    logger.info("ort_isa: %s shares int8 initializers (%s); ONNX Runtime's exact path loads a copy: %s",
                path, ", ".join(sorted(shared)), dest)
    return dest


def _installed_package() -> Path:
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.origin:
        raise OrtIsaError("ort_isa: onnxruntime is not installed")
    return Path(spec.origin).parent


# --- ELF: executable segments and the xgetbv instructions in them ----------------------------
def _exec_segments(data: bytes) -> list[tuple[int, int, int]]:
    """(file offset, virtual address, size) of each executable PT_LOAD segment of an ELF64 file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise OrtIsaError("ort_isa: not a little-endian ELF64 file")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    out = []
    for i in range(phnum):
        p_type, p_flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", data,
                                                                                 phoff + i * phentsize)
        if p_type == 1 and p_flags & 1:  # PT_LOAD, PF_X
            out.append((p_offset, p_vaddr, p_filesz))
    return out


def xgetbv_offsets(path: Path) -> list[int]:
    """File offsets of the ``xgetbv`` *instructions* of an ELF shared library.

    Found by disassembly (``objdump``), not by searching bytes: 0f 01 d0 can occur inside other
    instructions or in data, and patching those would corrupt the library.
    """
    objdump = shutil.which("objdump")
    if objdump is None:
        raise OrtIsaError("ort_isa: needs binutils' objdump to find the xgetbv instructions (apt install binutils)")
    data = Path(path).read_bytes()
    segs = _exec_segments(data)
    res = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(path)], capture_output=True, text=True)
    if res.returncode != 0:
        raise OrtIsaError(f"ort_isa: objdump failed on {path}: {res.stderr.strip()[:200]}")
    offsets = []
    for line in res.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) >= 2 and parts[-1].strip() == "xgetbv":
            addr = int(parts[0].strip().rstrip(":"), 16)
            for off, vaddr, size in segs:
                if vaddr <= addr < vaddr + size:
                    offsets.append(addr - vaddr + off)
                    break
            else:
                raise OrtIsaError(f"ort_isa: xgetbv at {addr:#x} lies outside every executable segment of {path}")
    for o in offsets:
        if data[o:o + 3] != XGETBV:
            raise OrtIsaError(f"ort_isa: bytes at {o:#x} of {path} are not xgetbv")
    return offsets


def patch_library(src: Path, dst: Path) -> int:
    """Write ``src`` to ``dst`` with every xgetbv replaced; returns how many were replaced."""
    offsets = xgetbv_offsets(src)
    data = bytearray(Path(src).read_bytes())
    for o in offsets:
        data[o:o + 3] = REPLACEMENT
    Path(dst).write_bytes(bytes(data))
    shutil.copymode(src, dst)
    return len(offsets)


# --- the probe ---------------------------------------------------------------------------------
_PROBE_SCRIPT = r"""
import sys, json
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper
K = %d
b = helper.make_tensor("b", TensorProto.INT8, [K, 8], np.full([K, 8], 127, np.int8).tobytes(), raw=True)
g = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "probe",
                      [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, K])],
                      [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 8])], [b])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
m.ir_version = 8
s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
y = s.run(None, {"a": np.full([1, K], 255, np.uint8)})[0]
print(json.dumps({"value": int(y[0, 0]), "file": ort.__file__, "version": ort.__version__}))
""" % PROBE_TERMS


def probe(package_dir: Optional[Path] = None) -> dict:
    """Run the int8 probe in a child process (with ``package_dir`` first on the path).

    Returns ``{"kernels": "int32" | "int16-saturating", "value", "file", "version"}``:
    ``int32`` is VNNI (``vpdpbusd``), ``int16-saturating`` is AVX2 or AVX-512BW ``vpmaddubsw``.
    """
    res = subprocess.run([sys.executable, "-c", _PROBE_SCRIPT], capture_output=True, text=True,
                         env=child_env(package_dir), timeout=300)
    if res.returncode != 0:
        raise OrtIsaError(f"ort_isa: the probe process failed (exit {res.returncode}): {res.stderr.strip()[-300:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    if out["value"] == PROBE_EXACT:
        out["kernels"] = "int32"
    elif out["value"] == PROBE_SATURATED:
        out["kernels"] = "int16-saturating"
    else:
        raise OrtIsaError(f"ort_isa: unexpected probe value {out['value']} "
                          f"(int32 accumulation gives {PROBE_EXACT}, int16 saturation {PROBE_SATURATED})")
    return out


def mask_unavailable_reason() -> Optional[str]:
    """Why this host's ONNX Runtime cannot be made to dispatch as on an AVX2-only CPU, or None.

    Only the host's CPU decides (not objdump or the ORT build; :func:`masked_package` checks those).
    """
    from ..x86.isa import host_features

    feats = host_features()
    if "avx512f" not in feats:
        return "the host has no AVX-512: its ONNX Runtime already runs AVX2-class kernels"
    if "avxvnni" in feats:
        return ("the host has AVX-VNNI, which MLAS enables from CPUID alone (no XCR0 state to hide): "
                "a masked copy would still run int32 vpdpbusd kernels")
    return None


def masked_package(cache: Optional[Path] = None) -> Path:
    """A directory holding an ``onnxruntime`` package that dispatches as on an AVX2-only CPU.

    Put it first on ``PYTHONPATH`` of a *child* process. Made once per installed onnxruntime
    (keyed by its version and the libraries' sha256) and checked with :func:`probe`.

    Raises
    ------
    OrtIsaError
        The host cannot be masked (:func:`mask_unavailable_reason`), objdump is missing, or the
        copy's probe still shows int32 int8 kernels.
    """
    reason = mask_unavailable_reason()
    if reason is not None:
        raise OrtIsaError(f"ort_isa: cannot restrict ONNX Runtime to AVX2 here: {reason}")
    src = _installed_package()
    libs = sorted(p for p in src.rglob("*.so*") if p.is_file())
    h = hashlib.sha256()
    for p in libs:
        h.update(p.name.encode())
        h.update(hashlib.sha256(p.read_bytes()).digest())
    root = Path(cache) if cache is not None else _cache_root() / "ort-avx2"
    dest = root / h.hexdigest()[:16]
    done = dest / "MASKED.json"
    if done.is_file():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="tmp-", dir=root))
    try:
        pkg = tmp / "onnxruntime"
        shutil.copytree(src, pkg, ignore=shutil.ignore_patterns("__pycache__"))
        patched = {}
        for p in libs:
            rel = p.relative_to(src)
            n = patch_library(p, pkg / rel)
            if n:
                patched[str(rel)] = n
        if not patched:
            raise OrtIsaError(f"ort_isa: no xgetbv instruction in onnxruntime's libraries under {src}: "
                              "this build does not read XCR0, so it cannot be masked this way")
        got = probe(tmp)
        if got["kernels"] != "int16-saturating" or not str(got["file"]).startswith(str(tmp)):
            raise OrtIsaError(f"ort_isa: the masked copy still runs {got['kernels']} int8 kernels "
                              f"(loaded from {got['file']}); not using it")
        (tmp / "MASKED.json").write_text(json.dumps({"source": str(src), "version": got["version"],
                                                     "patched_xgetbv": patched, "probe": got["value"]}, indent=1))
        logger.info("ort_isa: made an AVX2-dispatching copy of onnxruntime %s in %s (%s)",
                    got["version"], dest, patched)
        try:
            tmp.rename(dest)
        except OSError:  # another process made it first
            if not done.is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


# --- a session in a child process ----------------------------------------------------------------
_SETUP = r"""
def setup(cfg):
    import onnxruntime as ort
    sess = ort.InferenceSession(cfg["path"], session_options(ort, cfg["threads"], cfg["exact"]),
                                providers=["CPUExecutionProvider"])
    feed_name = cfg["input"]
    return {"file": ort.__file__}, lambda x: sess.run(None, {feed_name: x})[0]
"""


class ChildSession(PipeChild):
    """An ONNX Runtime session in a child process, importing onnxruntime from ``package_dir``.

    ``run(x)`` returns the first output; ``time(x, n)`` times ``n`` runs *in the child* (the pipe's
    cost is not in the numbers); ``pid`` is the child's. Close it, or use it as a context manager.
    """

    def __init__(self, model_path, input_name: str, threads: int, package_dir: Optional[Path] = None,
                 exact: bool = False):
        super().__init__(inspect.getsource(session_options) + _SETUP,
                         {"path": str(model_path), "input": input_name, "threads": int(threads),
                          "exact": bool(exact)},
                         env=child_env(package_dir), error=OrtIsaError, what="ort_isa: ONNX Runtime")
        self.file = self.info["file"]


def main(argv=None) -> int:
    """``python -m tvm_ext.tools.ort_isa [--probe]``: print the AVX2-dispatching copy's directory.

    Use it as ``PYTHONPATH=$(python -m tvm_ext.tools.ort_isa) python my_script.py`` to run your own
    ONNX Runtime measurements on AVX2 kernels from an AVX-512 host. Errors go to stderr, exit 1.
    """
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tvm_ext.tools.ort_isa", description=main.__doc__.splitlines()[0])
    ap.add_argument("--probe", action="store_true", help="also print which int8 kernels each onnxruntime runs")
    args = ap.parse_args(argv)
    try:
        path = masked_package()
        if args.probe:
            print(f"installed: {probe()['kernels']}; copy: {probe(path)['kernels']}", file=sys.stderr)
    except OrtIsaError as err:
        print(err, file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
