"""Tests for tvm_ext._compat (onnx.mapping shim) and tvm_ext.core.frontend."""
import logging
import sys
import types

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tvm_ext  # noqa: F401  (installs the shim)
from tvm_ext import _compat
from tvm_ext.core import frontend


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
    import onnx.mapping as m

    assert m.TENSOR_TYPE_TO_NP_TYPE[TensorProto.FLOAT] == np.dtype("float32")
    assert m.TENSOR_TYPE_TO_NP_TYPE[TensorProto.INT8] == np.dtype("int8")
    assert m.TENSOR_TYPE_TO_NP_TYPE[TensorProto.UINT8] == np.dtype("uint8")
    assert m.NP_TYPE_TO_TENSOR_TYPE[np.dtype("int64")] == TensorProto.INT64
    assert m.NP_TYPE_TO_TENSOR_TYPE[np.dtype("float16")] == TensorProto.FLOAT16
    assert m.TENSOR_TYPE_TO_STORAGE_TENSOR_TYPE[TensorProto.FLOAT16] == TensorProto.UINT16 or \
        m.TENSOR_TYPE_TO_STORAGE_TENSOR_TYPE[TensorProto.FLOAT16] == TensorProto.INT32
    assert onnx.mapping is sys.modules["onnx.mapping"]


def test_shim_idempotent():
    before = sys.modules["onnx.mapping"]
    assert _compat.install_onnx_mapping_shim() is True
    assert _compat.install_onnx_mapping_shim() is True
    assert sys.modules["onnx.mapping"] is before


def test_shim_leaves_real_mapping_alone(monkeypatch):
    real = types.ModuleType("onnx.mapping")
    real.TENSOR_TYPE_TO_NP_TYPE = {"sentinel": 1}
    monkeypatch.setitem(sys.modules, "onnx.mapping", real)
    monkeypatch.setattr(onnx, "mapping", real, raising=False)
    assert _compat.install_onnx_mapping_shim() is False
    assert sys.modules["onnx.mapping"] is real


def test_libinfo_cache_returns_tvms_build_info_and_is_idempotent():
    import tvm.support
    from tvm.relay.backend import te_compiler

    assert _compat.install_libinfo_cache() is True
    first = te_compiler.libinfo
    assert _compat.install_libinfo_cache() is True
    assert te_compiler.libinfo is first  # not wrapped twice
    assert first() == dict(tvm.support.libinfo())
    first()["INDEX_DEFAULT_I64"] = "changed"  # a caller mutating its copy changes nothing
    assert first()["INDEX_DEFAULT_I64"] == tvm.support.libinfo()["INDEX_DEFAULT_I64"]


@pytest.mark.parametrize("given, seen", [(None, "NONE"), ("/srv/tophub", "/srv/tophub")])
def test_tophub_env_default(given, seen):
    """``import tvm_ext`` sets TOPHUB_LOCATION=NONE when it is unset and keeps the user's value. A new
    process: this one's TOPHUB_LOCATION was set before tvm_ext was imported (``tests/conftest.py``)."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TOPHUB_LOCATION"}
    if given is not None:
        env["TOPHUB_LOCATION"] = given
    code = "import os, tvm_ext; print(os.environ.get('TOPHUB_LOCATION'))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == seen


def test_relay_from_onnx_needs_shim(monkeypatch):
    """Without the shim TVM 0.19's frontend fails on onnx>=1.16; with it, it works."""
    from tvm import relay

    model = _tiny_model()
    if not getattr(sys.modules.get("onnx.mapping"), "__tvm_ext_shim__", False):
        pytest.skip("real onnx.mapping present: nothing to shim")
    monkeypatch.delitem(sys.modules, "onnx.mapping")
    monkeypatch.delattr(onnx, "mapping")
    with pytest.raises(ImportError):
        relay.frontend.from_onnx(model, shape={"x": (2, 3)})
    assert _compat.install_onnx_mapping_shim() is True
    mod, _ = relay.frontend.from_onnx(model, shape={"x": (2, 3)})
    assert "cast" in mod.astext()


def test_from_onnx_tiny_model_runs():
    model = _tiny_model()
    mod, params = frontend.from_onnx(model)
    x = np.array([[0.3, -0.9, 1.6], [-2.2, 0.1, 0.7]], np.float32)
    y = _run_relay(mod, params, {"x": x})
    np.testing.assert_allclose(y, _tiny_ref(x), rtol=1e-6)
    assert mod["main"].params[0].type_annotation.concrete_shape == (2, 3)


def test_from_onnx_path(tmp_path):
    p = tmp_path / "tiny.onnx"
    onnx.save(_tiny_model(), str(p))
    mod, _ = frontend.from_onnx(str(p))
    assert [v.name_hint for v in mod["main"].params] == ["x"]
    mod2, _ = frontend.from_onnx(p)  # pathlib
    assert mod2["main"].params[0].type_annotation.concrete_shape == (2, 3)


# ------------------------------------------------------------ input_info ----
def test_input_info_skips_initializers_and_reports_dtype():
    info = frontend.input_info(_tiny_model())
    assert info == {"x": ((2, 3), "float32")}


def test_dynamic_dim_raises_clear_error():
    model = _tiny_model(in_shape=(2, "K"))
    with pytest.raises(ValueError) as ei:
        frontend.from_onnx(model)
    msg = str(ei.value)
    assert "'x'" in msg and "shape=" in msg and "dim 1" in msg
    mod, _ = frontend.from_onnx(model, shape={"x": (2, 3)})
    assert mod["main"].params[0].type_annotation.concrete_shape == (2, 3)


def test_unknown_dim_raises():
    model = _tiny_model(in_shape=(2, None))
    with pytest.raises(ValueError, match=r"dynamic dim 1 \(\?\)"):
        frontend.input_info(model)


def test_missing_shape_raises():
    model = _tiny_model()
    model.graph.input[0].type.tensor_type.ClearField("shape")
    with pytest.raises(ValueError, match="has no shape"):
        frontend.input_info(model)


def test_symbolic_batch_defaults_to_one_with_warning(caplog):
    model = _tiny_model(in_shape=("N", 3))
    with caplog.at_level(logging.WARNING, logger="tvm_ext.core.frontend"):
        info = frontend.input_info(model)
    assert info["x"][0] == (1, 3)
    assert any("batch" in r.getMessage() and "'N'" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError):
        frontend.input_info(model, default_batch=None)


def test_shape_override_unknown_name():
    with pytest.raises(ValueError, match="unknown input"):
        frontend.input_info(_tiny_model(), shape={"nope": (1,)})


def test_dtype_override():
    mod, _ = frontend.from_onnx(_tiny_model(), dtype="float32")
    assert str(mod["main"].params[0].type_annotation.dtype) == "float32"


# ---------------------------------------------------------------- errors ----
def test_missing_file(tmp_path):
    p = tmp_path / "nope.onnx"
    with pytest.raises(FileNotFoundError, match="nope.onnx"):
        frontend.from_onnx(p)
    with pytest.raises(FileNotFoundError):
        frontend.load_onnx(tmp_path)  # a directory is not a model file


@pytest.mark.parametrize(
    "content",
    [b"hello, this is a text file\n", b"", bytes(range(256)) * 4, b"\x08\x07"],
    ids=["text", "empty", "binary", "protobuf-ish"],
)
def test_not_onnx_file(tmp_path, content):
    p = tmp_path / "junk.onnx"
    p.write_bytes(content)
    with pytest.raises(ValueError) as ei:
        frontend.from_onnx(p)
    msg = str(ei.value)
    assert msg.startswith(f"{p} is not an ONNX model: ")
    assert "\n" not in msg


def test_bad_type():
    with pytest.raises(TypeError):
        frontend.load_onnx(42)
