"""How the oracle compares: outputs under its tolerances, well-formedness, structural equality.

Integer outputs are compared bit for bit, float outputs within :data:`FLOAT_RTOL` /
:data:`FLOAT_ATOL` of the output's magnitude, integer outputs of graphs that compute in float
within one step; ``QDQToInteger``, approximate by design, may move every 8-bit level a quantize
writes by :data:`QDQ_STEPS`, and each output within how far those moves can carry to it
(:mod:`.bounds`).
"""
from __future__ import annotations

import math

import numpy as np

from .builder import last_line

__all__ = ["FLOAT_RTOL", "FLOAT_ATOL", "QDQ_STEPS", "compare_outputs"]

#: Float outputs: |a - b| <= FLOAT_ATOL * max(1, max|ref|) + FLOAT_RTOL * |ref|.
FLOAT_RTOL = 1e-4
FLOAT_ATOL = 1e-4
#: QDQToInteger (approximate by design): integer outputs within this many steps.
QDQ_STEPS = 2


def _is_float_graph(mod) -> bool:
    """True when the graph computes in float: a float input or a call with a float result. Float
    constants alone do not count: QNN ops take their scales as float constants and compute in
    integers (a ``qnn.conv2d`` + ``qnn.requantize`` graph is compared bit for bit)."""
    from tvm import relay

    found = []

    def visit(node):
        if isinstance(node, (relay.Call, relay.Var)):
            ty = node.checked_type
            if isinstance(ty, relay.TensorType) and str(ty.dtype).startswith("float"):
                found.append(True)

    relay.analysis.post_order_visit(mod["main"], visit)
    return bool(found)


def _well_formed(mod) -> str | None:
    """None, or what is wrong with ``mod`` (type errors, malformed functions, free vars)."""
    import tvm
    from tvm import relay

    try:
        typed = relay.transform.InferType()(mod)
    except tvm.TVMError as err:
        return f"does not type-check: {last_line(err)}"
    for gv in typed.get_global_vars():
        func = typed[gv]
        if isinstance(func, relay.Function):
            if not relay.analysis.well_formed(func):
                return f"{gv.name_hint} is not well formed"
            if gv.name_hint == "main" and relay.analysis.free_vars(func):
                return "free variables in main"
    return None


def _same(a, b) -> bool:
    import tvm

    return tvm.ir.structural_equal(a["main"], b["main"], map_free_vars=True)


def compare_outputs(ref, got, float_graph: bool, int_steps: int = 0, bounds=None) -> str | None:
    """None when ``got`` matches ``ref`` under the oracle's tolerance, else what differs.

    With ``int_steps`` (a pass that may move 8-bit levels by that many steps), ``bounds``
    (:func:`.bounds.output_bounds`) gives per output how far those moves can carry: an integer
    output may differ by its bound rounded up, a float output by its bound on top of the float
    tolerance. An output without a bound keeps ``int_steps`` levels (integers) or the float tolerance.
    """
    for n, (ra, ga) in enumerate(zip(ref, got)):
        if len(ra) != len(ga):
            return f"input {n}: {len(ra)} outputs vs {len(ga)}"
        moves = bounds if int_steps and bounds is not None and len(bounds) == len(ra) else [None] * len(ra)
        for i, (r, g) in enumerate(zip(ra, ga)):
            if r.dtype != g.dtype or r.shape != g.shape:
                return f"input {n} output {i}: {r.dtype}{r.shape} vs {g.dtype}{g.shape}"
            if np.issubdtype(r.dtype, np.integer) or r.dtype == bool:
                moved = int_steps if moves[i] is None else math.ceil(moves[i] - 1e-9)
                allowed = max(moved, 1 if float_graph else 0)
                diff = np.abs(r.astype(np.int64) - g.astype(np.int64))
                if diff.max(initial=0) > allowed:
                    return (f"input {n} output {i} ({r.dtype}): {int((diff > allowed).sum())} of {r.size} elements "
                            f"differ by more than {allowed} (max {int(diff.max())})")
            else:
                finite = np.isfinite(r) & np.isfinite(g)
                if not np.array_equal(np.isfinite(r), np.isfinite(g)) or not np.array_equal(r[~finite], g[~finite]):
                    if not np.array_equal(np.isnan(r), np.isnan(g)):
                        return f"input {n} output {i}: non-finite values differ"
                scale = max(1.0, float(np.abs(r[finite]).max(initial=0)))
                err = np.abs(r[finite] - g[finite])
                tol = FLOAT_ATOL * scale + FLOAT_RTOL * np.abs(r[finite])
                if moves[i] is not None:  # e.g. a dequantized output: int_steps levels of its scale
                    tol = tol + moves[i] * (1 + FLOAT_RTOL)
                if (err > tol).any():
                    return f"input {n} output {i} (float): max abs diff {float(err.max()):.3g} (scale {scale:.3g})"
    return None
