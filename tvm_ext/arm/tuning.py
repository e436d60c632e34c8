"""aarch64 tuned int8 conv schedules: the records ``tvm-ext tune --rpc`` measured on a board.

Records of TVM's ``conv2d_NCHWc_int8.arm_cpu`` template and of :mod:`tvm_ext.arm.dot_conv`'s, in
``$TVM_EXT_CACHE/tuned/aarch64_int8_<mcpu>_<class>.log`` with the class ``neon``, ``dotprod`` or
``i8mm`` (:func:`tvm_ext.arm.isa.isa_class`), written by ``tvm-ext tune --rpc`` or ``--rpc-tracker``
(:mod:`tvm_ext.tools.tune_remote`) and applied by the aarch64 back end for that ``-mcpu`` and class.
None are shipped: no ARM board times here. The shared machinery is :mod:`tvm_ext._records`.
"""
from __future__ import annotations

from pathlib import Path

from .. import _records
from .isa import isa_class

__all__ = ["TASK", "DOT_TASK", "WIDENING_TASK", "CONV_TASKS", "DENSE_TASKS", "TASKS", "records_name", "user_path",
           "load_records", "apply", "target_key"]

#: TVM's int8 conv template on aarch64 (``sdot``/``udot``, ``smull`` with NEON only).
TASK = "conv2d_NCHWc_int8.arm_cpu"
#: tvm-ext's NCHW4c convs in register tiles (:mod:`tvm_ext.arm.dot_conv`): ``sdot`` and ``smull`` + ``sadalp``.
DOT_TASK = "conv2d_NCHWc_dot.tvm_ext"
WIDENING_TASK = "conv2d_NCHWc_smull.tvm_ext"
CONV_TASKS = (TASK, DOT_TASK, WIDENING_TASK)
DENSE_TASKS: tuple = ()
TASKS = CONV_TASKS


def target_key(target) -> tuple[str, str]:
    """(``-mcpu``, int8 class) of ``target``: what a record must match to be applied."""
    return str(target.attrs.get("mcpu", "")) or "generic", isa_class(target)


def records_name(target) -> str:
    """``aarch64_int8_<mcpu>_<class>.log`` (the class without its ``aarch64_`` prefix)."""
    mcpu, cls = target_key(target)
    return f"aarch64_int8_{mcpu}_{cls[len('aarch64_'):]}.log"


def user_path(target) -> Path:
    """Where ``tvm-ext tune --rpc`` writes the records for ``target``."""
    return _records.user_dir() / records_name(target)


def load_records(target, *, user: bool = True, shipped: bool = True) -> list:  # noqa: ARG001 (none shipped)
    """The user's records for ``target``'s CPU and class."""
    return _records.read(user_path(target), target_key(target), target_key) if user else []


def apply(target, records=None):
    """A context manager applying the records for ``target`` (with ``hits``), or a no-op one."""
    recs = load_records(target) if records is None else records
    return _records.apply(recs, records_name(target))
