"""TVM's GPU schedules of pools, softmax and transposed convs, with the stages fused in front of them inlined.

FuseOps never puts a producer into the kernel of a pool (``kOutEWiseFusable``) or of a softmax, so
TVM's GPU schedules for them (``topi/cuda/pooling.py``, ``topi/cuda/softmax.py``, taken by every
target with the ``gpu`` key) schedule the anchor and the elementwise ops after it, and leave a stage
in front of the anchor at the root of the kernel with no thread binding: lowering then fails with
"Memory verification failed". ``FuseWideningIntoPool`` makes such kernels on purpose (the widening
chain of an 8-bit value, then the pool or softmax reading it, one ``Primitive`` function), and so does
``DequantizeInConvTranspose`` (the dequantize in front of a transposed conv, whose GPU schedule,
``topi/cuda/conv2d_transpose.py``, stages its dilated input in shared memory and inlines what follows).

:func:`producers_inlined` wraps those schedules, while it is entered, so that every injective stage
in front of the anchor is inlined into it (``compute_inline``): the same expression per element,
evaluated where the anchor reads it. Stages after the anchor are TVM's as before. A kernel that has
no such stage (every kernel FuseOps makes by itself) gets TVM's schedule unchanged. The GPU back end
enters it for every GPU build (:mod:`tvm_ext.gpu.backend`); like the x86 schedule changes it is
process-wide while entered (:class:`tvm_ext._patch.Patch`) and TVM's functions come back on exit.
"""
from __future__ import annotations

import contextlib
import functools

from .._patch import Patch

__all__ = ["producers_inlined", "inline_producers"]

_SAVED: dict = {}


def inline_producers(s, outs) -> int:
    """Inline every injective stage of schedule ``s`` that is not one of ``outs``' ops (the stages
    in front of the anchor); returns how many were inlined."""
    from tvm import te
    from tvm.topi import tag

    outs = [outs] if isinstance(outs, te.tensor.Tensor) else list(outs)
    out_ops = {o.op for o in outs}
    seen, stack, count = set(), [o.op for o in outs], 0
    while stack:
        op = stack.pop()
        if op in seen or not isinstance(op, te.tensor.ComputeOp):
            continue
        seen.add(op)
        if tag.is_injective(op.tag) and op not in out_ops:
            s[op].compute_inline()
            count += 1
        stack.extend(t.op for t in op.input_tensors)
    return count


def _inlining_producers(schedule_fn):
    """``schedule_fn`` (TVM's GPU pool or transposed-conv schedule), then the stages in front of the
    anchor inlined."""

    @functools.wraps(schedule_fn)
    def wrapped(outs, *args, **kwargs):
        s = schedule_fn(outs, *args, **kwargs)
        inline_producers(s, outs)
        return s

    return wrapped


def _softmax_schedule(schedule_fn):
    """``schedule_fn`` (``topi.cuda.softmax._schedule_softmax(op, s, outs, tgt)``), then the stages
    in front of the softmax inlined."""

    @functools.wraps(schedule_fn)
    def wrapped(softmax_op, s, outs, tgt):
        out = schedule_fn(softmax_op, s, outs, tgt)
        inline_producers(s, outs)
        return out

    return wrapped


def _install():
    import tvm.topi.cuda as cuda
    import tvm.topi.cuda.softmax as softmax

    _SAVED["pools"] = (cuda.schedule_pool, cuda.schedule_adaptive_pool)
    _SAVED["conv_transpose"] = cuda.schedule_conv2d_transpose_nchw
    _SAVED["softmax"] = softmax._schedule_softmax  # pylint: disable=protected-access
    cuda.schedule_pool = _inlining_producers(cuda.schedule_pool)
    cuda.schedule_adaptive_pool = _inlining_producers(cuda.schedule_adaptive_pool)
    # the dequantize is inlined into the dilated, padded input, which the schedule loads into shared memory
    cuda.schedule_conv2d_transpose_nchw = _inlining_producers(cuda.schedule_conv2d_transpose_nchw)
    # the softmax strategies hold topi.cuda.schedule_softmax itself; it calls this module global
    softmax._schedule_softmax = _softmax_schedule(softmax._schedule_softmax)  # pylint: disable=protected-access


def _uninstall():
    import tvm.topi.cuda as cuda
    import tvm.topi.cuda.softmax as softmax

    cuda.schedule_pool, cuda.schedule_adaptive_pool = _SAVED.pop("pools")
    cuda.schedule_conv2d_transpose_nchw = _SAVED.pop("conv_transpose")
    softmax._schedule_softmax = _SAVED.pop("softmax")  # pylint: disable=protected-access


_PATCH = Patch(_install, _uninstall)


@contextlib.contextmanager
def producers_inlined():
    """Enter to build GPU kernels whose pool or softmax reads stages fused in front of it (see the
    module note). Re-entrant and thread-safe; TVM's schedules are restored when the outermost entry
    exits."""
    with _PATCH.entered():
        yield
