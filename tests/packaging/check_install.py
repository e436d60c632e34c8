"""Install tvm-ext as a user of PyPI would and run it from outside the source tree.

Builds the wheel and the sdist of the checkout, then:

1. the wheel holds every package the source tree has (a folder with ``__init__.py`` under
   ``tvm_ext/``, ``passes/`` and ``patterns/``) and the package data (the tuned records);
2. a wheel built from the sdist holds the same files;
3. a fresh virtual environment gets the wheel with its ``[tvm,zoo]`` extras (a regular install, not
   editable); from a folder outside the tree, ``import tvm_ext`` loads it from that environment and
   ``tvm-ext zoo --small`` + ``tvm-ext report --pipeline int8`` build a small zoo model;
4. the sdist's wheel replaces it (``--no-deps``) and ``import tvm_ext`` + ``tvm-ext report`` run again.

Run by ``make check-install`` (and ``.ci/run``); prints one line per check, exits non-zero on the
first failure. Needs PyPI (or a mirror) for the dependencies.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Installed name -> source folder of the package trees the distribution holds.
TREES = {"tvm_ext": "tvm_ext", "tvm_ext.passes": "passes", "tvm_ext.patterns": "patterns"}
#: Package data that must be in the wheel (globs relative to the install root).
DATA = ("tvm_ext/x86/tuned/*.log",)


def _run(cmd, cwd=None, env=None) -> str:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"check-install: {' '.join(map(str, cmd))} failed ({r.returncode}):\n"
                         f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout


def source_packages() -> set:
    """Installed names of every package folder (with ``__init__.py``) of the source tree."""
    out = set()
    for name, folder in TREES.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base).parts
            if "__pycache__" not in rel:
                out.add(".".join((name, *rel)))
    return out


def wheel_packages(wheel: Path) -> tuple[set, list]:
    """(packages, file names) of a wheel."""
    names = zipfile.ZipFile(wheel).namelist()
    pkgs = {n[: -len("/__init__.py")].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    return pkgs, sorted(n for n in names if ".dist-info/" not in n)


def check_wheel(wheel: Path) -> list:
    pkgs, files = wheel_packages(wheel)
    missing = sorted(source_packages() - pkgs)
    if missing:
        raise SystemExit(f"check-install: the wheel lacks packages {missing}")
    for pattern in DATA:
        if not any(Path(f).match(pattern) for f in files):
            raise SystemExit(f"check-install: the wheel holds no package data {pattern}")
    print(f"wheel {wheel.name}: {len(files)} files, all {len(pkgs)} packages of the tree, package data {DATA}")
    return files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="the Python to make the fresh environment with")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (default: a temporary folder)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tvm-ext-install-") as tmp:
        work = Path(args.keep or tmp)
        dist, outside = work / "dist", work / "outside"
        outside.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", dist, ROOT])
        (wheel,) = dist.glob("tvm_ext-*.whl")
        files = check_wheel(wheel)
        from_sdist = dist / "from-sdist"
        _run([sys.executable, "-m", "build", "--outdir", from_sdist, ROOT])  # the sdist, then a wheel built from it
        (sdist,) = from_sdist.glob("tvm_ext-*.tar.gz")
        (wheel2,) = from_sdist.glob("tvm_ext-*.whl")
        files2 = check_wheel(wheel2)
        if files2 != files:
            raise SystemExit(f"check-install: the sdist's wheel differs: {sorted(set(files) ^ set(files2))[:10]}")
        print(f"sdist {sdist.name}: its wheel holds the same {len(files)} files")

        venv = work / "venv"
        _run([args.python, "-m", "venv", venv])
        py, cli = venv / "bin" / "python", venv / "bin" / "tvm-ext"
        _run([py, "-m", "pip", "install", "--quiet", f"{wheel}[tvm,zoo]"])
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the zoo's cache stays the user's
        for label, pkg in (("wheel", wheel), ("sdist", wheel2)):
            if label == "sdist":
                _run([py, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", pkg])
            where = _run([py, "-c", "import tvm_ext, tvm_ext.tools.cli, tvm_ext.families; "
                                    "print(tvm_ext.__file__)"], cwd=outside, env=env).strip()
            if not where.startswith(str(venv)):
                raise SystemExit(f"check-install: import tvm_ext loaded {where}, not the installed {label}")
            if label == "wheel":
                _run([cli, "zoo", "--small", "--out", outside / "zoo"], cwd=outside, env=env)
            report = _run([cli, "report", outside / "zoo" / "resnet50_int8_qdq_small.onnx", "--pipeline", "int8"],
                          cwd=outside, env=env)
            if "kernel" not in report.lower():
                raise SystemExit(f"check-install: tvm-ext report printed no kernel report:\n{report[-2000:]}")
            print(f"{label}: installed in a fresh venv, imported from {where}, tvm-ext report ran outside the tree")
    print(f"check-install: passed in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
