"""Run a library written by ``tvm-ext compile`` on a remote TVM RPC server (``tvm-ext run --rpc``).

Design note
-----------
The remote is anything that runs ``python -m tvm.exec.rpc_server`` (a board; here, the aarch64
emulation of :mod:`tvm_ext.testing.aarch64`). :func:`run_remote` reads the library's sidecar and
checks the inputs first (as :func:`tvm_ext.tools.deploy.run_library` does, without the host CPU
check: the library runs over there), then uploads a shared object, loads it with
``graph_executor`` through the session, runs it and fetches the outputs. Timings
(``repeat``) come from the remote's ``time_evaluator``.

What is uploaded: a ``.so`` as it is. A ``.tar`` is linked here when a compiler for its
architecture is on PATH (the cross compiler, :func:`tvm_ext.tools.deploy.cross_cxx`, or the
system one for this host's architecture), else uploaded as it is, and the server links it with
its own C++ compiler (a board usually has one; the emulated set-up has none).

Failures (:class:`tvm_ext.tools.deploy.DeployError`, one line): a malformed address, no server
there, a library the server cannot load (wrong architecture, no compiler for a ``.tar``).
"""
from __future__ import annotations

import hashlib
import logging
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .deploy import DeployError, RunResult, cross_cxx, foreign_arch, match_inputs, read_sidecar

logger = logging.getLogger(__name__)

__all__ = ["parse_address", "run_remote"]


def parse_address(text: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> ``(host, port)``.

    Raises
    ------
    DeployError
        No colon, a port that is not an integer in 1..65535, an empty host.
    """
    host, sep, port = str(text).rpartition(":")
    if not sep or not host:
        raise DeployError(f"RPC address {text!r}: expected HOST:PORT")
    try:
        number = int(port)
    except ValueError:
        raise DeployError(f"RPC address {text!r}: port {port!r} is not an integer") from None
    if not 0 < number < 65536:
        raise DeployError(f"RPC address {text!r}: port {number} is out of range")
    return host.strip("[]"), number


def _last_line(err: Exception) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return lines[-1] if lines else type(err).__name__


def _shared_object(lib: Path, meta: dict, workdir: Path) -> Path:
    """The file to upload: ``lib`` itself, or a ``.tar`` linked here when a compiler for it exists."""
    if lib.suffix != ".tar":
        return lib
    from tvm.contrib import cc, tar

    cxx = cross_cxx(meta["target"]) if foreign_arch(meta["target"]) else shutil.which("g++")
    if cxx is None:
        logger.info("no compiler here links %s for %s; the server links it", lib.name, meta["target"])
        return lib
    objects = workdir / "objects"
    objects.mkdir()
    tar.untar(str(lib), str(objects))
    shared = workdir / (lib.stem + ".so")
    cc.create_shared(str(shared), sorted(str(p) for p in objects.iterdir()), cc=cxx)
    logger.info("linked %s with %s", lib.name, cxx)
    return shared


def run_remote(lib_path, address: str, inputs: Mapping[str, np.ndarray] | None = None,
               positional: Sequence[np.ndarray] = (), repeat: int = 0, session_timeout: float = 0) -> RunResult:
    """Run a library written by :func:`tvm_ext.tools.deploy.compile_library` on a TVM RPC server.

    Parameters
    ----------
    lib_path : str or os.PathLike
        A ``.so`` or ``.tar`` with its sidecar ``<lib>.json``.
    address : str
        ``HOST:PORT`` of ``python -m tvm.exec.rpc_server``.
    inputs, positional
        As :func:`tvm_ext.tools.deploy.run_library`.
    repeat : int
        When > 0, the median of ``repeat`` timed runs on the remote (``time_evaluator``), in ms.
    session_timeout : float
        Seconds before the server ends the session (0: none).

    Returns
    -------
    tvm_ext.tools.deploy.RunResult
        ``meta`` is the sidecar plus ``"rpc": address``.

    Raises
    ------
    DeployError
        See :func:`parse_address`, :func:`tvm_ext.tools.deploy.read_sidecar`,
        :func:`tvm_ext.tools.deploy.match_inputs`; no server at ``address``; the server cannot load
        or run the library.
    """
    import tvm
    from tvm import rpc
    from tvm.contrib import graph_executor

    if repeat < 0:
        raise DeployError(f"run_remote: repeat must be >= 0, got {repeat}")
    host, port = parse_address(address)
    lib = Path(lib_path)
    meta = read_sidecar(lib)
    feed = match_inputs(meta, inputs, positional)
    with tempfile.TemporaryDirectory(prefix="tvm_ext_rpc_") as tmp:
        upload = _shared_object(lib, meta, Path(tmp))
        try:
            sess = rpc.connect(host, port, session_timeout=session_timeout)
        except (tvm.TVMError, OSError, RuntimeError) as err:
            raise DeployError(f"cannot reach a TVM RPC server at {host}:{port} ({_last_line(err)})") from None
        # a name per content: a server keeps one work folder per session, and boards are shared
        name = f"{lib.stem}-{hashlib.sha256(upload.read_bytes()).hexdigest()[:12]}{upload.suffix}"
        try:
            sess.upload(str(upload), name)
            factory = sess.load_module(name)["default"]
        except tvm.TVMError as err:
            raise DeployError(f"the server at {host}:{port} could not load {upload.name} built for "
                              f"{meta['target']} ({_last_line(err)})") from None
    dev = sess.cpu(0)
    gm = graph_executor.GraphModule(factory(dev))
    for key, arr in feed.items():
        gm.set_input(key, arr)
    gm.run()
    outputs = [gm.get_output(i).numpy() for i in range(gm.get_num_outputs())]
    latency = None
    if repeat:
        timer = gm.module.time_evaluator("run", dev, number=1, repeat=repeat)
        latency = statistics.median(timer().results) * 1e3
    return RunResult(outputs, latency, repeat, {**meta, "rpc": f"{host}:{port}"})
