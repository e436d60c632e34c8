"""Exceptions shared across tvm-ext (a leaf module: it imports nothing from tvm-ext)."""
from __future__ import annotations

__all__ = ["UsageError", "UnsupportedByTVM"]


class UsageError(Exception):
    """A user mistake (bad option, missing file, unknown name): the CLI prints it as one line and exits 2."""


class UnsupportedByTVM(ValueError):
    """The module or target hits a known TVM 0.19 bug or gap; the message says which and what to do."""
