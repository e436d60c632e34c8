"""tvm_ext._patch.Patch: installed by the outermost entry, restored by its exit, shared by threads."""
import threading

import pytest

from tvm_ext._patch import Patch


def _recording():
    log = []
    return log, Patch(lambda *args: log.append(("install", args)), lambda: log.append(("uninstall",)))


def test_nested_entries_install_once_with_the_outermost_arguments():
    log, patch = _recording()
    assert not patch.active
    with patch.entered("outer"):
        with patch.entered("inner"):
            assert patch.active
        assert log == [("install", ("outer",))]
    assert log == [("install", ("outer",)), ("uninstall",)] and not patch.active


def test_restored_when_the_block_raises():
    log, patch = _recording()
    with pytest.raises(RuntimeError):
        with patch.entered():
            raise RuntimeError("build failed")
    assert log == [("install", ()), ("uninstall",)] and not patch.active


def test_threads_share_one_installation():
    log, patch = _recording()
    inside, release = threading.Barrier(3), threading.Event()

    def build():
        with patch.entered():
            inside.wait()
            release.wait()

    workers = [threading.Thread(target=build) for _ in range(2)]
    for w in workers:
        w.start()
    inside.wait()  # both workers are inside
    assert log == [("install", ())] and patch.active
    release.set()
    for w in workers:
        w.join()
    assert log == [("install", ()), ("uninstall",)] and not patch.active
