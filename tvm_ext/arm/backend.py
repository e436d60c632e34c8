"""The aarch64 back end: what a build for a 64-bit ARM CPU adds to ``relay.build``.

* contexts: requantize rounded once, as on every other CPU (:mod:`tvm_ext.arm.requantize`), and
  strided NHWC 1x1 convs computed from their strided pixels (:mod:`tvm_ext.arm.strided_gemm`: TVM's
  GEMM conv reads the wrong pixels there, docs/tvm-bugs.md), always;
  with ``kernels``, the int8 kernel policy (:mod:`tvm_ext.arm.int8_conv`: 8-bit operands for every
  int8 conv and dense, ``sdot``/``smmla`` where the target has them); with ``tuned``, the records
  ``tvm-ext tune --rpc`` measured on a board of the target's CPU (:mod:`tvm_ext.arm.tuning`).
* configure: with ``kernels`` at a class with the ``smmla`` conv, TIR CSE off unless the user set it
  (the conv's epilogue, unrolled over its register tile, gives TIR CSE vector let variables whose
  debug info LLVM 22 rejects: docs/tvm-bugs.md), so the build runs once; and the tile's regrouping
  read as shuffles of whole vectors (:mod:`tvm_ext.arm.tile_shuffle`), so that it stays in registers.
* configure, for 8-bit graphs with ``kernels``: float products fenced before their sums
  (:mod:`tvm_ext._no_contract`), and ``round(x / c)`` by a scale parameter as a product with its
  reciprocal in double (:mod:`tvm_ext._round_reciprocal`, exact): the residual adds' float epilogue
  keeps no ``fdiv`` (docs/arm-kernels.md); and 256-entry byte-table lookups (the activations
  ``TabulateEightBit`` tabulates) as ``tbl``/``tbx`` on the table in q registers (:mod:`tvm_ext.arm.byte_table`).
* passes, instruments: none.
"""
from __future__ import annotations

from ..backend import Backend, BuildPlan, BuildRequest, llvm_arch

__all__ = ["AArch64"]

#: TVM's PassContext option that turns TIR common-subexpression elimination off.
_DISABLE_TIR_CSE = "tir.disable_cse_tir"


class AArch64(Backend):
    """64-bit ARM CPUs (``-mtriple=aarch64-...``): NEON, ``+dotprod``, ``+i8mm``."""

    family = "aarch64"

    def claims(self, target) -> bool:
        return llvm_arch(target) in ("aarch64", "arm64", "aarch64_be")

    def plan(self, request: BuildRequest) -> BuildPlan:
        from . import int8_conv, requantize, strided_gemm, tile_shuffle, tuning
        from .int8_policy import policy

        plan = BuildPlan(contexts=[requantize.generic_q_multiply_shift(), strided_gemm.strided_one_by_one()])
        if request.kernels:
            plan.contexts.insert(0, int8_conv.kernels(int8_graph=request.eight_bit))
            if policy(request.target).mmla_conv:
                plan.configure = lambda config: {_DISABLE_TIR_CSE: True, **(config or {})}
                plan.add_configure(tile_shuffle.lower_config)
        if request.kernels and request.eight_bit:  # float products rounded before their sums
            from .. import _no_contract, _round_reciprocal
            from . import byte_table

            plan.add_configure(_no_contract.lower_config)
            plan.add_configure(_round_reciprocal.lower_config)  # round(x / scale) without fdiv, exact
            plan.add_configure(byte_table.lower_config)  # tabulated activations as tbl/tbx, not lane loads
        if request.tuned:
            plan.add_records(tuning.apply(request.target))
        return plan

    def isa_class(self, target) -> str:
        from .isa import isa_class

        return isa_class(target)

    def tuning(self):
        from . import tuning

        return tuning
