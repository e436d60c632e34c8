"""Passes by name: what the pipelines, the CLI and the benchmarks create passes through.

Each public pass module registers its factory at import time with :func:`register_pass`
(:mod:`tvm_ext.passes._registry`, a leaf). The registered name equals the ``name=`` the pass is
created with, so ``disabled_pass``, PassContext instruments, the CLI and the benchmarks all key on
the same string. This module sits above the passes and imports them, so every built-in pass is
registered before a name is looked up; a user's pass registers with the same decorator.
"""
from __future__ import annotations

from ..passes import __all__ as BUILTIN  # importing the package registers every built-in pass
from ..passes._registry import PassSpec, UnknownPassError, register_pass, registered

__all__ = ["PassSpec", "register_pass", "list_passes", "get_pass", "create_pass", "UnknownPassError", "BUILTIN"]


def list_passes() -> list[PassSpec]:
    """All registered passes, sorted by name."""
    table = registered()
    return [table[k] for k in sorted(table)]


def get_pass(name: str) -> PassSpec:
    """The spec registered under ``name``; :class:`UnknownPassError` lists the known names."""
    table = registered()
    try:
        return table[name]
    except KeyError:
        known = ", ".join(sorted(table)) or "none"
        raise UnknownPassError(f"unknown pass {name!r}; registered passes: {known}") from None


def create_pass(name: str, **kwargs):
    """Instantiate the pass registered under ``name`` with ``kwargs``."""
    spec = get_pass(name)
    try:
        return spec.factory(**kwargs)
    except TypeError as err:
        raise TypeError(f"pass {name!r} cannot be created with {kwargs}: {err}") from err
