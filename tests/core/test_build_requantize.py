"""pipelines.int8() requantizes with exact integer arithmetic at every x86 target, whatever was built before.

The oracle is exact rational arithmetic of QNN's requantize, ``floor(acc * s_in / s_out + 1/2) + zp``
(rounding ``UPWARD``), clipped to uint8. The scales are those of a requantize of the full-size zoo
QOperator ResNet-50 (a downsampling 1x1 conv of its third stage), where ``acc = 17057`` is exactly
28.4999935 and TVM's float32 lowering, its default at SSE4.1 targets, gives 29.
"""
from fractions import Fraction

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.contrib import graph_executor

import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.x86.isa import runs_on_host

S_IN, S_OUT, ZP = np.float32(6.2514846e-05), np.float32(0.037414595), 128
#: the near-half accumulator, its neighbours, and a spread over the uint8 output range
ACC = np.concatenate([[17057, 17056, 17058, -17057, 0], np.arange(-80000, 80000, 997)]).astype("int32")
TARGET = "llvm -mcpu=x86-64-v3"  # AVX2 code: SSE4.1, so TVM's default requantize is float32

needs_host = pytest.mark.skipif(not runs_on_host(TARGET), reason=f"host cannot run {TARGET}")


def _exact(acc: np.ndarray) -> np.ndarray:
    m = Fraction(float(S_IN)) / Fraction(float(S_OUT))
    q = [(2 * int(a) * m.numerator + m.denominator) // (2 * m.denominator) + ZP for a in acc]
    return np.clip(np.array(q, dtype=np.int64), 0, 255).astype("uint8")


def _module() -> tvm.IRModule:
    """A new module each time: TVM writes the lowering it chose into a requantize's attributes."""
    x = relay.var("acc", shape=ACC.shape, dtype="int32")
    y = relay.qnn.op.requantize(x, relay.const(S_IN), relay.const(0), relay.const(S_OUT), relay.const(ZP),
                                out_dtype="uint8")
    return tvm.IRModule.from_expr(relay.Function([x], y))


def _run(lib) -> np.ndarray:
    m = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    m.set_input("acc", ACC)
    m.run()
    return m.get_output(0).numpy()


def _stock(mod, target):
    with tvm.transform.PassContext(opt_level=3):
        return relay.build(mod, target=target)


def _requantize_attrs(mod):
    return mod["main"].body.attrs


@needs_host
def test_int8_requantize_is_exact_where_stock_rounds_in_float32():
    exact = _exact(ACC)
    assert exact[0] == 28 + ZP  # 28.4999935 rounds down
    stock = _run(_stock(_module(), TARGET))
    assert stock[0] == exact[0] + 1, "the case must tell the float32 lowering from exact arithmetic"
    ext = _run(tvm_ext.build(_module(), target=TARGET, passes=pipelines.int8()))
    np.testing.assert_array_equal(ext, exact)


@needs_host
def test_int8_requantize_does_not_follow_an_earlier_build_of_the_same_module():
    mod = _module()
    _stock(mod, TARGET)
    assert _requantize_attrs(mod).compute_dtype == "float32"  # TVM 0.19 wrote its choice into the call
    np.testing.assert_array_equal(_run(tvm_ext.build(mod, target=TARGET, passes=pipelines.int8())), _exact(ACC))


def test_build_leaves_the_callers_requantize_attributes_as_they_were():
    mod = _module()
    tvm_ext.build(mod, target=TARGET, passes=pipelines.int8())  # compile only
    assert _requantize_attrs(mod).compute_dtype == "None"
    assert _requantize_attrs(mod).rounding == "None"


def test_pin_requantize_returns_a_new_module_and_leaves_the_callers():
    from tvm_ext.core.build import pin_requantize

    mod = _module()
    pinned = pin_requantize(mod, dict(pipelines.EXACT_REQUANTIZE))
    assert (_requantize_attrs(mod).compute_dtype, _requantize_attrs(mod).rounding) == ("None", "None")
    assert (_requantize_attrs(pinned).compute_dtype, _requantize_attrs(pinned).rounding) == ("int64", "None")


def _ties_module(rounding: str) -> tvm.IRModule:
    """A requantize by 1/2: every odd accumulator is a tie. TVM's ONNX importer writes
    ``rounding="TONEAREST"`` for ``QGemm`` and ``QLinearMatMul``."""
    x = relay.var("acc", shape=TIES.shape, dtype="int32")
    y = relay.qnn.op.requantize(x, relay.const(np.float32(0.5)), relay.const(0), relay.const(np.float32(1.0)),
                                relay.const(0), rounding=rounding, out_dtype="int8")
    return tvm.IRModule.from_expr(relay.Function([x], y))


TIES = np.arange(-9, 10).astype("int32")


@pytest.mark.parametrize("rounding, want", [
    ("TONEAREST", np.sign(TIES) * ((np.abs(TIES) + 1) // 2)),  # half away from zero: -4.5 -> -5
    ("UPWARD", (TIES + 1) // 2),                                # half up: -4.5 -> -4
    ("None", (TIES + 1) // 2),                                  # unset: TVM's default, UPWARD
])
def test_int8_keeps_each_requantize_rounding(rounding, want):
    from tvm_ext.testing import run_module

    for target in ("llvm", TARGET):
        if not runs_on_host(target):
            continue
        got = run_module(tvm_ext.build(_ties_module(rounding), target=target, passes=pipelines.int8()),
                         {"acc": TIES})[0]
        np.testing.assert_array_equal(got, want.astype("int8"), err_msg=f"rounding={rounding} at {target}")
