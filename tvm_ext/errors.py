"""Exceptions shared across tvm-ext (a leaf module: it imports nothing from tvm-ext)."""
from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(Exception):
    """A user mistake (bad option, missing file, unknown name): the CLI prints it as one line and exits 2."""
