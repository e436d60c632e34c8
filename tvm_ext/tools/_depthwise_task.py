"""x86 depthwise conv tasks that time the kernel ``tvm_ext.build`` compiles, for ``tvm-ext tune``.

Design note
-----------
AutoTVM's task table holds TVM's own compute and schedule for ``depthwise_conv2d_NCHWc.x86``, captured
when TVM registered them; :func:`tvm_ext.x86.int8_conv.kernels` replaces the TOPI functions a build
calls (the tap kernels of :mod:`tvm_ext.x86.depthwise_taps`), not that table. A task from
``autotvm.task.create`` would therefore time TVM's kernel (one widened tap per lane) and offer only
TVM's knobs. :func:`create` gives the task the template a build uses: the TOPI functions as they are
when it runs (inside ``kernels()``, tvm-ext's, with the tap form's knob), and the config space they
define. Records keep TVM's task name and workload, so builds apply them as before.
"""
from __future__ import annotations

__all__ = ["create"]


def _template(*args):
    """``(schedule, buffers)`` of the depthwise conv ``args`` (a serialized workload's arguments) through
    TOPI's x86 depthwise compute and schedule as they are now (``kernels()`` installs tvm-ext's)."""
    from tvm import topi
    from tvm.autotvm.task.task import deserialize_args

    data, kernel, *rest = deserialize_args(args)
    out = topi.x86.depthwise_conv2d_NCHWc(data, kernel, *rest)
    return topi.x86.schedule_depthwise_conv2d_NCHWc([out]), [data, kernel, out]


def create(workload, target):
    """``autotvm.task.create`` for ``workload``; for an x86 depthwise conv, with the template and config
    space of the kernel ``tvm_ext.build`` compiles (module note)."""
    from tvm import autotvm
    from tvm.autotvm.task.space import ConfigSpace

    from ..x86 import int8_conv, tuning

    task = autotvm.task.create(workload[0], args=workload[1:], target=target)
    if workload[0] != tuning.DEPTHWISE_TASK:
        return task
    space = ConfigSpace()
    with int8_conv.kernels(), target, autotvm.task.ApplyConfig(space):
        _template(*task.args)
    task.func = _template
    task.config_space = space
    return task
