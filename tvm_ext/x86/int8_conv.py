"""Fast int8 convolutions on x86 with TVM 0.19 and LLVM 22: VNNI that builds, and runs fast.

:func:`kernels` replaces TVM 0.19 x86 TOPI functions (schedules, fallback configs, a
legalization, a tensor intrinsic) while it is entered and restores TVM's own when the outermost
entry exits, so a plain ``relay.build`` in the same process keeps TVM's behaviour.
:func:`tvm_ext.build` enters it for every LLVM target: with a tvm-ext pipeline (or
``kernels=True``) as ``kernels(schedule=True)``, and every change applies; without one as
``kernels(schedule=False)``, and only ``exact_without_vnni`` and ``vnni_operand_types`` do
(otherwise the kernels are ``relay.build``'s). Each change is decided per instruction-set class
(:func:`tvm_ext.x86.isa.isa_class` of the target being compiled, read at schedule time) from the
tables of :mod:`tvm_ext.x86.int8_policy`.

Apart from ``exact_without_vnni``, which makes results exact where TVM's saturate, no change
alters results. The changes: ``exact_without_vnni`` (:mod:`tvm_ext.x86.exact_int8`),
``vnni_operand_types``, ``epilogue_per_row``, ``per_tile_accumulators``, ``tile_oc_chunks``, ``tile_budget_1x1``,
``tile_chains``, ``fallback_register_tile``, ``fallback_kw_reuse``, ``fallback_strided_chains``,
``depthwise_int8_block``, ``depthwise_taps``
(:mod:`tvm_ext.x86.depthwise_taps`), ``int8_graph_float_conv_blocks``,
``narrow_channel_blocks``, ``vnni_24_lanes``, ``pool_prologue_inline``, ``global_pool_channel_vector``,
``block_vector_lanes`` (:mod:`tvm_ext.x86.block_vectors`) and ``conv_transpose_without_zeros``
(:mod:`tvm_ext.x86.conv_transpose`). The conv schedules are in :mod:`tvm_ext.x86.int8_schedules`; the
layouts, fallback configs and :func:`kernels` are here.
Each change's rule, where it applies and its measured reason: docs/x86-kernels.md ("Each change's
rule, code and measured reason").
"""
from __future__ import annotations

import contextlib
import logging

from . import conv_transpose as x86_conv_transpose
from . import depthwise_taps
from . import exact_int8
from .._patch import Patch
from .block_vectors import injective_block_vectors, inline_pool_producers, vectorize_pool_channel_block
from .int8_policy import (FALLBACK_TILE_ACCUMULATORS, INT8_CONV_BLOCK, SHORT_REDUCTION, KernelPolicy,
                          needs_operand_fix, policy)
from .int8_schedules import _SAVED, _current_target, _schedule_1x1_int8, _schedule_common_int8, dot_u8s8_vnni
from .isa import isa_class
from .tile_rules import (kw_reuse_width, output_pixels, output_size, output_width, strided_chain_width, tile_shape,
                         tile_width, wide_out_block)

logger = logging.getLogger(__name__)

__all__ = ["kernels", "active", "int8_block", "int8_out_channels"]


def _depthwise_int8_block(fallback):
    """``fallback`` (TVM's x86 depthwise default config), then an 8-bit depthwise conv blocked like
    the int8 convs around it (``depthwise_int8_block``): ``tile_ic = tile_oc = INT8_CONV_BLOCK`` when the channels
    divide by it, else the int8 rule's block (:func:`int8_block`) where it fits one vector
    register. The other knobs (``tile_ow``, ``unroll_kw``) stay TVM's."""
    import functools

    from tvm.autotvm.task.space import SplitEntity

    @functools.wraps(fallback)
    def wrapped(cfg, wkl):
        from tvm.target.x86 import get_simd_32bit_lanes

        fallback(cfg, wkl)
        if str(wkl.in_dtype) not in ("uint8", "int8") or wkl.in_filter != wkl.out_filter:
            return None
        block = _block_here(wkl.out_filter)
        if block is None or (block != INT8_CONV_BLOCK and block > get_simd_32bit_lanes()):
            return None
        cfg["tile_ic"] = SplitEntity([wkl.in_filter // block, block])
        cfg["tile_oc"] = SplitEntity([wkl.out_filter // block, block])
        return None

    wrapped._tvm_ext_change = "depthwise_int8_block"  # pylint: disable=protected-access
    return wrapped


def _fallback_tile_budget(cfg):
    """``(accumulator registers, vector registers per pixel)`` for cutting an untuned conv's tile on
    the current target (``fallback_register_tile``), or None where TVM's tile is kept
    (:data:`.int8_policy.FALLBACK_TILE_ACCUMULATORS`)."""
    from tvm.target.x86 import get_simd_32bit_lanes

    target = _current_target()
    budget = FALLBACK_TILE_ACCUMULATORS.get(isa_class(target)) if target is not None else None
    if budget is None:
        return None
    return budget, -(-cfg["tile_oc"].size[-1] // get_simd_32bit_lanes())


def _depthwise_register_tile(fallback):
    """``fallback`` (a TVM x86 depthwise default config), then, on classes with a tile budget
    (AVX2: :data:`.int8_policy.FALLBACK_TILE_ACCUMULATORS`), ``tile_ow`` cut to the widest tile whose
    accumulators fit the registers (``fallback_register_tile``; 8-bit and float depthwise convs alike). The other knobs
    stay; tuned configs are not touched."""
    import functools

    from tvm.autotvm.task.space import SplitEntity

    @functools.wraps(fallback)
    def wrapped(cfg, wkl):
        fallback(cfg, wkl)
        tile = _fallback_tile_budget(cfg)
        if tile is None:
            return None
        budget, groups = tile
        out_w = 1
        for size in cfg["tile_ow"].size:
            out_w *= int(size)
        cols = tile_width(out_w, groups, cfg["tile_ow"].size[-1], budget)
        cfg["tile_ow"] = SplitEntity([out_w // cols, cols])
        return None

    return wrapped


def int8_block(channels: int, target=None):
    """The channel block of an 8-bit tensor with ``channels`` channels, or None.

    Without ``target``: the block TVM's x86 int8 rule gives ``channels`` on a conv's input side
    (the largest of 16, 12, 8, 4 dividing it). With ``target`` (a target or its string): the
    first of that target's :attr:`KernelPolicy.channel_blocks` dividing it (``narrow_channel_blocks``:
    on AVX2 and AVX-512 VNNI 8 comes before 12, so 24 and 360 channels take 8; 12 and 36 keep 12).
    """
    blocks = policy(target).channel_blocks if target is not None else KernelPolicy.channel_blocks
    return next((b for b in blocks if channels % b == 0), None)


def int8_out_channels(channels: int, target=None) -> int:
    """The output channels x86's int8 legalization gives an int8 conv with ``channels`` outputs:
    ``channels`` where 16 or (with ``target``) the policy's narrower output block divides it
    (``narrow_channel_blocks``), else ``channels`` padded to a multiple of 16, sliced back after the conv."""
    if channels % INT8_CONV_BLOCK == 0:
        return channels
    blocks = policy(target).int8_out_blocks if target is not None else KernelPolicy.int8_out_blocks
    if any(channels % b == 0 for b in blocks):
        return channels
    return -(-channels // INT8_CONV_BLOCK) * INT8_CONV_BLOCK


def _block_here(channels: int):
    """:func:`int8_block` for the target being compiled (TVM's rule when none is current)."""
    return int8_block(channels, _current_target())


def _int8_out_block(out_channels, wkl=None):
    """The output block an int8 conv with ``out_channels`` channels takes for the target being
    compiled (``narrow_channel_blocks``), or None where TVM's (a multiple of 16, padded) stays, also for
    channel counts that are not compile-time integers. A block wider than 16 (``vnni_24_lanes``) only
    for a workload ``wkl`` that :func:`tvm_ext.x86.tile_rules.wide_out_block` admits; without one the
    narrowest (which pads the same: not at all)."""
    target = _current_target()
    if target is None:
        return None
    blocks = policy(target).int8_out_blocks
    if blocks == KernelPolicy.int8_out_blocks:
        return None
    try:
        out_channels = int(out_channels)
    except (TypeError, ValueError):  # a symbolic dimension: TVM's handling
        return None
    if out_channels % INT8_CONV_BLOCK == 0:
        return None
    wide = wkl is not None and wide_out_block(wkl.in_filter // wkl.groups, output_pixels(wkl), SHORT_REDUCTION)
    return next((b for b in blocks if out_channels % b == 0 and b != INT8_CONV_BLOCK
                 and (wide or b < INT8_CONV_BLOCK)), None)


def _int8_legalize_out_block(alter):
    """``alter`` (TVM's ``conv2d_alter_int8_common`` as x86's conv2d legalization calls it, padding
    output channels to 16 and slicing them off again), with the output channels padded to the
    policy's narrower int8 output block where that divides them (``narrow_channel_blocks``: 24
    channels are not padded to 32; 8 lanes are one tensorize step, ``vpmaddubsw`` on AVX2, the ymm
    ``vpdpbusd`` on AVX-512 VNNI)."""
    import functools

    @functools.wraps(alter)
    def wrapped(data, data_tensor, kernel, kernel_tensor, output_tensor, attrs, data_dtype,
                in_channel_vector_length, out_channel_vector_length):
        layout = str(attrs["data_layout"])
        if out_channel_vector_length == INT8_CONV_BLOCK and layout in ("NCHW", "NHWC"):
            block = _int8_out_block(output_tensor.shape[layout.index("C")])
            if block is not None:
                out_channel_vector_length = block
        return alter(data, data_tensor, kernel, kernel_tensor, output_tensor, attrs, data_dtype,
                     in_channel_vector_length, out_channel_vector_length)

    wrapped._tvm_ext_change = "narrow_channel_blocks"  # pylint: disable=protected-access
    return wrapped


def _int8_conv_compute(compute):
    """``compute`` (TVM's x86 ``conv2d_NCHWc_int8``), able to take an output block narrower than 16
    (``narrow_channel_blocks``). Its AutoTVM space admits only output blocks that 16 divides
    (``define_split("tile_oc", filter=...% 16 == 0)``): for 24 channels the space is empty and
    defining it raises. A fallback config that already holds ``tile_oc`` skips that definition, so
    the config is given the policy's block first; :func:`_int8_conv_blocks` then fills in the rest as
    for any fallback."""
    import functools

    from tvm.autotvm.task import DispatchContext
    from tvm.autotvm.task.space import SplitEntity
    from tvm.autotvm.task.topi_integration import args_to_workload
    from tvm.topi.utils import get_const_tuple

    @functools.wraps(compute)
    def wrapped(*args):
        kernel_shape = get_const_tuple(args[1].shape)
        channels = kernel_shape[0] * kernel_shape[5] if len(kernel_shape) == 7 else kernel_shape[0]
        block = _int8_out_block(channels)
        if block is not None and len(kernel_shape) == 7:  # packed: the block the layout already took
            block = kernel_shape[5]
        if block is not None:
            workload = args_to_workload(args, "conv2d_NCHWc_int8.x86")
            cfg = DispatchContext.current.query(_current_target(), workload)
            entities = cfg._entity_map  # pylint: disable=protected-access
            if cfg.is_fallback and "tile_oc" not in entities:
                entities["tile_oc"] = SplitEntity([channels // block, block])
        return compute(*args)

    wrapped._tvm_ext_change = "narrow_channel_blocks"  # pylint: disable=protected-access
    return wrapped


def _int8_conv_blocks(fallback):
    """``fallback`` (TVM's generic int8 conv default config, which x86 calls with ``int32_lanes=16``),
    with the policy's blocks for the target being compiled (``narrow_channel_blocks``): the input
    block of :func:`int8_block` and the output block the legalization above kept (8 for 24 channels
    on AVX2 and AVX-512 VNNI). Elsewhere, and for other callers (other ``int32_lanes``), TVM's own config."""
    import functools

    from tvm.autotvm.task.space import SplitEntity

    @functools.wraps(fallback)
    def wrapped(cfg, wkl, int32_lanes, num_int8_elements):
        target = _current_target()
        pol = policy(target) if target is not None else None
        tvms = pol is None or (pol.channel_blocks, pol.int8_out_blocks) == (KernelPolicy.channel_blocks,
                                                                          KernelPolicy.int8_out_blocks)
        if int32_lanes != INT8_CONV_BLOCK or tvms:
            return fallback(cfg, wkl, int32_lanes, num_int8_elements)
        fallback(cfg, wkl, _int8_out_block(wkl.out_filter, wkl) or int32_lanes, num_int8_elements)
        block = int8_block(wkl.in_filter, target)
        if block is not None:
            cfg["tile_ic"] = SplitEntity([wkl.in_filter // block, block])
        return None

    wrapped._tvm_ext_change = "narrow_channel_blocks"  # pylint: disable=protected-access
    return wrapped


def _untuned_conv_geometry(cfg, wkl):
    """``(policy, output width, registers per pixel, output-channel blocks, TVM's tile_ow)`` of an int8
    conv's fallback config on the target being compiled, or None without a target or for a 1x1 or
    dilated conv."""
    from tvm.target.x86 import get_simd_32bit_lanes

    target = _current_target()
    if target is None or wkl.dilation_w != 1 or wkl.kernel_w < 2:
        return None
    out_w = output_width(wkl)
    oc_bn = cfg["tile_oc"].size[-1]
    return (policy(target), out_w, max(1, oc_bn // get_simd_32bit_lanes()), wkl.out_filter // oc_bn,
            cfg["tile_ow"].size[-1])


def _int8_conv_kw_reuse(fallback):
    """``fallback`` (the generic int8 conv default config, with the channel blocks above), then, for a
    stride-1 conv with ``kw`` > 1 on classes with :attr:`KernelPolicy.kw_reuse_registers`,
    ``unroll_kw`` set and ``tile_ow`` cut to :func:`tvm_ext.x86.tile_rules.kw_reuse_width`
    (``fallback_kw_reuse``): neighbouring kernel columns share the tile's broadcast data words.
    Tuned configs are not touched; the same products in the same order per output."""
    import functools

    from tvm.autotvm.task.space import OtherOptionEntity, SplitEntity

    @functools.wraps(fallback)
    def wrapped(cfg, wkl, int32_lanes, num_int8_elements):
        fallback(cfg, wkl, int32_lanes, num_int8_elements)
        geometry = _untuned_conv_geometry(cfg, wkl) if wkl.stride_w == 1 else None
        if geometry is None or not geometry[0].kw_reuse_registers:
            return None
        pol, out_w, groups, _, wanted = geometry
        pixels = kw_reuse_width(out_w, groups, wkl.kernel_w, pol.kw_reuse_registers, wanted)
        if pixels is not None:
            cfg["tile_ow"] = SplitEntity([out_w // pixels, pixels])
            cfg["unroll_kw"] = OtherOptionEntity(True)
        return None

    wrapped._tvm_ext_change = "fallback_kw_reuse"  # pylint: disable=protected-access
    return wrapped


def _int8_conv_strided_chains(fallback):
    """``fallback`` (as above), then, for a strided conv on classes with
    :attr:`KernelPolicy.strided_chain_tiles`, ``tile_ow`` cut to
    :func:`tvm_ext.x86.tile_rules.strided_chain_width` (``fallback_strided_chains``): ``tile_chains``
    then computes the tile with two output-channel blocks that share each broadcast data word. Tuned
    configs are not touched; the same products in the same order per output."""
    import functools

    from tvm.autotvm.task.space import SplitEntity

    @functools.wraps(fallback)
    def wrapped(cfg, wkl, int32_lanes, num_int8_elements):
        fallback(cfg, wkl, int32_lanes, num_int8_elements)
        geometry = _untuned_conv_geometry(cfg, wkl) if wkl.stride_w > 1 else None
        if geometry is None or not (geometry[0].strided_chain_tiles and geometry[0].dot_chains):
            return None
        pol, out_w, groups, oc_chunks, wanted = geometry
        pixels = strided_chain_width(out_w, groups, oc_chunks, pol.dot_chains, wanted)
        if pixels is not None:
            cfg["tile_ow"] = SplitEntity([out_w // pixels, pixels])
        return None

    wrapped._tvm_ext_change = "fallback_strided_chains"  # pylint: disable=protected-access
    return wrapped


def _one_output_pixel(wkl) -> bool:
    """The conv computes one output pixel per channel (an SE block's 1x1 convs after a global
    pool): no loop to vectorize over, so no block is too wide for it."""
    return output_pixels(wkl) == 1


def _float_conv_int8_blocks(fallback):
    """``fallback`` (a TVM x86 float conv default config), then ``tile_ic`` by the int8 rule
    (:func:`int8_block`) where it has a block, and ``tile_oc`` where that block is no wider than
    the target's 32-bit SIMD lanes or the conv has one output pixel, while the graph being built
    computes in 8 bits (``int8_graph_float_conv_blocks``). The other knobs (``tile_ow``,
    ``tile_oh``, ``unroll_kw``) stay TVM's."""
    import functools

    from tvm.autotvm.task.space import SplitEntity

    @functools.wraps(fallback)
    def wrapped(cfg, wkl):
        fallback(cfg, wkl)
        if not _SAVED.get("int8_graph") or str(wkl.in_dtype) not in ("float32", "float16"):
            return None
        from tvm.target.x86 import get_simd_32bit_lanes

        block = _block_here(wkl.in_filter)
        if block is not None:
            cfg["tile_ic"] = SplitEntity([wkl.in_filter // block, block])
        block = _block_here(wkl.out_filter)
        if block is not None and (block <= get_simd_32bit_lanes() or _one_output_pixel(wkl)):
            cfg["tile_oc"] = SplitEntity([wkl.out_filter // block, block])
        return None

    wrapped._tvm_ext_change = "int8_graph_float_conv_blocks"  # pylint: disable=protected-access
    return wrapped


def _float_conv_register_tile(fallback, one_by_one: bool):
    """``fallback`` (a TVM x86 float conv default config), then, on classes with a tile budget
    narrower than TVM's rule (AVX2: :data:`.int8_policy.FALLBACK_TILE_ACCUMULATORS`), ``tile_ow`` (and
    ``tile_oh`` for 1x1 convs) cut to the widest tile whose accumulators fit the registers
    (``fallback_register_tile``). The other knobs stay TVM's; tuned configs are not touched."""
    import functools

    from tvm.autotvm.task.space import OtherOptionEntity, SplitEntity

    @functools.wraps(fallback)
    def wrapped(cfg, wkl):
        fallback(cfg, wkl)
        tile = _fallback_tile_budget(cfg) if str(wkl.in_dtype) == "float32" else None
        if tile is None:
            return None
        budget, groups = tile
        out_h, out_w = output_size(wkl)
        cols = cfg["tile_ow"].size[-1]
        if one_by_one:
            rows, cols = tile_shape(out_h, out_w, groups, (cfg["tile_oh"].val, cols), budget)
            cfg["tile_oh"] = OtherOptionEntity(rows)
        else:
            cols = tile_width(out_w, groups, cols, budget)
        cfg["tile_ow"] = SplitEntity([out_w // cols, cols])
        return None

    return wrapped


def _install(schedule, int8_graph=False):
    import tvm.topi.generic.conv2d as generic
    import tvm.topi.x86 as x86
    import tvm.topi.x86.conv2d_alter_op as alter_op
    import tvm.topi.x86.conv2d_avx_1x1 as one_by_one
    import tvm.topi.x86.conv2d_avx_common as common
    import tvm.topi.x86.conv2d_int8 as conv2d_int8
    import tvm.topi.x86.depthwise_conv2d as depthwise
    import tvm.topi.x86.injective as injective
    import tvm.topi.x86.tensor_intrin as intrin

    logger.debug("x86 int8 kernels: vnni_operand_types %s, schedule %s", needs_operand_fix(), schedule)
    _SAVED["intrin"] = intrin.dot_16x1x16_uint8_int8_int32_cascadelake
    _SAVED["int8_blocks"] = (alter_op.conv2d_alter_int8_common, generic.fallback_schedule_cpu_1x1_int8,
                             generic.fallback_schedule_cpu_common_int8, x86.conv2d_NCHWc_int8,
                             conv2d_int8.conv2d_NCHWc_int8)
    _SAVED["schedule"] = common._schedule_conv_NCHWc_int8
    _SAVED["schedule_1x1"] = one_by_one._schedule_conv_NCHWc_int8
    _SAVED["pools"] = (x86.schedule_pool, x86.schedule_adaptive_pool)
    _SAVED["injective"] = injective.schedule_injective_from_existing
    _SAVED["conv_transpose"] = (x86.conv2d_transpose_nchw, x86.schedule_conv2d_transpose_nchw)
    _SAVED["depthwise"] = depthwise._fallback_schedule
    _SAVED["depthwise_taps"] = (x86.depthwise_conv2d_NCHWc, x86.schedule_depthwise_conv2d_NCHWc)
    _SAVED["float_convs"] = (one_by_one._fallback_schedule, common._fallback_schedule)
    _SAVED["int8_graph"] = bool(schedule) and int8_graph
    if needs_operand_fix():
        intrin.dot_16x1x16_uint8_int8_int32_cascadelake = dot_u8s8_vnni
    _SAVED["mode"] = schedule
    if schedule:
        common._schedule_conv_NCHWc_int8 = _schedule_common_int8
        one_by_one._schedule_conv_NCHWc_int8 = _schedule_1x1_int8
        x86.schedule_pool = inline_pool_producers(x86.schedule_pool)
        x86.schedule_adaptive_pool = vectorize_pool_channel_block(inline_pool_producers(x86.schedule_adaptive_pool))
        injective.schedule_injective_from_existing = injective_block_vectors(injective.schedule_injective_from_existing)
        x86.conv2d_transpose_nchw = x86_conv_transpose.conv2d_transpose_nchw(x86.conv2d_transpose_nchw)
        x86.schedule_conv2d_transpose_nchw = x86_conv_transpose.schedule_conv2d_transpose_nchw(
            x86.schedule_conv2d_transpose_nchw)
        depthwise._fallback_schedule = _depthwise_register_tile(_depthwise_int8_block(depthwise._fallback_schedule))
        x86.depthwise_conv2d_NCHWc = depthwise_taps.wrap_compute(x86.depthwise_conv2d_NCHWc)
        x86.schedule_depthwise_conv2d_NCHWc = depthwise_taps.wrap_schedule(x86.schedule_depthwise_conv2d_NCHWc)
        one_by_one._fallback_schedule = _float_conv_register_tile(
            _float_conv_int8_blocks(one_by_one._fallback_schedule), one_by_one=True)
        common._fallback_schedule = _float_conv_register_tile(
            _float_conv_int8_blocks(common._fallback_schedule), one_by_one=False)
        alter_op.conv2d_alter_int8_common = _int8_legalize_out_block(alter_op.conv2d_alter_int8_common)
        generic.fallback_schedule_cpu_1x1_int8 = _int8_conv_blocks(generic.fallback_schedule_cpu_1x1_int8)
        generic.fallback_schedule_cpu_common_int8 = _int8_conv_strided_chains(_int8_conv_kw_reuse(
            _int8_conv_blocks(generic.fallback_schedule_cpu_common_int8)))
        compute = _int8_conv_compute(conv2d_int8.conv2d_NCHWc_int8)
        x86.conv2d_NCHWc_int8 = conv2d_int8.conv2d_NCHWc_int8 = compute
    exact_int8.install()  # wraps the schedules installed above


def _uninstall():
    import tvm.topi.generic.conv2d as generic
    import tvm.topi.x86 as x86
    import tvm.topi.x86.conv2d_alter_op as alter_op
    import tvm.topi.x86.conv2d_avx_1x1 as one_by_one
    import tvm.topi.x86.conv2d_avx_common as common
    import tvm.topi.x86.conv2d_int8 as conv2d_int8
    import tvm.topi.x86.depthwise_conv2d as depthwise
    import tvm.topi.x86.injective as injective
    import tvm.topi.x86.tensor_intrin as intrin

    exact_int8.uninstall()
    intrin.dot_16x1x16_uint8_int8_int32_cascadelake = _SAVED.pop("intrin")
    (alter_op.conv2d_alter_int8_common, generic.fallback_schedule_cpu_1x1_int8,
     generic.fallback_schedule_cpu_common_int8, x86.conv2d_NCHWc_int8,
     conv2d_int8.conv2d_NCHWc_int8) = _SAVED.pop("int8_blocks")
    depthwise._fallback_schedule = _SAVED.pop("depthwise")
    x86.depthwise_conv2d_NCHWc, x86.schedule_depthwise_conv2d_NCHWc = _SAVED.pop("depthwise_taps")
    one_by_one._fallback_schedule, common._fallback_schedule = _SAVED.pop("float_convs")
    _SAVED.pop("int8_graph", None)
    common._schedule_conv_NCHWc_int8 = _SAVED.pop("schedule")
    one_by_one._schedule_conv_NCHWc_int8 = _SAVED.pop("schedule_1x1")
    x86.schedule_pool, x86.schedule_adaptive_pool = _SAVED.pop("pools")
    injective.schedule_injective_from_existing = _SAVED.pop("injective")
    x86.conv2d_transpose_nchw, x86.schedule_conv2d_transpose_nchw = _SAVED.pop("conv_transpose")
    _SAVED.pop("mode", None)


_PATCH = Patch(_install, _uninstall)


@contextlib.contextmanager
def kernels(schedule=True, int8_graph=False):
    """Enter to build x86 int8 kernels with the changes the module note names.

    Parameters
    ----------
    schedule : bool or {"per_row", "per_tile"}
        ``True``: every change where the target being compiled takes it (:func:`policy`):
        ``epilogue_per_row`` or ``per_tile_accumulators`` for int8 convs,
        ``fallback_register_tile``, ``depthwise_int8_block``, ``narrow_channel_blocks``,
        ``vnni_24_lanes``, ``pool_prologue_inline``, ``global_pool_channel_vector``,
        ``block_vector_lanes`` and ``conv_transpose_without_zeros``. ``False`` keeps TVM's schedules and
        layouts everywhere and only applies ``vnni_operand_types`` (VNNI buildable with LLVM 22): that is "stock TVM"
        for a VNNI target. ``"per_row"`` (``"per_tile"``) uses the per-row (per-tile) int8 conv
        schedule on every instruction set (for measurements such as
        ``benchmarks/lab/int8_conv_schedules.py``).
    int8_graph : bool
        The graph being built computes in 8 bits: float convs read their input blocked as the
        int8 convs write it (``int8_graph_float_conv_blocks``; only with ``schedule``). Float
        models keep TVM's blocking.

    Re-entrant and thread-safe: nested entries share the outermost setting, and TVM's own
    functions are restored when the outermost entry exits. Other threads that call
    ``relay.build`` meanwhile see the replaced functions too (TOPI has no per-thread state).
    """
    with _PATCH.entered(schedule, int8_graph):
        yield


def active() -> bool:
    """True while some thread is inside :func:`kernels`."""
    return _PATCH.active
