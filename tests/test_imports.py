"""No import cycles between tvm-ext's modules (lazy, function-level imports included), and the
layers of the package: ``tvm_ext.tools`` (cli, bench, tune, ...) on top of ``tvm_ext.core`` (build,
pipelines, report, explain, ...), which sits on ``tvm_ext.x86`` (isa, target, int8_conv, tuning) and
the leaves (``errors``, ``_op_pattern``, ...). The one allowed loop is plugin registration:
``registry.list_passes`` imports ``tvm_ext.passes`` so that every pass module registers itself.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (("tvm_ext", "tvm_ext"), ("passes", "tvm_ext.passes"), ("patterns", "tvm_ext.patterns"))
ALLOWED = {("tvm_ext.core.registry", "tvm_ext.passes")}  # plugin registration (see the module note)


def _modules() -> dict:
    mods = {}
    for folder, pkg in PACKAGES:
        for f in (ROOT / folder).rglob("*.py"):
            parts = [p for p in f.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            mods[".".join([pkg, *parts])] = f
    return mods


def _imports(name: str, path: Path, mods: dict) -> set:
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else (node.module or "")
            subs = {f"{target}.{a.name}" for a in node.names} & set(mods)
            out |= subs | ({target} if len(subs) < len(node.names) else set())
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m in mods and m != name}


def _cycles(deps: dict) -> list:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in deps[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in deps:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    mods = _modules()
    deps = {n: {d for d in _imports(n, p, mods) if (n, d) not in ALLOWED} for n, p in mods.items()}
    assert _cycles(deps) == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_leaves_do_not_import_the_layers_above():
    mods = _modules()
    for leaf in ("tvm_ext.errors", "tvm_ext.x86.isa", "tvm_ext.x86.int8_conv", "tvm_ext.x86.tuning",
                 "tvm_ext.x86.target"):
        above = {"tvm_ext.tools.cli", "tvm_ext.tools.bench", "tvm_ext.core.build", "tvm_ext.tools.tune"}
        assert not (_imports(leaf, mods[leaf], mods) & above), leaf


def test_subpackages_import_only_the_layers_below():
    """x86 imports neither core nor tools; core does not import tools (lazy imports included)."""
    mods = _modules()
    assert {"tvm_ext.core.build", "tvm_ext.x86.isa", "tvm_ext.tools.cli"} <= set(mods)
    for name, path in mods.items():
        deps = _imports(name, path, mods)
        if name.startswith("tvm_ext.x86."):
            assert not {d for d in deps if d.startswith(("tvm_ext.core", "tvm_ext.tools"))}, name
        if name.startswith("tvm_ext.core."):
            assert not {d for d in deps if d.startswith("tvm_ext.tools")}, name


def test_flat_module_names_are_the_same_modules():
    import importlib

    import tvm_ext

    for flat, where in tvm_ext.MODULE_PATHS.items():
        assert importlib.import_module(f"tvm_ext.{flat}") is importlib.import_module(f"tvm_ext.{where}"), flat
    assert callable(tvm_ext.build) and not isinstance(tvm_ext.build, type(tvm_ext)), "still the function"


def _pass_modules(mods: dict) -> set:
    """The modules of tvm_ext.passes that hold a pass (not ``__init__``, not an underscore module)."""
    return {n for n in mods if n.startswith("tvm_ext.passes.") and not n.rsplit(".", 1)[1].startswith("_")}


def test_no_pass_imports_another_pass():
    """Shared machinery lives in the underscore modules of passes/ (and tvm_ext leaves), never in
    another pass's module: every import of every passes/*.py is parsed, lazy ones included."""
    mods = _modules()
    passes = _pass_modules(mods)
    assert len(passes) >= 20  # the finder sees the pass modules
    for name in sorted(n for n in mods if n.startswith("tvm_ext.passes.")):
        reached = _imports(name, mods[name], mods) & passes
        assert not reached, f"{name} imports pass module(s) {sorted(reached)}"


def test_shared_leaves_import_no_pass_or_table():
    """TOpPattern values and Reject come from leaves that the passes and pattern tables both import."""
    mods = _modules()
    for leaf in ("tvm_ext._op_pattern", "tvm_ext._reject"):
        reached = _imports(leaf, mods[leaf], mods)
        assert not {m for m in reached if m.startswith(("tvm_ext.passes", "tvm_ext.patterns"))}, leaf


def test_the_pass_import_check_sees_a_pass_import(tmp_path):
    """The parser resolves ``from .other_pass import x`` inside passes/ to the pass module."""
    mods = {"tvm_ext.passes.a_pass": tmp_path / "a_pass.py", "tvm_ext.passes.other_pass": tmp_path / "other_pass.py",
            "tvm_ext.passes._util": tmp_path / "_util.py"}
    mods["tvm_ext.passes.a_pass"].write_text("from ._util import op_name\n\ndef f():\n    from .other_pass import g\n")
    assert _imports("tvm_ext.passes.a_pass", mods["tvm_ext.passes.a_pass"], mods) & _pass_modules(mods) == {
        "tvm_ext.passes.other_pass"}
