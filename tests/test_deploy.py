"""tvm-ext compile / run (tvm_ext.tools.deploy): round trip, sidecar, plain-TVM loading, every refusal.

Everything is built for the host target; "features the host lacks" is faked by shrinking
``tvm_ext.x86.isa.host_features``, never by executing code compiled for another CPU.
"""
import json
import subprocess
import sys

import numpy as np
import pytest
from tvm.contrib import graph_executor

import tvm_ext
from tvm_ext.tools import deploy
from tvm_ext._files import sha256_file
from tvm_ext.x86 import isa
from tvm_ext.tools.cli import main
from tvm_ext.core.frontend import from_onnx

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from test_cli import tiny_onnx  # noqa: E402


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """tiny.onnx compiled by the CLI into tiny.tar (+ tiny.tar.json), and an input."""
    d = tmp_path_factory.mktemp("deploy")
    model = tiny_onnx(d / "tiny.onnx")
    lib = d / "tiny.tar"
    assert main(["compile", str(model), "-o", str(lib)]) == 0
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype("float32")
    np.save(d / "x.npy", x)
    return d, model, lib, x


def _one_line_error(capsys, rc, text):
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and text in lines[0], err


def test_compile_writes_library_and_sidecar(compiled):
    d, model, lib, _ = compiled
    meta = json.loads(deploy.sidecar_path(lib).read_text())
    assert deploy.sidecar_path(lib).name == "tiny.tar.json"
    assert meta["inputs"] == [{"name": "x", "shape": [1, 3, 8, 8], "dtype": "float32"}]
    assert meta["outputs"] == [{"shape": [1, 4, 8, 8], "dtype": "float32"}]
    assert meta["format"] == deploy.SIDECAR_FORMAT and meta["pipeline"] == "none"
    assert meta["target"] == str(tvm_ext.build_target()) and isa.runs_on_host(meta["target"])
    assert deploy.read_sidecar(lib) == meta  # sha256 matches the library


def test_run_is_bit_exact_to_in_process_build(compiled, capsys):
    d, model, lib, x = compiled
    out = d / "out.npz"
    assert main(["run", str(lib), "--input", str(d / "x.npy"), "--output", str(out), "--repeat", "3"]) == 0
    text = capsys.readouterr().out
    assert "output 0: float32[1, 4, 8, 8]" in text and "median of 3 runs" in text
    mod, params = from_onnx(model)
    fac = tvm_ext.build(mod, params=params)
    gm = graph_executor.GraphModule(fac["default"](__import__("tvm").cpu()))
    gm.set_input("x", x)
    gm.run()
    np.testing.assert_array_equal(np.load(out)["output_0"], gm.get_output(0).numpy())
    # the float model's crossings: x -> [layout_transform] -> conv -> [layout_transform] -> y
    reasons = [(c.reason, c.holds) for c in fac.kernel_report.float_crossings()]
    assert reasons == [("graph_input", "input"), ("graph_output", "float")], fac.kernel_report.table()


def test_plain_tvm_loads_it_without_tvm_ext(compiled):
    d, model, lib, x = compiled
    code = (
        "import sys, numpy as np, tvm\n"
        "from tvm.contrib import graph_executor\n"
        f"gm = graph_executor.GraphModule(tvm.runtime.load_module({str(lib)!r})['default'](tvm.cpu()))\n"
        f"gm.set_input('x', np.load({str(d / 'x.npy')!r})); gm.run()\n"
        f"np.save({str(d / 'plain.npy')!r}, gm.get_output(0).numpy())\n"
        "assert not any(m.startswith('tvm_ext') for m in sys.modules), 'tvm_ext was imported'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = deploy.run_library(lib, positional=[x])
    np.testing.assert_array_equal(np.load(d / "plain.npy"), res.outputs[0])


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # TVM's failed TempDirectory
def test_run_writes_nothing_beside_the_library(tmp_path, compiled):
    """Plain TVM loads ``m.tar`` by untarring into ``m/`` (failing if that exists) and linking
    ``m.tar.so`` beside it; run_library links in a private temporary directory instead."""
    import shutil
    import tvm

    d, _, lib, x = compiled
    for name in (lib.name, deploy.sidecar_path(lib).name):
        shutil.copy(d / name, tmp_path / name)
    copy = tmp_path / lib.name
    (tmp_path / copy.stem).mkdir()  # what TVM's loader would create: it cannot
    (tmp_path / copy.stem / "keep.txt").write_text("user data")
    with pytest.raises(FileExistsError):
        tvm.runtime.load_module(str(copy))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    res = deploy.run_library(copy, positional=[x])
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    np.testing.assert_array_equal(res.outputs[0], deploy.run_library(lib, positional=[x]).outputs[0])
    # a .so loads as it is
    so = tmp_path / "tiny.so"
    deploy.compile_library(*from_onnx(compiled[1]), so)
    np.testing.assert_array_equal(deploy.run_library(so, positional=[x]).outputs[0], res.outputs[0])


def test_int8_pipeline_so_round_trip_on_a_qdq_model(tmp_path, compiled, capsys):
    """A QDQ model (ONNX Runtime's quantize_static), --pipeline int8, .so, a named input: bit-exact
    to tvm_ext.build(..., passes=pipelines.int8()) run in-process."""
    from tvm_ext.core import pipelines
    from tvm_ext.tools import zoo_models

    _, fp32, _, x = compiled
    model = zoo_models.quantize_onnx(fp32, tmp_path / "tiny_qdq.onnx", "qdq")
    lib = tmp_path / "tiny.so"
    assert main(["compile", str(model), "-o", str(lib), "--pipeline", "int8"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert json.loads((tmp_path / "tiny.so.json").read_text())["pipeline"] == "int8"
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npz"
    assert main(["run", str(lib), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(out)]) == 0
    assert "output 0: float32[1, 4, 8, 8]" in capsys.readouterr().out
    mod, params = from_onnx(model)
    fac = tvm_ext.build(mod, params=params, passes=pipelines.int8())
    gm = graph_executor.GraphModule(fac["default"](__import__("tvm").cpu()))
    gm.set_input("x", x)
    gm.run()
    np.testing.assert_array_equal(np.load(out)["output_0"], gm.get_output(0).numpy())
    # no int32 crossing either way: with 4 output channels the x86 int8 conv is padded to 16 and
    # sliced back; on AVX-512 without VNNI (and SSE) QDQToInteger keeps this small conv in float, as
    # stock TVM has it, so the quantized input crosses in float (flagged avoidable) and the output
    # is the graph's float; on AVX2 and AVX-512 VNNI hosts it converts (PADDED_INT8_MIN_MACS_BY_ISA)
    # and the slice fuses with the output's dequantize: nothing crosses in float
    from tvm_ext.x86.isa import isa_class
    from tvm_ext.passes.qdq_to_integer import PADDED_INT8_MIN_MACS_BY_ISA

    assert fac.kernel_report.int_crossings() == [], fac.kernel_report.table()
    reasons = [(c.reason, c.holds) for c in fac.kernel_report.float_crossings()]
    converts = PADDED_INT8_MIN_MACS_BY_ISA.get(isa_class(tvm_ext.build_target())) == 0
    want = [] if converts else [("dequantize_early", "q8"), ("graph_output", "q8")]
    assert reasons == want, fac.kernel_report.table()


def test_refuses_missing_file_and_not_a_library(tmp_path, compiled, capsys):
    d, _, _, _ = compiled
    _one_line_error(capsys, main(["run", str(tmp_path / "nope.tar"), "--input", str(d / "x.npy")]), "no such file")
    _one_line_error(capsys, main(["run", str(d / "x.npy"), "--input", str(d / "x.npy")]),
                    "not a library written by `tvm-ext compile`")
    # a sidecar that describes the file, but the file is not a library: TVM's loader refuses it
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"\x00not a tar archive" * 64)
    meta = json.loads(deploy.sidecar_path(d / "tiny.tar").read_text())
    meta["sha256"] = sha256_file(junk)
    deploy.sidecar_path(junk).write_text(json.dumps(meta))
    _one_line_error(capsys, main(["run", str(junk), "--input", str(d / "x.npy")]), "not a TVM library")


def test_refuses_sidecar_of_another_file(tmp_path, compiled, capsys):
    d, _, lib, _ = compiled
    other = tmp_path / "tiny.tar"
    other.write_bytes(lib.read_bytes() + b"\x00")
    deploy.sidecar_path(other).write_text(deploy.sidecar_path(lib).read_text())
    _one_line_error(capsys, main(["run", str(other), "--input", str(d / "x.npy")]), "describes another file")


@pytest.mark.parametrize("arr, text", [
    (np.zeros((1, 3, 8, 9), "float32"), "got float32[1, 3, 8, 9], the library takes float32[1, 3, 8, 8]"),
    (np.zeros((1, 3, 8, 8), "float64"), "got float64[1, 3, 8, 8]"),
])
def test_refuses_wrong_shape_or_dtype(tmp_path, compiled, capsys, arr, text):
    _, _, lib, _ = compiled
    np.save(tmp_path / "bad.npy", arr)
    _one_line_error(capsys, main(["run", str(lib), "--input", str(tmp_path / "bad.npy")]), text)


def test_refuses_bad_input_names(tmp_path, compiled, capsys):
    d, _, lib, _ = compiled
    _one_line_error(capsys, main(["run", str(lib), "--input", f"y={d / 'x.npy'}"]), "unknown input name(s) ['y']")
    _one_line_error(capsys, main(["run", str(lib)]), "missing input(s) ['x']")
    _one_line_error(capsys, main(["run", str(lib), "--input", str(d / "x.npy"), "--input", str(d / "x.npy")]),
                    "2 unnamed input(s) for 1 remaining input(s)")


def test_refuses_features_the_host_lacks(compiled, capsys, monkeypatch):
    """The library needs avx2 (and more) and the host 'lacks' them: refused before loading."""
    d, _, lib, _ = compiled
    needs = isa.llvm_features(json.loads(deploy.sidecar_path(lib).read_text())["target"])
    assert "avx2" in needs or "sse2" in needs
    fake = frozenset(isa.host_features() - {"avx2", "sse2"})
    monkeypatch.setattr(isa, "host_features", lambda: fake)
    loaded = []
    monkeypatch.setattr("tvm.runtime.load_module", lambda *a, **k: loaded.append(a))
    rc = main(["run", str(lib), "--input", str(d / "x.npy")])
    _one_line_error(capsys, rc, "needs CPU features this host lacks")
    assert loaded == []  # never loaded, let alone executed


@pytest.mark.parametrize("target, text", [
    ("llvm -mtriple=aarch64-linux-gnu", "architecture aarch64"),
    ("c", "runs LLVM CPU libraries only"),
])
def test_refuses_other_architectures_and_kinds(tmp_path, compiled, capsys, monkeypatch, target, text):
    """isa.missing_on_host compares x86 feature names: an aarch64 library must be refused by its triple.
    (The sidecar is edited; nothing is compiled for, or loaded from, another architecture.)"""
    d, _, lib, _ = compiled
    copy = tmp_path / "m.tar"
    copy.write_bytes(lib.read_bytes())
    meta = json.loads(deploy.sidecar_path(lib).read_text())
    meta["target"] = target
    deploy.sidecar_path(copy).write_text(json.dumps(meta))
    monkeypatch.setattr("tvm.runtime.load_module", lambda *a, **k: pytest.fail("loaded"))
    _one_line_error(capsys, main(["run", str(copy), "--input", str(d / "x.npy")]), text)


def test_compile_warns_for_features_the_host_lacks(tmp_path, compiled, capsys, monkeypatch):
    """Compiling for a CPU this host is not is allowed (one warning line); the default target never
    needs more than the host has, so the target is given explicitly (the real host's)."""
    _, model, _, _ = compiled
    target = str(tvm_ext.build_target())
    fake = frozenset(isa.host_features() - {"avx2"})
    monkeypatch.setattr(isa, "host_features", lambda: fake)
    assert main(["compile", str(model), "-o", str(tmp_path / "m.tar"), "--opt-level", "1", "--target", target]) == 0
    cap = capsys.readouterr()
    assert "wrote" in cap.out
    warn = [ln for ln in cap.err.splitlines() if "warning" in ln]
    assert len(warn) == 1 and "avx2" in warn[0] and "cannot run here" in warn[0]


def test_compile_usage_errors(tmp_path, compiled, capsys):
    _, model, _, _ = compiled
    _one_line_error(capsys, main(["compile", str(model), "-o", str(tmp_path / "m.zip")]), "must end in .tar or .so")
    _one_line_error(capsys, main(["compile", str(model), "-o", str(tmp_path / "no" / "m.tar")]), "no such directory")
    _one_line_error(capsys, main(["compile", str(tmp_path / "x.onnx"), "-o", str(tmp_path / "m.tar")]),
                    "no such file")
    _one_line_error(capsys, main(["compile", str(model), "-o", str(tmp_path / "m.tar"), "--pipeline", "int8",
                                  "--passes", "FoldPadIntoConv"]), "cannot be combined")
    _one_line_error(capsys, main(["compile", str(model), "-o", str(tmp_path / "m.tar"), "--target", "cuda -foo=1"]),
                    "bad --target")


def test_report_pipeline(compiled, capsys):
    _, model, _, _ = compiled
    assert main(["report", str(model), "--pipeline", "int8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pipeline"] == "int8" and "QDQToInteger" in out["passes"] and "FoldPadIntoConv" in out["passes"]
    assert "float_crossings" in out
    _one_line_error(capsys, main(["report", str(model), "--pipeline", "int8", "--passes", "FoldPadIntoConv"]),
                    "--pipeline and --passes cannot be combined")
    _one_line_error(capsys, main(["report", str(model), "--pipeline", "int8", "--ir", "relax"]),
                    "--pipeline int8 is a Relay pipeline")
    _one_line_error(capsys, main(["report", str(model), "--pipeline", "int8", "--at", "start"]),
                    "--at applies to --passes")


@pytest.mark.parametrize("cmd", ["compile", "run"])
def test_help(cmd, capsys):
    with pytest.raises(SystemExit) as exc:
        main([cmd, "--help"])
    assert exc.value.code == 0 and f"usage: tvm-ext {cmd}" in capsys.readouterr().out


def qdq_matmul_onnx(path, m=64, k=256, n=64):
    """x[m, k] -> QuantizeLinear(u8) -> DequantizeLinear -> MatMul(dequantized int8 W[k, n]) ->
    QuantizeLinear -> DequantizeLinear: with --pipeline int8 a uint8 x int8 dense of whole AMX tiles."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).integers(-128, 128, (k, n)).astype(np.int8)
    inits = [numpy_helper.from_array(np.array(0.02, np.float32), "xs"), numpy_helper.from_array(np.uint8(128), "xz"),
             numpy_helper.from_array(w, "wq"), numpy_helper.from_array(np.array(0.01, np.float32), "ws"),
             numpy_helper.from_array(np.int8(0), "wz"), numpy_helper.from_array(np.array(0.5, np.float32), "ys"),
             numpy_helper.from_array(np.uint8(100), "yz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"]),
             helper.make_node("MatMul", ["xd", "wd"], ["mm"]),
             helper.make_node("QuantizeLinear", ["mm", "ys", "yz"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    graph = helper.make_graph(nodes, "qdq_matmul", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def _instructions(lib) -> dict:
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)], capture_output=True, text=True,
                          check=True).stdout
    return {i: len(__import__("re").findall(rf"\s{i}\b", text)) for i in ("tdpbusd", "ldtilecfg", "tilerelease",
                                                                          "vpdpbusd")}


@pytest.mark.skipif(not __import__("shutil").which("objdump"), reason="needs objdump to read the library's code")
def test_compile_amx_opt_in_for_sapphire_rapids(tmp_path, capsys):
    """tvm-ext compile --amx: the library's int8 dense runs on configured AMX tiles (tdpbusd between
    ldtilecfg and tilerelease), the sidecar says so, and `tvm-ext run` refuses it on a host without
    AMX. Without --amx, VNNI only. Compiled in child processes (another CPU), never run here."""
    model = qdq_matmul_onnx(tmp_path / "mm.onnx")
    libs = {}
    for amx in (True, False):
        lib = tmp_path / f"mm_{'amx' if amx else 'vnni'}.so"
        r = subprocess.run([sys.executable, "-m", "tvm_ext.tools.cli", "compile", str(model), "-o", str(lib),
                            "--pipeline", "int8", "--target", "llvm -mcpu=sapphirerapids", *(["--amx"] if amx else [])],
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        libs[amx] = lib
    on, off = _instructions(libs[True]), _instructions(libs[False])
    assert min(on["tdpbusd"], on["ldtilecfg"], on["tilerelease"]) > 0, on
    assert off["tdpbusd"] == off["ldtilecfg"] == 0 and off["vpdpbusd"] > 0, off
    meta_on, meta_off = deploy.read_sidecar(libs[True]), deploy.read_sidecar(libs[False])
    assert meta_on["amx"] is True and {"amx-tile", "amx-int8"} <= set(meta_on["features"])
    assert meta_off["amx"] is False and not {"amx-tile", "amx-int8"} & set(meta_off["features"])
    if not {"amx-tile", "amx-int8"} <= isa.host_features():
        np.save(tmp_path / "x.npy", np.zeros((64, 256), np.float32))
        _one_line_error(capsys, main(["run", str(libs[True]), "--input", str(tmp_path / "x.npy")]),
                        "needs CPU features this host lacks")


def test_compile_amx_without_amx_on_the_target_warns(tmp_path, compiled, capsys):
    """--amx for a target without AMX (AVX2 code): one warning line, and the library is built without it."""
    _, model, _, _ = compiled
    lib = tmp_path / "m.tar"
    assert main(["compile", str(model), "-o", str(lib), "--opt-level", "1", "--target", "llvm -mcpu=x86-64-v3",
                 "--amx"]) == 0
    warn = [ln for ln in capsys.readouterr().err.splitlines() if "warning" in ln]
    assert len(warn) == 1 and "--amx" in warn[0] and "has no AMX" in warn[0], warn
    assert not {"amx-tile", "amx-int8"} & set(deploy.read_sidecar(lib)["features"])
