"""tvm_ext.tools.ort_isa: ONNX Runtime dispatching as on an AVX2-only CPU, for the benchmark's peer.

Everything that imports a patched onnxruntime runs in a child process; this process keeps the
installed one (checked at the end).
"""
import math
import shutil
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tvm_ext.tools import bench, ort_isa
from tvm_ext.x86 import isa

HOST = isa.host_features()
HOST_INT8_DOT = "int32" if ({"avx512vnni", "avxvnni"} & HOST) else "int16-saturating"
CANNOT_MASK = ort_isa.mask_unavailable_reason() or (
    None if shutil.which("objdump") else "finding xgetbv in ONNX Runtime's libraries needs objdump")
needs_mask = pytest.mark.skipif(CANNOT_MASK is not None, reason=f"cannot mask ONNX Runtime here: {CANNOT_MASK}")


@pytest.fixture(scope="module")
def masked(tmp_path_factory):
    if CANNOT_MASK is not None:
        pytest.skip(f"cannot mask ONNX Runtime here: {CANNOT_MASK}")
    return ort_isa.masked_package(tmp_path_factory.mktemp("cache") / "ort-avx2")


def _qlinear_matmul_model(path):
    """y = QLinearMatMul(x u8, w s8) with weights that saturate AVX2's int16 pair sums."""
    k, n = 64, 8
    w = np.full([k, n], 127, np.int8)
    w[:, 1] = -128
    inits = [
        helper.make_tensor("w", TensorProto.INT8, [k, n], w.tobytes(), raw=True),
        helper.make_tensor("xs", TensorProto.FLOAT, [], [0.5]),
        helper.make_tensor("xz", TensorProto.UINT8, [], [0]),
        helper.make_tensor("ws", TensorProto.FLOAT, [], [0.01]),
        helper.make_tensor("wz", TensorProto.INT8, [], [0]),
        helper.make_tensor("ys", TensorProto.FLOAT, [], [2000.0]),
        helper.make_tensor("yz", TensorProto.UINT8, [], [128]),
    ]
    node = helper.make_node("QLinearMatMul", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"])
    g = helper.make_graph([node], "qmm", [helper.make_tensor_value_info("x", TensorProto.UINT8, [4, k])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, [4, n])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def test_probe_of_the_installed_onnxruntime_follows_the_host():
    got = ort_isa.probe()
    assert got["kernels"] == HOST_INT8_DOT, got
    assert got["value"] == (ort_isa.PROBE_EXACT if HOST_INT8_DOT == "int32" else ort_isa.PROBE_SATURATED)


@needs_mask
def test_masked_copy_runs_avx2_kernels(masked):
    info = (masked / "MASKED.json").read_text()
    assert "patched_xgetbv" in info
    got = ort_isa.probe(masked)
    assert got["kernels"] == "int16-saturating", got
    assert got["file"].startswith(str(masked)), "the probe imported the copy, not the installed package"


@needs_mask
def test_masked_copy_is_made_once(masked):
    before = (masked / "MASKED.json").stat().st_mtime_ns
    assert ort_isa.masked_package(masked.parent) == masked
    assert (masked / "MASKED.json").stat().st_mtime_ns == before


@pytest.mark.slow  # two objdump passes over ONNX Runtime's library: over a minute on 2 cores
def test_only_xgetbv_instructions_are_replaced(tmp_path):
    if shutil.which("objdump") is None:
        pytest.skip("needs objdump")
    src = next((p for p in sorted(ort_isa._installed_package().rglob("*.so*")) if ort_isa.xgetbv_offsets(p)), None)
    if src is None:
        pytest.skip("this onnxruntime build has no xgetbv instruction")
    offsets = ort_isa.xgetbv_offsets(src)
    dst = tmp_path / src.name
    assert ort_isa.patch_library(src, dst) == len(offsets) > 0
    a, b = src.read_bytes(), dst.read_bytes()
    changed = [i for i in range(0, len(a), 1 << 16) if a[i:i + (1 << 16)] != b[i:i + (1 << 16)]]
    diff = [i for c in changed for i in range(c, min(c + (1 << 16), len(a))) if a[i] != b[i]]
    assert len(a) == len(b)
    assert set(diff) <= {o + d for o in offsets for d in range(3)}
    for o in offsets:
        assert b[o:o + 3] == ort_isa.REPLACEMENT
    assert ort_isa.xgetbv_offsets(dst) == [], "no xgetbv left in the copy"


def test_not_an_elf_file_is_refused(tmp_path):
    bogus = tmp_path / "lib.so"
    bogus.write_bytes(b"MZ" + bytes(100))
    with pytest.raises(ort_isa.OrtIsaError, match="ELF64"):
        ort_isa._exec_segments(bogus.read_bytes())


def test_without_objdump_the_reason_is_given(monkeypatch, tmp_path):
    monkeypatch.setattr(ort_isa, "mask_unavailable_reason", lambda: None)
    monkeypatch.setattr(ort_isa.shutil, "which", lambda name: None)
    with pytest.raises(ort_isa.OrtIsaError, match="objdump"):
        ort_isa.masked_package(tmp_path)


def test_a_host_with_avx_vnni_is_refused_before_copying(monkeypatch, tmp_path):
    """AVX-VNNI is read from CPUID alone: no XCR0 mask hides it, so no copy is made."""
    monkeypatch.setattr(isa, "host_features", lambda: frozenset({"avx2", "avx512f", "avx512bw", "avxvnni"}))
    assert "AVX-VNNI" in ort_isa.mask_unavailable_reason()
    with pytest.raises(ort_isa.OrtIsaError, match="AVX-VNNI"):
        ort_isa.masked_package(tmp_path)
    assert not any(tmp_path.iterdir()), "nothing was copied"
    monkeypatch.setattr(isa, "host_features", lambda: frozenset({"avx2", "avx512f", "avx512bw", "avx512vnni"}))
    assert ort_isa.mask_unavailable_reason() is None
    monkeypatch.setattr(isa, "host_features", lambda: frozenset({"avx2", "fma"}))
    assert "no AVX-512" in ort_isa.mask_unavailable_reason()


def test_child_session_equals_in_process_onnxruntime(tmp_path):
    import onnxruntime as ort

    path = _qlinear_matmul_model(tmp_path / "m.onnx")
    x = np.random.default_rng(0).integers(0, 256, [4, 64], dtype=np.uint8)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with ort_isa.ChildSession(path, "x", 1) as s:
        np.testing.assert_array_equal(s.run(x), want)
        times = s.time(x, 3)
    assert len(times) == 3 and all(t > 0 for t in times)


@needs_mask
def test_masked_child_session_gives_avx2_numerics(masked, tmp_path):
    """255 x 127 pairs saturate in AVX2's vpmaddubsw: the masked ORT's int8 output differs from VNNI's."""
    import onnxruntime as ort

    path = _qlinear_matmul_model(tmp_path / "m.onnx")
    x = np.full([4, 64], 255, np.uint8)
    here = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with ort_isa.ChildSession(path, "x", 1, masked) as s:
        avx2 = s.run(x)
    exact = np.clip(np.round(255 * 0.5 * 0.01 * 64 * np.array([127, -128] + [127] * 6) / 2000.0) + 128, 0, 255)
    sat = np.clip(np.round(0.5 * 0.01 * 32 * np.array([32767, -32768] + [32767] * 6) / 2000.0) + 128, 0, 255)
    np.testing.assert_array_equal(avx2[0], sat.astype(np.uint8))
    if HOST_INT8_DOT == "int32":
        np.testing.assert_array_equal(here[0], exact.astype(np.uint8))


def test_bench_peer_choice(monkeypatch):
    host = bench.ort_peer("llvm -mcpu=x86-64-v3", "host")
    assert host["isa"] == "host" and host["package"] is None
    assert bench.ort_peer("llvm -mcpu=znver4", "auto")["isa"] == "host", "an AVX-512 target needs no masking"
    with pytest.raises(ValueError, match="ort_isa"):
        bench.ort_peer("llvm -mcpu=x86-64-v3", "avx512")
    monkeypatch.setattr(ort_isa, "masked_package", lambda: (_ for _ in ()).throw(ort_isa.OrtIsaError("no way")))
    got = bench.ort_peer("llvm -mcpu=x86-64-v3", "auto")
    assert got["package"] is None
    if "avx512f" in HOST:
        assert "no way" in got["note"], "the reason masking failed is recorded"


def _qlinear_matmul_saturating_and_exact(path):
    """The saturating model, an input whose pair sums saturate int16, and the exact output."""
    x = np.full([4, 64], 255, np.uint8)
    exact = np.clip(np.round(255 * 0.5 * 0.01 * 64 * np.array([127, -128] + [127] * 6) / 2000.0) + 128, 0, 255)
    return _qlinear_matmul_model(path), x, exact.astype(np.uint8)


def test_exact_session_options_ask_for_onnxruntimes_exact_int8_path():
    import onnxruntime as ort

    assert ort_isa.session_options(ort, 1, exact=True).get_session_config_entry("session.x64quantprecision") == "1"
    with pytest.raises(RuntimeError, match="x64quantprecision"):  # not set: ONNX Runtime's default path
        ort_isa.session_options(ort, 1).get_session_config_entry("session.x64quantprecision")


def test_exact_child_session_computes_exact_pair_sums(tmp_path):
    """On its exact path ONNX Runtime's int8 output is exact arithmetic whatever the host's int8 dot."""
    path, x, exact = _qlinear_matmul_saturating_and_exact(tmp_path / "m.onnx")
    with ort_isa.ChildSession(path, "x", 1, exact=True) as s:
        np.testing.assert_array_equal(s.run(x)[0], exact)


@needs_mask
def test_masked_exact_child_session_is_exact_where_the_default_saturates(masked, tmp_path):
    path, x, exact = _qlinear_matmul_saturating_and_exact(tmp_path / "m.onnx")
    with ort_isa.ChildSession(path, "x", 1, masked, exact=True) as s:
        np.testing.assert_array_equal(s.run(x)[0], exact)
    with ort_isa.ChildSession(path, "x", 1, masked) as s:
        assert not np.array_equal(s.run(x)[0], exact), "without the option the AVX2 kernels saturate"


def _two_readers_of_one_int8_weight(path):
    """Two QLinearMatMul reading the same int8 weights and zero point (as quantizers share them), with the
    saturating model's values: each output is the saturating model's exact output."""
    one = onnx.load(_qlinear_matmul_model(path))
    g = one.graph
    g.node.append(helper.make_node("QLinearMatMul", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y2"]))
    g.output.append(helper.make_tensor_value_info("y2", TensorProto.UINT8, [4, 8]))
    onnx.save(one, path)
    return path


def test_exact_path_model_gives_each_reader_its_own_int8_initializers(tmp_path, monkeypatch):
    import onnxruntime as ort

    monkeypatch.setenv("TVM_EXT_CACHE", str(tmp_path / "cache"))
    _, x, exact = _qlinear_matmul_saturating_and_exact(tmp_path / "one.onnx")
    path = _two_readers_of_one_int8_weight(tmp_path / "two.onnx")
    before = path.read_bytes()
    copy = ort_isa.exact_path_model(path)
    assert copy != path and path.read_bytes() == before, "the caller's model is left as it was"
    g = onnx.load(copy).graph
    int8 = {t.name for t in g.initializer if t.data_type == TensorProto.INT8}
    reads = [name for node in g.node for name in node.input if name in int8]
    assert len(reads) == len(set(reads)) == 4 and int8 == set(reads), reads
    sess = ort.InferenceSession(str(copy), ort_isa.session_options(ort, 1, exact=True),
                                providers=["CPUExecutionProvider"])
    for out in sess.run(None, {"x": x}):
        np.testing.assert_array_equal(out, np.broadcast_to(exact, out.shape))
    assert ort_isa.exact_path_model(path) == copy and ort_isa.exact_path_model(copy) == copy
    assert ort_isa.exact_path_model(tmp_path / "one.onnx") == tmp_path / "one.onnx", "nothing shared: no copy"


def test_exact_path_model_leaves_a_model_with_external_data_as_it_is(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TVM_EXT_CACHE", str(tmp_path / "cache"))
    model = onnx.load(_two_readers_of_one_int8_weight(tmp_path / "two.onnx"))
    external = tmp_path / "external" / "two.onnx"
    external.parent.mkdir()
    onnx.save(model, external, save_as_external_data=True, size_threshold=0, location="two.data")
    with caplog.at_level("WARNING", logger="tvm_ext.tools.ort_isa"):
        assert ort_isa.exact_path_model(external) == external
    assert "external files" in caplog.text and not (tmp_path / "cache").exists()


def test_bench_times_onnxruntimes_exact_path_where_tvm_exts_convs_are_exact_without_vnni():
    assert bench.ort_peer("llvm -mcpu=x86-64-v3", "host")["exact"], "AVX2: tvm-ext's exact pair path"
    assert "session.x64quantprecision" in bench.ort_peer("llvm -mcpu=x86-64-v3", "host")["note"]
    assert not bench.ort_peer("llvm -mcpu=znver4", "host")["exact"], "VNNI's int8 dot is exact: no second ORT"


@needs_mask
def test_bench_at_an_avx2_target_times_the_masked_onnxruntime(masked, monkeypatch, tmp_path):
    import io
    import json

    monkeypatch.setattr(ort_isa, "_cache_root", lambda: masked.parent.parent)
    target = "llvm -mcpu=x86-64-v3"  # AVX2 class, vendor-neutral: every AVX-512 host runs its code
    if not isa.runs_on_host(target):
        pytest.skip(f"this host cannot run {target} code: {isa.missing_on_host(target)}")
    results = bench.run(["qoperator"], small=True, target=target, repeat=2, out=str(tmp_path),
                        stream=io.StringIO())
    env = json.loads((tmp_path / "results.json").read_text())["environment"]
    assert env["onnxruntime_isa"]["isa"] == "avx2" and env["onnxruntime_isa"]["package"] == str(masked)
    (v,) = results["variants"]
    ort_lat, ext_lat = v["pipelines"]["onnxruntime"]["latency"], v["pipelines"]["tvm_ext"]["latency"]
    assert ort_lat["n"] == ext_lat["n"] > 0 and ort_lat["median_ms"] > 0, "timed in the child, same count"
    assert "tvm_ext/onnxruntime" in v["ratios"]
    n, md = v["numerics"], (tmp_path / "results.md").read_text()
    assert n["inputs"] == bench.NUM_CHECK_INPUTS, "every seeded input ran through both engines"
    top1, flips = n["tvm_ext_vs_ort_top1"], n["tvm_ext_vs_ort_top1_within_tolerance"]
    assert isinstance(top1, int) and 0 <= top1 <= n["inputs"], n
    assert 0 <= flips <= n["inputs"] - top1, "a flip within tolerance is a disagreement"
    assert math.isfinite(n["tvm_ext_vs_ort_max_abs"]) and n["tvm_ext_vs_ort_max_abs"] >= 0, n
    assert f"{n['tvm_ext_vs_ort_max_abs']:.4g}" in md and f"{top1}/{n['inputs']}" in md, "the table shows them"
    assert "ONNX Runtime kernels: AVX2" in md


def test_this_process_keeps_the_installed_onnxruntime():
    import onnxruntime

    assert str(ort_isa._installed_package()) in onnxruntime.__file__
    assert not any("ort-avx2" in p for p in sys.path)


@needs_mask
def test_module_entry_prints_the_copy(masked, monkeypatch, capsys):
    monkeypatch.setattr(ort_isa, "_cache_root", lambda: masked.parent.parent)
    assert ort_isa.main([]) == 0
    assert capsys.readouterr().out.strip() == str(masked)


def test_module_entry_reports_errors(monkeypatch, capsys):
    monkeypatch.setattr(ort_isa, "masked_package",
                        lambda: (_ for _ in ()).throw(ort_isa.OrtIsaError("ort_isa: no way")))
    assert ort_isa.main([]) == 1
    assert "no way" in capsys.readouterr().err
