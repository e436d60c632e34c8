"""Exact fixed-point requantization on aarch64: TVM's generic ``q_multiply_shift`` while tvm-ext builds.

Design note
-----------
``qnn.requantize`` lowers to ``tir.q_multiply_shift(x, m, 31, s)``: ``round(x * m / 2^(31 + s))``,
rounded once (TVM's generic lowering, in int64). TVM 0.19 registers an aarch64 lowering
(``tvm.topi.arm_cpu.tensor_intrin._q_multiply_shift_arm``, NEON ``sqrdmulh`` then ``srshl``) that
rounds twice, ``round(round(x * m / 2^31) / 2^s)``; its own docstring says so. That is one output
step off on some values, and through a network it adds up: a QDQ ResNet-50 built by stock TVM for
``neoverse-n1 +dotprod`` differs from the exact build in 773 of 1000 logits, by up to 6 steps, run
under qemu (``docs/arm.md``).

:func:`generic_q_multiply_shift` registers, for as long as it is entered, a lowering for
``llvm.aarch64`` that leaves the call alone, so TVM's generic lowering applies::

    # q_multiply_shift(x, m, 31, s) on aarch64: sqrdmulh + srshl  ->  round(x * m / 2^(31 + s)) in int64

and registers TVM's again on the outermost exit. Lowering rules are process-wide: the replacement
is re-entrant and shared by threads (:class:`tvm_ext._patch.Patch`); each registration takes a
higher priority level than the last, since TVM keeps the highest.
"""
from __future__ import annotations

import contextlib
import itertools
import logging

from tvm.ir import register_intrin_lowering

from .._patch import Patch

logger = logging.getLogger(__name__)

__all__ = ["generic_q_multiply_shift", "AARCH64_LOWERING"]

#: The target key TVM's aarch64 lowering of ``q_multiply_shift`` is registered under.
AARCH64_LOWERING = "llvm.aarch64"
#: Priority levels above TVM's own registration (``level=99``); one more for every registration.
_LEVELS = itertools.count(200)


def _register(lowering) -> None:
    register_intrin_lowering("tir.q_multiply_shift", target=AARCH64_LOWERING, f=lowering, level=next(_LEVELS))


def _install():
    logger.debug("aarch64: TVM's generic q_multiply_shift lowering (one rounding)")
    _register(lambda op: op)  # unchanged here: LowerIntrin goes on to TVM's generic rule


def _uninstall():
    from tvm.topi.arm_cpu.tensor_intrin import _q_multiply_shift_arm

    _register(_q_multiply_shift_arm)


_PATCH = Patch(_install, _uninstall)


@contextlib.contextmanager
def generic_q_multiply_shift():
    """Enter to lower ``q_multiply_shift`` on aarch64 as TVM does on every other CPU (one
    rounding: exact integer requantization) instead of with ``sqrdmulh`` + ``srshl``."""
    with _PATCH.entered():
        yield
