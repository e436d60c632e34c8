"""Float arithmetic inside int8 kernels at ``opencl`` as TIR states it (:mod:`tvm_ext.gpu.exact_float`).

The case: QLinearAdd as the ONNX importer writes it, ``quantize(dequantize(a) + dequantize(b))``,
over every pair of int8 values, with scales whose float32 values 7 printed digits do not name. Its
kernel computes ``round((a - za) * s1 + (b - zb) * s2) * (1 / s3)) + z3`` (TVM's simplifier turns the
division by a constant into a product with its reciprocal). The oracle is numpy float32 arithmetic
in that order, each operation rounded on its own, ``round`` half away from zero (OpenCL C's
``round``, LLVM's ``llvm.round``). With the scales printed to 7 digits, PoCL's result is one 8-bit
level off at one pair (docs/gpu.md, "Float arithmetic inside int8 kernels").
"""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.gpu import exact_float
from _opencl_cases import device_or_skip, run_graph

F32 = np.float32
#: (s1, s2, s3), (za, zb, z3): s2 as printed (4.092885e-02) is another float32.
SCALES = (0.03748451918363571, 0.04092884808778763, 0.01698041893541813)
ZEROS = (-9, 3, 4)


def _qlinear_add(n):
    """``quantize(dequantize(a, s1, za) + dequantize(b, s2, zb), s3, z3)`` of two int8 vectors."""
    a = relay.var("a", shape=(n,), dtype="int8")
    b = relay.var("b", shape=(n,), dtype="int8")
    (s1, s2, s3), (za, zb, z3) = SCALES, ZEROS

    def f(v):
        return relay.const(v, "float32")

    def i(v):
        return relay.const(v, "int32")

    out = relay.qnn.op.quantize(relay.qnn.op.dequantize(a, f(s1), i(za)) + relay.qnn.op.dequantize(b, f(s2), i(zb)),
                                f(s3), i(z3), out_dtype="int8")
    return tvm.IRModule.from_expr(relay.Function([a, b], out))


def _numpy(a, b, constant=F32):
    """The kernel's arithmetic in numpy float32, in TVM's order; ``constant`` reads each float
    constant (the exact float32 by default)."""
    (s1, s2, s3), (za, zb, z3) = SCALES, ZEROS
    s1, s2, inv = constant(s1), constant(s2), constant(1.0 / np.float64(F32(s3)))
    t = (a.astype(np.int32) - za).astype(F32) * s1 + (b.astype(np.int32) - zb).astype(F32) * s2
    scaled = t * inv
    rounded = np.sign(scaled) * np.floor(np.abs(scaled) + F32(0.5))  # half away from zero
    return np.clip(rounded + F32(z3), -128, 127).astype(np.int8)


def _printed(v):
    """``v`` as TVM's C-like printers write it (7 significant digits), read back as float32."""
    return F32(float(f"{float(v):.6e}"))


def _pairs():
    a, b = np.meshgrid(np.arange(-128, 128), np.arange(-128, 128))
    return a.ravel().astype(np.int8), b.ravel().astype(np.int8)


def test_the_case_tells_printed_constants_apart():
    """The oracle changes at some pair when the constants are read as printed: the case can fail."""
    a, b = _pairs()
    assert not exact_float.printed_exactly(F32(SCALES[1]), "float32")
    assert (_numpy(a, b) != _numpy(a, b, constant=_printed)).sum() >= 1


def test_qlinear_add_on_opencl_equals_numpy_float32():
    dev = device_or_skip()
    a, b = _pairs()
    built = tvm_ext.build(_qlinear_add(a.size), target="opencl")
    (got,) = run_graph(built, dev, {"a": a, "b": b})
    np.testing.assert_array_equal(got, _numpy(a, b))


def test_opencl_source_has_exact_constants_and_no_contraction():
    """Compile only: every kernel's program starts with the pragma, the constant 7 digits do not
    name is its bits, and a build outside tvm_ext (stock relay.build) is left as TVM writes it."""
    mod = _qlinear_add(64)
    source = tvm_ext.build(mod, target="opencl").lib.imported_modules[0].get_source()
    kernels = source.count("__kernel void") // 2  # a declaration and a definition each
    assert kernels >= 1 and source.count(exact_float.PRAGMA) == kernels
    bits = int(np.array(F32(SCALES[1])).view(np.int32))
    assert f"as_float({bits})" in source
    with tvm.transform.PassContext(opt_level=3):
        stock = relay.build(mod, target=tvm.target.Target("opencl", host="llvm"))
    stock_source = stock.lib.imported_modules[0].get_source()
    assert exact_float.PRAGMA not in stock_source and "as_float" not in stock_source


def test_fp_contract_off_calls_a_registered_postproc_and_restores_it():
    name = "tvm_callback_opencl_postproc"
    assert tvm.get_global_func(name, allow_missing=True) is None
    tvm.register_func(name, lambda code, target: "// user\n" + code)
    try:
        with exact_float.fp_contract_off(), exact_float.fp_contract_off():
            assert tvm.get_global_func(name)("int x;", None) == exact_float.PRAGMA + "\n// user\nint x;"
        assert tvm.get_global_func(name)("int x;", None) == "// user\nint x;"
    finally:
        tvm._ffi.registry.remove_global_func(name)


@pytest.mark.parametrize("value, dtype, exact", [
    (0.5, "float32", True), (float(F32(SCALES[1])), "float32", False), (0.123456789, "float64", False),
    (0.25, "float64", True), (float("inf"), "float32", True)])
def test_printed_exactly(value, dtype, exact):
    assert exact_float.printed_exactly(value, dtype) is exact
