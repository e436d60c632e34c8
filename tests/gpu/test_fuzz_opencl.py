"""The differential fuzzer at ``opencl``: its builds run on OpenCL device 0 (PoCL, ``make gpu-env``) in
the worker processes and are compared with exact integer arithmetic (plain ``llvm``, run here). Skips
with the reason when the OpenCL set-up is missing."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_ext.gpu import opencl
from tvm_ext.testing.fuzz import execution, runner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_opencl import _int8_conv_requantize  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def device():
    why = opencl.missing()
    if why:
        pytest.skip(f"no OpenCL device: {why}")


def test_opencl_builds_run_and_are_not_compiled_only():
    run, why = execution.executor("opencl")
    assert why is None and run is not None
    tgt, stock = execution.targets("opencl")
    assert tgt.kind.name == stock.kind.name == "opencl" and tgt.host.kind.name == "llvm"


def test_run_factory_runs_a_plain_relay_build_on_the_opencl_device():
    """A plain relay.build at opencl makes a source-only OpenCL module; run_factory hands it to the
    OpenCL runtime and equals the plain llvm build bit for bit (integer graph)."""
    mod, inputs = _int8_conv_requantize()
    tgt, _ = execution.targets("opencl")
    with tvm.transform.PassContext(opt_level=3):
        gpu = relay.build(mod, target=tgt)
        ref = relay.build(mod, target=execution.EXACT_TARGET)
    assert any(m.type_key == "opencl" and not m.is_runnable for m in opencl._walk(gpu.get_lib()))
    got = execution.run_factory(gpu, [inputs])[0][0]
    want = execution.run_factory(ref, [inputs])[0][0]
    assert got.dtype == np.uint8 and len(np.unique(want)) > 1 and np.array_equal(got, want)


def test_a_short_campaign_at_opencl_compares_outputs_without_failures(tmp_path):
    summary = runner.run(n=3, seed=0, workers=1, out_dir=tmp_path, shrink_failures=False,
                         kw={"target": "opencl"}, progress=False)
    assert "OpenCL device 0" in summary.execution
    assert summary.graphs == 3 and summary.compared >= 1
    assert summary.failures == {}, summary.table()
