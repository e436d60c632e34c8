"""Session-wide checks for pass tests: every pass a test runs is followed by a well-formedness check.

The autouse fixture enters a ``PassContext`` (opt_level 2, TVM's default, so tests see the same
levels a user does) whose instrument asserts ``relay.analysis.well_formed`` on every function after
every pass. Contexts a test opens itself replace it; ``tvm_ext.build`` inherits its instruments.
"""
from __future__ import annotations

import os

os.environ.setdefault("TOPHUB_LOCATION", "NONE")

import pytest  # noqa: E402


def _make_instrument():
    import tvm
    from tvm import relay

    @tvm.instrument.pass_instrument
    class WellFormed:  # pylint: disable=too-few-public-methods
        """Fails the pass that left an ill-formed Relay function behind."""

        def run_after_pass(self, mod, info):
            for gv in mod.get_global_vars():
                func = mod[gv]
                if isinstance(func, relay.Function):
                    assert relay.analysis.well_formed(func), f"{info.name} left {gv.name_hint} ill-formed"

    return WellFormed()


@pytest.fixture(autouse=True)
def well_formed_after_every_pass():
    import tvm

    with tvm.transform.PassContext(opt_level=2, instruments=[_make_instrument()]):
        yield
