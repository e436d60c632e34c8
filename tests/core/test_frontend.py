"""Tests for tvm_ext._compat (onnx.mapping shim) and tvm_ext.core.frontend."""
import sys
import types

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tvm_ext  # noqa: F401  (installs the shim)
from tvm_ext import _compat


def _tiny_model(in_shape=(2, 3), name="x"):
    """y = Relu(Cast<float>(Cast<int32>(x * 2)) + b) ; exercises Cast (uses onnx.mapping)."""
    b = helper.make_tensor("b", TensorProto.FLOAT, [3], [0.5, -1.0, 2.0])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    nodes = [
        helper.make_node("Mul", [name, "two"], ["m"]),
        helper.make_node("Cast", ["m"], ["mi"], to=TensorProto.INT32),
        helper.make_node("Cast", ["mi"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["mf", "b"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(in_shape)),
         # old exporters list initializers as inputs too: must be ignored
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(in_shape))],
        initializer=[b, two],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _tiny_ref(x):
    return np.maximum(np.trunc(x * 2).astype(np.int32).astype(np.float32) + np.array([0.5, -1.0, 2.0], np.float32), 0)


def _run_relay(mod, params, feeds):
    import tvm
    from tvm import relay
    from tvm.contrib import graph_executor

    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target="llvm", params=params)
    g = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    for k, v in feeds.items():
        g.set_input(k, v)
    g.run()
    return g.get_output(0).numpy()


# ----------------------------------------------------------------- shim ----
def test_shim_module_contents():
    with _compat.onnx_mapping():
        import onnx.mapping as m

        assert m.TENSOR_TYPE_TO_NP_TYPE[TensorProto.FLOAT] == np.dtype("float32")
        assert m.TENSOR_TYPE_TO_NP_TYPE[TensorProto.INT8] == np.dtype("int8")
        assert m.TENSOR_TYPE_TO_NP_TYPE[TensorProto.UINT8] == np.dtype("uint8")
        assert m.NP_TYPE_TO_TENSOR_TYPE[np.dtype("int64")] == TensorProto.INT64
        assert m.NP_TYPE_TO_TENSOR_TYPE[np.dtype("float16")] == TensorProto.FLOAT16
        assert m.TENSOR_TYPE_TO_STORAGE_TENSOR_TYPE[TensorProto.FLOAT16] in (TensorProto.UINT16, TensorProto.INT32)
        assert onnx.mapping is sys.modules["onnx.mapping"]


def test_shim_is_removed_on_exit_and_idempotent_inside():
    assert "onnx.mapping" not in sys.modules
    with _compat.onnx_mapping():
        before = sys.modules["onnx.mapping"]
        assert _compat.install_onnx_mapping_shim() is True
        assert sys.modules["onnx.mapping"] is before
        with _compat.onnx_mapping():  # nested: the outer one owns it
            pass
        assert sys.modules["onnx.mapping"] is before
    assert "onnx.mapping" not in sys.modules and not hasattr(onnx, "mapping")


def test_shim_leaves_real_mapping_alone(monkeypatch):
    real = types.ModuleType("onnx.mapping")
    real.TENSOR_TYPE_TO_NP_TYPE = {"sentinel": 1}
    monkeypatch.setitem(sys.modules, "onnx.mapping", real)
    monkeypatch.setattr(onnx, "mapping", real, raising=False)
    assert _compat.install_onnx_mapping_shim() is False
    assert sys.modules["onnx.mapping"] is real


def test_libinfo_cache_returns_tvms_build_info_and_is_undone():
    import tvm.support
    from tvm.relay.backend import te_compiler

    original = te_compiler.libinfo
    with _compat.te_compiler_libinfo_cached():
        first = te_compiler.libinfo
        assert first is not original
        with _compat.te_compiler_libinfo_cached():
            assert te_compiler.libinfo is first  # not wrapped twice
        assert first() == dict(tvm.support.libinfo())
        first()["INDEX_DEFAULT_I64"] = "changed"  # a caller mutating its copy changes nothing
        assert first()["INDEX_DEFAULT_I64"] == tvm.support.libinfo()["INDEX_DEFAULT_I64"]
    assert te_compiler.libinfo is original


@pytest.mark.parametrize("given, seen", [(None, "NONE"), ("/srv/tophub", "/srv/tophub")])
def test_no_tophub_download_while_entered(given, seen, monkeypatch):
    """TOPHUB_LOCATION is NONE while a build runs unless the user set it, and is unset again after."""
    import os

    monkeypatch.delenv("TOPHUB_LOCATION", raising=False)
    if given is not None:
        monkeypatch.setenv("TOPHUB_LOCATION", given)
    with _compat.no_tophub_download():
        assert os.environ.get("TOPHUB_LOCATION") == seen
    assert os.environ.get("TOPHUB_LOCATION") == given
