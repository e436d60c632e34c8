"""An inference engine in a child process, driven over pipes: the benchmark's peers that must not
share the benchmark's process.

Contract
--------
The child runs ``python -c <prelude + serve loop>``. The prelude (engine-specific source text) defines
``setup(cfg) -> (info, run)``: ``cfg`` is the dict the parent sends first, ``info`` a picklable dict
sent back once, ``run(x)`` returns the engine's first output for one input array. The loop then
answers ``("run", x, 1)`` with that output and ``("time", x, n)`` with ``n`` latencies in ms
measured *in the child* (the pipe is not in the numbers). A setup that raises is answered with
``{"error": "..."}`` and the child exits; the parent raises the caller's error class with it.

Used by :class:`tvm_ext.tools.ort_isa.ChildSession` (ONNX Runtime from a masked package) and
:class:`tvm_ext.tools.openvino_peer.ChildOpenVINO` (OpenVINO under ``ONEDNN_MAX_CPU_ISA``): both
need a process of their own because what they change is read once, when the library loads.
"""
from __future__ import annotations

import pickle
import subprocess
import sys
from typing import Optional

__all__ = ["PipeChild"]

_SERVE_LOOP = r"""
import pickle, sys, time
inp, out = sys.stdin.buffer, sys.stdout.buffer
sys.stdout = sys.stderr  # nothing but replies on the pipe
cfg = pickle.load(inp)
try:
    info, run = setup(cfg)
except Exception as err:
    pickle.dump({"error": f"{type(err).__name__}: {err}"}, out); out.flush()
    sys.exit(0)
pickle.dump(info, out); out.flush()
while True:
    try:
        op, x, n = pickle.load(inp)
    except EOFError:
        break
    if op == "run":
        reply = run(x)
    else:
        reply = []
        for _ in range(n):
            t0 = time.perf_counter()
            run(x)
            reply.append((time.perf_counter() - t0) * 1e3)
    pickle.dump(reply, out); out.flush()
"""


class PipeChild:
    """A child process serving one model (see the module note).

    Parameters
    ----------
    prelude : str
        Source defining ``setup(cfg)``.
    cfg : dict
        Sent to ``setup``.
    env : dict, optional
        The child's environment (default: this process's).
    error : type
        Exception class raised when the child fails or ends.
    what : str
        Names the engine in error messages.
    """

    def __init__(self, prelude: str, cfg: dict, *, env: Optional[dict] = None, error: type = RuntimeError,
                 what: str = "engine"):
        self._error, self._what = error, what
        self._proc = subprocess.Popen([sys.executable, "-c", prelude + _SERVE_LOOP], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, env=env)
        self._send(cfg)
        info = self._recv()
        if isinstance(info, dict) and "error" in info:
            self.close()
            raise error(f"{what}: the child process could not load the model: {info['error']}")
        self.info = info

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _send(self, obj) -> None:
        pickle.dump(obj, self._proc.stdin)
        self._proc.stdin.flush()

    def _recv(self):
        try:
            return pickle.load(self._proc.stdout)
        except EOFError:
            code = self._proc.wait()
            raise self._error(f"{self._what}: the child process ended (exit {code})") from None

    def run(self, x):
        """The engine's first output for ``x``."""
        self._send(("run", x, 1))
        return self._recv()

    def time(self, x, n: int) -> list:
        """``n`` latencies in ms, measured in the child."""
        self._send(("time", x, int(n)))
        return self._recv()

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
