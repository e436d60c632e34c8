"""Tuned int8 schedules and layouts: records shipped per CPU, records tuned by the user, applied by
``tvm_ext.build``.

Design note
-----------
A leaf below :mod:`tvm_ext.build` (it imports only :mod:`tvm_ext.x86.isa` and :mod:`tvm_ext.x86.int8_conv`);
:mod:`tvm_ext.tools.tune` records and searches, on top of ``build``.

Records are AutoTVM records of TVM's int8 templates (``conv2d_NCHWc_int8.x86``, ``dense_*.x86``),
kept in two places, each keyed by the int8 instruction-set class (:func:`tvm_ext.x86.isa.isa_class`:
AVX2, AVX-512, AVX-512 VNNI, AMX), because a schedule measured for one instruction set says nothing
about another (an ``amx`` target, ``tvm_ext.build(..., amx=True)``, has its own: TVM's AMX dense
template has other knobs than its VNNI one):

* **user**: ``$TVM_EXT_CACHE/tuned/x86_int8_<mcpu>_<isa>.log`` (default
  ``~/.cache/tvm_ext/tuned``), written by ``tvm-ext tune`` on the user's own machine, for that CPU
  (``-mcpu``) only;
* **shipped**: ``tvm_ext/x86/tuned/x86_int8_<isa>.log``, package data, for *every* CPU of the class,
  whatever its name or vendor: an Intel AVX-512 VNNI host uses what was measured on an AMD one and
  the reverse, unless the user tuned their own.

:func:`apply` gives the user's records precedence: for a workload the user tuned, a shipped record
is never consulted. Two kinds of conv records exist:

* ``NCHWc`` workloads (5-d data): the schedule knobs of a conv as it is compiled, after tvm-ext's
  passes (``FoldPadIntoConv``'s folded padding is part of the key);
* ``NCHW`` workloads (4-d data): what ``AlterOpLayout`` queries to choose the channel blocking
  (``tile_ic``/``tile_oc`` = ``ic_bn``/``oc_bn``). Without one, TVM's rule applies (``oc_bn`` 16,
  ``ic_bn`` the largest divisor up to it).

aarch64 targets (``-mtriple=aarch64-...``) have their own files, ``aarch64_int8_<mcpu>_<class>.log``
with the class ``neon``, ``dotprod`` or ``i8mm`` (:func:`tvm_ext.x86.isa.target_class`): records of TVM's
``conv2d_NCHWc_int8.arm_cpu`` template, measured on a board by ``tvm-ext tune --rpc`` or
``--tracker`` (:mod:`tvm_ext.tools.tune_remote`). None are shipped: no ARM board times here.

Tuned records win over the configuration AlterOpLayout registers (``update``) for the same
``NCHWc`` workload. Schedules and layouts never change results: integer accumulation is exact in
any loop order (the tests compare tuned and untuned builds bit for bit).
"""
from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from .isa import target_class

logger = logging.getLogger(__name__)

__all__ = ["TASK", "ARM_TASK", "CONV_TASKS", "DENSE_TASKS", "records_name", "shipped_name",
           "shipped_path", "user_path", "user_dir", "load_records", "apply", "TUNED_DIR"]

TASK = "conv2d_NCHWc_int8.x86"
#: TVM's int8 conv template on aarch64 (``sdot``/``udot``, ``smull`` with NEON only).
ARM_TASK = "conv2d_NCHWc_int8.arm_cpu"
#: The int8 conv templates tuned: the NCHWc data of the workload is 5-d, the NCHW one (layout query) 4-d.
CONV_TASKS = (TASK, ARM_TASK)
#: TVM's x86 dense templates an int8 dense may compile to.
DENSE_TASKS = ("dense_pack.x86", "dense_nopack.x86", "dense_int8.x86", "dense_vnni.x86")
TUNED_DIR = Path(__file__).parent / "tuned"


def target_key(target) -> tuple[str, str]:
    """(``-mcpu``, int8 class) of ``target``: what a user's record must match to be applied."""
    return str(target.attrs.get("mcpu", "")) or "generic", target_class(target)


def records_name(target) -> str:
    """File name of the user's records for ``target``'s CPU and instruction set
    (``x86_int8_<mcpu>_<isa>.log``; ``aarch64_int8_<mcpu>_<class>.log``)."""
    mcpu, cls = target_key(target)
    if cls.startswith("aarch64_"):
        return f"aarch64_int8_{mcpu}_{cls[len('aarch64_'):]}.log"
    return f"x86_int8_{mcpu}_{cls}.log"


def shipped_name(target) -> str:
    """File name of the package's records for ``target``'s instruction-set class."""
    cls = target_class(target)
    if cls.startswith("aarch64_"):
        return f"aarch64_int8_{cls[len('aarch64_'):]}.log"
    return f"x86_int8_{cls}.log"


def shipped_path(target) -> Path:
    """The package's records for ``target``'s instruction-set class (any CPU of that class)."""
    return TUNED_DIR / shipped_name(target)


def user_dir() -> Path:
    """``$TVM_EXT_CACHE/tuned`` (default ``~/.cache/tvm_ext/tuned``)."""
    base = os.environ.get("TVM_EXT_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "tvm_ext") / "tuned"


def user_path(target) -> Path:
    """Where ``tvm-ext tune`` writes the records for ``target``."""
    return user_dir() / records_name(target)


#: (path, mtime_ns, size, key) -> records: a file is parsed again only when it changes.
_READ_CACHE: dict = {}


def _read(path: Path, key, key_of=target_key) -> list:
    from tvm import autotvm

    try:
        st = path.stat()
    except OSError:
        return []
    if not path.is_file():
        return []
    ck = (str(path), st.st_mtime_ns, st.st_size, key)
    if ck in _READ_CACHE:
        return list(_READ_CACHE[ck])
    try:
        recs = list(autotvm.record.load_from_file(str(path)))
    except Exception as err:  # a corrupt user file must not break builds: say so, use none of it
        logger.warning("ignoring tuning records %s: %s", path, err)
        return []
    out = [(inp, res) for inp, res in recs if res.error_no == 0 and key_of(inp.target) == key]
    _READ_CACHE[ck] = tuple(out)
    return out


def load_records(target, *, user: bool = True, shipped: bool = True) -> list:
    """Records for ``target``: the user's for its CPU, then the ones shipped for its instruction-set
    class, for workloads the user did not tune."""
    mine = _read(user_path(target), target_key(target)) if user else []
    tuned = {inp.task.workload for inp, _ in mine}
    shipped_recs = _read(shipped_path(target), target_class(target), target_class) if shipped else []
    return mine + [r for r in shipped_recs if r[0].task.workload not in tuned]


def _tuned_first(records):
    """An ApplyHistoryBest whose records win over configurations registered with ``update``."""
    from tvm import autotvm

    class _TunedFirst(autotvm.task.ApplyHistoryBest):
        def __init__(self, recs):
            super().__init__(recs)
            self.hits: list = []

        def _query_inside(self, target, workload):
            for k in target.keys:
                hit = self.best_by_targetkey.get((k, workload))
                if hit is not None:
                    if workload not in self.hits:
                        self.hits.append(workload)
                    return hit[0].config
            return super()._query_inside(target, workload)

    return _TunedFirst(records)


def apply(target, records=None):
    """A context manager applying the records for ``target`` (user first), or a no-op one.

    The returned context has ``hits``: the workloads that were answered from records while it was
    entered (``tvm_ext.build`` puts them in the kernel report).
    """
    recs = load_records(target) if records is None and target.kind.name == "llvm" else (records or [])
    if not recs:
        return contextlib.nullcontext()
    logger.debug("applying %d tuned int8 records for %s / %s", len(recs), records_name(target),
                 shipped_name(target))
    return _tuned_first(recs)
