"""An explanation rendered (``_render``, ``_html``): JSON, the text table, the Markdown summary the
benchmark embeds, a self-contained HTML page (opened in headless Chromium where there is one) and
``tvm-ext explain``."""
import json
import os
import shutil
import subprocess

import pytest

import tvm_ext
from tvm_ext.core.explain import REASONS, explain, summary_markdown

from _explain_graphs import by_kind, quantized_pair, residual


def test_json_text_and_summary_markdown():
    ex = explain(residual())
    d = json.loads(ex.to_json())
    assert d["num_kernels"] == ex.num_kernels and d["verified"] is True
    assert sum(v["boundaries"] for v in d["by_reason"].values()) == len(ex.boundaries) == d["num_boundaries"]
    assert set(d["by_reason"]) <= {k for k, _ in REASONS}
    text = ex.table()
    for b in ex.boundaries:
        assert b.kind in text
    md = summary_markdown({"residual": ex})
    assert md.startswith("| variant |") and "| residual |" in md


def test_html_self_contained():
    ex = explain(residual())
    page = ex.to_html()
    assert page.count('class="kernel"') == ex.num_kernels
    assert page.count('class="edge"') == sum(len(b.consumers) for b in ex.boundaries)
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in page


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None)
        if path:
            return path
    return None


def _open_in_chromium(ex, tmp_path):
    page = tmp_path / "explain.html"
    page.write_text(ex.to_html())
    r = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
                        "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    # the script ran to its end (it stamps the number of kernels it found) and logged no error
    assert f'data-kernels="{ex.num_kernels}"' in r.stdout
    assert r.stdout.count('class="kernel"') == ex.num_kernels
    errors = [ln for ln in r.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert not errors, errors


@pytest.mark.skipif(_chromium() is None, reason="no Chromium on this machine")
def test_html_in_headless_chromium(tmp_path):
    _open_in_chromium(explain(residual()), tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(_chromium() is None, reason="no Chromium on this machine")
def test_html_branchy_network_in_chromium(tmp_path):
    """Inception v3 (relay.testing; a stand-in for a detector's branches): 123 kernels, all drawn."""
    from tvm.relay import testing

    mod, params = testing.inception_v3.get_workload(batch_size=1)
    ex = explain(mod, params=params)
    assert ex.verified is True and ex.num_kernels > 100
    assert by_kind(ex, "tuple") and by_kind(ex, "multiple_readers")
    _open_in_chromium(ex, tmp_path)


def test_reasons_have_colours():
    from tvm_ext.core.explain._html import COLOURS

    assert set(COLOURS) == {k for k, _ in REASONS}


def test_bench_markdown_has_the_explainer_summary():
    from tvm_ext.tools import bench

    ex = explain(quantized_pair())
    summary = tvm_ext.core.explain.summary_dict(ex)
    assert json.loads(json.dumps(summary)) == summary
    results = {"environment": {"versions": {"tvm": "0.19.0"}, "date": "d", "cpu": "c", "cores": 2, "threads": 2,
                               "target": "llvm", "repeat": 1},
               "variants": [{"label": "(c) seed", "numerics": {},
                             "pipelines": {"tvm": {"explain": summary, "build_s": 1.0}}}]}
    md = bench.render_markdown(results)
    assert "| (c) seed / TVM stock | 5 | prologue_into_anchor 2, graph_output 1 |" in md and "stop_fusion 0.00" in md


def test_cli_explain(tmp_path):
    from tests.test_cli import run_cli, tiny_onnx

    model = tiny_onnx(tmp_path / "tiny.onnx")
    html = tmp_path / "out.html"
    r = run_cli("explain", str(model), "--json", "--html", str(html))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["verified"] is True and d["num_kernels"] == len(d["kernels"])
    assert html.read_text().count('class="kernel"') == d["num_kernels"]
    r = run_cli("explain", str(tmp_path / "missing.onnx"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no such file" in r.stderr
    r = run_cli("explain", str(model), "--pipeline", "fp16")
    assert r.returncode == 2 and "unknown --pipeline" in r.stderr
