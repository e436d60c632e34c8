"""The aarch64 tier: libraries cross-compiled for ARM, run under qemu-user through TVM's RPC server.

``arm_server`` starts one emulated server per test process that needs one (30 to 60 s: two aarch64
Pythons import TVM under emulation) and skips, with what is missing, where ``make arm-env`` has not
been run.
"""
import pytest

from tvm_ext.testing import aarch64


@pytest.fixture(scope="session")
def arm_server():
    why = aarch64.missing()
    if why:
        pytest.skip(why)
    with aarch64.rpc_server() as server:
        yield server


@pytest.fixture
def arm_session(arm_server):
    """A fresh RPC session (the server forks one process per session)."""
    return arm_server.connect()
