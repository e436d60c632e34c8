"""The aarch64 tier: libraries cross-compiled for ARM, run under qemu-user through TVM's RPC server.

``arm_server`` skips, with what is missing, where ``make arm-env`` has not been run. Starting the
emulated server takes 30 to 60 s (two aarch64 Pythons import TVM under emulation), so the pytest-xdist
workers of one run share one: the first worker that needs it starts it and records its address
in the run's shared temporary folder; the others attach. Each worker detaches at the end of its
session; the worker that started the server waits there until no other worker is attached, then
stops it (TVM's server serves one session at a time, so workers take turns, a test at a time).
The tests that hold an ``arm_session`` from their set-up run in one worker under ``--dist loadgroup``
(:func:`pytest_collection_modifyitems`): they take turns on the server wherever they run, and in a
second worker they would only wait for it.
"""
import contextlib
import fcntl
import gc
import json
import os
import sys
import time

import pytest

from tvm_ext.testing import aarch64

_WAIT_FOR_OTHERS_S = 1800  # the owner stops the server after this long even if a worker never detached


@contextlib.contextmanager
def _locked(path):
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _read(path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _alive(pid) -> bool:
    try:
        os.kill(pid, 0)
    except (OSError, TypeError):
        return False
    return True


@pytest.fixture(scope="session")
def arm_server(tmp_path_factory):
    why = aarch64.missing()
    if why:
        pytest.skip(why)
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # no xdist: a server of our own
        with aarch64.rpc_server() as server:
            yield server
        return
    shared = tmp_path_factory.getbasetemp().parent  # one folder for every worker of this run
    lock, state_file = shared / "arm_server.lock", shared / "arm_server.json"
    with contextlib.ExitStack() as stack:
        with _locked(lock):
            state = _read(state_file)
            if state and _alive(state.get("pid")):
                server = aarch64.RPCServer(state["host"], state["port"])
                state["users"] += 1
                owner = False
            else:
                server = stack.enter_context(aarch64.rpc_server())
                state = {"host": server.host, "port": server.port, "pid": server.proc.pid, "users": 1}
                owner = True
            state_file.write_text(json.dumps(state))
        yield server
        with _locked(lock):
            state = _read(state_file)
            state["users"] -= 1
            state_file.write_text(json.dumps(state))
        deadline = time.monotonic() + _WAIT_FOR_OTHERS_S
        while owner:
            with _locked(lock):  # checked and retired under the lock: no worker attaches in between
                if _read(state_file).get("users", 0) <= 0 or time.monotonic() > deadline:
                    state_file.unlink(missing_ok=True)
                    break
            time.sleep(1)
        # leaving the ExitStack stops the server when this worker started it


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """``xdist_group("arm_server")`` on every test that uses ``arm_session`` (before pytest-xdist reads the
    groups): its session is held from the test's set-up to its end, the build included, so these tests
    run one at a time whatever the number of workers. Tests that take ``arm_server`` alone connect after
    their builds, which another worker can overlap; they are not grouped."""
    for item in items:
        if "arm_session" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("arm_server"))


@pytest.fixture
def arm_session(arm_server):
    """A fresh RPC session (the server forks one process per session). The server ends it after
    300 s whatever holds it, so a session kept alive by mistake cannot block the others for good."""
    return arm_server.connect(session_timeout=300)


#: The fixtures whose RPC server later tests connect to again.
_SHARED_SERVERS = {"arm_server", "board", "tracker_with_board"}


@pytest.fixture(autouse=True)
def _release_rpc_sessions(request):
    """After each test, drop what keeps a failed test's frames, and so its RPC session, alive
    (pytest keeps the last exception in sys.last_*): the server serves one session at a time, and
    the next test's connection would wait for it. ``gc.collect()`` (up to a fifth of a second once a
    worker holds many builds) runs only after the tests that reach a shared server: the others hold
    no session."""
    yield
    sys.last_type = sys.last_value = sys.last_traceback = None
    if _SHARED_SERVERS & set(request.fixturenames):
        gc.collect()
