"""Legalizations TVM 0.19's Relax lacks, registered once, only where none exists.

Design note
-----------
``relax.ewise_fma`` (the op an ``add(multiply(a, b), c)`` rewrite targets) is registered in TVM 0.19 but has no
``FLegalize``: ``LegalizeOps`` leaves it and ``relax.build`` fails in ``CodeGenVM`` ("cannot handle
this intrinsic now: Op(relax.ewise_fma)"). :func:`ensure_legalizations` registers
``ewise_fma(a, b, c) -> topi.add(topi.multiply(a, b), c)`` (an elementwise PrimFunc ``FuseOps``
fuses like any other). It is idempotent and never replaces a legalization TVM already has; it is
called by :func:`tvm_ext.relax.lower` / :func:`tvm_ext.relax.build`.
"""
from __future__ import annotations

__all__ = ["ensure_legalizations"]

_DONE = False


def _ewise_fma(bb, call):
    from tvm import topi

    return bb.call_te(lambda a, b, c: topi.add(topi.multiply(a, b), c), *call.args, primfunc_name_hint="ewise_fma")


def ensure_legalizations() -> None:
    """Register the missing legalizations (idempotent; existing ones are kept)."""
    global _DONE
    if _DONE:
        return
    import tvm
    from tvm.relax.transform.legalize_ops.common import register_legalize

    if tvm.ir.Op.get("relax.ewise_fma").get_attr("FLegalize") is None:
        register_legalize("relax.ewise_fma", _ewise_fma)
    _DONE = True
