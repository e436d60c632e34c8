"""benchmarks/compare_commits.py: two commits' kernels, bytes, code and outputs compared.

The comparison is tested on hand-made results (every kind of difference is reported, naming the
model and the kernel; identical results give none), the commit-code import on a hand-made source
tree and on a real worktree of HEAD, and the whole tool on HEAD against HEAD (slow: two builds).
"""
import copy
import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).parents[1]
SCRIPT = REPO / "benchmarks/compare_commits.py"


def _script_module():
    if str(SCRIPT.parent) not in sys.path:  # its parts (benchmarks/_commits), as when it runs as a script
        sys.path.append(str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("compare_commits", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("compare_commits", mod)  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


cc = _script_module()


def _kernel(index, func_name, ops, out_dtype="uint8", tuned=False):
    return {"index": index, "name": func_name, "func_name": func_name, "ops": list(ops),
            "anchor": next((o for o in ops if o.startswith("nn.")), None),
            "outputs": [{"shape": [1, 8, 4, 4], "dtype": out_dtype}],
            "inputs": [{"shape": [1, 8, 4, 4], "dtype": "uint8"}], "tuned": tuned,
            "input_uses": ["int"], "output_kinds": ["int"]}


def _traffic(nbytes: dict) -> dict:
    return {"count": {k: 1 for k in nbytes}, "bytes": dict(nbytes), "total_count": len(nbytes),
            "total_bytes": sum(nbytes.values())}


def _result(model="toy_int8"):
    kernels = [_kernel(0, "tvmgen_default_fused_cast_nn_pad", ["cast", "nn.pad"]),
               _kernel(1, "tvmgen_default_fused_nn_contrib_conv2d_NCHWc_add", ["nn.contrib_conv2d_NCHWc", "add"]),
               _kernel(2, "tvmgen_default_fused_nn_global_avg_pool2d", ["nn.global_avg_pool2d"], "float32")]
    return {
        "model": model, "error": None,
        "model_digest": {"onnx_sha256": "a" * 64, "relay_structural_hash": "123"},
        "report": {"num_kernels": 3, "crossing": _traffic({"uint8": 256}), "inputs": _traffic({"float32": 192}),
                   "outputs": _traffic({"float32": 32}), "kernels": kernels,
                   "float_crossings": [], "int_crossings": []},
        "code": {"functions": {k["func_name"]: f"{i:064x}" for i, k in enumerate(kernels)}
                 | {"tvmgen_default_fused_nn_contrib_conv2d_NCHWc_add_compute_": "f" * 64}},
        "params_sha256": "b" * 64,
        "runs": [{"seed": 0, "inputs_sha256": "c" * 64,
                  "outputs": [{"file": "outputs/seed0_out0.npy", "shape": [1, 8], "dtype": "float32",
                               "sha256": "d" * 64}]}],
    }


def test_identical_results_have_no_difference():
    assert cc.compare_results(_result(), _result()) == []


def test_every_kind_of_difference_is_reported_with_model_and_kernel(tmp_path):
    base, head = _result(), _result()
    conv = "tvmgen_default_fused_nn_contrib_conv2d_NCHWc_add"
    head["report"]["kernels"][1]["ops"] = ["nn.contrib_conv2d_NCHWc", "add", "clip"]
    head["report"]["kernels"][2]["tuned"] = True
    head["report"]["crossing"] = _traffic({"uint8": 256, "int32": 1024})
    head["code"]["functions"][conv + "_compute_"] = "e" * 64
    head["runs"][0]["outputs"][0]["sha256"] = "0" * 64
    for side, value in (("base", 1.0), ("head", 1.5)):
        (tmp_path / side / "outputs").mkdir(parents=True)
        np.save(tmp_path / side / "outputs/seed0_out0.npy", np.full((1, 8), value, np.float32))

    diffs = cc.compare_results(base, head, tmp_path / "base", tmp_path / "head")
    by_kind = {}
    for d in diffs:
        assert d.model == "toy_int8"
        by_kind.setdefault(d.kind, []).append(d.detail)
    assert set(by_kind) == {"kernel", "tuned", "bytes", "code", "outputs"}, diffs
    assert by_kind["kernel"] == [(f'kernel 1 {conv}: ops ["nn.contrib_conv2d_NCHWc", "add"] -> '
                                  '["nn.contrib_conv2d_NCHWc", "add", "clip"]')]
    assert "kernel 2 tvmgen_default_fused_nn_global_avg_pool2d: tuned False -> True" in by_kind["tuned"]
    assert by_kind["bytes"] == ["crossing bytes int32: 0 -> 1024", "crossing count int32: 0 -> 1"]
    assert by_kind["code"] == [f"function {conv}_compute_ (kernel {conv}): assembly differs"]
    assert by_kind["outputs"] == ["seed 0 output 0: not bit-identical (max |diff| 0.5, 8 of 8 elements differ)"]
    assert [d.kind for d in cc.compare_results(base, head, ignore=("code", "tuned", "outputs"))] == [
        "kernel", "bytes", "bytes"]


def test_a_kernel_more_or_less_is_named():
    base, head = _result(), _result()
    extra = _kernel(3, "tvmgen_default_fused_layout_transform", ["layout_transform"])
    head["report"]["kernels"].append(extra)
    head["report"]["num_kernels"] = 4
    head["code"]["functions"][extra["func_name"]] = "1" * 64
    diffs = [str(d) for d in cc.compare_results(base, head)]
    assert "toy_int8: kernel count: 3 -> 4" in diffs
    assert ('toy_int8: kernel: tvmgen_default_fused_layout_transform (ops ["layout_transform"]): 0 in base, 1 in head'
            in diffs)
    assert "toy_int8: code: function tvmgen_default_fused_layout_transform only in head" in diffs


def test_a_model_that_failed_at_one_commit_is_an_error_not_a_match():
    head = copy.deepcopy(_result())
    head["error"] = "TVMError: boom"
    assert [str(d) for d in cc.compare_results(_result(), head)] == ["toy_int8: error: head: TVMError: boom"]
    row = cc.summary_row(_result(), head, cc.compare_results(_result(), head))
    assert row["kernels"] == "3 / error" and row["outputs"] == "-"
    with pytest.raises(ValueError, match="unknown kinds"):
        cc.compare_results(_result(), _result(), ignore=("typo",))


def _listing(n=3, f_op="vpdpbusd", g_const="1065353216", tail="producer: TVM"):
    """Two global functions as LLVM prints them: f launches a parallel lambda; g has a constant pool."""
    return textwrap.dedent(f"""\
        \t.text
        \t.type\tf,@function
        f:
        \tjmp\t.LBB{n}_2
        .LBB{n}_2:
        \t{f_op}
        \tcall\t.L__tvm_parallel_lambda.{n}
        .Lfunc_end{n}:
        \t.size\tf, .Lfunc_end{n}-f
        \t.type\t.L__tvm_parallel_lambda.{n},@function
        .L__tvm_parallel_lambda.{n}:
        \tret
        .Lfunc_end{n + 1}:
        \t.size\t.L__tvm_parallel_lambda.{n}, .Lfunc_end{n + 1}-.L__tvm_parallel_lambda.{n}
        \t.section\t.rodata.cst4,"aM",@progbits,4
        .LCPI{n + 2}_0:
        \t.long\t{g_const}
        \t.text
        \t.type\tg,@function
        g:
        \tvbroadcastss\t.LCPI{n + 2}_0(%rip), %ymm0
        \tret
        .Lfunc_end{n + 2}:
        \t.size\tg, .Lfunc_end{n + 2}-g
        \t.section\t.debug_str,"MS",@progbits,1
        \t.asciz\t"{tail}"
        """)


def test_function_hashes_do_not_depend_on_label_numbers_elsewhere_in_the_module():
    a = cc.function_hashes(_listing())
    assert set(a) == {"f", "g", cc.MODULE_TAIL}, "a parallel lambda belongs to the function before it"
    assert cc.function_hashes(_listing(n=7)) == a
    changed = {name: {k for k in a if cc.function_hashes(_listing(**kw))[k] != a[k]}
               for name, kw in (("f", {"f_op": "vpmaddubsw"}), ("g", {"g_const": "0"}), ("tail", {"tail": "x"}))}
    assert changed == {"f": {"f"}, "g": {"g"}, "tail": {cc.MODULE_TAIL}}, "a constant pool belongs to its function"


def test_the_module_tail_is_reported_only_when_no_function_differs():
    base, head = _result(), _result()
    base["code"]["functions"][cc.MODULE_TAIL] = "1" * 64
    head["code"]["functions"][cc.MODULE_TAIL] = "2" * 64
    assert [d.detail for d in cc.compare_results(base, head)] == [f"assembly {cc.MODULE_TAIL} differs"]
    head["code"]["functions"]["tvmgen_default_fused_cast_nn_pad"] = "3" * 64
    assert [d.detail for d in cc.compare_results(base, head)] == [
        "function tvmgen_default_fused_cast_nn_pad: assembly differs"]


def _fake_tree(root: Path, pyproject: str, files: dict) -> Path:
    root.mkdir(parents=True)
    (root / "pyproject.toml").write_text(textwrap.dedent(pyproject))
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_package_dirs_follow_package_dir_and_find(tmp_path):
    mapped = _fake_tree(tmp_path / "mapped", """\
        [tool.setuptools]
        packages = ["tvm_ext", "tvm_ext.passes", "tvm_ext.sub"]
        [tool.setuptools.package-dir]
        "tvm_ext" = "tvm_ext"
        "tvm_ext.passes" = "passes"
        """, {"tvm_ext/__init__.py": "", "tvm_ext/sub/__init__.py": "", "passes/__init__.py": ""})
    assert cc.package_dirs(mapped) == {"tvm_ext": (mapped / "tvm_ext").resolve(),
                                       "tvm_ext.passes": (mapped / "passes").resolve(),
                                       "tvm_ext.sub": (mapped / "tvm_ext/sub").resolve()}
    src = _fake_tree(tmp_path / "src_layout", """\
        [tool.setuptools.packages.find]
        where = ["src"]
        """, {"src/tvm_ext/__init__.py": "", "src/tvm_ext/passes/__init__.py": "", "src/other/__init__.py": ""})
    assert cc.package_dirs(src) == {"tvm_ext": (src / "src/tvm_ext").resolve(),
                                    "tvm_ext.passes": (src / "src/tvm_ext/passes").resolve()}
    with pytest.raises(FileNotFoundError, match="no package 'tvm_ext'"):
        cc.package_dirs(_fake_tree(tmp_path / "empty", "[project]\nname = 'x'\n", {}))


def test_use_tree_imports_only_from_the_tree(tmp_path):
    tree = _fake_tree(tmp_path / "tree", """\
        [tool.setuptools]
        packages = ["tvm_ext", "tvm_ext.passes"]
        [tool.setuptools.package-dir]
        "tvm_ext" = "tvm_ext"
        "tvm_ext.passes" = "passes"
        """, {"tvm_ext/__init__.py": "", "passes/__init__.py": "", "passes/rule.py": "RULE = 'tree'\n"})
    code = textwrap.dedent(f"""\
        import importlib.util, json, sys
        sys.path.append({str(SCRIPT.parent)!r})
        spec = importlib.util.spec_from_file_location("compare_commits", {str(SCRIPT)!r})
        cc = importlib.util.module_from_spec(spec); sys.modules["compare_commits"] = cc; spec.loader.exec_module(cc)
        cc.use_tree({str(tree)!r})
        from tvm_ext.passes import rule
        try:
            import tvm_ext.core.pipelines  # in the caller's checkout, not in the tree
            leaked = True
        except ModuleNotFoundError:
            leaked = False
        print(json.dumps({{"rule": rule.RULE, "file": rule.__file__, "leaked": leaked,
                          "outside": cc.modules_outside({str(tree)!r})}}))
        """)
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                    cwd=tmp_path).stdout)
    assert out["rule"] == "tree" and Path(out["file"]).resolve() == (tree / "passes/rule.py").resolve()
    assert not out["leaked"], "a module missing from the tree must not come from the editable install"
    assert out["outside"] == []


def test_worktree_of_head_is_imported_and_removed(tmp_path):
    sha = cc.resolve_commit(REPO, "HEAD")
    with pytest.raises(ValueError, match="not a commit"):
        cc.resolve_commit(REPO, "no-such-revision-here")
    with cc.worktree(REPO, sha, tmp_path) as wt:
        out = subprocess.run([sys.executable, str(SCRIPT), "_child", "--tree", str(wt), "--label", "probe",
                              "--probe"], capture_output=True, text=True, check=True, cwd=tmp_path).stdout
        probe = json.loads(out)
        assert subprocess.run(["git", "-C", str(wt), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip() == sha
    for name in ("tvm_ext", "tvm_ext.passes", "tvm_ext.patterns"):
        assert Path(probe["files"][name]).resolve().is_relative_to(wt.resolve()), (name, probe)
    assert probe["outside"] == []
    assert not wt.exists()
    assert str(wt) not in subprocess.run(["git", "-C", str(REPO), "worktree", "list"], capture_output=True,
                                         text=True, check=True).stdout


@pytest.mark.slow
def test_head_against_head_is_identical_end_to_end(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "HEAD", "HEAD", "--models", "resnet50_int8_qoperator",
                           "--small", "--seeds", "0", "--out", str(tmp_path)], check=False, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    comparison = json.loads((tmp_path / "comparison.json").read_text())
    assert comparison["differences"] == []
    (row,) = comparison["rows"]
    n = row["kernels"].split(" / ")[0]
    assert int(n) > 0 and row["kernels"] == f"{n} / {n}" and row["code"] == "y" and row["outputs"] == "y"
    assert f"| resnet50_int8_qoperator_small | {n} / {n} |" in proc.stdout
    results = sorted(tmp_path.glob("*-int8-small/resnet50_int8_qoperator/result.json"))
    assert len(results) == 2 and all(json.loads(r.read_text())["runs"] for r in results)
