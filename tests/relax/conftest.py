"""Relax tests: every tvm-ext Relax pass is checked for well-formedness after it runs."""
import pytest
import tvm
from tvm import relax

from tvm_ext.testing import with_instruments

RELAX_PASSES = {"FuseByPattern", "CombineParallelCast"}


@tvm.instrument.pass_instrument
class RelaxWellFormed:
    """Fails a tvm-ext Relax pass that leaves a malformed module behind."""

    def run_after_pass(self, mod, info):
        if info.name in RELAX_PASSES and any(isinstance(f, relax.Function) for f in mod.functions.values()):
            if not relax.analysis.well_formed(mod):
                raise AssertionError(f"pass {info.name} left a malformed Relax module")


@pytest.fixture(autouse=True)
def _relax_well_formed():
    with with_instruments(RelaxWellFormed()):
        yield


def check_relax(pass_, before, expected):
    """Run ``pass_`` on ``before``; the input is not mutated and the result equals ``expected``."""
    text = before.script()
    after = pass_(before)
    assert before.script() == text, "the pass mutated its input module"
    assert relax.analysis.well_formed(after)
    tvm.ir.assert_structural_equal(after, expected)
    return after


def run_relax(mod, *args):
    """Build ``mod`` with tvm_ext.relax.build for the host and run main on numpy ``args``."""
    import tvm_ext.relax as tr

    ex = tr.build(mod)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.nd.array(a) for a in args])
    return out.numpy(), ex
