"""Name -> factory registry of tvm-ext passes (used by the CLI and the benchmarks).

Each public pass module registers its factory at import time with :func:`register_pass`.
The registered name equals the ``name=`` the pass is created with, so ``disabled_pass``,
PassContext instruments, the CLI and the benchmarks all key on the same string.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

__all__ = ["PassSpec", "register_pass", "list_passes", "get_pass", "create_pass", "UnknownPassError"]


class UnknownPassError(KeyError):
    """No pass of that name is registered."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return self.args[0]


@dataclass(frozen=True)
class PassSpec:
    """A registered pass factory."""

    name: str
    factory: Callable
    summary: str
    needs_args: bool


_REGISTRY: dict[str, PassSpec] = {}


def _summary(factory) -> str:
    doc = inspect.getdoc(factory) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def register_pass(name: str | None = None):
    """Decorator registering a pass factory under ``name`` (default: the factory's name)."""

    def deco(factory):
        key = name or factory.__name__
        if key in _REGISTRY and _REGISTRY[key].factory is not factory:
            raise ValueError(f"pass {key!r} is registered twice")
        sig = inspect.signature(factory)
        needs = any(
            p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            for p in sig.parameters.values()
        )
        _REGISTRY[key] = PassSpec(key, factory, _summary(factory), needs)
        return factory

    return deco


def _load_builtin() -> None:
    from .. import passes  # noqa: F401  (imports every pass module, which registers itself)


def list_passes() -> list[PassSpec]:
    """All registered passes, sorted by name."""
    _load_builtin()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def get_pass(name: str) -> PassSpec:
    """The spec registered under ``name``; :class:`UnknownPassError` lists the known names."""
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise UnknownPassError(f"unknown pass {name!r}; registered passes: {known}") from None


def create_pass(name: str, **kwargs):
    """Instantiate the pass registered under ``name`` with ``kwargs``."""
    spec = get_pass(name)
    try:
        return spec.factory(**kwargs)
    except TypeError as err:
        raise TypeError(f"pass {name!r} cannot be created with {kwargs}: {err}") from err
