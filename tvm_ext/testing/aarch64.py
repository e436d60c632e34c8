"""Run aarch64 TVM libraries on an x86-64 host: TVM's RPC server under qemu-user.

``make arm-env`` (``tests/arm/arm-env.sh``) leaves in ``.arm/`` (or ``$TVM_EXT_ARM_DIR``) an aarch64
Python 3.11 sysroot with TVM 0.19's aarch64 wheel and ``bin/python3.11``, a wrapper that runs it
under ``qemu-aarch64`` with ``TVM_USE_RUNTIME_LIB=1``. :func:`find_env` finds that set-up or raises
:class:`ArmEnvMissing` naming what is missing (:func:`missing`: the same as a string, for
``pytest.skip``).

:func:`rpc_server` starts ``python -m tvm.exec.rpc_server`` through the wrapper on 127.0.0.1 and a
free port (optionally registered with a tracker under a key, :func:`rpc_tracker`; ``cpu=`` picks the
CPU qemu emulates, e.g. ``cortex-a72`` without dotprod), waits until it listens, and kills its
process group on exit or when the thread that started it exits. Its sessions register
``tvm_ext.tools._remote.EMULATION_FUNC`` so that clients label what they measured as emulated.
docs/arm.md (where it says how the server runs under qemu-user) has the details.

``python -m tvm_ext.testing.aarch64 [--port N] [--cpu CPU] [--tracker HOST:PORT --key KEY]`` serves
until interrupted, for ``tvm-ext run/bench/tune --rpc`` by hand.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

logger = logging.getLogger(__name__)

__all__ = ["ArmEnv", "ArmEnvMissing", "RPCServer", "find_env", "missing", "rpc_server", "board_server", "default_dir",
           "run_on_session", "load_on_session", "rpc_tracker", "CROSS_CXX", "TARGETS", "EMULATION_LABEL"]

#: The cross compiler export_library links aarch64 libraries with.
CROSS_CXX = "aarch64-linux-gnu-g++"

#: LLVM targets of the three ARM classes (NEON only; +dotprod; +i8mm), the names docs/arm.md uses.
TARGETS = {
    "cortex-a72": "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72 -mattr=+neon",
    "neoverse-n1": "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1 -mattr=+neon,+dotprod",
    "neoverse-v1": "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-v1 -mattr=+neon,+dotprod,+i8mm",
}

_SETUP_HINT = "run `make arm-env` (docs/arm.md)"


class ArmEnvMissing(RuntimeError):
    """The aarch64 emulation set-up is incomplete (the message names what is missing)."""


@dataclass(frozen=True)
class ArmEnv:
    """A usable set-up: the folder, the wrapper (an executable the host can exec), qemu, the cross
    compiler (None when absent: libraries can then only be written as ``.tar``)."""

    root: Path
    python: Path
    qemu: str
    cxx: Optional[str]

    @property
    def sysroot(self) -> Path:
        return self.root / "sysroot"


def default_dir() -> Path:
    """``$TVM_EXT_ARM_DIR``, else ``.arm`` in the repository holding this package."""
    env = os.environ.get("TVM_EXT_ARM_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".arm"


def find_env(root=None, need_cxx: bool = True) -> ArmEnv:
    """The set-up in ``root`` (default :func:`default_dir`).

    Raises
    ------
    ArmEnvMissing
        qemu-aarch64 not on PATH, no sysroot or wrapper in ``root``, or (``need_cxx``) no
        aarch64-linux-gnu-g++; the message lists every missing piece.
    """
    root = Path(root) if root is not None else default_dir()
    gaps = []
    qemu = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
    if not qemu:
        gaps.append("qemu-aarch64 is not on PATH (Debian: qemu-user)")
    cxx = shutil.which(CROSS_CXX)
    if need_cxx and not cxx:
        gaps.append(f"{CROSS_CXX} is not on PATH (Debian: g++-aarch64-linux-gnu)")
    python = root / "bin" / "python3.11"
    if not (root / "sysroot" / "usr" / "bin" / "python3.11").is_file():
        gaps.append(f"no aarch64 Python sysroot in {root}/sysroot")
    elif not (root / "sysroot" / "usr" / "lib" / "python3" / "dist-packages" / "tvm" / "libtvm_runtime.so").is_file():
        gaps.append(f"no aarch64 TVM runtime in {root}/sysroot")
    if not os.access(python, os.X_OK):
        gaps.append(f"no executable wrapper {python}")
    if gaps:
        raise ArmEnvMissing("aarch64 emulation set-up incomplete: " + "; ".join(gaps) + f"; {_SETUP_HINT}")
    return ArmEnv(root, python, qemu, cxx)


def missing(root=None, need_cxx: bool = True) -> Optional[str]:
    """Why :func:`find_env` would fail, or None when the set-up is complete."""
    try:
        find_env(root, need_cxx)
    except ArmEnvMissing as err:
        return str(err)
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepts(host: str, port: int) -> bool:
    """A TCP connection to the server is accepted. It sends a magic number that is not TVM's, which
    the server's listen loop answers by closing the connection and waiting for the next one."""
    try:
        with socket.create_connection((host, port), timeout=2) as s:
            s.sendall(b"\0\0\0\0")
        return True
    except OSError:
        return False


# Runs in the aarch64 Python: TVM's own server (rpc.Server, as ``python -m tvm.exec.rpc_server`` makes it),
# with sys.executable naming the wrapper so that the PopenWorker it starts is exec'd through qemu, and
# a server_init_callback that registers tvm_ext.tools._remote.EMULATION_FUNC in that worker (every
# session is a fork of it): a client can tell the server is emulated.
# SIGTERM (sent by _kill_group, or by the kernel when the process that started the server dies: see
# _die_with_parent) ends the whole process group: TVM's PopenWorker child would otherwise outlive it.
_SERVER_MAIN = """\
import logging, os, signal, sys
sys.executable = {python!r}
signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
logging.basicConfig(level=logging.INFO)
from tvm import rpc

def _say_emulated():
    import tvm
    tvm.register_func({func!r}, lambda: {label!r}, override=True)

server = rpc.Server({host!r}, {port}, {port_end}, key={key!r}, tracker_addr={tracker!r},
                    server_init_callback=_say_emulated)
server.proc.join()
"""

#: What the emulated server answers when asked what emulates it (tvm_ext.tools._remote.emulation).
EMULATION_LABEL = "qemu-user"


def _die_with_parent():
    """A ``preexec_fn`` that asks Linux for SIGTERM when the thread that started the server exits
    (PR_SET_PDEATHSIG, kept across exec), so a killed test process leaves no emulated server
    behind. prctl is looked up here, before the fork: the child only calls it."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


@dataclass
class RPCServer:
    """A running emulated server: ``host``, ``port``, and, for the process that started it, the
    process and its log lines so far (None and empty for a server another process started)."""

    host: str
    port: int
    proc: Optional[subprocess.Popen] = None
    log: list = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def connect(self, session_timeout: float = 0):
        """``tvm.rpc.connect`` to this server."""
        from tvm import rpc

        return rpc.connect(self.host, self.port, session_timeout=session_timeout)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (the server, its PopenWorker child, forked sessions),
    then SIGKILL to whatever of the group is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)


@contextlib.contextmanager
def rpc_server(env: Optional[ArmEnv] = None, port: Optional[int] = None, start_timeout: float = 300.0,
               tracker: Optional[str] = None, key: str = "", cpu: Optional[str] = None) -> Iterator[RPCServer]:
    """TVM's RPC server in the emulated aarch64 Python, on 127.0.0.1.

    Parameters
    ----------
    env : ArmEnv, optional
        Default :func:`find_env` (without requiring the cross compiler: the server does not link).
    port : int, optional
        Default: a free port.
    start_timeout : float
        Seconds to wait for the server to listen (its start imports TVM twice under emulation).
    tracker, key : str, optional
        ``HOST:PORT`` of a TVM RPC tracker to register with, under ``key`` (then clients reach the
        server through the tracker only: it accepts the match key the tracker hands out).
    cpu : str, optional
        The CPU qemu emulates (``QEMU_CPU``: ``cortex-a72``, ``neoverse-n1``, ...; ``qemu-aarch64 -cpu
        help`` lists them). Default qemu's ``max``, which has every feature qemu implements.

    Yields
    ------
    RPCServer

    Raises
    ------
    ArmEnvMissing
        The set-up is incomplete.
    RuntimeError
        The server exited or did not listen within ``start_timeout`` (its log is in the message).
    """
    env = env or find_env(need_cxx=False)
    port = port or _free_port()
    host = "127.0.0.1"
    from ..tools._remote import EMULATION_FUNC, parse_address

    if tracker and not key:
        raise ValueError("rpc_server: a server registered with a tracker needs a key")
    tracker_addr = parse_address(tracker) if tracker else None
    main = _SERVER_MAIN.format(python=str(env.python), func=EMULATION_FUNC, label=EMULATION_LABEL, host=host,
                               port=port, port_end=port + 1, key=key, tracker=tracker_addr)
    cmd = [str(env.python), "-c", main]
    logger.info("starting aarch64 RPC server under qemu (cpu %s): %s:%d", cpu or "max", host, port)
    with _serve(cmd, cpu, None, start_timeout, f"{host}:{port}") as (proc, log, _address):
        yield RPCServer(host, port, proc, log)


def _qemu_environ(cpu: Optional[str], env_vars: Optional[dict]) -> dict:
    environ = dict(os.environ)
    environ.pop("QEMU_CPU", None)
    environ.update(env_vars or {})
    if cpu:
        environ["QEMU_CPU"] = cpu  # qemu-user reads it; the server's worker and sessions inherit it
    return environ


@contextlib.contextmanager
def _serve(cmd: list, cpu: Optional[str], env_vars: Optional[dict], start_timeout: float,
           address: Optional[str]) -> Iterator[tuple]:
    """Start a server process, wait until it binds (``address``, or the first ``bind to HOST:PORT`` it
    logs when None) and accepts connections; yield ``(proc, log, "HOST:PORT")``; kill its group on exit."""
    import re

    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env=_qemu_environ(cpu, env_vars),
                            preexec_fn=_die_with_parent() if sys.platform == "linux" else None)
    log: list = []
    bound: dict = {}
    listening = threading.Event()

    def _read():
        for line in proc.stdout:
            log.append(line.rstrip("\n"))
            logger.debug("rpc server: %s", log[-1])
            found = re.search(r"bind to (\S+):(\d+)", line)
            if found and (address is None or f"{found[1]}:{found[2]}" == address):
                bound["address"] = f"{found[1]}:{found[2]}"
                listening.set()

    reader = threading.Thread(target=_read, daemon=True)
    reader.start()
    try:
        t0 = time.monotonic()
        while not listening.wait(0.2):
            if proc.poll() is not None or time.monotonic() - t0 > start_timeout:
                why = (f"exited with code {proc.returncode}" if proc.poll() is not None
                       else f"did not listen within {start_timeout:g} s")
                tail = "\n".join(log[-20:])
                raise RuntimeError(f"rpc_server: the aarch64 TVM RPC server {why}; its log:\n{tail}")
        host, _, port = bound["address"].rpartition(":")
        # TVM logs "bind to" before listen(): wait until a connection is accepted
        while not _accepts(host, int(port)):
            if proc.poll() is not None or time.monotonic() - t0 > start_timeout:
                raise RuntimeError(f"rpc_server: the aarch64 TVM RPC server bound {host}:{port} but does not "
                                   f"accept connections; its log:\n" + "\n".join(log[-20:]))
            time.sleep(0.2)
        logger.info("aarch64 RPC server listening on %s:%s after %.1f s", host, port, time.monotonic() - t0)
        yield proc, log, bound["address"]
    finally:
        _kill_group(proc)
        reader.join(5)


# ``python -m tvm.exec.rpc_server ARGS`` as a board runs it, in the emulated Python: sys.executable names
# the wrapper (the PopenWorker it starts must be exec'd through qemu) and SIGTERM ends the process group.
_MODULE_MAIN = """\
import os, runpy, signal, sys
sys.executable = {python!r}
signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
sys.argv = ["rpc_server", *{args!r}]
runpy.run_module("tvm.exec.rpc_server", run_name="__main__", alter_sys=True)
"""


@contextlib.contextmanager
def board_server(args, env_vars: Optional[dict] = None, cpu: Optional[str] = None, env: Optional[ArmEnv] = None,
                 start_timeout: float = 300.0) -> Iterator[RPCServer]:
    """``VARS python -m tvm.exec.rpc_server ARGS``, the command a board runs (docs/arm.md), in the
    emulated Python: ``args`` are the server's own (``--host``, ``--port``, ``--tracker``, ``--key``),
    ``env_vars`` the variables set on the command line (``TVM_NUM_THREADS``), ``cpu`` the CPU qemu
    emulates (``QEMU_CPU``). Yields the server once it accepts connections at the address it bound.

    Raises
    ------
    ArmEnvMissing
        The set-up is incomplete.
    RuntimeError
        The server exited or did not listen within ``start_timeout`` (its log is in the message).
    """
    env = env or find_env(need_cxx=False)
    cmd = [str(env.python), "-c", _MODULE_MAIN.format(python=str(env.python), args=[str(a) for a in args])]
    logger.info("starting python -m tvm.exec.rpc_server %s under qemu (cpu %s)", " ".join(map(str, args)),
                cpu or "max")
    with _serve(cmd, cpu, env_vars, start_timeout, None) as (proc, log, address):
        host, _, port = address.rpartition(":")
        yield RPCServer("127.0.0.1" if host == "0.0.0.0" else host, int(port), proc, log)


@contextlib.contextmanager
def rpc_tracker(start_timeout: float = 60.0) -> Iterator[str]:
    """TVM's tracker (``python -m tvm.exec.rpc_tracker``, this host's Python) on 127.0.0.1 and a free
    port, for :func:`rpc_server`'s ``tracker=``; yields its ``HOST:PORT``. Its process group (the
    tracker runs in a child of that process) is killed on exit.

    Raises
    ------
    RuntimeError
        The tracker exited or did not listen within ``start_timeout``.
    """
    port = _free_port()
    cmd = [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
           "--port-end", str(port + 1), "--silent"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=_die_with_parent() if sys.platform == "linux" else None)
    try:
        t0 = time.monotonic()
        while not _accepts("127.0.0.1", port):
            if proc.poll() is not None or time.monotonic() - t0 > start_timeout:
                raise RuntimeError(f"rpc_tracker: TVM's RPC tracker did not listen on 127.0.0.1:{port} "
                                   f"(exit code {proc.poll()})")
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        _kill_group(proc)


def load_on_session(session, factory, workdir, name: str = "lib"):
    """Link a built module for aarch64 (``export_library`` with :data:`CROSS_CXX`) in ``workdir``,
    upload it through ``session`` (``tvm.rpc.connect``) as ``<name>.so`` and load it there: a
    ``graph_executor.GraphModule`` on the remote CPU."""
    from tvm.contrib import graph_executor

    cxx = shutil.which(CROSS_CXX)
    if cxx is None:
        raise ArmEnvMissing(f"load_on_session: {CROSS_CXX} is not on PATH (Debian: g++-aarch64-linux-gnu); "
                            f"{_SETUP_HINT}")
    path = Path(workdir) / f"{name}.so"
    factory.export_library(str(path), cc=cxx)
    session.upload(str(path))
    return graph_executor.GraphModule(session.load_module(path.name)["default"](session.cpu(0)))


def run_on_session(session, factory, inputs: dict, workdir, name: str = "lib") -> list:
    """Link a built module for aarch64, upload it through ``session``, run it with ``graph_executor``
    there (:func:`load_on_session`); the outputs as numpy arrays.

    ``factory`` is what ``relay.build`` (or :func:`tvm_ext.build`) returned for an aarch64 target.
    """
    gm = load_on_session(session, factory, workdir, name)
    for key, arr in inputs.items():
        gm.set_input(key, arr)
    gm.run()
    return [gm.get_output(i).numpy() for i in range(gm.get_num_outputs())]


def main(argv=None) -> int:  # pragma: no cover - interactive
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tvm_ext.testing.aarch64",
                                     description="Serve TVM RPC from the emulated aarch64 Python until interrupted.")
    parser.add_argument("--port", type=int, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--tracker", metavar="HOST:PORT", help="register with this TVM RPC tracker (needs --key)")
    parser.add_argument("--key", default="", help="the key to register under (e.g. qemu-aarch64)")
    parser.add_argument("--cpu", help="the CPU qemu emulates (QEMU_CPU, e.g. cortex-a72; default max)")
    args = parser.parse_args(argv)
    if args.tracker and not args.key:
        parser.error("--tracker needs --key")
    try:
        with rpc_server(port=args.port, tracker=args.tracker, key=args.key, cpu=args.cpu) as server:
            via = f", registered with the tracker {args.tracker} as {args.key!r}" if args.tracker else ""
            print(f"aarch64 TVM RPC server (qemu-user) listening on {server.address}{via}; Ctrl-C stops it",
                  flush=True)
            server.proc.wait()
    except ArmEnvMissing as err:
        print(f"error: {err}")
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
