"""Run a library written by ``tvm-ext compile`` on a remote TVM RPC server (``tvm-ext run --rpc``).

Design note
-----------
The remote is anything that runs ``python -m tvm.exec.rpc_server`` (a board; here, the aarch64
emulation of :mod:`tvm_ext.testing.aarch64`), reached directly or through a TVM tracker.
:func:`run_remote` reads the library's sidecar and checks the inputs first (as
:func:`tvm_ext.tools.deploy.run_library` does, without the host CPU check: the library runs over
there), then checks the remote CPU instead: it has every feature the library's target uses
(:func:`tvm_ext.tools._remote_cpu.check_remote_cpu`; a missing one would be SIGILL there). Then it
uploads a shared object, loads it with ``graph_executor`` through the session, runs it and fetches
the outputs. Timings (``repeat``) come from the remote's ``time_evaluator``. An ``opencl`` library
runs on the server's OpenCL device 0 (:func:`tvm_ext.tools._remote.remote_device`, checked first).

What is uploaded: a ``.so`` as it is. A ``.tar`` is linked here when a compiler for its
architecture is on PATH (the cross compiler, :func:`tvm_ext.tools.deploy.cross_cxx`, or the
system one for this host's architecture), else uploaded as it is, and the server links it with
its own C++ compiler (a board usually has one; the emulated set-up has none).

Failures (:class:`tvm_ext.tools.deploy.DeployError`, one line): a malformed address, no server
there, a library the server cannot load (wrong architecture, no compiler for a ``.tar``).
"""
from __future__ import annotations

import logging
import statistics
import tempfile
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from ._remote import DEFAULT_TIMEOUT, open_session, parse_address, remote_device, shared_object, upload_and_load
from ._remote_cpu import check_remote_cpu
from .deploy import DeployError, RunResult, match_inputs, read_sidecar

logger = logging.getLogger(__name__)

__all__ = ["parse_address", "run_remote"]


def run_remote(lib_path, address: Optional[str] = None, inputs: Mapping[str, np.ndarray] | None = None,
               positional: Sequence[np.ndarray] = (), repeat: int = 0, session_timeout: float = 0, *,
               tracker: Optional[str] = None, key: Optional[str] = None,
               timeout: float = DEFAULT_TIMEOUT) -> RunResult:
    """Run a library written by :func:`tvm_ext.tools.deploy.compile_library` on a TVM RPC server.

    Parameters
    ----------
    lib_path : str or os.PathLike
        A ``.so`` or ``.tar`` with its sidecar ``<lib>.json``.
    address : str, optional
        ``HOST[:PORT]`` of ``python -m tvm.exec.rpc_server`` (port 9090 by default).
    inputs, positional
        As :func:`tvm_ext.tools.deploy.run_library`.
    repeat : int
        When > 0, the median of ``repeat`` timed runs on the remote (``time_evaluator``), in ms.
    session_timeout : float
        Seconds before the server ends the session (0: none).
    tracker, key : str, optional
        Instead of ``address``: ``HOST[:PORT]`` of a TVM RPC tracker and the key of the boards to ask it for.
    timeout : float
        Seconds to wait for the server's handshake or a free board.

    Returns
    -------
    tvm_ext.tools.deploy.RunResult
        ``meta`` is the sidecar plus ``"rpc"`` (where it ran) and ``"remote_features"`` (the remote
        CPU's ``/proc/cpuinfo`` feature names, None when they could not be read).

    Raises
    ------
    DeployError
        See :func:`parse_address`, :func:`tvm_ext.tools.deploy.read_sidecar`,
        :func:`tvm_ext.tools.deploy.match_inputs`; no server at ``address`` (or no board of ``key``);
        the remote CPU lacks a feature the library uses
        (:func:`tvm_ext.tools._remote_cpu.check_remote_cpu`, checked before the library is loaded);
        the server cannot load or run the library.
    """
    from tvm.contrib import graph_executor

    if repeat < 0:
        raise DeployError(f"run_remote: repeat must be >= 0, got {repeat}")
    if address:
        parse_address(address)  # a malformed address is refused before anything is read
    lib = Path(lib_path)
    meta = read_sidecar(lib)
    feed = match_inputs(meta, inputs, positional)
    with tempfile.TemporaryDirectory(prefix="tvm_ext_rpc_") as tmp:
        upload = shared_object(lib, meta["target"], Path(tmp))
        sess, where = open_session(address, tracker, key, session_timeout=session_timeout, timeout=timeout)
        features = check_remote_cpu(sess, meta["target"], where, needed=meta.get("features"))
        dev, device = remote_device(sess, meta, where)
        factory = upload_and_load(sess, upload, meta["target"], where)["default"]
    gm = graph_executor.GraphModule(factory(dev))
    for key, arr in feed.items():
        gm.set_input(key, arr)
    gm.run()
    outputs = [gm.get_output(i).numpy() for i in range(gm.get_num_outputs())]
    latency = None
    if repeat:
        timer = gm.module.time_evaluator("run", dev, number=1, repeat=repeat)
        latency = statistics.median(timer().results) * 1e3
    return RunResult(outputs, latency, repeat, {**meta, "rpc": where, "device": device,
                                                "remote_features": sorted(features) if features is not None else None})
