"""The repository's scripts (benchmarks/...) imported as modules for their tests, as they run: by path,
not as a package."""
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_script(relative: str):
    """The module of the script at ``relative`` (from the repository root), named by its file's stem."""
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
