"""x86 tuned int8 schedules and layouts: the records shipped per instruction-set class and the ones
the user tuned, applied by the x86 back end (:mod:`tvm_ext.x86.backend`).

Records are AutoTVM records of TVM's int8 templates (``conv2d_NCHWc_int8.x86``, 8-bit
``depthwise_conv2d_NCHWc.x86``, ``dense_*.x86``),
keyed by the int8 class (:func:`tvm_ext.x86.isa.isa_class`), because a schedule measured for one
instruction set says nothing about another:

* **user**: ``$TVM_EXT_CACHE/tuned/x86_int8_<mcpu>_<isa>.log``, written by ``tvm-ext tune`` on the
  user's machine, for that ``-mcpu`` only; it wins for every workload it has;
* **shipped**: ``tvm_ext/x86/tuned/x86_int8_<isa>.log`` (package data), for every CPU of the class,
  whatever its name or vendor.

``NCHWc`` workloads hold a compiled conv's schedule knobs; ``NCHW`` ones what AlterOpLayout queries
for the channel blocking. Schedules and layouts never change results (integer accumulation is
exact in any order): the tests compare tuned and untuned builds bit for bit. docs/x86-kernels.md
has the rest; the shared machinery is :mod:`tvm_ext._records`.
"""
from __future__ import annotations

from pathlib import Path

from .. import _records
from ._depthwise_template import TASK as DEPTHWISE_TASK  # TVM's x86 depthwise task (also the tap form's)
from .isa import isa_class

__all__ = ["TASK", "CONV_TASKS", "DEPTHWISE_TASK", "DENSE_TASKS", "TASKS", "records_name", "shipped_name",
           "shipped_path", "user_path", "user_dir", "load_records", "apply", "TUNED_DIR", "target_key"]

TASK = "conv2d_NCHWc_int8.x86"
#: The int8 conv templates tuned (NCHWc data 5-d; the NCHW layout query 4-d).
CONV_TASKS = (TASK,)
#: TVM's x86 dense templates an int8 dense may compile to.
DENSE_TASKS = ("dense_pack.x86", "dense_nopack.x86", "dense_int8.x86", "dense_vnni.x86")
#: Every template the x86 records hold.
TASKS = CONV_TASKS + (DEPTHWISE_TASK,) + DENSE_TASKS
TUNED_DIR = Path(__file__).parent / "tuned"
user_dir = _records.user_dir


def target_key(target) -> tuple[str, str]:
    """(``-mcpu``, int8 class) of ``target``: what a user's record must match to be applied."""
    return str(target.attrs.get("mcpu", "")) or "generic", isa_class(target)


def records_name(target) -> str:
    """File name of the user's records for ``target`` (``x86_int8_<mcpu>_<isa>.log``)."""
    mcpu, cls = target_key(target)
    return f"x86_int8_{mcpu}_{cls}.log"


def shipped_name(target) -> str:
    """File name of the package's records for ``target``'s instruction-set class."""
    return f"x86_int8_{isa_class(target)}.log"


def shipped_path(target) -> Path:
    """The package's records for ``target``'s instruction-set class (any CPU of that class)."""
    return TUNED_DIR / shipped_name(target)


def user_path(target) -> Path:
    """Where ``tvm-ext tune`` writes the records for ``target``."""
    return user_dir() / records_name(target)


def load_records(target, *, user: bool = True, shipped: bool = True) -> list:
    """Records for ``target``: the user's for its CPU, then the shipped ones of its class for
    workloads the user did not tune."""
    mine = _records.read(user_path(target), target_key(target), target_key) if user else []
    theirs = _records.read(shipped_path(target), isa_class(target), isa_class) if shipped else []
    return _records.merge(mine, theirs)


def apply(target, records=None):
    """A context manager applying the records for ``target`` (user first), or a no-op one; it lists
    the workloads it answered in ``hits`` (the build puts them in the kernel report)."""
    recs = load_records(target) if records is None and target.kind.name == "llvm" else (records or [])
    return _records.apply(recs, f"{records_name(target)} / {shipped_name(target)}")
