"""Modules a reader can hold in their head: every Python file of the package (``tvm_ext/``, ``passes/``,
``patterns/``) and of ``benchmarks/`` opens with a module docstring of at most
:data:`MAX_DOCSTRING_LINES` lines and has at most :data:`MAX_MODULE_LINES` lines; every file under
``tests/`` has at most :data:`MAX_TEST_LINES`. No exceptions: a long explanation goes to ``docs/``,
a long module is split by idea.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE_FOLDERS = ("tvm_ext", "passes", "patterns", "benchmarks")
MAX_MODULE_LINES = 500
MAX_DOCSTRING_LINES = 25
MAX_TEST_LINES = 600


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _docstring_lines(path: Path):
    """Lines of the module docstring's text (closing quotes on their own line not counted), or None."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=True)
    return None if doc is None else len(doc.splitlines())


def code_problems(root: Path = ROOT, folders=CODE_FOLDERS) -> list:
    """``"<path>: <what is wrong>"`` for every code file over the limits or without a docstring."""
    out = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root)
            n, doc = _lines(path), _docstring_lines(path)
            if n > MAX_MODULE_LINES:
                out.append(f"{rel}: {n} lines (at most {MAX_MODULE_LINES}: split it by idea)")
            if doc is None:
                out.append(f"{rel}: no module docstring")
            elif doc > MAX_DOCSTRING_LINES:
                out.append(f"{rel}: module docstring of {doc} lines (at most {MAX_DOCSTRING_LINES}: "
                           "the explanation goes to docs/)")
    return out


def long_test_files(root: Path = ROOT) -> list:
    """``"<path>: <n> lines"`` for every file under ``tests/`` over :data:`MAX_TEST_LINES`."""
    return [f"{p.relative_to(root)}: {_lines(p)} lines (at most {MAX_TEST_LINES})"
            for p in sorted((root / "tests").rglob("*.py")) if _lines(p) > MAX_TEST_LINES]


def test_code_modules_are_short_with_short_docstrings():
    assert len(list((ROOT / "tvm_ext").rglob("*.py"))) > 100  # the walk sees the package
    assert list((ROOT / "benchmarks").rglob("*.py"))
    assert code_problems() == []


def test_test_files_are_short():
    assert long_test_files() == []


def test_the_checks_see_long_files_and_docstrings(tmp_path):
    """A module over the line limit, one with a long docstring, one without any, and a long test file
    are all reported; a file at the limits is not."""
    pkg = tmp_path / "tvm_ext"
    pkg.mkdir()
    (pkg / "ok.py").write_text('"""' + "\n" * (MAX_DOCSTRING_LINES - 1) + '"""\n'
                               + "x = 1\n" * (MAX_MODULE_LINES - MAX_DOCSTRING_LINES))
    (pkg / "long.py").write_text('"""Doc."""\n' + "x = 1\n" * MAX_MODULE_LINES)
    (pkg / "wordy.py").write_text('"""First.\n' + "more\n" * MAX_DOCSTRING_LINES + '"""\n')
    (pkg / "bare.py").write_text("x = 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_long.py").write_text("x = 1\n" * (MAX_TEST_LINES + 1))
    (tmp_path / "tests" / "test_ok.py").write_text("x = 1\n" * MAX_TEST_LINES)
    assert _lines(pkg / "ok.py") == MAX_MODULE_LINES and _docstring_lines(pkg / "ok.py") <= MAX_DOCSTRING_LINES
    found = code_problems(tmp_path, ("tvm_ext",))
    assert [p.split(":")[0] for p in found] == ["tvm_ext/bare.py", "tvm_ext/long.py", "tvm_ext/wordy.py"]
    assert "501 lines" in found[1] and f"docstring of {MAX_DOCSTRING_LINES + 1} lines" in found[2]
    assert [p.split(":")[0] for p in long_test_files(tmp_path)] == ["tests/test_long.py"]
