"""bench --rpc, tune --rpc and tune --rpc-tracker against the emulated aarch64 server (qemu-user).

The model is a tiny QOperator graph (two uint8 x int8 QLinearConv, 16 channels): an integer graph,
so the numerics are checked against exact integer arithmetic (``relay.build`` at plain ``llvm`` on
this host). Timings under emulation are not speed: these tests check the flow, the labels, and
that the records tuning writes are the ones a later build for the same target applies.
"""
import json
import time

import numpy as np
import pytest
from tvm import autotvm, rpc

import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.core.frontend import from_onnx
from tvm_ext.testing import aarch64
from tvm_ext.tools import _remote
from tvm_ext.tools.cli import main
from tvm_ext.tools.tune import write_records
from tvm_ext.tools.tune_remote import Boards, tune_model_remote
from tvm_ext.arm import tuning
from tvm_ext.x86.target import build_target

from _cases import plain_llvm_output, qlinearconv_onnx

N1 = aarch64.TARGETS["neoverse-n1"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = qlinearconv_onnx(tmp_path_factory.mktemp("rpc_tools") / "tiny_qlinearconv.onnx", np.random.default_rng(0))
    mod, params = from_onnx(str(path), shape={"x": [1, 16, 8, 8]})
    return path, mod, params


def test_bench_over_rpc_is_exact_and_labelled_emulated(tiny, arm_server, tmp_path, capsys):
    path, _, _ = tiny
    out = tmp_path / "bench"
    assert main(["bench", "--model", str(path), "--rpc", arm_server.address, "--target", N1, "--repeat", "3",
                 "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    env, (v,) = res["environment"], res["variants"]
    feats = env["rpc"].pop("features")  # read from the server's CPU (qemu's max: every feature N1 uses)
    assert env["rpc"] == {"address": arm_server.address, "emulated": aarch64.EMULATION_LABEL}
    assert {"asimd", "asimddp", "atomics", "asimdhp", "lrcpc"} <= set(feats)
    for name in ("tvm", "tvm_ext"):
        p = v["pipelines"][name]
        assert p["target"] == str(build_target(N1)) and p["report"]["num_kernels"] >= 2
        assert p["latency"]["n"] >= 3  # timed by the server's time_evaluator
    assert "skipped" in v["pipelines"]["onnxruntime"] and "skipped" in v["pipelines"]["openvino"]
    n = v["numerics"]
    assert n["integer_graph"] and n["exact_outputs"] == 8 * 16 * 8 * 8
    assert n["tvm_vs_exact_differ"] == 0 and n["tvm_ext_vs_exact_differ"] == 0
    md = (out / "results.md").read_text()
    assert f"**under emulation ({aarch64.EMULATION_LABEL})**" in md and f"TVM RPC server {arm_server.address}" in md
    assert "under emulation" in capsys.readouterr().out


def test_tune_over_rpc_writes_records_a_later_build_applies(tiny, arm_server, tmp_path, monkeypatch):
    _, mod, params = tiny
    monkeypatch.setenv("TVM_EXT_CACHE", str(tmp_path))
    boards = Boards.open(rpc=arm_server.address)
    assert boards.emulated == aarch64.EMULATION_LABEL
    # min_gain -inf: the best candidate is recorded whatever the emulated timings say
    res = tune_model_remote(mod, params, N1, pipelines.int8(), boards, trials=2, number=1, repeat=1,
                            min_gain=float("-inf"))
    boards.close()
    assert len(res.rows) == 2 and len(res.records) == 2  # the 3x3 and the 1x1 conv, both measured
    path = write_records(res.records, N1)
    assert path.endswith("tuned/aarch64_int8_neoverse-n1_dotprod.log")
    recs = tuning.load_records(build_target(N1))
    assert len(recs) == 2
    for inp, result in recs:
        assert str(inp.target) == str(build_target(N1)) and inp.task.name == tuning.DOT_TASK  # tvm_ext.arm.dot_conv
        assert inp.task.workload in [r[5] for r in res.rows] and result.error_no == 0 and result.costs[0] > 0
        assert inp.config["tile_quads"] is not None and inp.config["tile_ic"].size[-1] == inp.task.workload[1][1][4]
    assert all(tuning.load_records(build_target(aarch64.TARGETS[c])) == [] for c in ("cortex-a72", "neoverse-v1"))

    fac = tvm_ext.build(mod, target=N1, params=params, passes=pipelines.int8())
    tuned = [k.name for k in fac.kernel_report.kernels if k.tuned]
    assert len(tuned) == 2 and all("conv2d_NCHWc" in name for name in tuned), fac.kernel_report.kernels
    x = np.random.default_rng(3).integers(0, 256, (1, 16, 8, 8)).astype(np.uint8)
    (out,) = aarch64.run_on_session(arm_server.connect(session_timeout=300), fac, {"x": x}, tmp_path, "tuned")
    np.testing.assert_array_equal(out, plain_llvm_output(mod, params, x))


@pytest.fixture(scope="module")
def tracker_with_board():
    """``python -m tvm.exec.rpc_tracker`` on this host and the emulated server registered with it."""
    why = aarch64.missing()
    if why:
        pytest.skip(why)
    with aarch64.rpc_tracker() as address, aarch64.rpc_server(tracker=address, key="qemu-aarch64"):
        host, port = _remote.parse_address(address)
        client = rpc.connect_tracker(host, port)
        deadline = time.monotonic() + 120
        while "qemu-aarch64" not in _remote.tracker_keys(client.summary()):
            assert time.monotonic() < deadline, "the emulated server did not register with the tracker"
            time.sleep(0.5)
        client.close()
        yield address


@pytest.mark.slow  # a second emulated server (about a minute); tests/test_remote.py covers trackers without qemu
def test_tune_over_tracker(tiny, tracker_with_board, tmp_path, monkeypatch, capsys):
    path, _, _ = tiny
    monkeypatch.setenv("TVM_EXT_CACHE", str(tmp_path))
    assert main(["tune", str(path), "--rpc-tracker", tracker_with_board, "--rpc-key", "qemu-aarch64", "--target", N1,
                 "--trials-per-conv", "1", "--budget", "5"]) == 0
    text = capsys.readouterr().out
    assert "timed on 1 board(s) with key 'qemu-aarch64'" in text and "the remote is emulated (qemu-user)" in text
    assert text.count("| conv | conv data [1, 4, 8, 8, 4] int8") == 2  # both convs measured
    records = tmp_path / "tuned" / "aarch64_int8_neoverse-n1_dotprod.log"
    assert records.is_file() and f"records to {records}" in text
    for line in filter(None, records.read_text().splitlines()):
        inp, _ = autotvm.record.decode(line)
        assert str(inp.target) == str(build_target(N1)) and inp.task.name == tuning.DOT_TASK  # tvm_ext.arm.dot_conv
    assert main(["tune", str(path), "--tracker", tracker_with_board, "--key", "pi4", "--target", N1]) == 2  # old names
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no board with key 'pi4' (keys: qemu-aarch64)" in err[0]
