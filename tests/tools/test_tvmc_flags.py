"""tvmc's flags on tvm-ext's commands: --rpc-tracker/--rpc-key (old --tracker/--key), HOST[:PORT] with
port 9090, --rpc-timeout and --trials-per-conv (old names warned as deprecated), run -i/--inputs
FILE.npz and -o/--outputs, run --compare-with, compile --cross-compiler. On this host only: the
remote flows run against the emulated board in tests/arm.
"""
import logging
import os
import shutil
import stat

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_ext.tools import _remote
from tvm_ext.tools.cli import build_parser, main


def _error(capsys, rc, text):
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and text in err[0], err


@pytest.mark.parametrize("command", [["run", "lib.so"], ["bench"], ["tune", "m.onnx"]])
def test_remote_flags_and_their_old_spellings(command):
    parser = build_parser()
    new = parser.parse_args([*command, "--rpc-tracker", "t.local", "--rpc-key", "rpi5", "--rpc-timeout", "5"])
    old = parser.parse_args([*command, "--tracker", "t.local", "--key", "rpi5"])
    assert (new.rpc_tracker, new.rpc_key, new.rpc_timeout) == ("t.local", "rpi5", 5.0)
    assert (old.rpc_tracker, old.rpc_key, old.rpc_timeout) == ("t.local", "rpi5", 60.0)
    assert not getattr(new, "deprecated", None) and not getattr(old, "deprecated", None)
    if command[0] != "run":  # bench and tune had --timeout, with another meaning than tvmc's
        args = parser.parse_args([*command, "--timeout", "5"])
        assert args.rpc_timeout == 5.0
        assert args.deprecated == ["--timeout is deprecated, use --rpc-timeout: tvmc's --timeout is a compile timeout"]
    assert parser.parse_args([*command, "--rpc", "board"]).rpc == "board"
    assert parser.parse_args(command).rpc_timeout == 60.0
    assert _remote.parse_address("t.local") == ("t.local", 9090)  # tvmc's default port


def test_tune_trials_and_records_names():
    parser = build_parser()
    args = parser.parse_args(["tune", "m.onnx", "--trials", "3"])
    assert args.trials_per_conv == 3 and "tvmc's --trials counts for the model" in args.deprecated[0]
    assert parser.parse_args(["tune", "m.onnx", "--trials-per-conv", "4"]).trials_per_conv == 4
    for flag in ("-o", "--output", "--out"):
        assert parser.parse_args(["tune", "m.onnx", flag, "r.log"]).output == "r.log"


def test_deprecated_names_are_logged(capsys, caplog):
    with caplog.at_level(logging.WARNING):
        _error(capsys, main(["tune", "nope.onnx", "--trials", "2", "--timeout", "9"]), "no such file: nope.onnx")
    warned = [r.getMessage() for r in caplog.records if r.name == "tvm_ext.tools.cli"]
    assert warned == ["--trials is deprecated, use --trials-per-conv: it counts per convolution; tvmc's --trials "
                      "counts for the model",
                      "--timeout is deprecated, use --rpc-timeout: tvmc's --timeout is a compile timeout"]


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    """A float conv model (input "x") compiled for this host: a library and its ONNX model."""
    d = tmp_path_factory.mktemp("tvmc_flags")
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "conv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [numpy_helper.from_array(w, "w")])
    model = d / "conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), model)
    lib = d / "conv.so"
    assert main(["compile", str(model), "-o", str(lib)]) == 0
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.savez(d / "inputs.npz", x=x)
    np.save(d / "x.npy", x)
    ref = sum(np.einsum("nchw,oc->nohw", np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))[:, :, i:i + 8, j:j + 8],
                        w[:, :, i, j]) for i in range(3) for j in range(3))
    return d, model, lib, ref


def test_run_takes_tvmcs_npz_and_compares(conv, capsys):
    d, model, lib, ref = conv
    assert main(["run", str(lib), "-i", str(d / "inputs.npz"), "-o", str(d / "a.npz")]) == 0
    np.testing.assert_allclose(np.load(d / "a.npz")["output_0"], ref, rtol=1e-4, atol=1e-4)
    assert main(["run", str(lib), "--input", str(d / "x.npy"), "--outputs", str(d / "b.npz"),
                 "--compare-with", str(d / "a.npz")]) == 0
    out = capsys.readouterr().out
    assert "compare: output 0: max abs diff 0, 0 of 256 elements beyond atol 0" in out
    assert f"compare: the outputs match {d / 'a.npz'}" in out
    assert main(["run", str(lib), "-i", str(d / "inputs.npz"), "--compare-with", str(model), "--atol", "1e-4"]) == 0
    assert "0 of 256 elements beyond atol 0.0001" in capsys.readouterr().out  # ONNX Runtime on the same input
    np.savez(d / "off.npz", output_0=np.load(d / "a.npz")["output_0"] + np.float32(0.5))
    assert main(["run", str(lib), "-i", str(d / "inputs.npz"), "--compare-with", str(d / "off.npz")]) == 1
    out = capsys.readouterr().out
    assert "max abs diff 0.5, 256 of 256 elements beyond atol 0" in out and "the outputs differ" in out


def test_compare_with_an_onnx_model_runs_onnxruntimes_exact_int8_path(conv, capsys, monkeypatch):
    """On x86 CPUs without VNNI ONNX Runtime's default int8 kernels saturate int16 pair sums; the reference
    is its exact path (``session.x64quantprecision``), which a saturating default would fail against an exact
    build by up to tens of steps."""
    import onnxruntime as ort

    d, model, lib, _ref = conv
    seen, session = [], ort.InferenceSession

    def recording(path, sess_options=None, **kwargs):
        seen.append(sess_options)
        return session(path, sess_options, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", recording)
    assert main(["run", str(lib), "-i", str(d / "inputs.npz"), "--compare-with", str(model), "--atol", "1e-4"]) == 0
    capsys.readouterr()
    (options,) = seen
    assert options is not None and options.get_session_config_entry("session.x64quantprecision") == "1"


def test_run_input_errors(conv, capsys):
    d, _model, lib, _ref = conv
    _error(capsys, main(["run", str(lib), "-i", str(d / "x.npy")]), "-i/--inputs")
    np.savez(d / "wrong.npz", y=np.zeros((1, 3, 8, 8), np.float32))
    _error(capsys, main(["run", str(lib), "-i", str(d / "wrong.npz")]), "unknown input name(s) ['y']")
    _error(capsys, main(["run", str(lib), "-i", str(d / "inputs.npz"), "--input", f"x={d / 'x.npy'}"]),
           "input 'x' given twice")
    _error(capsys, main(["run", str(lib), "--input", f"x={d / 'inputs.npz'}"]), "a .npz names its arrays itself")
    _error(capsys, main(["run", str(lib), "-i", str(d / "inputs.npz"), "--compare-with", str(d / "x.npy")]),
           "give a .npz")
    _error(capsys, main(["run", str(lib), "-i", str(d / "inputs.npz"), "--rpc", "h", "--rpc-tracker", "t"]),
           "not both")


def test_compile_cross_compiler(conv, tmp_path, capsys):
    """--cross-compiler links the .so with that compiler and --cross-compiler-options reach it (a wrapper
    around the system g++ records its arguments); the library runs."""
    d, model, _lib, ref = conv
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ on PATH")
    log = tmp_path / "cc.log"
    cc = tmp_path / "my-cc"
    cc.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {gxx} "$@"\n')
    cc.chmod(cc.stat().st_mode | stat.S_IXUSR)
    lib = tmp_path / "cross.so"
    assert main(["compile", str(model), "-o", str(lib), "--cross-compiler", str(cc),
                 "--cross-compiler-options", "-Wl,-O1 -Wl,--build-id=sha1"]) == 0
    assert "-Wl,-O1" in log.read_text() and "-Wl,--build-id=sha1" in log.read_text()
    assert main(["run", str(lib), "-i", str(d / "inputs.npz"), "-o", str(tmp_path / "o.npz")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["output_0"], ref, rtol=1e-4, atol=1e-4)
    capsys.readouterr()
    _error(capsys, main(["compile", str(model), "-o", str(tmp_path / "x.tar"), "--cross-compiler", str(cc)]),
           "--cross-compiler links a .so")
    _error(capsys, main(["compile", str(model), "-o", str(tmp_path / "y.so"), "--cross-compiler-options=-O1"]),
           "--cross-compiler-options needs --cross-compiler")
    _error(capsys, main(["compile", str(model), "-o", str(tmp_path / "z.so"), "--cross-compiler",
                         str(tmp_path / "no-such-cc")]), "not found")
    assert not os.path.exists(tmp_path / "z.so")
