"""Reaching remote boards (tvm_ext.tools._remote, tune --rpc/--tracker, bench --rpc): the error paths,
the tracker's boards and the aarch64 record keys, without emulation (host TVM RPC servers and tracker).

The flows themselves run against the emulated aarch64 server in tests/arm/test_aarch64_rpc_tools.py.
"""
import socket
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm import autotvm, rpc
from tvm.rpc.tracker import Tracker

from tvm_ext.tools import _remote
from tvm_ext.tools.cli import main
from tvm_ext.tools.deploy import DeployError
from tvm_ext.tools.tune import write_records
from tvm_ext.tools.tune_remote import Boards, _layout_candidates
from tvm_ext.families import isa_class
from tvm_ext.arm import tuning as arm_tuning
from tvm_ext.x86 import tuning
from tvm_ext.x86.target import build_target

N1 = "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1 -mattr=+neon,+dotprod"
A72 = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72 -mattr=+neon"
V1 = "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-v1 -mattr=+neon,+dotprod,+i8mm"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_listener():
    """A port that accepts TCP connections and never answers (a peer that hangs)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        yield f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(scope="module")
def tracker():
    """TVM's tracker on this host, with two host RPC servers registered under the key "board"."""
    port = _free_port()
    trk = Tracker("127.0.0.1", port=port, port_end=port + 1, silent=True)
    servers = [rpc.Server("127.0.0.1", port=(p := _free_port()), port_end=p + 1, key="board",
                          tracker_addr=("127.0.0.1", trk.port), silent=True) for _ in range(2)]
    try:
        client = rpc.connect_tracker("127.0.0.1", trk.port)
        deadline = time.monotonic() + 60
        while _remote.tracker_keys(client.summary()).get("board", 0) < 2:
            assert time.monotonic() < deadline, "the host RPC servers did not register with the tracker"
            time.sleep(0.2)
        client.close()
        yield f"127.0.0.1:{trk.port}"
    finally:
        for s in servers:
            s.terminate()
        trk.terminate()


@pytest.mark.parametrize("address, error", [(":9090", r"expected HOST\[:PORT\]"), ("h:x", "not an integer"),
                                            ("fe80::1", r"IPv6 address as \[ADDR\]")])
def test_bad_address(address, error):
    with pytest.raises(DeployError, match=error):
        Boards.open(rpc=address)
    with pytest.raises(DeployError, match=error):
        Boards.open(tracker=address, key="board")


def test_no_server_and_no_tracker():
    port = _free_port()
    with pytest.raises(DeployError, match=f"cannot reach a TVM RPC server at 127.0.0.1:{port}"):
        _remote.connect(f"127.0.0.1:{port}", timeout=5)
    t0 = time.monotonic()
    with pytest.raises(DeployError, match=f"cannot reach a TVM RPC tracker at 127.0.0.1:{port}"):
        _remote.request(f"127.0.0.1:{port}", "board", timeout=5)
    assert time.monotonic() - t0 < 5  # not TVM's 60 s of retries


def test_a_peer_that_does_not_answer_times_out(silent_listener):
    t0 = time.monotonic()
    with pytest.raises(DeployError, match=r"TVM RPC server at 127\.0\.0\.1:\d+: no answer within 1 s"):
        _remote.connect(silent_listener, timeout=1)
    with pytest.raises(DeployError, match=r"TVM RPC tracker at 127\.0\.0\.1:\d+: no answer within 1 s"):
        _remote.request(silent_listener, "board", timeout=1)
    assert time.monotonic() - t0 < 10


def test_tracker_hands_out_every_board_and_then_none(tracker):
    with pytest.raises(DeployError, match=r"no board with key 'phone' \(keys: board\)"):
        Boards.open(tracker=tracker, key="phone")
    with pytest.raises(DeployError, match="needs --rpc-key"):
        Boards.open(tracker=tracker)
    boards = Boards.open(tracker=tracker, key="board", timeout=10)
    assert len(boards.sessions) == 2 and "2 board(s) with key 'board'" in boards.where
    assert boards.emulated is None  # a host server does not say it is emulated: not labelled
    with pytest.raises(DeployError, match=r"a free board with key 'board' from the tracker .*: no answer within 1 s"):
        _remote.request(tracker, "board", timeout=1)
    boards.close()


def test_check_remote_target():
    with pytest.raises(DeployError, match="give its --target"):
        _remote.check_remote_target(None, True, "tune")
    with pytest.raises(DeployError, match="is this host's architecture"):
        _remote.check_remote_target("llvm -mcpu=x86-64-v3", True, "tune")
    with pytest.raises(DeployError, match="is for aarch64, which cannot run here; give --rpc"):
        _remote.check_remote_target(N1, False, "bench")
    _remote.check_remote_target(N1, True, "bench")
    _remote.check_remote_target(None, False, "bench")


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory):
    w = np.random.default_rng(0).integers(-127, 128, (8, 8, 3, 3)).astype(np.int8)
    graph = helper.make_graph(
        [helper.make_node("ConvInteger", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "conv_integer",
        [helper.make_tensor_value_info("x", TensorProto.INT8, [1, 8, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 8, 4, 4])], [numpy_helper.from_array(w, "w")])
    path = tmp_path_factory.mktemp("remote") / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return str(path)


@pytest.mark.parametrize("argv, error", [
    (["tune", "{m}", "--rpc", "127.0.0.1:9"], "tvm-ext tune: error: --rpc/--rpc-tracker measure on a remote board: "
                                              "give its --target"),
    (["tune", "{m}", "--target", N1], "is for aarch64, which cannot run here; give --rpc HOST[:PORT]"),
    (["tune", "{m}", "--key", "board"], "--rpc-key selects the boards of an --rpc-tracker"),
    (["tune", "{m}", "--rpc-key", "board"], "--rpc-key selects the boards of an --rpc-tracker"),
    (["tune", "{m}", "--rpc", "h:1", "--tracker", "h:2"], "not both"),
    (["tune", "{m}", "--target", N1, "--tracker", "127.0.0.1:9"], "needs --rpc-key KEY"),
    (["tune", "{m}", "--target", N1, "--rpc-tracker", "127.0.0.1:9"], "needs --rpc-key KEY"),
    (["tune", "{m}", "--target", N1, "--rpc", "nowhere:port"], "port 'port' is not an integer"),
    (["bench", "--model", "{m}", "--rpc", "127.0.0.1:9"], "tvm-ext bench: error: --rpc/--rpc-tracker measure on a"),
    (["bench", "--model", "{m}", "--target", A72], "is for aarch64, which cannot run here"),
    (["bench", "--model", "{m}", "--target", A72, "--rpc-tracker", "h", "--rpc", "h"], "not both"),
    (["bench", "--model", "{m}", "--target", A72, "--rpc-tracker", "h"], "needs --rpc-key KEY"),
])
def test_cli_refuses_in_one_line(tiny_onnx, capsys, argv, error):
    assert main([a.replace("{m}", tiny_onnx) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and error in err[0], err


def test_cli_tune_names_an_unreachable_server(tiny_onnx, capsys):
    port = _free_port()
    assert main(["tune", tiny_onnx, "--target", N1, "--rpc", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot reach a TVM RPC server at 127.0.0.1:{port}" in err[0]


def test_emulation_is_none_for_a_plain_session():
    assert _remote.emulation(rpc.LocalSession()) is None


@pytest.mark.parametrize("target, cls, name", [
    (A72, "aarch64_neon", "aarch64_int8_cortex-a72_neon.log"),
    (N1, "aarch64_dotprod", "aarch64_int8_neoverse-n1_dotprod.log"),
    (V1, "aarch64_i8mm", "aarch64_int8_neoverse-v1_i8mm.log"),
])
def test_aarch64_record_keys(target, cls, name):
    tgt = build_target(target)
    assert isa_class(tgt) == cls and arm_tuning.records_name(tgt) == name
    assert tuning.records_name(build_target("llvm -mcpu=x86-64-v3")) == "x86_int8_x86-64-v3_avx2.log"


def test_aarch64_record_loads_for_its_target_only(tmp_path, monkeypatch):
    """A record tune --rpc writes for Neoverse-N1 is applied to Neoverse-N1 builds, not to another class or CPU."""
    monkeypatch.setenv("TVM_EXT_CACHE", str(tmp_path))
    tgt = build_target(N1)
    wl = ("conv2d_NCHWc_int8.arm_cpu", ("TENSOR", (1, 4, 8, 8, 4), "int8"), ("TENSOR", (4, 4, 3, 3, 1, 4, 4), "int8"),
          (1, 1), (1, 1, 1, 1), (1, 1), "NCHW4c", "NCHW4c", "int32")
    task = autotvm.task.create(wl[0], args=wl[1:], target=tgt)
    cands = _layout_candidates(task)
    assert cands and all(c["tile_ic"].size[-1] == 4 and c["tile_oc"].size[-1] == 4 for c in cands)
    cfg = cands[-1]
    line = autotvm.record.encode(autotvm.MeasureInput(tgt, task, cfg), autotvm.MeasureResult((1e-4,), 0, 0.0, 0.0))
    path = write_records([line], tgt)
    assert path.endswith("tuned/aarch64_int8_neoverse-n1_dotprod.log")
    (inp, _), = arm_tuning.load_records(tgt)
    assert str(inp.target) == str(tgt) and inp.task.workload == task.workload
    assert inp.config.to_json_dict()["entity"] == cfg.to_json_dict()["entity"]
    for other in (A72, V1, "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n2 -mattr=+neon,+dotprod"):
        assert arm_tuning.load_records(build_target(other)) == []


def test_bench_labels_emulation_only_when_the_server_says_so():
    from tvm_ext.tools.bench._render import _board_lines

    assert _board_lines({}) == []
    board = _board_lines({"rpc": {"address": "10.0.0.7:9090", "emulated": None}})
    assert len(board) == 1 and "TVM RPC server 10.0.0.7:9090" in board[0] and "emulat" not in board[0]
    tracked = _board_lines({"rpc": {"address": "10.0.0.1:9190", "key": "rpi5", "emulated": None,
                                    "features": ["asimd", "asimddp", "fp"]}})
    assert "a board with key `rpi5` from the TVM RPC tracker 10.0.0.1:9190" in tracked[0]
    assert len(tracked) == 2 and tracked[1].endswith("asimd asimddp fp")
    emulated = _board_lines({"rpc": {"address": "127.0.0.1:9090", "emulated": "qemu-user"}})
    assert len(emulated) == 2 and "**under emulation (qemu-user)**" in emulated[1]
