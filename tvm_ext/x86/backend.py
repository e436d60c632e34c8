"""The x86 back end: what a build for an x86 CPU adds to ``relay.build``.

* target: :func:`tvm_ext.x86.target.build_target` (the real CPU for ``-mcpu=native``, AVX-512 VNNI
  kept, AMX masked unless ``amx=True``);
* passes: where the int8 dot product is ``vpmaddubsw`` (no VNNI), ``OrderChannelsInSafePairs`` at
  the start (:mod:`tvm_ext.x86.pair_order`: channel orders in which the convs' pairs cannot
  saturate) and ``PairPackInt8Convs`` last before FuseOps (:mod:`tvm_ext.x86.pair_pack`: the convs
  still unsafe, in int16 pairs), so every int8 conv is exact; before it, where 8-bit denses are padded,
  ``FuseSlicedInt8Dense`` (:mod:`tvm_ext.x86.fuse_sliced_dense`);
* contexts: the int8 kernel policy (:func:`tvm_ext.x86.int8_conv.kernels`; with ``kernels`` off only
  the VNNI intrinsic LLVM 22 accepts), the tuned records of the target's class
  (:mod:`tvm_ext.x86.tuning`), the exactness record, with ``kernels`` on 8-bit graphs 8-bit denses padded
  to 16 outputs (:mod:`tvm_ext.x86.dense_padding`), and with ``amx`` the AMX tile schedules;
* instruments: :class:`tvm_ext.x86.exact_record.RecordWeights`;
* configure (TIR lowering passes of this build only): with ``kernels`` at AVX2 and AVX-512 requantization in
  even/odd int32 lanes (:mod:`tvm_ext.x86.requantize`); with ``kernels`` byte-table lookups as ``vpermi2b``
  at AVX-512 VBMI (:mod:`tvm_ext.x86.byte_table`), as ``vpermi2d`` at AVX-512 without it
  (:mod:`tvm_ext.x86.dword_table`); with ``kernels`` at AVX-512BW saturating 8-bit stores
  narrowed four vectors at a time by packs (:mod:`tvm_ext.x86.narrow_by_packs`); with ``kernels`` on 8-bit graphs, float
  products fenced from FMA contraction (:mod:`tvm_ext._no_contract`); with ``amx`` ``ConfigureTiles``.
"""
from __future__ import annotations

from ..backend import Backend, BuildPlan, BuildRequest, llvm_arch

__all__ = ["X86"]

_ARCHS = ("x86_64", "x86-64", "amd64", "i386", "i486", "i586", "i686")


class X86(Backend):
    """x86-64 CPUs, SSE to AVX-512 VNNI and AMX (:data:`tvm_ext.x86.isa.ISA_CLASSES`)."""

    family = "x86"

    def claims(self, target) -> bool:
        return llvm_arch(target) in _ARCHS

    def target(self, target, allow_vnni: bool | None = None, amx: bool = False, **options):
        import tvm

        from .target import build_target

        if options:
            raise TypeError(f"tvm_ext.build: {sorted(options)} are not options of the x86 back end "
                            f"(it takes allow_vnni, amx)")
        tgt = build_target(target, allow_vnni, allow_amx=amx)
        return tgt if tgt.host is not None else tvm.target.Target(tgt, host=tgt)

    def plan(self, request: BuildRequest) -> BuildPlan:
        from .. import _no_contract
        from . import (byte_table, dense_padding, dword_table, exact_record, fuse_sliced_dense, int8_conv,
                       narrow_by_packs, pair_order, pair_pack, requantize, tuning)

        tgt, amx = request.target, bool(request.options.get("amx"))
        plan = BuildPlan()
        if pair_order.orders_pairs(tgt) and request.eight_bit:
            plan.passes["start"] = [pair_order.OrderChannelsInSafePairs()]
        if pair_pack.packs_pairs(tgt) and request.eight_bit:
            plan.passes["before_fuse"] = [pair_pack.PairPackInt8Convs()]
        plan.contexts = [int8_conv.kernels(schedule=request.kernels, int8_graph=request.kernels and request.eight_bit),
                         exact_record.recording()]
        if request.kernels and request.eight_bit:
            plan.contexts.append(dense_padding.padded_int8_denses())
            if dense_padding.applies(tgt):
                plan.passes.setdefault("before_fuse", []).insert(0, fuse_sliced_dense.FuseSlicedInt8Dense())
        if request.kernels and requantize.applies(tgt):
            plan.add_configure(requantize.lower_config)
        if request.kernels and byte_table.applies(tgt):
            plan.add_configure(byte_table.lower_config)
        elif request.kernels and dword_table.applies(tgt):
            plan.add_configure(dword_table.lower_config)
        if request.kernels and narrow_by_packs.applies(tgt):
            plan.add_configure(narrow_by_packs.lower_config)
        if request.kernels and request.eight_bit:  # float products rounded before their sums
            plan.add_configure(_no_contract.lower_config)
        if request.tuned:
            plan.add_records(tuning.apply(tgt))
        plan.instruments = [exact_record.RecordWeights()]
        if amx:
            from . import amx as amx_tiles

            amx_tiles.prepare_process()  # the result runs in this process too: ask Linux for the tile state now
            plan.contexts.append(amx_tiles.tile_schedules())
            plan.add_configure(amx_tiles.lower_config)
        return plan

    def isa_class(self, target) -> str:
        from .isa import isa_class

        return isa_class(target)

    def tuning(self):
        from . import tuning

        return tuning
