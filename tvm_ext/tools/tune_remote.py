"""``tvm-ext tune --rpc`` / ``--rpc-tracker``: tune a model's int8 convolutions on remote boards.

The candidates are built here and timed there. The workloads are what :func:`tvm_ext.build`
compiles for the board's target (:func:`tvm_ext.tools.tune.record_workloads`: the NCHWc int8 convs
of :data:`tvm_ext.arm.tuning.CONV_TASKS` under tvm-ext's aarch64 kernel policy). For each,
TVM's rule and the template's points with the layout's channel blocks (at most ``trials``) are
compiled and linked here (:func:`tvm_ext.tools.deploy.cross_cxx`), uploaded to a board and timed
there by the remote's ``time_evaluator``.

Boards: one server (``--rpc HOST[:PORT]``), or every board a TVM tracker knows under a key
(``--rpc-tracker HOST[:PORT] --rpc-key KEY``): a thread per board takes the next candidate from a
shared queue, as TVM's ``RPCRunner`` does. A workload gets a record when its best candidate beats
TVM's rule by ``min_gain`` (2 %), keyed as :mod:`tvm_ext.arm.tuning` keys aarch64 records, so a later
``tvm_ext.build`` for the same target applies them. Layouts stay TVM's rule; kernels without AutoTVM
knobs (the ``smmla`` conv, the int8 denses) are not tuned. Failures are one line
(:class:`tvm_ext.tools.deploy.DeployError`); a candidate that fails on a board is skipped and logged,
and the run stops with the error when no board is left.
"""
from __future__ import annotations

import logging
import queue
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from . import _remote
from .deploy import DeployError, cross_cxx
from .tune import TuneResult, _describe, _fallback, _knobs, record_workloads

logger = logging.getLogger(__name__)

__all__ = ["Boards", "tune_model_remote"]


@dataclass
class Boards:
    """Where candidates are timed: ``sessions`` (one per board), where they came from, and whether
    the remote says it is emulated (:func:`tvm_ext.tools._remote.emulation`)."""

    sessions: list
    where: str
    emulated: Optional[str] = None
    features: Optional[frozenset] = None  # the first board's CPU features (None: not read)

    @classmethod
    def open(cls, *, rpc: Optional[str] = None, tracker: Optional[str] = None, key: Optional[str] = None,
             max_boards: Optional[int] = None, timeout: float = _remote.DEFAULT_TIMEOUT,
             session_timeout: float = 0, target=None) -> "Boards":
        """Sessions on one server (``rpc``) or on the free boards of ``key`` at ``tracker`` (the first
        within ``timeout``, the others if free within a few seconds; at most ``max_boards``).
        ``session_timeout``: seconds after which a board ends its session (0: never), so that a
        kernel that hangs there ends the measurement on that board. With ``target``, every board's
        CPU is checked to have the features the target uses
        (:func:`tvm_ext.tools._remote_cpu.check_remote_cpu`) before anything is timed there.

        Raises
        ------
        DeployError
            Neither or both of ``rpc`` and ``tracker``; ``tracker`` without ``key``; see
            :func:`tvm_ext.tools._remote.connect` and :func:`tvm_ext.tools._remote.request`; a board
            whose CPU lacks a feature of ``target``.
        """
        from ._remote_cpu import check_remote_cpu

        def checked(sess, where):
            return check_remote_cpu(sess, target, where) if target is not None else None

        if bool(rpc) == bool(tracker):
            raise DeployError("tune_remote: give one of --rpc HOST[:PORT] or --rpc-tracker HOST[:PORT] --rpc-key KEY")
        if rpc:
            sess = _remote.connect(rpc, timeout=timeout, session_timeout=session_timeout)
            where = "{}:{}".format(*_remote.parse_address(rpc))
            features = checked(sess, where)
            return cls([sess], f"RPC server {where}", _remote.emulation(sess), features)
        if not key:
            raise DeployError(f"tune_remote: --rpc-tracker {tracker} needs --rpc-key KEY (the key the boards "
                              f"registered with)")
        first, known = _remote.request(tracker, key, timeout=timeout, session_timeout=session_timeout)
        features = checked(first, f"a board with key {key!r}")
        sessions = [first]
        for _ in range(min(known, max_boards or known) - 1):
            try:  # a busy board is not waited for: the free ones start now
                sess = _remote.request(tracker, key, timeout=min(timeout, 5.0), session_timeout=session_timeout)[0]
            except DeployError as err:
                logger.info("measuring on %d board(s) of %s: %s", len(sessions), key, err)
                break
            checked(sess, f"board {len(sessions) + 1} with key {key!r}")  # boards of one key may differ
            sessions.append(sess)
        where = "{}:{}".format(*_remote.parse_address(tracker))
        return cls(sessions, f"{len(sessions)} board(s) with key {key!r} from the tracker {where}",
                   _remote.emulation(first), features)

    def close(self) -> None:
        """End the sessions (a session ends when its last reference goes): the boards serve the next client."""
        self.sessions.clear()


def _layout_candidates(task) -> list:
    """One configuration per distinct value of the layout-free knobs (``tile_ow``, ``unroll_kw`` or
    ``tile_oh``), with ``tile_ic``/``tile_oc`` the channel blocks of the workload's layout.

    The blocks are set, not filtered for: TVM's arm_cpu template admits only multiples of 8 in its
    space, while its own rule (and so the layout AlterOpLayout chose) may block by 4.
    """
    from collections import OrderedDict

    from tvm.autotvm.task.space import ConfigEntity, SplitEntity

    wl = task.workload
    ic_bn, oc_bn = int(wl[1][1][4]), int(wl[2][1][5])  # data NCHW[ic_bn]c, kernel OIHW[ic_bn/4]i[oc_bn]o4i
    cin, cout = int(wl[1][1][1]) * ic_bn, int(wl[2][1][0]) * oc_bn
    space = task.config_space
    seen, out = set(), []
    for i in range(len(space)):
        ents = space.get(i)._entity_map  # pylint: disable=protected-access
        rest = tuple((n, str(v)) for n, v in ents.items() if n not in ("tile_ic", "tile_oc"))
        if rest in seen:
            continue
        seen.add(rest)
        entities = OrderedDict(ents)
        entities["tile_ic"] = SplitEntity([cin // ic_bn, ic_bn])
        entities["tile_oc"] = SplitEntity([cout // oc_bn, oc_bn])
        out.append(ConfigEntity(i, space.code_hash, entities, []))
    return out


def _random_args(bufs, dev, rng) -> list:
    import tvm

    out = []
    for b in bufs:
        shape = [int(d) for d in b.shape]
        arr = rng.integers(-100, 100, shape).astype(b.dtype) if "int" in b.dtype else np.zeros(shape, b.dtype)
        out.append(tvm.nd.array(arr, dev))
    return out


#: AutoTVM's dispatch context (which configuration a template instantiates) is process-wide, not
#: per thread: the boards' threads compile one at a time, and measure in parallel.
_COMPILE = threading.Lock()


def _build_candidate(task, cfg, target, workdir: Path, name: str) -> tuple:
    """Compile one configuration here: ``(library, buffers, entry name)``; the library is a ``.so``
    linked with the cross compiler, else a ``.tar`` the board links."""
    import tvm

    with _COMPILE, target:
        sch, bufs = task.instantiate(cfg)
        func = tvm.build(sch, bufs, target=target)
    cxx = cross_cxx(target)
    path = workdir / (f"{name}.so" if cxx else f"{name}.tar")
    func.export_library(str(path), **({"cc": cxx} if cxx else {}))
    return path, bufs, func.entry_name


def _time_on_board(sess, path, bufs, entry, target, where, number, repeat) -> float:
    """Median seconds of one run of the uploaded kernel, timed by the board."""
    rmod = _remote.upload_and_load(sess, path, str(target), where)
    dev = sess.cpu(0)
    args = _random_args(bufs, dev, np.random.default_rng(0))
    timer = rmod.time_evaluator(entry, dev, number=number, repeat=repeat)
    return float(np.median(timer(*args).results))


def tune_model_remote(mod, params, target, passes, boards: Boards, *, budget_s: float = 600.0,
                      trials: Optional[int] = None, number: int = 5, repeat: int = 3, min_gain: float = 0.02,
                      progress: Optional[Callable] = None, skip=()) -> TuneResult:
    """Tune ``mod``'s int8 convs as ``tvm_ext.build(mod, target, params, passes)`` compiles them for a board.

    Parameters
    ----------
    mod, params, passes
        As for :func:`tvm_ext.build`.
    target : str or tvm.target.Target
        The boards' target, of another architecture than this host (``-mtriple=aarch64-linux-gnu``).
    boards : Boards
        Where candidates are timed (:meth:`Boards.open`).
    budget_s : float
        Wall-clock budget; what was measured when it runs out is kept.
    trials : int, optional
        At most this many candidates per workload besides TVM's rule (default: all).
    number, repeat
        ``time_evaluator``'s: runs per measurement, measurements (the median is kept).
    min_gain : float
        A record is written when the best candidate is faster than TVM's rule by this fraction.
    progress : callable, optional
        ``progress(message)`` per step.
    skip : collection of workloads
        Already tuned in this run.

    Returns
    -------
    tvm_ext.tools.tune.TuneResult
        ``rows`` per workload; ``records`` the AutoTVM record lines.

    Raises
    ------
    DeployError
        The target runs on this host (:func:`tvm_ext.tools._remote.check_remote_target`); every
        board failed.
    """
    from tvm import autotvm

    from ..x86.target import build_target

    t0 = time.monotonic()
    deadline = t0 + budget_s
    tgt = build_target(target)
    _remote.check_remote_target(tgt, True, "tune_model_remote")
    say = progress or (lambda msg: logger.info("%s", msg))
    say(f"recording the int8 workloads tvm_ext.build compiles for {tgt}")
    found = record_workloads(mod, params, tgt, passes)
    todo = [w for w in found.conv if w not in set(skip)]
    say(f"{len(found.conv)} conv schedules ({len(todo)} to tune), timed on {boards.where}"
        + (f" (emulated: {boards.emulated})" if boards.emulated else ""))

    jobs: "queue.Queue" = queue.Queue()
    tasks, cands = [], []
    for i, wl in enumerate(todo):
        try:
            task = autotvm.task.create(wl[0], args=wl[1:], target=tgt)
            options = _layout_candidates(task)[:trials] if trials is not None else _layout_candidates(task)
        except Exception as err:  # noqa: BLE001  TVM's template cannot describe it: say so, go on
            logger.warning("not tuned (TVM's rule kept): %s: %s", _describe(wl), _remote.last_line(err))
            tasks.append(None)
            cands.append([])
            continue
        tasks.append(task)
        cands.append(options)
        jobs.put((i, -1, _fallback(task)))  # TVM's rule first: the baseline of its workload
        for j, cfg in enumerate(options):
            jobs.put((i, j, cfg))
    costs: dict = {}  # (workload index, candidate index or -1) -> seconds
    errors: list = []  # boards that stopped
    refused: list = []  # candidates a board could not load
    lock = threading.Lock()
    budget_hit = threading.Event()

    def worker(n: int, sess, workdir: Path):
        where = f"board {n + 1} of {boards.where}"
        while True:
            if time.monotonic() > deadline:
                budget_hit.set()
                return
            try:
                i, j, cfg = jobs.get_nowait()
            except queue.Empty:
                return
            try:
                path, bufs, entry = _build_candidate(tasks[i], cfg, tgt, workdir, f"w{i}_c{j}_b{n}")
            except Exception as err:  # noqa: BLE001  an invalid point of TVM's space: skip it
                logger.debug("config %s of %s does not build: %s", cfg, todo[i][0], err)
                continue
            try:
                cost = _time_on_board(sess, path, bufs, entry, tgt, where, number, repeat)
            except DeployError as err:  # the board cannot load it (e.g. a .tar and no compiler there)
                logger.warning("%s", err)
                with lock:
                    refused.append(str(err))
                continue
            except Exception as err:  # noqa: BLE001  the session died (timeout, board gone): stop this board
                with lock:
                    errors.append(f"{where}: {_remote.last_line(err)}")
                jobs.put((i, j, cfg))  # another board may still measure it
                return
            finally:
                path.unlink(missing_ok=True)
            with lock:
                costs[(i, j)] = cost
                done = len(costs)
            if j == -1:
                say(f"[{done}] {_describe(todo[i])}: TVM's rule {cost * 1e3:.4f} ms")

    with tempfile.TemporaryDirectory(prefix="tvm_ext_tune_rpc_") as tmp:
        threads = [threading.Thread(target=worker, args=(n, s, Path(tmp)), name=f"tune-board-{n}", daemon=True)
                   for n, s in enumerate(boards.sessions)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if (errors or refused) and not costs:
        raise DeployError(f"tune_remote: no board measured anything ({(errors or refused)[0]})")
    for err in errors:
        logger.warning("a board stopped: %s", err)

    lines, rows = [], []
    for i, wl in enumerate(todo):
        base = costs.get((i, -1))
        if tasks[i] is None or base is None:
            continue
        measured = [(costs[(i, j)], cfg) for j, cfg in enumerate(cands[i]) if (i, j) in costs]
        best_cost, best_cfg = min(measured, key=lambda m: m[0]) if measured else (base, None)
        if best_cfg is not None and best_cost < base * (1 - min_gain):
            inp = autotvm.MeasureInput(tgt, tasks[i], best_cfg)
            lines.append(autotvm.record.encode(inp, autotvm.MeasureResult((best_cost,), 0, 0.0, time.time())))
        else:
            best_cost, best_cfg = base, None
        rows.append(("conv", _describe(wl), base * 1e3, best_cost * 1e3,
                     _knobs(best_cfg) if best_cfg is not None else "TVM's rule", wl))
        say(f"{_describe(wl)}: {len(measured)} candidate(s) timed; {rows[-1][4]}")
    result = TuneResult(str(tgt), lines, rows, "TVM's rule (not tuned over RPC)", {},
                        budget_hit=budget_hit.is_set() or not jobs.empty())
    result.seconds = time.monotonic() - t0
    return result

