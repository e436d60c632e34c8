"""The fuzzer at aarch64: a tiny campaign whose builds run on the emulated server through TVM RPC.

Each build under test is compiled for Neoverse-N1 (+dotprod), linked with the cross compiler and run
on the server; the exact reference of an integer graph is ``relay.build`` at plain ``llvm`` for this
host, run here. The graphs: a uint8 ``qnn.conv2d`` with its ``qnn.requantize`` (integer; its spec seed
makes the oracle check ``tvm_ext.build`` against exact arithmetic), a float conv with a sigmoid
(float tolerance against stock ``relay.build`` at the target), and an int8 conv behind a
``stop_fusion`` (RemoveStopFusion rewrites it, so a rewrite is compared too).
"""
from tvm_ext.testing import fuzz
from tvm_ext.testing.aarch64 import TARGETS

SPECS = [
    fuzz.Spec(seed=8, in_dtype="uint8", channels=4,
              steps=(("conv", 0, 8, 3, 1, 1, 0, "qnn", "none", True), ("requant", 1, "qnn", "uint8", False))),
    fuzz.Spec(seed=16, in_dtype="float32", steps=(("conv", 0, 4, 3, 1, 1, 0, "plain", "none", True),
                                                  ("ewise", 1, "sigmoid"))),
    fuzz.Spec(seed=1, in_dtype="int8", steps=(("stop", 0), ("conv", 1, 8, 1, 1, 0, 0, "plain", "none", False))),
]


def test_campaign_runs_the_aarch64_builds_on_the_server(arm_server):
    kw = {"target": TARGETS["neoverse-n1"], "rpc": arm_server.address, "stages": ("start",)}
    summary = fuzz.Summary()
    for _, spec, res in fuzz.run_specs(SPECS, workers=1, kw=kw):
        summary.add(spec, res)
    assert not summary.failures, summary.table()
    assert not [s for s in summary.skips if "compiled only" in s or "does not build" in s], summary.table()
    assert summary.rewrites.get("RemoveStopFusion@start") == 1
    # the rewrite against the reference, and for the first two graphs the build check (exact
    # integer arithmetic here, stock relay.build at the target)
    assert summary.compared >= 3, summary.table()
