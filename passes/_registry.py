"""The pass registry's storage: name -> factory, filled by :func:`register_pass`.

A leaf: it imports nothing of tvm-ext, so every pass module can register itself here without
importing the layer that reads the registry (:mod:`tvm_ext.core.registry`, which lists and creates
passes by name for the pipelines, the CLI and the benchmarks).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

__all__ = ["PassSpec", "register_pass", "registered", "UnknownPassError"]


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


def registered() -> dict[str, PassSpec]:
    """A copy of the registry: name -> :class:`PassSpec` of every pass registered so far."""
    return dict(_REGISTRY)
