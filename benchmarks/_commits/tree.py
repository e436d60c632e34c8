"""A commit's code imported in this process: its package folders read from ``pyproject.toml`` (or
``setup.py``'s ``MAPPED`` literal), and an import finder that maps each package to its folder in the
worktree instead of the caller's editable install."""
from __future__ import annotations

import fnmatch
import importlib.abc
import importlib.util
import sys
from pathlib import Path

PACKAGE = "tvm_ext"


def _setup_py_mapped(path: Path) -> dict:
    """The ``MAPPED = {package: folder}`` literal of a ``setup.py`` (read, never run); {} without one."""
    import ast

    for node in ast.parse(path.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign)
                                                                        and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "MAPPED" and node.value is not None:
            return dict(ast.literal_eval(node.value))
    return {}


def package_dirs(root, package: str = PACKAGE) -> dict:
    """``{package name: folder}`` of ``package`` and its subpackages in the source tree ``root``.

    Only packages whose folder is not the one Python's own search would find under their parent
    need an entry, but every package the project declares is listed. Read from ``pyproject.toml``:
    ``[tool.setuptools] packages`` (a list, or ``{find = {where, include, exclude}}``) and
    ``package-dir`` (``""`` is the root of all packages), or the literal ``MAPPED = {name: folder}``
    of a ``setup.py`` that discovers the rest; without them, ``src/<package>`` or ``<package>``.

    Raises
    ------
    FileNotFoundError
        No folder of ``package`` with an ``__init__.py`` was found.
    """
    import tomllib

    root = Path(root)
    cfg = {}
    if (root / "pyproject.toml").exists():
        cfg = tomllib.loads((root / "pyproject.toml").read_text()).get("tool", {}).get("setuptools", {})
    pkg_dir = {k: v for k, v in (cfg.get("package-dir") or {}).items()}
    if not pkg_dir and (root / "setup.py").exists():
        pkg_dir = _setup_py_mapped(root / "setup.py")
    base = root / pkg_dir.get("", "")
    declared = cfg.get("packages")
    names: list = []
    if isinstance(declared, list):
        names = list(declared)
    elif isinstance(declared, dict) and "find" in declared:
        find = declared["find"] or {}
        include, exclude = find.get("include", ["*"]), find.get("exclude", [])
        for where in find.get("where", ["."]):
            top = root / where
            for init in sorted(top.rglob("__init__.py")):
                name = ".".join(init.parent.relative_to(top).parts)
                if name and any(fnmatch.fnmatch(name, p) for p in include) and not any(
                        fnmatch.fnmatch(name, p) for p in exclude):
                    names.append(name)
                    pkg_dir.setdefault(name, str(init.parent.relative_to(root)))
    if not names:
        names = [n for n in pkg_dir if n]
    mapping: dict = {}
    for name in sorted(n for n in names if n == package or n.startswith(package + ".")):
        parent, _, leaf = name.rpartition(".")
        if name in pkg_dir:
            mapping[name] = root / pkg_dir[name]
        elif parent in mapping:
            mapping[name] = mapping[parent] / leaf
        else:
            mapping[name] = base.joinpath(*name.split("."))
    if package not in mapping:
        for cand in (base / package, root / "src" / package, root / package):
            if (cand / "__init__.py").exists():
                mapping[package] = cand
                break
    if package not in mapping or not (mapping[package] / "__init__.py").exists():
        raise FileNotFoundError(f"compare_commits: no package {package!r} with an __init__.py under {root} "
                                f"(pyproject.toml [tool.setuptools] packages/package-dir, src/ or flat layout)")
    return {k: v.resolve() for k, v in mapping.items() if (v / "__init__.py").exists()}


class _TreeFinder(importlib.abc.MetaPathFinder):
    """Finds the packages of :func:`package_dirs` in their folders; submodules follow ``__path__``."""

    def __init__(self, mapping: dict):
        self.mapping = mapping

    def find_spec(self, fullname, path=None, target=None):
        folder = self.mapping.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(fullname, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


def use_tree(root, package: str = PACKAGE) -> dict:
    """Make ``import package`` in this process load the source tree ``root``; returns the mapping.

    Editable-install finders (``__editable__*``, such as the caller's checkout installed with
    ``pip install -e``) are removed from ``sys.meta_path``, and a finder for ``root``'s packages
    goes first. Must run before ``package`` is imported.
    """
    if package in sys.modules:
        raise RuntimeError(f"compare_commits: {package} is already imported from "
                           f"{getattr(sys.modules[package], '__file__', '?')}")
    mapping = package_dirs(root, package)
    sys.meta_path[:] = [f for f in sys.meta_path
                        if not str(getattr(f, "__module__", "") or getattr(type(f), "__module__", "")).startswith(
                            "__editable__")]
    sys.meta_path.insert(0, _TreeFinder(mapping))
    return mapping


def modules_outside(root, package: str = PACKAGE) -> list:
    """Imported modules of ``package`` whose file is not under ``root`` (should be none)."""
    root = Path(root).resolve()
    out = []
    for name, module in list(sys.modules.items()):
        if name != package and not name.startswith(package + "."):
            continue
        f = getattr(module, "__file__", None)
        if f and not Path(f).resolve().is_relative_to(root):
            out.append(f"{name} ({f})")
    return sorted(out)
