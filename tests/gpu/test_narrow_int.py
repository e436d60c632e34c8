"""tvm_ext.gpu.narrow_int: 8- and 16-bit arithmetic wraps in GPU kernels as TIR says (C promotes
``char * char`` to ``int``). Oracle: numpy's wrapping arithmetic. Run on PoCL (skipped with the reason
where the OpenCL set-up is missing); the rewrite itself is checked on TIR without a device."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay, te

import tvm_ext
from tvm_ext.gpu import narrow_int, opencl
from _opencl_cases import device_or_skip, run_graph

OPS = {"add": (relay.add, np.add), "subtract": (relay.subtract, np.subtract), "multiply": (relay.multiply, np.multiply)}


@pytest.fixture(autouse=True, scope="module")
def _opencl_runtime():
    opencl.load_runtime()


def _widened(op, dtype):
    """x op y in ``dtype``, widened to int32 in the same kernel (where C's promotion shows)."""
    x, y = relay.var("x", shape=(64,), dtype=dtype), relay.var("y", shape=(64,), dtype=dtype)
    return tvm.IRModule.from_expr(relay.Function([x, y], relay.cast(OPS[op][0](x, y), "int32")))


def _extreme_inputs(dtype):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(0)
    edge = np.array([info.min, info.max, info.min + 1, info.max - 1, 0, 1, -1 if info.min < 0 else 2, 77], dtype)
    x = np.concatenate([edge, rng.integers(info.min, info.max, 56, endpoint=True, dtype=dtype)])
    y = np.concatenate([edge[::-1], rng.integers(info.min, info.max, 56, endpoint=True, dtype=dtype)])
    return x, y


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_narrow_arithmetic_widened_in_the_kernel_wraps_as_numpy_on_opencl(op, dtype):
    dev = device_or_skip()
    x, y = _extreme_inputs(dtype)
    with np.errstate(over="ignore"):
        want = OPS[op][1](x, y).astype(dtype).astype("int32")  # numpy wraps in the narrow type
    (got,) = run_graph(tvm_ext.build(_widened(op, dtype), target="opencl"), dev, {"x": x, "y": y})
    np.testing.assert_array_equal(got, want)


def _lowered(dtype, lanes=1):
    """The lowered TIR of C = A * B + A in ``dtype`` (``lanes`` > 1: a vector type)."""
    shape = (16,)
    a = te.placeholder(shape, dtype=dtype if lanes == 1 else f"{dtype}x{lanes}", name="A")
    b = te.placeholder(shape, dtype=a.dtype, name="B")
    c = te.compute(shape, lambda i: a[i] * b[i] + a[i], name="C")
    return tvm.lower(te.create_schedule(c.op), [a, b, c])["main"]


def _binary_ops(func):
    found = []
    tvm.tir.stmt_functor.post_order_visit(func.body, lambda n: found.append((type(n).__name__, str(n.dtype)))
                                          if isinstance(n, (tvm.tir.Add, tvm.tir.Mul, tvm.tir.Sub)) else None)
    return found


def test_scalar_narrow_arithmetic_is_computed_in_int32_and_wrapped():
    func = _lowered("int8")
    assert ("Mul", "int8") in _binary_ops(func)
    out = tvm.IRModule({"main": func})
    out = narrow_int.WrapNarrowIntegers()(out)["main"]
    ops = _binary_ops(out)
    assert not [o for o in ops if o[1] == "int8"], f"narrow arithmetic left: {ops}"
    assert ("Mul", "int32") in ops and ("Add", "int32") in ops
    again = narrow_int.WrapNarrowIntegers()(tvm.IRModule({"main": out}))["main"]
    assert _binary_ops(again) == ops, "a second run finds no narrow arithmetic"


@pytest.mark.parametrize("dtype, lanes", [("int32", 1), ("float32", 1), ("int8", 4)])
def test_wide_and_vector_arithmetic_is_left_alone(dtype, lanes):
    func = _lowered(dtype, lanes)
    out = narrow_int.WrapNarrowIntegers()(tvm.IRModule({"main": func}))["main"]
    tvm.ir.assert_structural_equal(out, func)


def test_lower_config_adds_the_pass_once_after_the_users():
    user = tvm.tir.transform.prim_func_pass(lambda f, m, c: f, opt_level=0, name="user_pass")
    cfg = narrow_int.lower_config({"tir.add_lower_pass": [(1, user)]})
    names = [p[1].info.name for p in cfg["tir.add_lower_pass"]]
    assert names == ["user_pass", narrow_int.PASS_NAME]
    assert [p[1].info.name for p in narrow_int.lower_config(cfg)["tir.add_lower_pass"]] == names
