"""Session-wide test set-up.

Every test runs under a PassContext whose instrument checks, after each Relay pass, that every
Relay function in the module is well formed (no variable bound twice, no free variables in
``main``). tvm_ext.build forwards the current context's instruments, so passes run through it are
checked too. Tests that open their own PassContext replace it (TVM does not nest instruments).
"""
import logging
import os

os.environ.setdefault("TOPHUB_LOCATION", "NONE")

import pytest  # noqa: E402
import tvm  # noqa: E402
from tvm import relay  # noqa: E402

import tvm_ext  # noqa: E402,F401
from tvm_ext.testing import with_instruments  # noqa: E402


@tvm.instrument.pass_instrument
class WellFormed:
    """Fails the pass that leaves a malformed Relay function behind."""

    def run_after_pass(self, mod, info):
        if info.name.startswith("tir.") or info.name in ("InferType", "sequential"):
            return
        for gv in mod.get_global_vars():
            try:
                func = mod[gv]
            except tvm.TVMError:  # PartitionGraph's sub-passes rename globals in steps
                continue
            if not isinstance(func, relay.Function):
                continue
            if not relay.analysis.well_formed(func):
                raise AssertionError(f"pass {info.name} left {gv.name_hint} malformed")
            if gv.name_hint == "main" and relay.analysis.free_vars(func):
                raise AssertionError(f"pass {info.name} left free variables in main")


@pytest.fixture(autouse=True)
def _well_formed_instrument():
    with with_instruments(WellFormed()):
        yield


@pytest.fixture(autouse=True, scope="session")
def _quiet_tvm_loggers():
    logging.getLogger("autotvm").setLevel(logging.ERROR)
    logging.getLogger("te_compiler").setLevel(logging.WARNING)
    yield
