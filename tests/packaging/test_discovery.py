"""The distribution's package list is discovered from the tree: setup.py's list equals every package
folder of tvm_ext/, passes/ and patterns/, plus the folders of package data (the install itself is
checked by ``make check-install``)."""
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from check_install import DATA, ROOT, source_packages  # noqa: E402


def _setup_module():
    spec = importlib.util.spec_from_file_location("tvm_ext_setup", ROOT / "setup.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # defines discover(); setup() runs only as a script
    return mod


def test_setup_discovers_every_package_of_the_tree():
    found = set(_setup_module().discover())
    data_folders = {str(Path(pattern).parent).replace("/", ".") for pattern in DATA}
    assert data_folders == {"tvm_ext.x86.tuned"}
    assert found == source_packages() | data_folders
    assert {"tvm_ext.core.explain", "tvm_ext.tools.bench", "tvm_ext.testing.fuzz", "tvm_ext.gpu",
            "tvm_ext.passes", "tvm_ext.patterns"} <= found


def test_a_new_subpackage_is_found_without_an_edit(tmp_path, monkeypatch):
    mod = _setup_module()
    for folder in ("tvm_ext/newpkg", "passes/sub", "patterns"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "tvm_ext" / "__init__.py").write_text("")
    (tmp_path / "passes" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    assert mod.discover() == ["tvm_ext", "tvm_ext.newpkg", "tvm_ext.passes", "tvm_ext.passes.sub", "tvm_ext.patterns"]


def test_a_data_folder_is_a_package_and_a_cache_folder_is_not(tmp_path, monkeypatch):
    """setuptools drops a data folder that ``packages`` does not list (it warns so), so discover() lists
    folders without ``__init__.py`` under tvm_ext/, never ``__pycache__``."""
    mod = _setup_module()
    for folder in ("tvm_ext/data", "tvm_ext/__pycache__", "passes", "patterns"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    for folder in ("tvm_ext", "passes", "patterns"):
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "tvm_ext" / "data" / "records.log").write_text("")
    monkeypatch.chdir(tmp_path)
    assert mod.discover() == ["tvm_ext", "tvm_ext.data", "tvm_ext.passes", "tvm_ext.patterns"]
