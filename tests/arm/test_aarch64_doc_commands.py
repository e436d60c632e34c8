"""docs/arm.md's commands outside "Set up your board" (tests/arm/test_aarch64_board_guide.py runs those).

:func:`test_every_command_of_arm_md_is_run` fails for a shell command in docs/arm.md that no test
here or in the board guide's test runs. The "RPC flow" commands run in one slow test: the emulated
servers ``python -m tvm_ext.testing.aarch64`` starts (plain, with a Cortex-A72, registered with a
tracker; ports replaced by free ones), then the host's ``compile``, ``run --rpc`` and ``bench --rpc``
in a folder holding ``model.onnx`` (a tiny integer QOperator graph) and ``x.npy`` (``bench`` with
``--repeat 2``).
"""
import contextlib
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tvm import rpc

from tvm_ext.testing import aarch64
from tvm_ext.tools import _remote
from tvm_ext.tools.cli import main

from _cases import qlinearconv_onnx

DOC = (Path(__file__).resolve().parents[2] / "docs" / "arm.md").read_text()
GUIDE = (DOC.index("## Set up your board"), DOC.index("## RPC flow"))


def _commands(outside_guide: bool = True) -> list:
    out = []
    for m in re.finditer(r"```sh\n(.*?)```", DOC, re.S):
        if outside_guide and GUIDE[0] <= m.start() < GUIDE[1]:
            continue
        for line in m.group(1).replace("\\\n", " ").splitlines():
            line = line.split("  #", 1)[0].strip()
            if line:
                out.append(" ".join(line.split()))
    return out


def _kind(cmd: str) -> str:
    argv = shlex.split(cmd)
    if argv[:3] == ["python", "-m", "tvm_ext.testing.aarch64"]:
        return "emulated server" + (" via tracker" if "--tracker" in argv else " cpu" if "--cpu" in argv else "")
    if argv[0] == "tvm-ext" and argv[1] in ("compile", "run", "bench"):
        return f"tvm-ext {argv[1]}"
    raise AssertionError(f"docs/arm.md: no test runs {cmd!r}")


def test_every_command_of_arm_md_is_run():
    kinds = {_kind(c) for c in _commands()}
    assert kinds == {"emulated server", "emulated server cpu", "emulated server via tracker", "tvm-ext compile",
                     "tvm-ext run", "tvm-ext bench"}
    assert _commands(outside_guide=False)[0].startswith("python3.11 -m venv")  # the guide's are in its own test


@contextlib.contextmanager
def _serve(argv: list):
    """``python -m tvm_ext.testing.aarch64 ARGS`` until it says it listens; its address."""
    proc = subprocess.Popen([sys.executable, "-m", "tvm_ext.testing.aarch64", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        for line in proc.stdout:
            found = re.search(r"listening on (\S+?)[;,]? ", line)
            if found:
                yield found[1]
                return
            assert time.monotonic() < deadline, "the emulated server did not start"
        raise AssertionError(f"python -m tvm_ext.testing.aarch64 exited ({proc.wait()})")
    finally:
        proc.terminate()  # its rpc_server context kills the emulated process group
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # three emulated servers and a bench over RPC: about two minutes
def test_rpc_flow_commands(tmp_path, monkeypatch, capsys):
    why = aarch64.missing()
    if why:
        pytest.skip(why)
    qlinearconv_onnx(tmp_path / "model.onnx", np.random.default_rng(0))
    np.save(tmp_path / "x.npy", np.random.default_rng(1).integers(0, 256, (1, 16, 8, 8)).astype(np.uint8))
    monkeypatch.chdir(tmp_path)
    cmds = {_kind(c): shlex.split(c) for c in _commands()}
    port = {"9090": str(_free_port())}
    with _serve([port.get(a, a) for a in cmds["emulated server"][3:]]) as address:
        subs = {"127.0.0.1:9090": address}
        for kind, extra in (("tvm-ext compile", []), ("tvm-ext run", []), ("tvm-ext bench", ["--repeat", "2"])):
            argv = [subs.get(a, a) for a in cmds[kind]]
            assert main([*argv[1:], *extra]) == 0, argv
        assert (tmp_path / "out.npz").is_file()
        (v,) = json.loads((tmp_path / "bench-results" / "results.json").read_text())["variants"]
        assert v["numerics"]["tvm_ext_vs_exact_differ"] == 0 and v["numerics"]["tvm_vs_exact_differ"] == 0
    capsys.readouterr()
    port = {"9090": str(_free_port())}
    with _serve([port.get(a, a) for a in cmds["emulated server cpu"][3:]]) as address:
        # the compile above was for Neoverse-N1 (+dotprod): a Raspberry Pi 4's core refuses it
        assert main(["run", "model.so", "--rpc", address, "--input", "x.npy"]) == 2
        assert "lacks dotprod (cpuinfo: asimddp)" in capsys.readouterr().err
    with aarch64.rpc_tracker() as tracker:
        argv = cmds["emulated server via tracker"]
        key = argv[argv.index("--key") + 1]
        with _serve([{"127.0.0.1:9190": tracker}.get(a, a) for a in argv[3:]]):
            host, tport = _remote.parse_address(tracker)
            client = rpc.connect_tracker(host, tport)
            deadline = time.monotonic() + 120
            while key not in _remote.tracker_keys(client.summary()):
                assert time.monotonic() < deadline, "the emulated server did not register with the tracker"
                time.sleep(0.5)
            client.close()
            assert main(["run", "model.so", "--rpc-tracker", tracker, "--rpc-key", key, "--input", "x.npy"]) == 0
