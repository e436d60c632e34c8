"""Every performance figure in README.md and docs/results/ names its CPU, date, commit and command.

A results file carries its runs' ``- date: ...; CPU: ...`` and ``- commit: ...; command: `...` ``
lines (what ``tvm-ext bench`` writes); the README's results table has them per row. A commit named
must exist in this repository's history (checked where the repository is a git checkout).
"""
import json
import re
import subprocess
from pathlib import Path

import pytest

from tvm_ext.tools import bench

REPO = Path(__file__).resolve().parents[2]
RESULTS = sorted((REPO / "docs" / "results").glob("*.md"))
DATE = r"\d{4}-\d\d-\d\d"


def _commit_exists(commit: str) -> bool:
    if not (REPO / ".git").exists():
        return True  # an unpacked sdist: nothing to look up
    r = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    return r.returncode == 0


@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_results_file_names_date_cpu_commit_and_command(path):
    text = path.read_text()
    dates = re.findall(rf"^- date: ({DATE}T[\d:]+\+00:00); CPU: (.+?)(?: \(\d+ cores\))?;", text, re.M)
    commits = re.findall(r"^- commit: ([0-9a-f]{7,40})\b.*; command: `([^`]+)`", text, re.M)
    assert dates, f"{path.name}: no '- date: <ISO>; CPU: ...' line"
    assert commits, f"{path.name}: no '- commit: <hash> ...; command: `...`' line"
    assert len(commits) >= len(dates), f"{path.name}: a run block without its commit line"
    for commit, _command in commits:
        assert _commit_exists(commit), f"{path.name}: commit {commit} is not in this repository"


def test_readme_results_rows_name_date_commit_and_command():
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Results"):readme.index("\n## ", readme.index("## Results") + 5)]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and "×" in ln]
    assert len(rows) >= 3
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        cpu, when, command = cells[0], cells[1], cells[2]
        found = re.fullmatch(rf"({DATE}), ([0-9a-f]{{7,40}})", when)
        assert cpu and found, row
        assert _commit_exists(found[2]), row
        assert re.fullmatch(r"`(tvm-ext bench|make bench|python benchmarks/\S+)[^`]*`", command), row
        assert re.search(r"\]\(docs/results/[\w-]+\.md", row), row
    # figures outside the table would lack their source: none in the section's prose
    prose = "\n".join(ln for ln in section.splitlines() if not ln.startswith("|"))
    assert not re.search(r"\d+\.\d+ ?ms\b", prose)


def test_bench_records_and_renders_its_commit_and_command():
    committed = json.loads((REPO / "docs" / "results" / "avx512-vnni-zen4.json").read_text())
    env = {**committed["environment"], "commit": "0123456789ab", "command": "tvm-ext bench --repeat 40"}
    md = bench.render_markdown({"environment": env, "variants": []})
    assert "- commit: 0123456789ab; command: `tvm-ext bench --repeat 40`" in md.splitlines()
    commit = bench.source_commit()
    if (REPO / ".git").exists():
        assert commit and re.fullmatch(r"[0-9a-f]{12}(-dirty)?", commit)
        assert _commit_exists(commit.removesuffix("-dirty"))
