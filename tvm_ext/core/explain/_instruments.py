"""Pass instruments around ``relay.build``'s pipeline up to FuseOps.

Both see only the outermost PassContext's passes: a nested compilation (QNN legalization's
lookup-table VM build) runs its own pipeline, FuseOps included, inside the pipeline explained.
"""
from __future__ import annotations

from ..build import copy_module


def _outermost(run_before=None, run_after=None):
    """A PassInstrument calling ``run_before(mod, info)`` / ``run_after(mod, info)`` for the passes of the
    outermost PassContext it is entered in (never a nested compilation's)."""
    import tvm

    depth = [0]  # PassContexts entered with this instrument: >1 is a nested compilation

    @tvm.instrument.pass_instrument
    class _Outermost:  # pylint: disable=too-few-public-methods
        def enter_pass_ctx(self):
            depth[0] += 1

        def exit_pass_ctx(self):
            depth[0] -= 1

        def run_before_pass(self, mod, info):
            if run_before is not None and depth[0] <= 1:
                run_before(mod, info)

        def run_after_pass(self, mod, info):
            if run_after is not None and depth[0] <= 1:
                run_after(mod, info)

    return _Outermost()




class FuseOpsInput:
    """PassInstrument factory capturing the module FuseOps receives inside any ``relay.build``.

    ``cap = FuseOpsInput(); PassContext(instruments=[cap.make()])`` around ``relay.build`` (or
    ``tvm_ext.build(..., instruments=[cap.make()])``), then ``explain_prefused(cap.module, target)``.
    """

    def __init__(self):
        self.module = None

    def make(self):
        def before(mod, info):
            if info.name == "FuseOps" and self.module is None:
                self.module = copy_module(mod)

        return _outermost(before)


class _OpCounter:
    """PassInstrument: op counts after each pass until FuseOps, to attribute created ops to passes."""

    def __init__(self):
        self.created: dict = {}
        self.stopped = False
        self._last = None

    @staticmethod
    def counts(mod) -> dict:
        import tvm
        from tvm import relay

        c: dict = {}

        def visit(e):
            if isinstance(e, relay.Call) and isinstance(e.op, tvm.ir.Op):
                c[e.op.name] = c.get(e.op.name, 0) + 1

        for gv in mod.get_global_vars():
            f = mod[gv]
            if isinstance(f, relay.Function):
                relay.analysis.post_order_visit(f, visit)
        return c

    def make(self):
        def before(mod, info):
            if info.name == "FuseOps":
                self.stopped = True
            if self.stopped or self._last is not None:
                return
            self._last = self.counts(mod)

        def after(mod, info):
            if (self.stopped or info.name in ("sequential", "InferType")
                    or info.name.startswith("tvm_ext.") or info.name == "tvm_ext.user_passes"):
                return
            now = self.counts(mod)
            for op, n in now.items():
                d = n - self._last.get(op, 0)
                if d > 0:
                    self.created.setdefault(op, {})
                    self.created[op][info.name] = self.created[op].get(info.name, 0) + d
            self._last = now

        return _outermost(before, after)
