"""A run of passes repeated until it no longer changes the module: how a stage keeps a group of
passes that enable each other idempotent as a whole (:attr:`tvm_ext.core._steps.Stage.fixed_points`).

Each pass of such a group is idempotent on its own, but one can open a match for an earlier one
(``FoldChannelRepadIntoConv`` removes a reader that kept ``EpilogueBeforeChannelSlice`` from a
region), so a second run of the stage would rewrite again. :func:`fixed_point` runs the group, and
again while a round changes the module (structural equality), as MLIR's greedy rewrite driver does.
"""
from __future__ import annotations

import logging

__all__ = ["fixed_point", "MAX_ROUNDS"]

_log = logging.getLogger(__name__)

#: Rounds after which a group that still changes the module is left as it is, with a warning (each
#: round's result is a correct rewrite; a group that never settles is a bug of its passes).
MAX_ROUNDS = 8


def fixed_point(passes, names):
    """A module pass running ``passes`` (a ``Sequential`` of them) until a round leaves the
    module unchanged, at most :data:`MAX_ROUNDS` rounds. ``names``: the passes' names, for its own name
    (``FixedPoint(A, B)``) and its warning."""
    import tvm

    label = f"FixedPoint({', '.join(names)})"
    seq = tvm.transform.Sequential(list(passes), opt_level=0, name=label)

    @tvm.transform.module_pass(opt_level=0, name=label)
    def _run(mod, _ctx):
        for _ in range(MAX_ROUNDS):
            out = seq(mod)
            if tvm.ir.structural_equal(out, mod, map_free_vars=True):
                return out
            mod = out
        _log.warning("%s: the module still changed after %d rounds; kept the last round's", label, MAX_ROUNDS)
        return mod

    return _run
