"""Fast int8 convolutions on x86 with TVM 0.19 and LLVM 22: VNNI that builds, and runs fast.

Design note
-----------
:func:`kernels` replaces TVM 0.19 x86 TOPI functions (schedules, fallback configs, a
legalization, a tensor intrinsic) while it is entered and restores TVM's own when the outermost
entry exits, so a plain ``relay.build`` in the same process keeps TVM's behaviour.
:func:`tvm_ext.build` enters it for every LLVM target: with a tvm-ext pipeline (or
``kernels=True``) as ``kernels(schedule=True)``, and every change below applies; without one as
``kernels(schedule=False)``, and only ``exact_without_vnni`` and ``vnni_operand_types`` do
(otherwise the kernels are ``relay.build``'s). Each change is decided per instruction-set class
(:func:`tvm_ext.x86.isa.isa_class` of the target being compiled, read at schedule time, so one process
can build for several classes) from measurements on that class; :mod:`tvm_ext.x86.int8_policy` holds
those choices as tables, with their evidence (:func:`~tvm_ext.x86.int8_policy.policy`; conv schedules from
``benchmarks/lab/int8_conv_schedules.py``).
The measurements in full: ``docs/x86-kernels.md``. "AVX2 code" below was measured as
``-mcpu=znver3`` code on Zen 4, "AVX-512 VNNI" as ``-mcpu=znver4`` on Zen 4.

Apart from ``exact_without_vnni``, which makes results exact where TVM's saturate, no change
alters results: integer accumulation is exact in every schedule and the epilogue's
arithmetic is the same per element; the block and pool changes only re-block tensors, inline
elementwise stages or reorder a pool's loops; the transposed conv sums the same non-zero products
in the same order. Tests check bit-equality against TVM's own schedule with the same dot product,
and exactness against numpy.

The changes, each with where it applies, its rule and its measured reason (the schedules named,
:func:`dot_u8s8_vnni`, :func:`tile_width`, :func:`tile_shape`, the ``_schedule_*`` and pool functions,
are in :mod:`tvm_ext.x86.int8_schedules`; the layouts and fallback configs are here):

``exact_without_vnni`` -- AVX2, AVX-512 and SSE, also with ``schedule=False``
    (:mod:`tvm_ext.x86.exact_int8`). ``vpmaddubsw`` saturates its int16 pair sums; a conv whose
    weight pairs can saturate is packed in int16 pairs (one ``vpmaddwd``), anything else that can
    saturate splits each data byte::

        # conv(x, w[..., 4]) -> conv(x, pairs(w)[..., 2])  with vpmaddwd(zext(x pair), sext(w pair))
        # vpmaddubsw(a, w) -> vpmaddubsw(a & 0x7f, w) and vpmaddubsw(a & 0x80, w), each through vpmaddwd

    Reason: stock TVM misses exact arithmetic on full-range weights (50,159 of 50,176 outputs of
    a 64->64 3x3 conv at x86-64-v3).

``vnni_operand_types`` -- AVX-512 VNNI with LLVM >= 22 (:func:`needs_operand_fix`), also with
    ``schedule=False``. TVM's ``dot_16x1x16_uint8_int8_int32_cascadelake`` calls
    ``llvm.x86.avx512.vpdpbusd.512`` with three ``<16 x i32>`` operands; LLVM 22 takes the byte
    operands as ``<64 x i8>`` (llvm-project #155194). :func:`dot_u8s8_vnni` replaces it (LLVM <= 21
    keeps TVM's)::

        # vpdpbusd(acc, a: i32x16, b: i32x16) -> vpdpbusd(acc, reinterpret<i8x64>(a), reinterpret<i8x64>(b))

    Reason: TVM's call aborts the whole process ("Calling a function with a bad signature!").

``epilogue_per_row`` -- 3x3/7x7 int8 convs on AVX-512 VNNI and AVX-512
    (:attr:`KernelPolicy.per_row`). TVM's ``schedule_conv_NCHWc_cpu_common_int8`` runs with
    ``inline_fused=True``: with a fused epilogue (bias, requantize) the conv is computed per output
    pixel inside the epilogue loop, so one accumulator carries the whole (kh, kw, ic) reduction and
    VNNI's 4-5-cycle ``vpdpbusd`` is on that chain. Here ``inline_fused=False`` (TVM's 1x1 form)::

        # for p in row: out[p] = epilogue(conv(p))  ->  acc[0:reg_n] = conv(row); out[row] = epilogue(acc)

    Measured: 0.19-0.49x TVM's time per ResNet-50 3x3/7x7 conv on AVX-512 VNNI and 0.82-0.99x on
    AVX-512 without VNNI, but 0.86-1.65x as AVX2 code, which therefore takes
    ``per_tile_accumulators``.

``per_tile_accumulators`` -- 3x3/7x7 int8 convs on AVX2, 1x1 int8 convs on AVX2, AVX-512 and
    AVX-512 VNNI (:attr:`KernelPolicy.tile_accumulators`: 12 ymm, 28 zmm). A row of TVM's
    ``tile_ow`` (28 pixels x 2 ymm) spills AVX2's 16 registers, TVM's per-pixel form reloads the
    kernel vectors for every pixel, and TVM's 1x1 form accumulates whole rows into a buffer, copies
    it and runs the epilogue over the copy. Here the conv is computed per tile of output pixels
    whose accumulators fit the registers, the epilogue per tile (:func:`tile_width`,
    :func:`_schedule_int8_per_tile`; 1x1: :func:`tile_shape`, :func:`_schedule_1x1_int8_per_tile`)::

        # tile pixels * (oc_bn / lanes) <= accumulators; each kernel vector loaded once per tile

    Measured: 0.86-1.02x TVM's time per ResNet-50 3x3/7x7 conv as AVX2 code (0.94-0.96x summed),
    and ResNet-50's 1x1 convs 2-9 % faster as AVX2 code and 4-15 % on AVX-512 VNNI.

``tile_oc_chunks`` -- 1x1 int8 convs on AVX-512 VNNI (:attr:`KernelPolicy.tile_oc_chunks`: up to 4).
    A 1x1 tile also spans several output-channel chunks, their kernel vectors held through each
    reduction step, so each data word loaded serves several ``vpdpbusd`` (oneDNN's brgemm tile is 4
    vectors x 6 pixels); :func:`.int8_schedules.tile_chunks_shape` takes the chunk count whose tile
    loads the fewest values per product::

        # C * tile pixels * (oc_bn / lanes) + (C - 1) * (oc_bn / lanes) <= accumulators

    Measured (Intel Cascade Lake class, QDQ ResNet-50, 2 threads): its 1x1 convs 0.72-0.89x the time
    of one chunk per tile, 0.91x end to end.

``fallback_register_tile`` -- untuned float convs and untuned depthwise convs (8-bit and float) on
    AVX2 (:data:`.int8_policy.FALLBACK_TILE_ACCUMULATORS`; tuned configs are not touched). TVM's fallback takes
    ``tile_ow`` = the largest divisor of the output width up to 31 (float 1x1: ``tile_oh x tile_ow``
    under 32 pixels), one vector register per pixel and channel block: that fits AVX-512's 32 zmm
    and spills AVX2's 16 ymm. Here the tile is cut (:func:`_float_conv_register_tile`,
    :func:`_depthwise_register_tile`)::

        # tile_ow = tile_width(out_w, registers per pixel, tile_ow, 12)

    Measured: 0.53-0.72x TVM's time on five ResNet-like float convs and 0.64-0.81x on 8-bit and
    float depthwise convs, as AVX2 code.

``depthwise_int8_block`` -- untuned 8-bit depthwise convs, every x86 class. AlterOpLayout blocks
    int8 convs by :data:`INT8_CONV_BLOCK` channels (TVM asks its int8 template with
    ``int32_lanes=16`` on every x86 CPU) but an int8 depthwise conv by the SIMD width of 32-bit
    lanes (``depthwise_conv2d._fallback_schedule``: 8 on AVX2, 4 on SSE), so on AVX2 every
    depthwise conv sits between two ``layout_transform`` kernels (:func:`_depthwise_int8_block`)::

        # tile_ic = tile_oc = 16 if 16 | C, else int8_block(C) where it fits one vector register, else TVM's

    Measured: PP-OCRv4 det QDQ as AVX2 code has 107 kernels instead of 135, of which 30 are lone
    re-blockings.

``int8_graph_float_conv_blocks`` -- untuned float convs, every x86 class, only with
    ``int8_graph=True`` (:func:`tvm_ext.build` sets it for modules with int8/uint8 tensors). The
    float convs an int8 pipeline keeps (SE blocks, channel counts x86's int8 path would pad) read
    tensors int8 convs wrote blocked by :func:`int8_block`, but TVM blocks a float conv's input
    channels by the largest divisor up to its output block (384 -> 360 channels: ``NCHW12c`` on
    AVX-512, ``NCHW8c`` on AVX2), a re-blocking kernel in between (:func:`_float_conv_int8_blocks`)::

        # tile_ic = int8_block(C_in); tile_oc = int8_block(C_out) where it fits one vector register
        #                                       or the conv has one output pixel

    Measured: PP-OCRv4 det QDQ 135 -> 98 kernels and 22.39 -> 20.96 ms as AVX2 code, 102 -> 94
    kernels on AVX-512 VNNI (with ``depthwise_int8_block``); the register-width condition because
    an output block of 12 on AVX2's 8 lanes made those convs 9-13x slower.

``narrow_channel_blocks`` -- AVX2 and AVX-512 VNNI (:attr:`KernelPolicy.channel_blocks`,
    :attr:`KernelPolicy.int8_out_blocks`). TVM's int8 rule blocks 24 or 360 channels by 12, wider
    than AVX2's 8 lanes, and x86's conv2d legalization pads an int8 conv's output channels to a
    multiple of 16 and slices them back (a ``layout_transform + strided_slice`` kernel). Here 8
    comes before 12 on every side (:func:`int8_block`), and an int8 conv whose output channels 8
    divides and 16 does not takes output block 8 (:func:`_int8_legalize_out_block`,
    :func:`_int8_conv_blocks`; :func:`_int8_conv_compute` gives the fallback config ``tile_oc``
    first, since TVM's AutoTVM space admits only multiples of 16)::

        # block(C) = first of (16, 8, 12, 4) dividing C;  out_block(C) = 8 where 8 | C and 16 does not

    On AVX-512 VNNI such a conv tensorizes with the 8-lane ymm ``vpdpbusd`` (AVX-512 VL;
    :func:`dot_u8s8_vnni` with ``lanes=8``, :func:`_dot_for_block`), which computes an 8-channel
    block exactly as the 16-lane form computes 16; AVX-512 without VNNI and SSE keep TVM's blocks.
    Measured: PP-OCRv4 det QDQ's three 96 -> 24 int8 convs 17-18 % faster as AVX2 code, and PP-OCR
    cls QDQ 0.66 -> 0.55 ms on AVX-512 VNNI with no float32 tensor left between its convs.

``pool_prologue_inline`` -- pools, every x86 class. ``FuseWideningIntoPool`` puts the widening of
    an 8-bit value (``cast -> subtract -> multiply -> floor -> cast``) in the pool's kernel; TVM's
    x86 pool schedules (``topi/x86/pooling.py``) inline only a pool's injective consumers, so each
    producer stage stays a serial, unvectorized loop nest with its own buffer (stock TVM never fuses
    producers into a pool) (:func:`_inline_pool_producers`)::

        # s = schedule_pool(outs); s[p].compute_inline() for every injective producer p of the pool,
        #   except a float product the pool's sum reads: inlined, LLVM would contract the multiply
        #   and the add into one fused multiply-add (one rounding where TVM's schedule rounds twice)

    Measured: PP-OCR cls's SE pools (1x20x2x96x10 uint8 -> int32) 500 -> 65 us per pool on Zen 4.

``global_pool_channel_vector`` -- global/adaptive pools over ``NCHW[x]c``, every x86 class. TVM's
    ``schedule_adaptive_pool`` leaves the channel block outside the window reduction: per channel a
    scalar sum strided by the block (:func:`_vectorize_pool_channel_block`, blocks up to
    ``_MAX_POOL_VECTOR``)::

        # for c in block: for w in window: s[c] += v[w, c]  ->  for w in window: s[0:block] += v[w, 0:block]

    Measured: PP-OCRv4 det's SE pool (1x6x80x80x16) 0.294 -> 0.045 ms on AVX-512 VNNI and
    0.296 -> 0.047 ms as AVX2 code.

``conv_transpose_without_zeros`` -- transposed convs whose stride equals their kernel, without
    padding, every x86 class (:mod:`tvm_ext.x86.conv_transpose`). TVM's x86 compute dilates the
    input with zeros and runs a dense conv over it; here each output pixel reads its one input
    pixel, per output row::

        # out[n, co, y, x] = sum_ci data[n, ci, y // kh, x // kw] * w[ci, co, y % kh, x % kw]

    Measured: PP-OCRv4 det's two DB-head layers 6.8 -> 0.45 and 1.2 -> 0.17 ms on AVX-512 VNNI,
    8.0 -> 0.58 and 3.5 -> 0.26 ms as AVX2 code.
"""
from __future__ import annotations

import contextlib
import logging

from . import conv_transpose as x86_conv_transpose
from . import exact_int8
from .._patch import Patch
from .int8_policy import FALLBACK_TILE_ACCUMULATORS, INT8_CONV_BLOCK, KernelPolicy, needs_operand_fix, policy
from .int8_schedules import _SAVED, _current_target, _inline_pool_producers, _schedule_1x1_int8, \
    _schedule_common_int8, _vectorize_pool_channel_block, dot_u8s8_vnni, tile_shape, tile_width
from .isa import isa_class

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


def _int8_out_block(out_channels):
    """The output block an int8 conv with ``out_channels`` channels takes for the target being
    compiled (``narrow_channel_blocks``), or None where TVM's (a multiple of 16, padded) stays, also for
    channel counts that are not compile-time integers."""
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
    return next((b for b in blocks if out_channels % b == 0 and b != INT8_CONV_BLOCK), None)


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
        fallback(cfg, wkl, _int8_out_block(wkl.out_filter) or int32_lanes, num_int8_elements)
        block = int8_block(wkl.in_filter, target)
        if block is not None:
            cfg["tile_ic"] = SplitEntity([wkl.in_filter // block, block])
        return None

    wrapped._tvm_ext_change = "narrow_channel_blocks"  # pylint: disable=protected-access
    return wrapped


def _one_output_pixel(wkl) -> bool:
    """The conv computes one output pixel per channel (an SE block's 1x1 convs after a global
    pool): no loop to vectorize over, so no block is too wide for it."""
    out_h = (wkl.height + wkl.padt + wkl.padb - ((wkl.kernel_h - 1) * wkl.dilation_h + 1)) // wkl.stride_h + 1
    out_w = (wkl.width + wkl.padl + wkl.padr - ((wkl.kernel_w - 1) * wkl.dilation_w + 1)) // wkl.stride_w + 1
    return out_h * out_w == 1


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
        out_h = (wkl.height + wkl.padt + wkl.padb - ((wkl.kernel_h - 1) * wkl.dilation_h + 1)) // wkl.stride_h + 1
        out_w = (wkl.width + wkl.padl + wkl.padr - ((wkl.kernel_w - 1) * wkl.dilation_w + 1)) // wkl.stride_w + 1
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
    import tvm.topi.x86.tensor_intrin as intrin

    logger.debug("x86 int8 kernels: vnni_operand_types %s, schedule %s", needs_operand_fix(), schedule)
    _SAVED["intrin"] = intrin.dot_16x1x16_uint8_int8_int32_cascadelake
    _SAVED["int8_blocks"] = (alter_op.conv2d_alter_int8_common, generic.fallback_schedule_cpu_1x1_int8,
                             generic.fallback_schedule_cpu_common_int8, x86.conv2d_NCHWc_int8,
                             conv2d_int8.conv2d_NCHWc_int8)
    _SAVED["schedule"] = common._schedule_conv_NCHWc_int8
    _SAVED["schedule_1x1"] = one_by_one._schedule_conv_NCHWc_int8
    _SAVED["pools"] = (x86.schedule_pool, x86.schedule_adaptive_pool)
    _SAVED["conv_transpose"] = (x86.conv2d_transpose_nchw, x86.schedule_conv2d_transpose_nchw)
    _SAVED["depthwise"] = depthwise._fallback_schedule
    _SAVED["float_convs"] = (one_by_one._fallback_schedule, common._fallback_schedule)
    _SAVED["int8_graph"] = bool(schedule) and int8_graph
    if needs_operand_fix():
        intrin.dot_16x1x16_uint8_int8_int32_cascadelake = dot_u8s8_vnni
    _SAVED["mode"] = schedule
    if schedule:
        common._schedule_conv_NCHWc_int8 = _schedule_common_int8
        one_by_one._schedule_conv_NCHWc_int8 = _schedule_1x1_int8
        x86.schedule_pool = _inline_pool_producers(x86.schedule_pool)
        x86.schedule_adaptive_pool = _vectorize_pool_channel_block(_inline_pool_producers(x86.schedule_adaptive_pool))
        x86.conv2d_transpose_nchw = x86_conv_transpose.conv2d_transpose_nchw(x86.conv2d_transpose_nchw)
        x86.schedule_conv2d_transpose_nchw = x86_conv_transpose.schedule_conv2d_transpose_nchw(
            x86.schedule_conv2d_transpose_nchw)
        depthwise._fallback_schedule = _depthwise_register_tile(_depthwise_int8_block(depthwise._fallback_schedule))
        one_by_one._fallback_schedule = _float_conv_register_tile(
            _float_conv_int8_blocks(one_by_one._fallback_schedule), one_by_one=True)
        common._fallback_schedule = _float_conv_register_tile(
            _float_conv_int8_blocks(common._fallback_schedule), one_by_one=False)
        alter_op.conv2d_alter_int8_common = _int8_legalize_out_block(alter_op.conv2d_alter_int8_common)
        generic.fallback_schedule_cpu_1x1_int8 = _int8_conv_blocks(generic.fallback_schedule_cpu_1x1_int8)
        generic.fallback_schedule_cpu_common_int8 = _int8_conv_blocks(
            generic.fallback_schedule_cpu_common_int8)
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
    import tvm.topi.x86.tensor_intrin as intrin

    exact_int8.uninstall()
    intrin.dot_16x1x16_uint8_int8_int32_cascadelake = _SAVED.pop("intrin")
    (alter_op.conv2d_alter_int8_common, generic.fallback_schedule_cpu_1x1_int8,
     generic.fallback_schedule_cpu_common_int8, x86.conv2d_NCHWc_int8,
     conv2d_int8.conv2d_NCHWc_int8) = _SAVED.pop("int8_blocks")
    depthwise._fallback_schedule = _SAVED.pop("depthwise")
    one_by_one._fallback_schedule, common._fallback_schedule = _SAVED.pop("float_convs")
    _SAVED.pop("int8_graph", None)
    common._schedule_conv_NCHWc_int8 = _SAVED.pop("schedule")
    one_by_one._schedule_conv_NCHWc_int8 = _SAVED.pop("schedule_1x1")
    x86.schedule_pool, x86.schedule_adaptive_pool = _SAVED.pop("pools")
    x86.conv2d_transpose_nchw, x86.schedule_conv2d_transpose_nchw = _SAVED.pop("conv_transpose")
    _SAVED.pop("mode", None)


_PATCH = Patch(_install, _uninstall)


@contextlib.contextmanager
def kernels(schedule=True, int8_graph=False):
    """Enter to build x86 int8 kernels with the changes of this module's design note.

    Parameters
    ----------
    schedule : bool or {"per_row", "per_tile"}
        ``True``: every change where the target being compiled takes it (:func:`policy`):
        ``epilogue_per_row`` or ``per_tile_accumulators`` for int8 convs,
        ``fallback_register_tile``, ``depthwise_int8_block``, ``narrow_channel_blocks``,
        ``pool_prologue_inline``, ``global_pool_channel_vector`` and
        ``conv_transpose_without_zeros``. ``False`` keeps TVM's schedules and layouts everywhere
        and only applies ``vnni_operand_types`` (VNNI buildable with LLVM 22): that is "stock TVM"
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
