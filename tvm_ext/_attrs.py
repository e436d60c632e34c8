"""Relay attribute values as Python values, for the passes and the core alike.

A leaf module (imports nothing from tvm-ext; TVM when called): :mod:`tvm_ext.core.explain` and the
passes' shared machinery (``tvm_ext.passes._util``) both read integer attribute arrays with it.
"""
from __future__ import annotations

__all__ = ["int_list"]


def int_list(values) -> list | None:
    """``[int(v) ...]`` of an attribute array whose entries are all ``IntImm``; else None."""
    import tvm

    out = []
    for v in values:
        if not isinstance(v, tvm.tir.IntImm):
            return None
        out.append(int(v))
    return out
