"""tvm_ext.arm.requantize: qnn.requantize on aarch64 rounded once (TVM's generic q_multiply_shift).

Compiled only (aarch64 code does not run here); tests/arm/ runs such builds under qemu through TVM's
RPC server against exact integer arithmetic.
"""
import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.arm import requantize

N1 = "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1 -mattr=+neon,+dotprod"


def _conv_requantize():
    """An int8 conv with its requantize vectorised in the epilogue (where TVM 0.19's aarch64
    lowering uses sqrdmulh + srshl)."""
    w = np.random.default_rng(0).integers(-127, 128, (64, 64, 3, 3)).astype("int8")
    x = relay.var("x", shape=(1, 64, 14, 14), dtype="uint8")
    y = relay.qnn.op.conv2d(x, relay.const(w), relay.const(77), relay.const(0), relay.const(np.float32(0.02)),
                            relay.const(np.float32(0.01)), kernel_size=(3, 3), channels=64, padding=(1, 1),
                            out_dtype="int32")
    y = relay.qnn.op.requantize(y, relay.const(np.float32(0.0002)), relay.const(0), relay.const(np.float32(0.005)),
                                relay.const(3), out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([x], y))


def _asm(build):
    return build().get_lib().get_source("asm")


def _stock(mod, target=N1):
    with tvm.transform.PassContext(opt_level=3):
        return relay.build(mod, target=target)


@pytest.fixture(scope="module")
def mod():
    return _conv_requantize()


def test_stock_rounds_twice_tvm_ext_once(mod):
    assert "sqrdmulh" in _asm(lambda: _stock(mod)), "TVM 0.19's aarch64 lowering (two roundings)"
    assert "sqrdmulh" not in _asm(lambda: tvm_ext.build(mod, target=N1))
    assert "sqrdmulh" in _asm(lambda: _stock(mod)), "TVM's lowering is back after the build"


def test_nested_and_failing_entries_restore_tvms_lowering(mod):
    with pytest.raises(RuntimeError):
        with requantize.generic_q_multiply_shift():
            with requantize.generic_q_multiply_shift():
                pass
            assert "sqrdmulh" not in _asm(lambda: _stock(mod)), "still replaced after the inner exit"
            raise RuntimeError("boom")
    assert "sqrdmulh" in _asm(lambda: _stock(mod))


def test_other_targets_untouched(mod):
    x86 = "llvm -mcpu=x86-64-v3"
    with requantize.generic_q_multiply_shift():
        inside = _asm(lambda: _stock(mod, x86))
    assert inside == _asm(lambda: _stock(mod, x86))
