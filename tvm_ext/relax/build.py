"""``tvm_ext.relax.build``: relax.build with a slot for your passes before the fusion pipeline.

Design note
-----------
Stages, in order (all under the caller's PassContext)::

    FoldConstant                        # frontends emit reshape(const bias); fold it first
    passes                              # yours, on high-level Relax ops (e.g. FuseByPattern(GENERIC))
    LegalizeOps, AnnotateTIROpPattern,  # TVM's "zero" pipeline, step by step, so the module
    FoldConstant, FuseOps               #   before FuseTIR is kept for the kernel report
    FuseTIR
    relax.build(pipeline="default_build")   # lowering + codegen (no further fusion)

``relax.build``'s own default pipeline does *not* fuse, which is why the steps are explicit (as in
the MLC course's graph optimisation chapter). The result is the ``relax.Executable`` with ``.kernel_report``
(:class:`tvm_ext.core.report.KernelReport`) and ``.tvm_ext_module`` (the lowered module that was
built). The caller's module is never modified. Note: TVM 0.19 ships no CPU schedules for Relax
(dlight has GPU rules only), so kernels are compiled as ``LegalizeOps`` writes them (serial loops)
unless a MetaSchedule database is current. ``relax.ewise_fma`` gets the legalization TVM 0.19
lacks (:mod:`tvm_ext.relax.legalize`).
"""
from __future__ import annotations

import logging

__all__ = ["build", "lower"]

_log = logging.getLogger("tvm_ext.relax.build")


def lower(mod, passes=()):
    """Run the stages up to ``FuseTIR``: ``(lowered module, ops by kernel)``."""
    import tvm
    from tvm import relax

    from .legalize import ensure_legalizations
    from .report import kernel_ops

    ensure_legalizations()
    if not isinstance(mod, tvm.IRModule):
        raise ValueError(f"tvm_ext.relax.build: expected an IRModule, got {type(mod).__name__}")
    if not any(isinstance(f, relax.Function) for f in mod.functions.values()):
        raise ValueError("tvm_ext.relax.build: the module has no Relax function (a Relay module? use tvm_ext.build)")
    seq = tvm.transform.Sequential(
        [relax.transform.FoldConstant(), *passes, relax.transform.LegalizeOps(),
         relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(), relax.transform.FuseOps()],
        name="tvm_ext.relax.before_fusetir",
    )
    fused = seq(mod)
    ops = kernel_ops(fused)
    lowered = tvm.transform.Sequential([relax.transform.FuseTIR(), relax.transform.RewriteDataflowReshape()],
                                       name="tvm_ext.relax.fusetir")(fused)
    return lowered, ops


def build(mod, target="llvm", passes=()):
    """Compile a Relax module with ``passes`` before fusion; returns the ``relax.Executable``.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module (e.g. from ``tvm.relax.frontend.onnx.from_onnx`` or TVMScript).
    target : str or tvm.target.Target
        Compilation target (default ``"llvm"``, the host).
    passes : sequence of tvm.transform.Pass
        Run on the high-level module after constant folding, before ``LegalizeOps``.

    Returns
    -------
    tvm.relax.Executable
        With ``.kernel_report`` and ``.tvm_ext_module`` attached.
    """
    from tvm import relax

    from .report import kernel_report

    lowered, ops = lower(mod, passes)
    report = kernel_report(lowered, ops)
    _log.info("tvm_ext.relax.build: %s", report.summary())
    ex = relax.build(lowered, target=target)
    ex.kernel_report = report
    ex.tvm_ext_module = lowered
    return ex
