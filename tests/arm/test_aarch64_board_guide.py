"""docs/arm.md "Set up your board", command by command.

Every command of that section's ``sh`` blocks is classified (:func:`_kind`); a command of a kind no
test here runs fails :func:`test_every_guide_command_is_run`. The board's commands run in the
emulated aarch64 Python (``make arm-env``) under ``QEMU_CPU=cortex-a76``, a Raspberry Pi 5's core,
started from the guide's own server command line (``tvm_ext.testing.aarch64.board_server``); the
host's commands run through ``tvm-ext``'s ``main`` in a folder holding ``model.onnx`` (a tiny integer
QOperator graph) and ``x.npy``. Substituted: ``BOARD:9090`` and ``TRACKER:9190`` by the emulated
server's and the tracker's addresses, ``--host 0.0.0.0`` by ``127.0.0.1`` and ports by free ones
(nothing is exposed beyond this host), ``~/tvm-rpc`` by a temporary folder; tune and bench get a
small budget (``--trials-per-conv 1``, ``--repeat 2``).
"""
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tvm import rpc

from tvm_ext.core.frontend import from_onnx
from tvm_ext.testing import aarch64
from tvm_ext.tools import _remote, _remote_cpu
from tvm_ext.tools.cli import main

from _cases import plain_llvm_output, qlinearconv_onnx

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "arm.md").read_text()
GUIDE = DOC[DOC.index("## Set up your board"):DOC.index("## RPC flow")]
BOARD_CPU = "cortex-a76"  # the guide's example target is a Raspberry Pi 5's

# /proc/cpuinfo Features of each board of the guide's table (Linux 6.x; Graviton 4 and Orin as their
# vendors' images print them): the test checks the table's targets against them.
FEATURES = {
    "Raspberry Pi 4": "fp asimd evtstrm crc32 cpuid",
    "Raspberry Pi 5": "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop "
                      "asimddp",
    "AWS Graviton 2": "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop "
                      "asimddp ssbs",
    "Ampere Altra": "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop "
                    "asimddp ssbs",
    "NVIDIA Jetson Orin": "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc "
                          "dcpop asimddp uscat ilrcpc flagm paca pacg",
    "AWS Graviton 3": "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma "
                      "lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs paca pacg "
                      "dcpodp svei8mm svebf16 i8mm bf16 dgh rng",
    "AWS Graviton 4": "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma "
                      "lrcpc dcpop sha3 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm sb paca pacg dcpodp sve2 "
                      "sveaes svepmull svebitperm svesha3 flagm2 frint svei8mm svebf16 i8mm bf16 dgh rng bti",
}


def _commands() -> list:
    out = []
    for block in re.findall(r"```sh\n(.*?)```", GUIDE, re.S):
        out += [line.strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]
    return out


def _kind(cmd: str) -> str:
    if cmd.startswith("python3.11 -m venv "):
        return "venv"
    if re.match(r"~/tvm-rpc/bin/pip install ", cmd):
        return "pip"
    if "-m tvm.exec.rpc_tracker" in cmd:
        return "tracker"
    if "-m tvm.exec.rpc_server" in cmd:
        return "server via tracker" if "--tracker" in cmd else "server"
    if cmd.startswith("grep ") and "/proc/cpuinfo" in cmd:
        return "cpuinfo"
    if cmd.startswith("TARGET="):
        return "target"
    if cmd.startswith("tvm-ext "):
        argv = shlex.split(cmd)
        where = "tracker" if "--rpc-tracker" in argv else "rpc" if "--rpc" in argv else "host"
        if argv[1] == "compile":
            where = "board" if "--target" in argv else "host"
        compare = " compare" if "--compare-with" in argv else ""
        return f"tvm-ext {argv[1]} {where}{compare}"
    raise AssertionError(f"docs/arm.md 'Set up your board': no test runs {cmd!r}")


#: What each test below runs.
KINDS = {
    "test_install_is_what_arm_env_installs": {"venv", "pip"},
    "test_pick_the_target_from_cpuinfo": {"cpuinfo", "target"},
    "test_board_server_compile_run_and_compare": {"server", "tvm-ext compile board", "tvm-ext compile host",
                                                  "tvm-ext run rpc", "tvm-ext run host", "tvm-ext run rpc compare"},
    "test_tune_and_bench_on_the_board": {"tvm-ext tune rpc", "tvm-ext bench rpc"},
    "test_tracker_and_key": {"tracker", "server via tracker", "tvm-ext run tracker", "tvm-ext tune tracker"},
}


def _target() -> str:
    (line,) = [c for c in _commands() if _kind(c) == "target"]
    return shlex.split(line)[0].split("=", 1)[1]


def test_every_guide_command_is_run():
    kinds = [_kind(c) for c in _commands()]  # raises for a command no test runs
    assert set(kinds) == set().union(*KINDS.values()), sorted(set(kinds) ^ set().union(*KINDS.values()))
    # compile, report, bench and tune for a board use the one $TARGET: records tuned at it apply to its builds
    for cmd in _commands():
        argv = shlex.split(cmd)
        if argv[0] == "tvm-ext" and "--target" in argv:
            assert argv[argv.index("--target") + 1] == "$TARGET", cmd


def test_install_is_what_arm_env_installs(tmp_path):
    """The board's pip line installs what ``make arm-env`` installs in the emulated board, and that
    Python imports TVM 0.19 with numpy 1.x; the venv line runs (here with the host's Python 3.11)."""
    venv, pip = [c for c in _commands() if _kind(c) in ("venv", "pip")]
    wheels = re.search(r"^WHEELS=\((.*)\)$", (REPO / "tests" / "arm" / "arm-env.sh").read_text(), re.M)[1]
    assert shlex.split(pip)[2:] == shlex.split(wheels)
    argv = shlex.split(venv.replace("~/tvm-rpc", str(tmp_path / "tvm-rpc")))
    assert argv[0] == "python3.11" and sys.version_info[:2] == (3, 11)
    subprocess.run([sys.executable, *argv[1:], "--without-pip"], check=True, timeout=120)
    assert (tmp_path / "tvm-rpc" / "bin" / "python").exists()
    why = aarch64.missing(need_cxx=False)
    if why:
        pytest.skip(why)
    env = aarch64.find_env(need_cxx=False)
    out = subprocess.run([str(env.python), "-c", "import tvm, numpy, cloudpickle; print(tvm.__version__, "
                                                  "numpy.__version__)"],
                         capture_output=True, text=True, timeout=300, check=True).stdout.split()
    assert out[-2] == "0.19.0" and out[-1].startswith("1.")


def test_pick_the_target_from_cpuinfo(tmp_path):
    """The guide's grep on a Raspberry Pi 5's /proc/cpuinfo gives the part and features its table
    row names; every row's target needs nothing that board's Features lack, and has +dotprod and
    +i8mm exactly where Features has asimddp and i8mm."""
    (grep,) = [c for c in _commands() if _kind(c) == "cpuinfo"]
    core = ("processor\t: {i}\nBogoMIPS\t: 108.00\nFeatures\t: " + FEATURES["Raspberry Pi 5"] +
            "\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x4\nCPU part\t: 0xd0b\n"
            "CPU revision\t: 1\n\n")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("".join(core.format(i=i) for i in range(4)) + "Model\t\t: Raspberry Pi 5 Model B Rev 1.0\n")
    out = subprocess.run(grep.replace("/proc/cpuinfo", str(cpuinfo)), shell=True, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == ["CPU part\t: 0xd0b", "Features\t: " + FEATURES["Raspberry Pi 5"]]
    rows = re.findall(r"^\| ([^|]+?) \| (0x[0-9a-f]+) \(([^)]+)\) \| ([^|]+?) \| `([^`]+)` \|$", GUIDE, re.M)
    assert {r[0] for r in rows} == set(FEATURES)
    for board, _part, core_name, shown, target in rows:
        have = _remote_cpu.parse_cpuinfo_features("Features\t: " + FEATURES[board])
        assert set(shown.replace("(no crypto)", "").replace("`", "").split()) <= have, board
        assert _remote_cpu.missing_features(_remote_cpu.target_features(target), have) == {}, board
        mattr = re.search(r"-mattr=(\S+)", target)[1].split(",")
        assert ("+dotprod" in mattr) == ("asimddp" in have) and ("+i8mm" in mattr) == ("i8mm" in have), board
        assert f"-mcpu={core_name.lower()}" in target, board
    pi5 = [r for r in rows if r[0] == "Raspberry Pi 5"][0]
    assert _target() == pi5[4] and out[0].endswith(pi5[1])


def _exact(model_path, x):
    return plain_llvm_output(*from_onnx(str(model_path)), x)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("board_guide")
    qlinearconv_onnx(d / "model.onnx", np.random.default_rng(0))
    x = np.random.default_rng(1).integers(0, 256, (1, 16, 8, 8)).astype(np.uint8)
    np.save(d / "x.npy", x)
    return d, x


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_args(cmd: str, subs: dict) -> tuple:
    """``(env_vars, args)`` of the guide's ``VARS ~/tvm-rpc/bin/python -m tvm.exec.rpc_server ARGS``."""
    argv = shlex.split(cmd)
    at = argv.index("-m")
    assert argv[at - 1] == "~/tvm-rpc/bin/python" and argv[at + 1] == "tvm.exec.rpc_server", cmd
    env_vars = dict(a.split("=", 1) for a in argv[:at - 1])
    assert env_vars.keys() == {"TVM_NUM_THREADS", "TVM_USE_RUNTIME_LIB"}, cmd
    return env_vars, [subs.get(a, a) for a in argv[at + 2:]]


@pytest.fixture(scope="module")
def board():
    """The guide's server command, run in the emulated Python with a Raspberry Pi 5's CPU."""
    why = aarch64.missing()
    if why:
        pytest.skip(why)
    (cmd,) = [c for c in _commands() if _kind(c) == "server"]
    port = _free_port()
    env_vars, args = _server_args(cmd, {"0.0.0.0": "127.0.0.1", "9090": str(port)})
    with aarch64.board_server([*args, "--port-end", str(port + 1)], env_vars=env_vars, cpu=BOARD_CPU) as server:
        yield server, env_vars


def _run_tvm_ext(cmd: str, subs: dict, extra=()) -> int:
    argv = [subs.get(a, a) for a in shlex.split(cmd)]
    assert argv[0] == "tvm-ext"
    return main([*argv[1:], *extra])


def test_board_server_compile_run_and_compare(board, workdir, monkeypatch, capsys):
    server, env_vars = board
    d, x = workdir
    monkeypatch.chdir(d)
    sess = server.connect(session_timeout=120)
    # TVM's pool takes TVM_NUM_THREADS workers and uses at most the (big) cores it sees: qemu-user sees this host's
    assert sess.get_function("runtime.NumThreads")() == min(int(env_vars["TVM_NUM_THREADS"]), os.cpu_count())
    del sess
    subs = {"BOARD:9090": server.address, "$TARGET": _target()}
    failed = {}
    for cmd in _commands():
        kind = _kind(cmd)
        if kind in KINDS["test_board_server_compile_run_and_compare"] - {"server"}:
            code, said = _run_tvm_ext(cmd, subs), capsys.readouterr()
            if code:
                failed[cmd] = (code, said.out[-2000:], said.err[-2000:])
    assert not failed, failed
    exact = _exact(d / "model.onnx", x)
    board_out, host_out = np.load(d / "board.npz")["output_0"], np.load(d / "host.npz")["output_0"]
    np.testing.assert_array_equal(board_out, exact)  # an integer graph: the board's output is exact
    np.testing.assert_array_equal(host_out, exact)
    # the output names the board's CPU features, read from the board: a Pi 5 core has dotprod, not i8mm
    assert _run_tvm_ext("tvm-ext run model.so --rpc BOARD:9090 --input x.npy", subs) == 0
    feats = capsys.readouterr().out.split("remote CPU features: ")[1].split()
    assert "asimddp" in feats and "i8mm" not in feats and "sve" not in feats


# run, bench and tune refusing a library on an emulated board (about 30 s);
# tests/tools/test_remote_cpu.py::test_check_refuses_in_one_line checks the refusal in the default tier
@pytest.mark.slow
def test_refuses_code_for_a_cpu_the_board_lacks(board, workdir, monkeypatch, capsys):
    """A Neoverse-V1 library (+i8mm, SVE, BF16) on a Cortex-A76 board: refused before it is loaded by
    run, bench and tune, in one line naming what is missing; the board still serves afterwards."""
    server, _ = board
    d, _x = workdir
    monkeypatch.chdir(d)
    v1 = aarch64.TARGETS["neoverse-v1"]
    assert main(["compile", "model.onnx", "-o", "v1.so", "--pipeline", "int8", "--target", v1]) == 0
    assert main(["compile", "model.onnx", "-o", "pi5.so", "--pipeline", "int8", "--target", _target()]) == 0
    capsys.readouterr()
    for argv in (["run", "v1.so", "--rpc", server.address, "--input", "x.npy"],
                 ["bench", "--model", "model.onnx", "--rpc", server.address, "--target", v1, "--repeat", "1"],
                 ["tune", "model.onnx", "--rpc", server.address, "--target", v1]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"the CPU at {server.address} lacks" in err[0], err
        assert "i8mm (cpuinfo: i8mm)" in err[0] and "sve (cpuinfo: sve)" in err[0] and "SIGILL" in err[0]
    assert main(["run", "pi5.so", "--rpc", server.address, "--input", "x.npy"]) == 0


@pytest.mark.slow  # tune and bench over RPC under emulation: about a minute
def test_tune_and_bench_on_the_board(board, workdir, monkeypatch, capsys, tmp_path):
    server, _ = board
    d, _x = workdir
    monkeypatch.chdir(d)
    monkeypatch.setenv("TVM_EXT_CACHE", str(tmp_path))
    subs = {"BOARD:9090": server.address, "$TARGET": _target()}
    for cmd in _commands():
        if _kind(cmd) == "tvm-ext tune rpc":
            assert _run_tvm_ext(cmd, subs, ["--trials-per-conv", "1", "--budget", "3"]) == 0
            text = capsys.readouterr().out
            records = tmp_path / "tuned" / "aarch64_int8_cortex-a76_dotprod.log"
            assert f"records to {records}" in text
        if _kind(cmd) == "tvm-ext bench rpc":
            assert _run_tvm_ext(cmd, subs, ["--repeat", "2", "--out", str(tmp_path / "bench")]) == 0
            res = json.loads((tmp_path / "bench" / "results.json").read_text())
            (v,) = res["variants"]
            assert v["numerics"]["tvm_ext_vs_exact_differ"] == 0 and v["numerics"]["tvm_vs_exact_differ"] == 0
            assert "asimddp" in res["environment"]["rpc"]["features"]


@pytest.mark.slow  # a tracker and a second emulated server: about a minute
def test_tracker_and_key(workdir, monkeypatch, capsys, tmp_path):
    why = aarch64.missing()
    if why:
        pytest.skip(why)
    d, x = workdir
    monkeypatch.chdir(d)
    monkeypatch.setenv("TVM_EXT_CACHE", str(tmp_path))
    (tracker_cmd,) = [c for c in _commands() if _kind(c) == "tracker"]
    (server_cmd,) = [c for c in _commands() if _kind(c) == "server via tracker"]
    port = _free_port()
    argv = shlex.split(tracker_cmd)
    assert argv[:3] == ["~/tvm-rpc/bin/python", "-m", "tvm.exec.rpc_tracker"]
    targs = [{"0.0.0.0": "127.0.0.1", "9190": str(port)}.get(a, a) for a in argv[3:]]
    proc = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", *targs, "--port-end", str(port + 1)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the tracker did not listen"
                time.sleep(0.2)
        tracker = f"127.0.0.1:{port}"
        env_vars, args = _server_args(server_cmd, {"TRACKER:9190": tracker})
        key = args[args.index("--key") + 1]
        sport = _free_port()
        with aarch64.board_server([*args, "--host", "127.0.0.1", "--port", str(sport), "--port-end", str(sport + 1)],
                                  env_vars=env_vars, cpu=BOARD_CPU):
            client = rpc.connect_tracker("127.0.0.1", port)
            while key not in _remote.tracker_keys(client.summary()):
                assert time.monotonic() < deadline + 120, "the emulated server did not register"
                time.sleep(0.5)
            client.close()
            subs = {"TRACKER:9190": tracker, "$TARGET": _target()}
            assert main(["compile", "model.onnx", "-o", "model.so", "--pipeline", "int8", "--target", _target()]) == 0
            for cmd in _commands():
                if _kind(cmd) == "tvm-ext run tracker":
                    assert _run_tvm_ext(cmd, subs, ["-o", "tracked.npz"]) == 0
                    np.testing.assert_array_equal(np.load(d / "tracked.npz")["output_0"], _exact(d / "model.onnx", x))
                if _kind(cmd) == "tvm-ext tune tracker":
                    assert _run_tvm_ext(cmd, subs, ["--trials-per-conv", "1", "--budget", "3"]) == 0
                    assert f"timed on 1 board(s) with key {key!r}" in capsys.readouterr().out
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(10)
