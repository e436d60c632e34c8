"""Graphs the fuzzer found failing (tests/fuzz_regressions/*.json), re-checked by the oracle.

Each file holds the spec, the failure it showed, the target it showed at (none: the host CPU) and
the Relay text of the module at the time. The oracle is run in this process on the failing subject
only (the bugs are fixed: no crash), at that target (compiled only if this host cannot run it).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tvm_ext.testing import fuzz

FILES = sorted((Path(__file__).parent / "fuzz_regressions").glob("*.json"))


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_fuzz_regression(path):
    spec, mod, failure = fuzz.load_failure(path)
    subject = failure["subject"]
    passes = (subject,) if subject in fuzz.PASSES else ()
    stages = ("start", "before_fuse") if failure["stage"] in ("start", "before_fuse", "build") else ("start",)
    res = fuzz.check_graph(mod, variant=spec.variant, passes=passes, stages=stages,
                           pipeline=subject == "int8()", build_check=subject == "build", target=failure["target"])
    assert not res.failures, res.failures
