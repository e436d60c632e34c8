"""Atomic file writes for caches (a leaf module: it imports nothing from tvm-ext).

A file is written to a temporary name in its own directory and ``os.replace``-d into place on
success, so concurrent readers (pytest workers, two benchmark runs) never see a partial file: at
worst two writers both build it and the last replace wins.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["atomic_target", "write_bytes_atomic"]


class atomic_target:
    """Context manager yielding a temp path that is os.replace-d onto ``path`` on success."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def __enter__(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        os.close(fd)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; cache files should be normal files
        self.tmp = Path(tmp)
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            os.replace(self.tmp, self.path)
        else:
            self.tmp.unlink(missing_ok=True)
        return False


def write_bytes_atomic(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns ``path``."""
    with atomic_target(path) as tmp:
        tmp.write_bytes(data)
    return path
