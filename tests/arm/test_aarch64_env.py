"""tvm_ext.testing.aarch64.find_env names every missing piece of the set-up (no emulation needed)."""
import pytest

from tvm_ext.testing import aarch64


def test_empty_folder_and_path_name_everything(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # neither qemu-aarch64 nor the cross compiler on it
    with pytest.raises(aarch64.ArmEnvMissing) as err:
        aarch64.find_env(tmp_path)
    text = str(err.value)
    for piece in ("qemu-aarch64 is not on PATH", "aarch64-linux-gnu-g++ is not on PATH",
                  f"no aarch64 Python sysroot in {tmp_path}/sysroot",
                  f"no executable wrapper {tmp_path}/bin/python3.11",
                  "make arm-env"):
        assert piece in text, text
    assert aarch64.missing(tmp_path) == text


def test_cross_compiler_only_needed_for_linking(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "g++" not in aarch64.missing(tmp_path, need_cxx=False)


def test_sysroot_without_tvm_runtime(tmp_path):
    (tmp_path / "sysroot" / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "sysroot" / "usr" / "bin" / "python3.11").write_text("")
    assert f"no aarch64 TVM runtime in {tmp_path}/sysroot" in aarch64.missing(tmp_path)


def test_default_folder_follows_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_EXT_ARM_DIR", str(tmp_path))
    assert aarch64.default_dir() == tmp_path
    monkeypatch.delenv("TVM_EXT_ARM_DIR")
    assert aarch64.default_dir().name == ".arm"
