"""tvm-ext's 8-bit dense kernels (tvm_ext.arm.int8_dense) under qemu: exact integer results.

The dot-product kernel (+dotprod; one data row at +i8mm) and the matrix-multiply kernel (+i8mm, two
or more rows; an odd count reads a padding row) against numpy int64 arithmetic, with data over the
full uint8 range, weights over [-127, 127], and the shapes each kernel treats differently: one, two
and three data rows, an odd unit count, a long reduction.
"""
import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.testing.aarch64 import TARGETS, run_on_session

from _cases import dense_reference, qnn_dense


# [neoverse-v1-1-64-16] is slow: one int8 data row at +i8mm (the dot-product kernel), which
# test_uint8_weights_exact_under_qemu[1-udot] runs at +i8mm and [neoverse-n1-3-2048-40] with int8 weights in the
# default tier
@pytest.mark.parametrize("cpu, m, k, n", [pytest.param("neoverse-n1", 1, 64, 15, marks=pytest.mark.slow),
                                          ("neoverse-n1", 3, 2048, 40),
                                          pytest.param("neoverse-v1", 1, 64, 16, marks=pytest.mark.slow),
                                          ("neoverse-v1", 3, 64, 10),
                                          pytest.param("neoverse-v1", 4, 2048, 24, marks=pytest.mark.slow)])
def test_qnn_dense_exact_under_qemu(cpu, m, k, n, arm_session, tmp_path):
    mod, x, w = qnn_dense(np.random.default_rng(m * k + n), m=m, k=k, n=n)
    factory = tvm_ext.build(mod, target=TARGETS[cpu], kernels=True)
    (out,) = run_on_session(arm_session, factory, {"x": x}, tmp_path, f"dense_{cpu}_{m}_{k}_{n}")
    np.testing.assert_array_equal(out, dense_reference(x, w), err_msg=f"qnn.dense {m}x{k}x{n} at {TARGETS[cpu]}")


@pytest.mark.parametrize("m, instruction", [(1, "udot"), (2, "ummla")])
def test_uint8_weights_exact_under_qemu(m, instruction, arm_session, tmp_path):
    rng = np.random.default_rng(m)
    x = rng.integers(0, 256, (m, 32)).astype("uint8")
    w = rng.integers(0, 256, (8, 32)).astype("uint8")
    var = relay.var("x", shape=x.shape, dtype="uint8")
    y = relay.nn.dense(var, relay.const(w), units=8, out_dtype="int32")
    factory = tvm_ext.build(tvm.IRModule.from_expr(relay.Function([var], y)), target=TARGETS["neoverse-v1"],
                            kernels=True)
    assert instruction in factory.get_lib().get_source("asm")
    (out,) = run_on_session(arm_session, factory, {"x": x}, tmp_path, f"dense_u8_{m}")
    np.testing.assert_array_equal(out, x.astype(np.int64) @ w.astype(np.int64).T)
