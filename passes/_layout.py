"""Layout strings as TVM writes them (``"NCHW"``, ``"NCHW16c"``, ``"OIHW4i16o4i"``), parsed once.

An upper-case letter is a primal axis, a number and a lower-case letter a sub-axis of the primal
axis of that letter, split by that factor (``NCHW16c``: C = C_o * 16 + c). Leaf module: no TVM.
"""
from __future__ import annotations

import re

__all__ = ["axes", "primal_positions", "primal_groups"]

_TOKEN = re.compile(r"(\d*)([A-Za-z])")


def axes(layout: str) -> list[tuple[str, int]]:
    """One ``(primal letter, factor)`` per axis, factor 0 for a primal axis.

    ``"OIHW4i16o"`` -> ``[("O", 0), ("I", 0), ("H", 0), ("W", 0), ("I", 4), ("O", 16)]``. Raises
    ``ValueError`` naming the layout when it is not one: stray characters, a primal axis with a
    factor, a sub-axis without one.
    """
    parts = _TOKEN.findall(layout)
    if "".join(n + a for n, a in parts) != layout:
        raise ValueError(f"cannot parse layout {layout!r}")
    out = []
    for num, letter in parts:
        if letter.isupper() and num:
            raise ValueError(f"layout {layout!r}: a primal axis with a factor")
        if letter.islower() and not num:
            raise ValueError(f"layout {layout!r}: sub-axis {letter!r} without a factor")
        out.append((letter.upper(), int(num) if num else 0))
    return out


def primal_positions(layout: str, letters: str) -> list[int]:
    """Positions, in layout order, of the primal axes of ``layout`` that are among ``letters``."""
    return [i for i, (a, f) in enumerate(axes(layout)) if not f and a in letters]


def primal_groups(layout: str, primal: str) -> list[list[int]]:
    """Per letter of ``primal`` its positions in ``layout``: the primal axis first, then its
    sub-axes outer to inner (TVM's convention: ``X = (X_o * f1 + x1) * f2 + x2``)."""
    parsed = axes(layout)
    if sorted(a for a, f in parsed if not f) != sorted(primal):
        raise ValueError(f"layout {layout!r} does not have exactly the axes {primal!r}")
    return [[i for i, (a, f) in enumerate(parsed) if a == p and not f]
            + [i for i, (a, f) in enumerate(parsed) if a == p and f]
            for p in primal]
