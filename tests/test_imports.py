"""One name per module, no import cycles between tvm-ext's modules (lazy, function-level imports
included), and the layers the README states, as data (:data:`LAYERS`): a module imports its own
layer and the layers below it, never one above, with no exception. The passes sit below the core:
they register into a leaf (``tvm_ext.passes._registry``), and ``tvm_ext.core.registry`` imports them.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (("tvm_ext", "tvm_ext"), ("passes", "tvm_ext.passes"), ("patterns", "tvm_ext.patterns"))

#: The layers, top first (the README's layering sentence): a module may import modules of its own
#: layer and of the layers below it. A module belongs to the entry that is its name or its
#: longest package prefix; ``"tvm_ext"`` is the package's ``__init__`` (it re-exports ``build``,
#: ``explain``, ...). Every module must belong to a layer: a new top-level module is placed here.
LAYERS = (
    ("tvm_ext.tools", "tvm_ext.testing"),
    ("tvm_ext.relax",),
    ("tvm_ext", "tvm_ext.core"),
    ("tvm_ext.passes",),
    ("tvm_ext.patterns",),
    ("tvm_ext.families",),
    ("tvm_ext.x86", "tvm_ext.arm", "tvm_ext.gpu"),
    ("tvm_ext.backend", "tvm_ext.backend", "tvm_ext._records"),
    ("tvm_ext.errors", "tvm_ext.ops", "tvm_ext._op_pattern", "tvm_ext._reject", "tvm_ext._attrs", "tvm_ext._compat",
     "tvm_ext._atomic", "tvm_ext._files", "tvm_ext._patch", "tvm_ext._rules", "tvm_ext._lower_pass",
     "tvm_ext._round_reciprocal", "tvm_ext._no_contract", "tvm_ext._byte_table", "tvm_ext._tir_const"),
)


#: The fuzzer's modules (``tvm_ext.testing.fuzz``), top first, by the same rule: the grammar at the
#: bottom, then the steps, the motifs, the builder and where builds run, the oracle, the runner, the package.
FUZZ_LAYERS = (
    ("tvm_ext.testing.fuzz", "tvm_ext.testing.fuzz.__main__"),
    ("tvm_ext.testing.fuzz.runner",),
    ("tvm_ext.testing.fuzz.oracle",),
    ("tvm_ext.testing.fuzz.compare", "tvm_ext.testing.fuzz.bounds"),
    ("tvm_ext.testing.fuzz.builder", "tvm_ext.testing.fuzz.execution"),
    ("tvm_ext.testing.fuzz.motifs",),
    ("tvm_ext.testing.fuzz.steps",),
    ("tvm_ext.testing.fuzz.grammar",),
)

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
    deps = {n: _imports(n, p, mods) for n, p in mods.items()}
    assert _cycles(deps) == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _layer(name: str, layers=LAYERS) -> int | None:
    """Index in ``layers`` (0 = top) of the entry that is ``name`` or its longest package prefix."""
    best, depth = None, -1
    for i, entries in enumerate(layers):
        for e in entries:
            if (name == e or (name.startswith(e + ".") and e != "tvm_ext")) and e.count(".") > depth:
                best, depth = i, e.count(".")
    return best


def _upward_imports(mods: dict, layers=LAYERS) -> list:
    """``(importer, imported)`` pairs where a module imports one of a higher layer."""
    out = []
    for name, path in sorted(mods.items()):
        for dep in sorted(_imports(name, path, mods)):
            if _layer(dep, layers) < _layer(name, layers):
                out.append((name, dep))
    return out


def test_every_module_has_a_layer():
    mods = _modules()
    assert {"tvm_ext", "tvm_ext.core.build", "tvm_ext.x86.isa", "tvm_ext.tools.cli", "tvm_ext.passes._util",
            "tvm_ext.patterns.qnn", "tvm_ext._attrs"} <= set(mods)
    assert [n for n in sorted(mods) if _layer(n) is None] == []


def test_no_module_imports_a_layer_above_its_own():
    assert _upward_imports(_modules()) == []


def test_fuzzer_modules_import_only_the_ones_below():
    fuzz = {n: p for n, p in _modules().items() if n == "tvm_ext.testing.fuzz" or n.startswith("tvm_ext.testing.fuzz.")}
    assert {"tvm_ext.testing.fuzz.grammar", "tvm_ext.testing.fuzz.oracle", "tvm_ext.testing.fuzz.runner"} <= set(fuzz)
    assert [n for n in sorted(fuzz) if _layer(n, FUZZ_LAYERS) is None] == []
    assert _upward_imports(fuzz, FUZZ_LAYERS) == []

def test_the_layer_check_sees_an_upward_import(tmp_path):
    """The check parses lazy imports too: a pass importing the core, or x86 importing the core, is
    reported; imports downwards (the core's registry loading the passes) are not."""
    files = {
        "tvm_ext.core.registry": "def f():\n    from .. import passes\n",
        "tvm_ext.x86.isa": "import tvm_ext.core.build\n",
        "tvm_ext.core.build": "from ..x86 import isa\n",
        "tvm_ext.passes": "", "tvm_ext.passes.add_as_onnxruntime": "from tvm_ext.core.registry import register_pass\n",
    }
    mods = {}
    for name, text in files.items():
        path = tmp_path / (name + ("/__init__.py" if name == "tvm_ext.passes" else ".py"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        mods[name] = path
    assert _upward_imports(mods) == [("tvm_ext.passes.add_as_onnxruntime", "tvm_ext.core.registry"),
                                     ("tvm_ext.x86.isa", "tvm_ext.core.build")]


def test_one_name_per_module():
    """Every tvm_ext module is in ``sys.modules`` under its own name only, as a plain module (no import
    hook gives it a second name, no module replaces its class), and no flat name imports."""
    import importlib
    import importlib.util
    import sys
    import types

    for name in _modules():
        importlib.import_module(name)
    for key, mod in list(sys.modules.items()):
        if key == "tvm_ext" or key.startswith("tvm_ext."):
            assert mod.__name__ == key, f"{key} is {mod.__name__}: a second name"
            assert type(mod) is types.ModuleType, f"{key} is a {type(mod).__name__}"
    for flat in ("build", "explain", "zoo", "x86_int8", "pipelines", "isa", "amx", "bench", "cli"):
        assert importlib.util.find_spec(f"tvm_ext.{flat}") is None, flat
    import tvm_ext
    import tvm_ext.core.build

    assert callable(tvm_ext.build) and tvm_ext.build is tvm_ext.core.build.build


def test_import_changes_nothing_process_wide():
    """``import tvm_ext`` (a new process, TOPHUB_LOCATION unset) adds no import hook, loads no TVM, sets
    no environment variable and installs no ``onnx.mapping`` stand-in (``tvm_ext._compat`` applies
    those while a build or an import runs)."""
    import os
    import subprocess
    import sys

    code = ("import json, os, sys; hooks = (list(sys.meta_path), list(sys.path_hooks)); env = dict(os.environ)\n"
            "import tvm_ext\n"
            "print(json.dumps({'hooks_kept': hooks == (sys.meta_path, sys.path_hooks), 'tvm': 'tvm' in sys.modules,\n"
            "                  'onnx_mapping': 'onnx.mapping' in sys.modules,\n"
            "                  'env': sorted(k for k in os.environ if os.environ[k] != env.get(k))}))")
    env = {k: v for k, v in os.environ.items() if k != "TOPHUB_LOCATION"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    assert json.loads(r.stdout) == {"hooks_kept": True, "tvm": False, "onnx_mapping": False, "env": []}


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
