"""A TIR lowering pass added to a PassContext's options once (``tir.add_lower_pass``)."""
from __future__ import annotations

from typing import Callable

__all__ = ["with_lower_pass"]


def with_lower_pass(config: dict | None, phase: int, name: str, make: Callable) -> dict:
    """``config`` (PassContext options) with ``make()`` added to ``tir.add_lower_pass`` at ``phase``,
    unless a pass called ``name`` is there already. The lower passes of ``config``, or else of the
    PassContext the caller entered, are kept before it. ``config`` is not modified."""
    import tvm

    out = dict(config or {})
    key = "tir.add_lower_pass"
    passes = out.get(key)
    if passes is None:
        cur = tvm.transform.PassContext.current().config
        passes = cur.get(key) if cur else None
    passes = [tuple(p) for p in (passes or [])]
    if not any(p[1].info.name == name for p in passes):
        passes.append((phase, make()))
    out[key] = passes
    return out
