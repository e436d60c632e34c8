"""Tuned-record machinery every family's ``tuning`` module shares (a leaf: imports nothing of tvm-ext).

AutoTVM records are read from a family's files (:func:`read`, cached per file version, filtered by
the family's key), merged user-first (:func:`merge`), and applied so that a record wins over a
configuration AlterOpLayout registered for the same workload (:func:`apply`); the applied context
lists the workloads it answered in ``hits``. Where the user's records live is :func:`user_dir`.
"""
from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["user_dir", "read", "merge", "apply"]


def user_dir() -> Path:
    """``$TVM_EXT_CACHE/tuned`` (default ``~/.cache/tvm_ext/tuned``)."""
    base = os.environ.get("TVM_EXT_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "tvm_ext") / "tuned"


#: (path, mtime_ns, size, key) -> records: a file is parsed again only when it changes.
_READ_CACHE: dict = {}


def read(path: Path, key, key_of) -> list:
    """The successful records of ``path`` whose target's ``key_of(target)`` equals ``key``; none for
    a missing file, and none (with a warning) for a corrupt one: a user's file must not break builds."""
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
    except Exception as err:
        logger.warning("ignoring tuning records %s: %s", path, err)
        return []
    out = [(inp, res) for inp, res in recs if res.error_no == 0 and key_of(inp.target) == key]
    _READ_CACHE[ck] = tuple(out)
    return out


def merge(mine: list, shipped: list) -> list:
    """``mine``, then the ``shipped`` records of workloads ``mine`` has none for."""
    tuned = {inp.task.workload for inp, _ in mine}
    return mine + [r for r in shipped if r[0].task.workload not in tuned]


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


def apply(records: list, what: str = ""):
    """A context manager applying ``records`` (with ``hits``), or a no-op one when there are none."""
    if not records:
        return contextlib.nullcontext()
    logger.debug("applying %d tuned int8 records (%s)", len(records), what)
    return _tuned_first(records)
