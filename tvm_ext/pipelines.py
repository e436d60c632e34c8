"""Named pass pipelines for :func:`tvm_ext.build`.

A :class:`Pipeline` maps build stages to ``tvm.transform.Sequential`` objects:
``"start"`` runs on the bound module before relay.build's optimisation prefix (where QNN ops
still exist), ``"before_fuse"`` runs after the prefix, right before FuseOps. Pass it as
``tvm_ext.build(mod, target, params, passes=pipelines.int8())``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Pipeline", "int8"]


@dataclass(frozen=True)
class Pipeline(Mapping):
    """Passes per build stage; behaves as ``{"start": Sequential, "before_fuse": Sequential}``."""

    name: str
    start: object
    before_fuse: object
    doc: str = ""

    def __getitem__(self, key):
        if key == "start":
            return [self.start]
        if key == "before_fuse":
            return [self.before_fuse]
        raise KeyError(key)

    def __iter__(self):
        return iter(("start", "before_fuse"))

    def __len__(self) -> int:
        return 2

    def pass_names(self) -> dict:
        """Names of the passes in each stage (what ``disabled_pass`` and instruments see)."""
        return {"start": _names(self.start), "before_fuse": _names(self.before_fuse)}


def _names(seq) -> list:
    return list(getattr(seq, "_tvm_ext_names", []))


def _sequential(passes, name):
    import tvm

    seq = tvm.transform.Sequential(list(passes), opt_level=0, name=name)
    seq._tvm_ext_names = [p.info.name for p in passes]  # Sequential does not expose its passes
    return seq


def int8() -> Pipeline:
    """tvm-ext's recommended pipeline for quantized CNNs (the benchmark's "tvm-ext" column).

    Stage ``start`` (QNN ops still present):

    1. ``FakeQuantizationToInteger`` (TVM): dequantize -> op -> quantize regions of QDQ graphs
       become integer QNN ops, so int8 instead of float32 flows between kernels.

    Stage ``before_fuse`` (after Legalize, CanonicalizeOps, AlterOpLayout and FoldConstant):

    2. ``CombineParallelCast`` (tvm-ext): one narrowing cast per value instead of one per
       consumer, so the cast fuses into its producer and int8, not int32, crosses kernels.

    Returns
    -------
    Pipeline
    """
    from tvm import relay

    from .passes import CombineParallelCast

    start = [relay.transform.FakeQuantizationToInteger(hard_fail=False, use_qat=False)]
    before_fuse = [CombineParallelCast()]
    return Pipeline(
        name="tvm_ext.int8",
        start=_sequential(start, "tvm_ext.int8.start"),
        before_fuse=_sequential(before_fuse, "tvm_ext.int8.before_fuse"),
        doc=int8.__doc__ or "",
    )
