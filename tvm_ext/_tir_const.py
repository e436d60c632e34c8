"""The integer a TIR expression holds as a constant, for the TIR passes' pattern matches."""
from __future__ import annotations

__all__ = ["int_value"]


def int_value(e):
    """The integer value of ``e`` (an int, an IntImm or a Broadcast of one), else None."""
    import tvm

    if isinstance(e, int):
        return e
    if isinstance(e, tvm.tir.Broadcast):
        e = e.value
    return int(e.value) if isinstance(e, tvm.tir.IntImm) else None
