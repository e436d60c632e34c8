"""Test helpers for Relay passes: structural checks and numerical differential runs.

``check(pass_, before, expected)`` is the one structural helper every pass test uses;
``assert_same_outputs`` builds two modules with TVM and compares them on seeded random inputs
(bit for bit for integer outputs).
"""
from __future__ import annotations

import contextlib
import os

import numpy as np

__all__ = ["QOperatorNet", "qoperator_net", "exact_ort_session", "infer", "check", "run_module", "random_inputs",
           "assert_same_outputs", "assert_unchanged", "with_instruments", "environment"]


def with_instruments(*instruments):
    """A PassContext equal to the current one plus ``instruments`` (for autouse test fixtures)."""
    import tvm

    cur = tvm.transform.PassContext.current()
    return tvm.transform.PassContext(
        opt_level=cur.opt_level,
        config=dict(cur.config) if cur.config else None,
        disabled_pass=list(cur.disabled_pass) if cur.disabled_pass else None,
        instruments=[*(cur.instruments or []), *instruments],
    )


@contextlib.contextmanager
def environment(name: str, value: str):
    """Set the environment variable ``name`` inside the block; restore (or unset) it after."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def infer(mod_or_expr, *more_outputs):
    """InferType on an IRModule, a Function or an expression (wrapped as main).

    Several expressions make a ``main`` returning their tuple; free variables become parameters.
    """
    import tvm
    from tvm import relay

    if more_outputs:
        mod_or_expr = relay.Tuple([mod_or_expr, *more_outputs])
    if isinstance(mod_or_expr, tvm.IRModule):
        return relay.transform.InferType()(mod_or_expr)
    if not isinstance(mod_or_expr, relay.Function):
        mod_or_expr = relay.Function(relay.analysis.free_vars(mod_or_expr), mod_or_expr)
    return relay.transform.InferType()(tvm.IRModule.from_expr(mod_or_expr))


def check(pass_, before, expected, opt_level: int = 3):
    """Run ``pass_`` on ``before`` and assert the result equals ``expected`` structurally.

    Both are type-inferred modules (or expressions); the input module must not be mutated.
    Returns the transformed module.
    """
    import tvm
    from tvm import relay

    before = infer(before)
    expected = infer(expected)
    text_before = before.astext()
    cur = tvm.transform.PassContext.current()  # keep the caller's instruments (e.g. well-formedness)
    with tvm.transform.PassContext(opt_level=opt_level, instruments=list(cur.instruments or [])):
        after = relay.transform.InferType()(pass_(before))
    assert before.astext() == text_before, "the pass mutated its input module"
    for gv in after.get_global_vars():
        assert not relay.analysis.free_vars(after[gv]), f"free variables in {gv.name_hint}"
    tvm.ir.assert_structural_equal(after["main"], expected["main"], map_free_vars=True)
    return after


def assert_unchanged(pass_, mod, opt_level: int = 3):
    """The pass leaves ``mod`` structurally unchanged."""
    return check(pass_, mod, mod, opt_level=opt_level)


def random_inputs(mod, seed: int = 0) -> dict:
    """Seeded random inputs for ``main``'s parameters (ints within a small range)."""
    mod = infer(mod)
    rng = np.random.default_rng(seed)
    out = {}
    for p in mod["main"].params:
        shape = [int(d) for d in p.checked_type.shape]
        dtype = p.checked_type.dtype
        if dtype.startswith(("int", "uint")):
            info = np.iinfo(dtype)
            lo, hi = max(info.min, -100), min(info.max, 100)
            out[p.name_hint] = rng.integers(lo, hi + 1, size=shape).astype(dtype)
        elif dtype == "bool":
            out[p.name_hint] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            out[p.name_hint] = rng.standard_normal(shape).astype(dtype)
    return out


def run_module(factory_or_mod, inputs: dict, target="llvm", params=None, opt_level: int = 3):
    """Run a built factory (or build ``mod`` with relay.build first); returns a list of outputs."""
    import tvm
    from tvm import relay
    from tvm.contrib import graph_executor

    if isinstance(factory_or_mod, tvm.IRModule):
        with tvm.transform.PassContext(opt_level=opt_level):
            factory_or_mod = relay.build(factory_or_mod, target=target, params=params)
    gm = graph_executor.GraphModule(factory_or_mod["default"](tvm.cpu()))
    for k, v in inputs.items():
        gm.set_input(k, v)
    gm.run()
    return [gm.get_output(i).numpy() for i in range(gm.get_num_outputs())]


def assert_same_outputs(a, b, inputs: dict, target="llvm", rtol=1e-5, atol=1e-5, opt_level: int = 3):
    """Build/run ``a`` and ``b`` (modules or factories) and compare outputs.

    Integer and boolean outputs must match bit for bit; floats within ``rtol``/``atol``.
    """
    out_a = run_module(a, inputs, target, opt_level=opt_level)
    out_b = run_module(b, inputs, target, opt_level=opt_level)
    assert len(out_a) == len(out_b), f"{len(out_a)} outputs vs {len(out_b)}"
    for i, (x, y) in enumerate(zip(out_a, out_b)):
        assert x.dtype == y.dtype and x.shape == y.shape, f"output {i}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}"
        if np.issubdtype(x.dtype, np.integer) or x.dtype == bool:
            np.testing.assert_array_equal(x, y, err_msg=f"output {i} differs (integer: must be bit-exact)")
        else:
            np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=f"output {i} differs")
    return out_a, out_b


def exact_ort_session(model):
    """An ONNX Runtime CPU session of ``model`` (path or bytes) on its exact int8 path
    (``session.x64quantprecision``): by default, on CPUs without VNNI, ONNX Runtime's uint8 x int8
    kernels saturate int16 pair sums, as TVM's do. A model it has no such kernel for (int8 x int8
    QOperator: ONNX Runtime says NOT_IMPLEMENTED) gets the default session, with a warning on
    ``tvm_ext.testing``; any other error is raised."""
    import logging

    import onnxruntime as ort
    from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as OrtNotImplemented

    options = ort.SessionOptions()
    options.add_session_config_entry("session.x64quantprecision", "1")
    try:
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    except OrtNotImplemented as err:
        logging.getLogger(__name__).warning("exact_ort_session: no exact int8 kernel for this model (%s); "
                                            "using ONNX Runtime's default session", str(err).splitlines()[0][:200])
        return ort.InferenceSession(model, providers=["CPUExecutionProvider"])



class QOperatorNet:
    """What a model loader gives (as :class:`tvm_ext.tools.zoo.ZooModel`): module, params, its input."""

    def __init__(self, mod, input_name: str, input_shape: tuple):
        self.mod, self.params, self.input_name, self.input_shape = mod, {}, input_name, input_shape
        self.input_dtype = "float32"


def qoperator_net(size: int = 16) -> QOperatorNet:
    """Three convolutions as TVM imports an ONNX QOperator model (uint8 activations, int8 weights):
    quantize, then per conv a zero-point ``nn.pad`` for the 3x3 ones, ``qnn.conv2d``, an int32 bias
    and ``qnn.requantize`` to uint8 with ReLU as a clip at the zero point; dequantized at the end.
    Seconds to build, where a small zoo ResNet takes most of a minute."""
    import tvm
    from tvm import relay

    rng = np.random.default_rng(0)
    x = relay.var("data", shape=(1, 3, size, size))
    zp, scale = relay.const(128), relay.const(np.float32(0.05))
    y = relay.qnn.op.quantize(x, scale, zp, out_dtype="uint8")
    for cin, cout, k in ((3, 32, 3), (32, 64, 1), (64, 64, 3)):
        if k == 3:
            y = relay.nn.pad(y, ((0, 0), (0, 0), (1, 1), (1, 1)), pad_value=zp)
        w = relay.const(rng.integers(-127, 128, (cout, cin, k, k)).astype("int8"))
        acc = relay.qnn.op.conv2d(y, w, zp, relay.const(0), scale, relay.const(np.float32(0.01)),
                                  kernel_size=(k, k), channels=cout)
        acc = relay.nn.bias_add(acc, relay.const(rng.integers(-500, 500, cout).astype("int32")))
        y = relay.qnn.op.requantize(acc, relay.const(np.float32(0.05 * 0.01)), relay.const(0), scale, zp,
                                    out_dtype="uint8")
        y = relay.clip(y, 128, 255)
    out = relay.qnn.op.dequantize(y, scale, zp)
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], out)))
    return QOperatorNet(mod, "data", (1, 3, size, size))
