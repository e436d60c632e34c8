"""Reaching remote boards through TVM RPC: what ``run --rpc``, ``bench --rpc`` and ``tune --rpc/--tracker`` share.

Design note
-----------
A leaf below :mod:`tvm_ext.tools.rpc`, :mod:`tvm_ext.tools.bench` and :mod:`tvm_ext.tools.tune_remote`
(it imports only :mod:`tvm_ext.tools.deploy`). A board is reached one of two ways:

* directly, ``HOST[:PORT]`` of ``python -m tvm.exec.rpc_server`` (:func:`connect`; ``--rpc``);
* through TVM's tracker, ``HOST[:PORT]`` of ``python -m tvm.exec.rpc_tracker`` and the key the boards
  registered with (:func:`request`; ``--rpc-tracker`` and ``--rpc-key``, as tvmc names them): the
  tracker hands out a free board of that key; several requests get several boards.

:func:`open_session` takes either. A port left out is 9090 (:data:`DEFAULT_PORT`), as in tvmc.

Every way of failing is one line (:class:`tvm_ext.tools.deploy.DeployError`): a malformed address,
nothing listening, a tracker that does not know the key, no board free within the timeout, a peer
that does not answer within it. TVM's own calls block without a bound (a server that serves another
session keeps the next client in its listen queue; a tracker keeps a request until a board is free),
so each is waited for in a daemon thread for at most ``timeout`` seconds.

:func:`emulation` asks the remote whether it is an emulator: the testing server of
:mod:`tvm_ext.testing.aarch64` registers :data:`EMULATION_FUNC` in its sessions and answers what
emulates it; a board has no such function and is not labelled.
"""
from __future__ import annotations

import hashlib
import logging
import shutil
import socket
import threading
from pathlib import Path
from typing import Callable, Optional

from .deploy import DeployError, cross_cxx, foreign_arch

logger = logging.getLogger(__name__)

__all__ = ["parse_address", "last_line", "connect", "request", "open_session", "tracker_keys", "emulation",
           "upload_and_load", "shared_object", "check_remote_target", "remote_device", "check_remote_options",
           "EMULATION_FUNC", "DEFAULT_TIMEOUT", "DEFAULT_PORT"]

#: The global function an emulated RPC server registers in its sessions; it returns what emulates it.
EMULATION_FUNC = "tvm_ext.testing.emulation"

#: Seconds to wait for a server's handshake or a tracker's free board.
DEFAULT_TIMEOUT = 60.0

#: The port of an address given without one (TVM's ``rpc_server`` and ``rpc_tracker`` default; tvmc's too).
DEFAULT_PORT = 9090


def parse_address(text: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """``"HOST[:PORT]"`` -> ``(host, port)``; the port defaults to ``default_port`` (9090, as tvmc and
    TVM's ``rpc_server``/``rpc_tracker``). An IPv6 address is written ``[ADDR]`` or ``[ADDR]:PORT``.

    Raises
    ------
    DeployError
        An empty host, a port that is not an integer in 1..65535, an IPv6 address without brackets.
    """
    text = str(text).strip()
    if text.startswith("["):
        host, close, rest = text[1:].partition("]")
        if not close or (rest and not rest.startswith(":")):
            raise DeployError(f"RPC address {text!r}: expected HOST[:PORT] ([ADDR]:PORT for IPv6)")
        port = rest[1:] if rest else None
    elif text.count(":") > 1:
        raise DeployError(f"RPC address {text!r}: write an IPv6 address as [ADDR] or [ADDR]:PORT")
    else:
        host, sep, port = text.partition(":")
        port = port if sep else None
    if not host:
        raise DeployError(f"RPC address {text!r}: expected HOST[:PORT]")
    if port is None:
        return host, int(default_port)
    try:
        number = int(port)
    except ValueError:
        raise DeployError(f"RPC address {text!r}: port {port!r} is not an integer") from None
    if not 0 < number < 65536:
        raise DeployError(f"RPC address {text!r}: port {number} is out of range")
    return host, number


def last_line(err: BaseException) -> str:
    """The last non-empty line of an error (TVM puts the cause there), or its type's name."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return lines[-1] if lines else type(err).__name__


def _within(timeout: float, fn: Callable, what: str):
    """``fn()``, waited for at most ``timeout`` seconds in a daemon thread (TVM's calls cannot be
    interrupted); its exception is re-raised here. A call still blocked is left to its thread."""
    box: dict = {}

    def call():
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001  re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=call, daemon=True, name=f"tvm-ext-rpc: {what}")
    thread.start()
    thread.join(timeout if timeout and timeout > 0 else None)
    if thread.is_alive():
        raise DeployError(f"{what}: no answer within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def connect(address: str, *, session_timeout: float = 0, timeout: float = DEFAULT_TIMEOUT):
    """A session on the RPC server at ``address`` (``tvm.rpc.connect``).

    Raises
    ------
    DeployError
        Malformed address; nothing listens there; no handshake within ``timeout`` (a server busy
        with another session, or not a TVM RPC server).
    """
    import tvm
    from tvm import rpc

    host, port = parse_address(address)
    try:
        return _within(timeout, lambda: rpc.connect(host, port, session_timeout=session_timeout),
                       f"the TVM RPC server at {host}:{port}")
    except (tvm.TVMError, OSError, RuntimeError) as err:
        raise DeployError(f"cannot reach a TVM RPC server at {host}:{port} ({last_line(err)})") from None


def _tracker(address: str, timeout: float):
    import tvm
    from tvm import rpc

    host, port = parse_address(address)
    try:
        # TVM's tracker client retries a refused connection for 60 s: a plain probe first
        socket.create_connection((host, port), timeout=min(timeout, 10) if timeout else 10).close()
        tracker = _within(timeout, lambda: rpc.connect_tracker(host, port), f"the TVM RPC tracker at {host}:{port}")
        summary = _within(timeout, tracker.summary, f"the TVM RPC tracker at {host}:{port}")
    except (tvm.TVMError, OSError, RuntimeError) as err:
        raise DeployError(f"cannot reach a TVM RPC tracker at {host}:{port} ({last_line(err)})") from None
    return tracker, summary, f"{host}:{port}"


def tracker_keys(summary: dict) -> dict:
    """``{key: boards registered}`` from a tracker's ``summary()``, free or busy (a server keeps its
    tracker connection, ``"server:KEY"``, while it serves a session)."""
    keys: dict = {}
    for info in summary.get("server_info", []):
        kind, _, key = str(info.get("key", "")).partition(":")
        if kind == "server" and key:
            keys[key] = keys.get(key, 0) + 1
    return keys


def request(address: str, key: str, *, session_timeout: float = 0, timeout: float = DEFAULT_TIMEOUT):
    """``(session, boards)``: a session on a free board of ``key`` from the tracker at ``address``,
    and how many boards of that key the tracker knows (what can measure in parallel).

    Raises
    ------
    DeployError
        Malformed address; no tracker there; no board registered with ``key`` (the message lists
        the keys it knows); no board free within ``timeout``.
    """
    import tvm

    tracker, summary, where = _tracker(address, timeout)
    keys = tracker_keys(summary)
    if key not in keys:
        known = ", ".join(sorted(keys)) or "none"
        raise DeployError(f"the TVM RPC tracker at {where} has no board with key {key!r} (keys: {known})")
    try:
        sess = _within(timeout, lambda: tracker.request(key, priority=1, session_timeout=session_timeout),
                       f"a free board with key {key!r} from the tracker at {where}")
    except (tvm.TVMError, OSError, RuntimeError) as err:
        raise DeployError(f"the TVM RPC tracker at {where} gave no board with key {key!r} ({last_line(err)})") from None
    return sess, keys[key]


def check_remote_options(rpc: Optional[str], tracker: Optional[str], key: Optional[str]) -> None:
    """One way to a remote: ``rpc`` (a server), or ``tracker`` with ``key``; neither is fine (no remote).

    Raises
    ------
    DeployError
        Both ``rpc`` and ``tracker``; ``tracker`` without ``key``; ``key`` without ``tracker``.
    """
    if rpc and tracker:
        raise DeployError("give --rpc HOST[:PORT] (a server) or --rpc-tracker HOST[:PORT] --rpc-key KEY, not both")
    if tracker and not key:
        raise DeployError(f"--rpc-tracker {tracker} needs --rpc-key KEY (the key the boards registered with)")
    if key and not tracker:
        raise DeployError("--rpc-key selects the boards of an --rpc-tracker; give --rpc-tracker HOST[:PORT] too")


def open_session(rpc: Optional[str] = None, tracker: Optional[str] = None, key: Optional[str] = None, *,
                 session_timeout: float = 0, timeout: float = DEFAULT_TIMEOUT) -> tuple:
    """``(session, where)``: a session on the server ``rpc``, or on a free board of ``key`` from
    ``tracker``; ``where`` names it for messages.

    Raises
    ------
    DeployError
        See :func:`check_remote_options` (and neither given), :func:`connect`, :func:`request`.
    """
    check_remote_options(rpc, tracker, key)
    if rpc:
        host, port = parse_address(rpc)
        return connect(rpc, session_timeout=session_timeout, timeout=timeout), f"{host}:{port}"
    if not tracker:
        raise DeployError("no remote: give --rpc HOST[:PORT] or --rpc-tracker HOST[:PORT] --rpc-key KEY")
    host, port = parse_address(tracker)
    sess, _boards = request(tracker, key, session_timeout=session_timeout, timeout=timeout)
    return sess, f"a board with key {key!r} from the tracker {host}:{port}"


def emulation(sess) -> Optional[str]:
    """What emulates the remote (the testing server says, e.g. ``"qemu-user"``), or None for a board."""
    try:
        return str(sess.get_function(EMULATION_FUNC)())
    except Exception:  # noqa: BLE001  a board has no such function: not emulated as far as we know
        return None


def shared_object(lib: Path, target: str, workdir: Path) -> Path:
    """The file to upload: ``lib`` itself, or a ``.tar`` linked here when a compiler for ``target`` exists
    (the cross compiler, :func:`tvm_ext.tools.deploy.cross_cxx`, or the system one for this host's
    architecture); else the ``.tar``, which the server links with its own compiler."""
    lib = Path(lib)
    if lib.suffix != ".tar":
        return lib
    from tvm.contrib import cc, tar

    cxx = cross_cxx(target) if foreign_arch(target) else shutil.which("g++")
    if cxx is None:
        logger.info("no compiler here links %s for %s; the server links it", lib.name, target)
        return lib
    objects = Path(workdir) / f"{lib.stem}-objects"
    objects.mkdir()
    tar.untar(str(lib), str(objects))
    shared = Path(workdir) / (lib.stem + ".so")
    cc.create_shared(str(shared), sorted(str(p) for p in objects.iterdir()), cc=cxx)
    logger.info("linked %s with %s", lib.name, cxx)
    return shared


def upload_and_load(sess, path: Path, target: str, where: str):
    """Upload ``path`` (a ``.so`` or ``.tar``) under a name per content and load it on the remote.

    A name per content: a server keeps one work folder per session, and boards are shared.

    Raises
    ------
    DeployError
        The server cannot load it (wrong architecture, no compiler for a ``.tar``).
    """
    import tvm

    path = Path(path)
    name = f"{path.stem}-{hashlib.sha256(path.read_bytes()).hexdigest()[:12]}{path.suffix}"
    try:
        sess.upload(str(path), name)
        return sess.load_module(name)
    except tvm.TVMError as err:
        raise DeployError(f"the server at {where} could not load {path.name} built for {target} "
                          f"({last_line(err)})") from None


def remote_device(sess, meta: dict, where: str) -> tuple:
    """``(device, words)``: the remote device a library's kernels run on, checked before anything is
    uploaded. A CPU library runs on ``sess.cpu(0)``; an ``opencl`` one (its ``target``) on
    ``sess.cl(0)``, which needs TVM's OpenCL runtime in the server's process: a TVM built with
    OpenCL, or the wheel's runtime plugin loaded by the server
    (``python -m tvm.exec.rpc_server --load-library .../libtvm_opencl_runtime.so``, docs/gpu.md).

    Raises
    ------
    DeployError
        An ``opencl`` library and a server without the OpenCL runtime, or whose runtime finds no device.
    """
    import tvm

    if tvm.target.Target(str(meta["target"])).kind.name != "opencl":
        return sess.cpu(0), "the CPU"
    try:
        sess.get_function("device_api.opencl")
        present = bool(sess.cl(0).exist)
    except (tvm.TVMError, AttributeError, RuntimeError) as err:
        if "device_api.opencl" not in str(err):
            raise DeployError(f"the server at {where} cannot tell whether it has an OpenCL device "
                              f"({last_line(err)})") from None
        raise DeployError(f"the server at {where} has no OpenCL runtime, which this opencl library needs: start it "
                          f"with `python -m tvm.exec.rpc_server --load-library <.gpu>/libtvm_opencl_runtime.so` "
                          f"(make gpu-env builds the plugin; docs/gpu.md)") from None
    if not present:
        raise DeployError(f"the server at {where} has TVM's OpenCL runtime but no OpenCL device (is an OpenCL "
                          f"driver such as pocl-opencl-icd installed there?)")
    return sess.cl(0), "OpenCL device 0 of the server"


def check_remote_target(target, remote: bool, command: Optional[str] = None) -> None:
    """Refuse a target that does not fit where the code runs.

    With a remote (``remote``), the target must name the board's CPU: a target of this host's
    architecture (or none) is refused. Without one, a target of another architecture is refused:
    its code cannot run here.

    Raises
    ------
    DeployError
        One line naming ``command`` (the function; the CLI names itself) and what to give instead.
    """
    arch = foreign_arch(target) if target is not None else None
    who = f"{command}: " if command else ""
    if remote and not arch:
        raise DeployError(f"{who}--rpc/--rpc-tracker measure on a remote board: give its --target "
                          f"(e.g. 'llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1 -mattr=+neon,+dotprod'); "
                          f"{'no --target' if target is None else repr(str(target))} is this host's architecture")
    if not remote and arch:
        raise DeployError(f"{who}target {str(target)!r} is for {arch.split('-')[0]}, which cannot run here; "
                          f"give --rpc HOST[:PORT] of a board (or --rpc-tracker HOST[:PORT] --rpc-key KEY)")
