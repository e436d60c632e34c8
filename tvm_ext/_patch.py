"""Re-entrant, thread-safe replacement of TVM functions for the duration of a ``with`` block.

:func:`tvm_ext.x86.int8_conv.kernels`, :func:`tvm_ext.x86.amx.tile_schedules`,
:func:`tvm_ext.arm.int8_conv.kernels`, :func:`tvm_ext.arm.requantize.generic_q_multiply_shift` and
:func:`tvm_ext.gpu.exact_float.fp_contract_off` replace TVM functions while a build runs. TOPI has
no per-thread state, so the replacement is process-wide: the outermost entry installs it, nested
entries (a build inside a build, two threads building at once) share it, and the outermost exit
restores TVM's functions.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable


class Patch:
    """``install(*args)`` on the outermost :meth:`entered`, ``uninstall()`` on its exit.

    Nested entries share the outermost entry's arguments (theirs are ignored).
    """

    def __init__(self, install: Callable[..., None], uninstall: Callable[[], None]):
        self._install, self._uninstall = install, uninstall
        self._lock = threading.RLock()
        self._depth = 0

    @property
    def active(self) -> bool:
        """True while some thread is inside :meth:`entered`."""
        return self._depth > 0

    @contextlib.contextmanager
    def entered(self, *args):
        with self._lock:
            if self._depth == 0:
                self._install(*args)
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._uninstall()
