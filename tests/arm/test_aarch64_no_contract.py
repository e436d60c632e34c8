"""Quantized adds over every pair of uint8 inputs at aarch64, run under qemu (``tvm_ext._no_contract``).

Every aarch64 CPU has ``fmla``, and TVM lets LLVM contract ``a * s + c`` into it. The uint8 + uint8 ->
uint8 add with a float requantize (QDQ, ONNX ``QLinearAdd``, a conv with the add in its epilogue),
built with ``pipelines.int8()`` for each ARM class, against numpy in TVM's float order (each product
rounded, then the sum: what a plain ``llvm`` build computes, tests/test_no_contract.py). Stock TVM's
contraction, recorded at one class.
"""
import itertools

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.core.frontend import from_onnx
from tvm_ext.testing import quantized_add as qa
from tvm_ext.testing.aarch64 import TARGETS, run_on_session

#: The float requantize reaches the back end only without ``AffineEightBitJoin``, which makes it integer
#: arithmetic where an integer form exists: each build is checked both ways.
JOINS = {"integer-join": (), "float-join": ("AffineEightBitJoin",)}
#: ``sa = sb``, ``sc = 2 sa``: one rounding instead of two moves 6,195 to 6,258 of the 65,536 pairs.
SCALES = qa.AddScales(0.0299846101552248, 113, 0.0299846101552248, 137, 0.0599692203104496, 110)


def _module(form):
    if form == "qdq":
        return qa.qdq_add(SCALES), {}
    if form == "qlinear_add":
        return from_onnx(qa.qlinear_add_onnx(SCALES))
    return qa.conv_residual_add(SCALES), {}


def _outputs(session, lib, tmp_path, name):
    a, b = qa.pairs()
    (out,) = run_on_session(session, lib, {"a": a, "b": b}, tmp_path, name)
    return out, qa.reference(a, b, SCALES)


#: The default tier: a diagonal of forms and classes with the float requantize (what LLVM would contract) at each
#: class, and the integer join once. The slow tier runs every form at every class both ways (the same add through
#: the other classes' kernels and the other join).
DEFAULT = {("qdq", "cortex-a72", "float-join"), ("qlinear_add", "neoverse-n1", "float-join"),
           ("conv_residual", "neoverse-v1", "float-join"), ("qlinear_add", "cortex-a72", "integer-join")}


@pytest.mark.parametrize("form, cpu, join", [
    pytest.param(*case, id="-".join(case), marks=() if case in DEFAULT else pytest.mark.slow)
    for case in itertools.product(["qdq", "qlinear_add", "conv_residual"], TARGETS, JOINS)])
def test_int8_build_exact_over_all_pairs_under_qemu(form, cpu, join, arm_session, tmp_path):
    mod, params = _module(form)
    lib = tvm_ext.build(mod, TARGETS[cpu], params=params, passes=pipelines.int8(), disabled_pass=JOINS[join])
    assert "fmla" not in lib.get_lib().get_source("asm")
    out, ref = _outputs(arm_session, lib, tmp_path, f"add_{form}_{cpu}_{join}")
    assert np.array_equal(out, ref), f"{np.count_nonzero(out != ref)} of {out.size} pairs differ"


def test_stock_tvm_contracts_the_add(arm_session, tmp_path):
    """``relay.build`` at neoverse-n1: LLVM fuses one product into the sum (``fmla``), and the pairs
    whose exact sum lies within a rounding of a quantization tie come out a level off."""
    mod, _ = _module("qdq")
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=TARGETS["neoverse-n1"])
    assert "fmla" in lib.get_lib().get_source("asm")
    out, ref = _outputs(arm_session, lib, tmp_path, "add_stock")
    a, b = qa.pairs()
    assert any(np.array_equal(out, qa.fused_reference(a, b, SCALES, fused)) for fused in "ab")
    assert np.count_nonzero(out != ref) > 6000
