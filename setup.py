"""Package discovery for tvm-ext (the rest of the metadata is in pyproject.toml).

Every package under ``tvm_ext/`` is found, and the top-level ``passes/`` and ``patterns/`` folders
install as ``tvm_ext.passes`` and ``tvm_ext.patterns`` with their subpackages: nothing is listed by
hand, so a new subpackage is packaged without an edit here. Folders of package data without an
``__init__.py`` (the tuned records) are listed as packages too: setuptools drops data folders that
are not in ``packages`` (it warns so today).
"""
from setuptools import find_namespace_packages, find_packages, setup

#: Installed package name -> folder, for the packages that live outside tvm_ext/.
MAPPED = {"tvm_ext.passes": "passes", "tvm_ext.patterns": "patterns"}


def discover() -> list:
    """Every package of the distribution, by name."""
    packages = find_namespace_packages(include=["tvm_ext", "tvm_ext.*"], exclude=["*.__pycache__"])
    for name, folder in MAPPED.items():
        packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]
    return sorted(packages)


if __name__ == "__main__":
    setup(packages=discover(), package_dir={"tvm_ext": "tvm_ext", **MAPPED})
