"""The TOPI schedules :func:`tvm_ext.x86.int8_conv.kernels` puts in place of TVM's: int8 convs per
output row or per register tile, and the VNNI dot product with LLVM 22's operand types (pools and
injective ops: :mod:`tvm_ext.x86.block_vectors`).

Which one a conv takes is decided per instruction-set class at schedule time
(:func:`tvm_ext.x86.int8_policy.policy` of the target being compiled); the names of the changes
(``epilogue_per_row``, ``per_tile_accumulators``, ``tile_oc_chunks``, ``tile_budget_1x1``, ``tile_chains``,
``parallel_rows_first``, ``weights_once``, ``vnni_operand_types``, ``vnni_24_lanes``) and their measurements are
in docs/x86-kernels.md.
"""
from __future__ import annotations

from . import narrow_by_packs
from .int8_policy import SHORT_REDUCTION, WEIGHTS_ONCE_ITEMS, needs_operand_fix, policy, vnni_ready
from .tile_rules import (groups_in_turn, pass_blocks, rows_first, tile_chains, tile_chunks_shape, tile_width,
                         weights_once_rows, whole_row_over_budget)

__all__ = ["dot_u8s8_vnni"]


#: While :func:`tvm_ext.x86.int8_conv.kernels` is entered: TVM's functions it replaced (the schedules
#: here fall back to TVM's own, ``"schedule"`` and ``"schedule_1x1"``) and the entered ``"mode"``.
_SAVED: dict = {}


def dot_u8s8_vnni(lanes: int = 16):
    """``int32[lanes] += sum_k uint8[4] * int8[lanes][4]`` as one ``vpdpbusd`` (LLVM 22 operand types).

    ``lanes`` 16: a zmm ``vpdpbusd``, the same computation, buffers and body/reset/update protocol
    as TVM's ``dot_16x1x16_uint8_int8_int32_cascadelake``, so TVM's int8 schedules tensorize with
    it unchanged. ``lanes`` 8: the ymm form (AVX-512 VL + VNNI), for int8 convs whose output block
    is 8 (``narrow_channel_blocks`` on AVX-512 VNNI). On LLVM <= 21 the byte operands are passed
    as ``int32`` vectors, the intrinsic's old signature.
    """
    import tvm
    from tvm import te

    if lanes not in (8, 16, 24):
        raise ValueError(f"dot_u8s8_vnni: lanes must be 8, 16 or 24, got {lanes}")
    group = 4  # 4 bytes reduced into each int32 output
    data = te.placeholder((group,), dtype="uint8", name="data")
    kernel = te.placeholder((lanes, group), dtype="int8", name="kernel")
    k = te.reduce_axis((0, group), name="k")
    out = te.compute(
        (lanes,),
        lambda i: te.sum(data[k].astype("int32") * kernel[i, k].astype("int32"), axis=k),
        name="C",
    )
    a_buf = tvm.tir.decl_buffer(data.shape, dtype="uint8", name="a_buffer", offset_factor=1, strides=[1])
    b_buf = tvm.tir.decl_buffer(
        kernel.shape, dtype="int8", name="b_buffer", offset_factor=1, strides=[te.var("ldw"), 1]
    )
    # 24 lanes: a zmm and a ymm vpdpbusd on lanes 0-15 and 16-23 (both read the same data word)
    parts = ((0, 16), (16, 8)) if lanes == 24 else ((0, lanes),)

    def intrin_func(ins, outs):
        def emit(kind):  # kind: "body" (c = dot), "reset" (c = 0), "update" (c += dot)
            ib = tvm.tir.ir_builder.create()
            # the 4 data bytes as one int32, broadcast to every lane of each part below
            word = tvm.tir.call_intrin("int32", "tir.reinterpret", ins[0].vload([0], "uint8x4"))
            for first, n in parts:
                acc_t = f"int32x{n}"
                byte_t = f"int8x{4 * n}" if needs_operand_fix() else acc_t
                if kind == "reset":
                    ib.emit(outs[0].vstore(first, tvm.tir.const(0, acc_t)))
                    continue
                a = word.astype(acc_t)
                if byte_t != acc_t:
                    a = tvm.tir.call_intrin(byte_t, "tir.reinterpret", a)
                b = ins[1].vload([first, 0], f"int8x{4 * n}")
                if byte_t != b.dtype:
                    b = tvm.tir.call_intrin(byte_t, "tir.reinterpret", b)
                acc = outs[0].vload([first], acc_t) if kind == "update" else tvm.tir.const(0, acc_t)
                dot = tvm.tir.call_llvm_pure_intrin(
                    acc_t, f"llvm.x86.avx512.vpdpbusd.{32 * n}", tvm.tir.const(3, "uint32"), acc, a, b
                )
                ib.emit(outs[0].vstore(first, dot))
            return ib.get()

        return emit("body"), emit("reset"), emit("update")

    return te.decl_tensor_intrin(
        out.op, intrin_func, binds={data: a_buf, kernel: b_buf}, default_buffer_params={"offset_factor": 1}
    )


def _dot_for_block(oc_bn: int) -> tuple:
    """``(int32 lanes, tensor intrinsic)`` an int8 conv with output block ``oc_bn`` tensorizes
    with on the target being compiled: TVM's (the SIMD width's) unless the block is narrower than
    that, which only ``narrow_channel_blocks`` gives (8 on AVX-512 VNNI: the ymm ``vpdpbusd``)."""
    from tvm.target.x86 import get_simd_32bit_lanes
    from tvm.topi.x86.tensor_intrin import dot_16x1x16_uint8_int8_int32

    lanes = get_simd_32bit_lanes()
    if oc_bn in (8, 24) and vnni_ready(_current_target()):  # VNNI: 16 lanes; 24 = a zmm and a ymm
        return oc_bn, dot_u8s8_vnni(oc_bn)
    return lanes, dot_16x1x16_uint8_int8_int32()


def _registers(oc_bn: int, lanes: int) -> int:
    """Vector registers one pixel's accumulators of an output block of ``oc_bn`` take with
    ``lanes``-lane dot products: one per dot, two for the 24-lane dot (a zmm and a ymm)."""
    return oc_bn // lanes * (2 if lanes == 24 else 1)


def _chosen_schedule(kind: str) -> tuple:
    """``(schedule, accumulators, chunks, chains)`` for the target being compiled: ``kind`` ``"3x3"``
    (also 7x7) takes :attr:`KernelPolicy.conv_schedule`, ``"1x1"`` :attr:`KernelPolicy.conv1x1_schedule`;
    ``kernels(schedule="per_row" | "per_tile")`` forces one (per-row has no 1x1 form: TVM's).
    ``accumulators`` is the class's tile budget, 12 where it has none (a forced per-tile);
    ``chunks`` its :attr:`KernelPolicy.tile_oc_chunks` (1 without a target), ``chains`` its
    :attr:`KernelPolicy.dot_chains` (0 without a target)."""
    import tvm

    target = tvm.target.Target.current(allow_none=True)
    pol = policy(target) if target is not None else None
    chosen = "tvm" if pol is None else (pol.conv_schedule if kind == "3x3" else pol.conv1x1_schedule)
    mode = _SAVED.get("mode")
    if mode in ("per_row", "per_tile"):  # forced, for measurements
        chosen = mode if kind == "3x3" or mode == "per_tile" else "tvm"
    accumulators = pol.tile_accumulators if pol is not None and pol.tile_accumulators else 12
    return (chosen, accumulators, (pol.tile_oc_chunks if pol is not None else 1),
            (pol.dot_chains if pol is not None else 0))


def _schedule_common_int8(s, cfg, data_vec, kernel_vec, conv_out, last):
    """TVM's x86 NCHWc int8 conv schedule, with the conv computed per output row
    (``epilogue_per_row``) or per register tile (``per_tile_accumulators``) where :func:`policy`
    says so for the target being compiled; a row tile with fewer accumulators than the class's
    ``dot_chains`` is computed per tile of several output-channel blocks (``tile_chains``)."""
    from tvm.target.x86 import get_simd_32bit_lanes
    from tvm.topi.generic import conv2d as conv2d_generic
    from tvm.topi.utils import get_const_tuple

    chosen, accumulators, max_chunks, chains = _chosen_schedule("3x3")
    lanes, intrin = _dot_for_block(get_const_tuple(conv_out.shape)[-1])
    if chosen == "per_row" and chains and _tileable(kernel_vec, conv_out, last):
        _, oc_chunks, _, out_width, oc_bn = get_const_tuple(conv_out.shape)
        registers = _registers(oc_bn, lanes)
        pixels = tile_width(out_width, registers, _wanted_width(cfg), accumulators)
        chunks = tile_chains(pixels, registers, oc_chunks, chains, max_chunks, accumulators)
        if chunks > 1 or _weights_once_rows(conv_out, 1, chunks):
            return _schedule_int8_per_tile(s, cfg, data_vec, conv_out, last, lanes, intrin, accumulators, chunks)
    if chosen == "per_row":
        return conv2d_generic.schedule_conv_NCHWc_cpu_common_int8(
            s, cfg, data_vec, kernel_vec, conv_out, last, int32_lanes=lanes, intrin=intrin, inline_fused=False)
    if chosen == "per_tile" and _tileable(kernel_vec, conv_out, last):
        return _schedule_int8_per_tile(s, cfg, data_vec, conv_out, last, lanes, intrin, accumulators)
    if lanes != get_simd_32bit_lanes():  # TVM's form, with the narrow block's intrinsic (8-lane VNNI)
        return conv2d_generic.schedule_conv_NCHWc_cpu_common_int8(
            s, cfg, data_vec, kernel_vec, conv_out, last, int32_lanes=lanes, intrin=intrin, inline_fused=True)
    return _SAVED["schedule"](s, cfg, data_vec, kernel_vec, conv_out, last)


def _tileable(kernel_vec, conv_out, last) -> bool:
    """The per-tile schedule handles NCHWc outputs of a pre-packed kernel (what AlterOpLayout
    gives); TVM's ``conv2d_nchw`` test path (kernel packed in the schedule) keeps TVM's."""
    from tvm import te

    packed_here = isinstance(kernel_vec.op, te.tensor.ComputeOp) and kernel_vec.name == "kernel_vec"
    return not packed_here and len(conv_out.shape) == 5 and len(last.shape) == 5


def _wanted_width(cfg) -> int:
    """The config's ``tile_ow`` (tuned or TVM's fallback)."""
    return cfg["tile_ow"] if isinstance(cfg["tile_ow"], int) else cfg["tile_ow"].size[-1]


def _nbytes(t) -> int:
    """Bytes of tensor ``t`` (static shape)."""
    import tvm
    from tvm.topi.utils import get_const_tuple

    size = tvm.DataType(t.dtype).bits // 8
    for d in get_const_tuple(t.shape):
        size *= d
    return size


def _rows_first(conv_out) -> bool:
    """Whether the target's class splits this conv's tiles over rows first (``parallel_rows_first``,
    :func:`tvm_ext.x86.tile_rules.rows_first`): by the bytes of its input and of its weights."""
    target = _current_target()
    if target is None or not policy(target).rows_first:
        return False
    data, kernel = conv_out.op.input_tensors[:2]
    return rows_first(_nbytes(data), _nbytes(kernel))


def _weights_once_rows(conv_out, tile_rows: int, chunks: int) -> int:
    """Output rows per block of ``conv_out``'s ``weights_once`` reduction order for the target being compiled
    (:func:`tvm_ext.x86.tile_rules.weights_once_rows`), 0 where its class or its shape keeps the reduction
    inside each tile of ``tile_rows`` rows x ``chunks`` output-channel blocks (weights not large enough
    beside the input, or a buffer of accumulators that does not fit)."""
    import tvm
    from tvm.topi.utils import get_const_tuple

    target = _current_target()
    budget = policy(target).weights_once_bytes if target is not None else 0
    if not budget:
        return 0
    data, kernel = conv_out.op.input_tensors[:2]
    _, oc_chunks, out_height, out_width, oc_bn = get_const_tuple(conv_out.shape)
    row_bytes = chunks * out_width * oc_bn * (tvm.DataType(conv_out.dtype).bits // 8)  # a row of accumulators
    least_items = max(WEIGHTS_ONCE_ITEMS, 2 * _threads())  # blocks of rows must not leave threads idle
    return weights_once_rows(_nbytes(data), _nbytes(kernel), out_height, tile_rows, oc_chunks // chunks, row_bytes,
                             budget, least_items)


def _threads() -> int:
    """Threads TVM's runtime takes in this process: ``TVM_NUM_THREADS``, else the CPUs this process may run on
    (the compiling machine's: a build for another machine's many cores should set ``TVM_NUM_THREADS``)."""
    import os

    try:
        return max(1, int(os.environ.get("TVM_NUM_THREADS", "")))
    except ValueError:
        return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def _tile_stages(s, data_vec, conv_out, last, rows, cols, chunks=1, weights_once=False):
    """The per-tile schedules' stages: the conv's output computed per ``rows x cols`` tile of the fused output
    (parallel over channel chunks and row blocks, or row blocks and channel chunks where
    :func:`_rows_first`; channel block vectorized), its accumulation stage per tile, or with
    ``weights_once`` per parallel item (a block of ``rows`` rows: the caller splits it into tiles). ``chunks``
    > 1: each tile also spans that many output-channel chunks (which it must divide). Returns the
    accumulation stage; the caller orders its reduction."""
    from tvm import autotvm, te

    by_rows = _rows_first(conv_out)
    if isinstance(s[data_vec].op, te.tensor.ComputeOp) and "pad" in data_vec.op.tag:
        batch, ic_chunk, ih, _, ic_block = s[data_vec].op.axis
        outer = (ih, ic_chunk) if by_rows else (ic_chunk, ih)  # split the same way as the tiles that read it
        s[data_vec].reorder(*outer)
        s[data_vec].parallel(s[data_vec].fuse(batch, *outer))
        if data_vec.dtype == "int16":  # data widened for a kernel packed in int16 pairs
            s[data_vec].vectorize(ic_block)
        data_vec = data_vec.op.input_tensors[0]
    if autotvm.GLOBAL_SCOPE.in_tuning and isinstance(data_vec.op, te.tensor.ComputeOp):
        s[data_vec].pragma(s[data_vec].op.axis[0], "debug_skip_region")  # a layout transform when tuning

    conv, out = conv_out, last
    acc = s.cache_write(conv, "global")

    def split_tiles(stage):
        """(batch, oc chunk group, row block) fused, or (batch, row block, oc chunk group) when
        ``by_rows``, then the tiles of a row; oc block innermost."""
        batch, oc_chunk, oh, ow, oc_block = s[stage].op.axis
        oh_outer, oh_inner = s[stage].split(oh, factor=rows)
        ow_outer, ow_inner = s[stage].split(ow, factor=cols)
        if chunks == 1:
            oc_outer, inner = oc_chunk, (oh_inner, ow_inner, oc_block)
        else:
            oc_outer, oc_inner = s[stage].split(oc_chunk, factor=chunks)
            inner = (oc_inner, oh_inner, ow_inner, oc_block)
        outer = (oh_outer, oc_outer) if by_rows else (oc_outer, oh_outer)
        s[stage].reorder(*outer, ow_outer, *inner)
        return s[stage].fuse(batch, *outer), ow_outer, oc_block

    row, tile, oc_block = split_tiles(conv)
    s[conv].vectorize(oc_block)
    if conv == out:
        s[conv].parallel(row)
    else:
        out_row, out_tile, out_block = split_tiles(out)
        s[out].vectorize(out_block)
        s[out].parallel(out_row)
        s[conv].compute_at(s[out], out_tile)
    if not weights_once:
        s[acc].compute_at(s[conv], tile)
    elif conv == out:
        s[acc].compute_at(s[conv], row)
    else:
        s[acc].compute_at(s[out], out_row)
    return acc


def _schedule_int8_per_tile(s, cfg, data_vec, conv_out, last, lanes, intrin, accumulators, chunks=1):
    """``per_tile_accumulators``: the int8 NCHWc conv computed per tile of ``reg_n`` output pixels of one row, every
    pixel's accumulators in registers (:func:`tile_width`), the epilogue applied per tile. ``chunks`` > 1
    (``tile_chains``): the tile also spans that many output-channel blocks, each reduction step updating
    all of them (more independent accumulators for the same data words).

    TVM's form (``inline_fused=True``) computes one pixel at a time: the kernel vectors are loaded
    again for every pixel and only ``oc_bn / lanes`` accumulators are live. Per row
    (``inline_fused=False``, ``epilogue_per_row``) with TVM's ``tile_ow`` (up to 28 pixels) spills on AVX2's 16
    registers. A tile reuses each kernel vector ``reg_n`` times and keeps the tile in registers.
    Same products, summed in the same order per output: bit-identical to TVM's schedule.
    """
    from tvm.topi.utils import get_const_tuple

    _, _, _, out_width, oc_bn = get_const_tuple(conv_out.shape)
    registers = _registers(oc_bn, lanes)
    reg_n = tile_width(out_width, registers, _wanted_width(cfg), accumulators)
    unroll_kw = cfg["unroll_kw"] if isinstance(cfg["unroll_kw"], (int, bool)) else cfg["unroll_kw"].val
    # several blocks per tile, or a whole row over the budget, at stride 1: kw unrolled, so neighbouring
    # kw positions share their data words (at stride 2 the unrolled tile spills)
    kernel_w, padded_w = int(conv_out.op.input_tensors[1].shape[3]), int(conv_out.op.input_tensors[0].shape[3])
    stride_one = padded_w == out_width + kernel_w - 1
    unroll_kw = unroll_kw or (stride_one and (chunks > 1 or whole_row_over_budget(
        out_width, reg_n, registers, accumulators)))

    block = _weights_once_rows(conv_out, 1, chunks)
    acc = _tile_stages(s, data_vec, conv_out, last, block or 1, reg_n, chunks, weights_once=bool(block))
    # the tile's reduction: every (kh, kw, input block) step updates all chunks x reg_n x groups accumulators
    _, oc_chunk, oh, ow, oc_block = s[acc].op.axis
    kh, kw, ic_outer, ic_f_inner, ic_s_inner = s[acc].op.reduce_axis
    oc_group, oc_lane = s[acc].split(oc_block, factor=lanes)
    steps = (ic_f_inner, kw) if unroll_kw else (kw, ic_f_inner)
    if block:  # weights_once: each (input block, kernel row) of weights serves every tile of the block's rows
        ow_outer, ow = s[acc].split(ow, factor=reg_n)
        s[acc].reorder(ic_outer, kh, oh, ow_outer, *steps, oc_chunk, ow, oc_group, oc_lane, ic_s_inner)
    else:
        s[acc].reorder(ic_outer, kh, *steps, oc_chunk, oh, ow, oc_group, oc_lane, ic_s_inner)
    if unroll_kw:
        s[acc].unroll(kw)
    if chunks > 1:
        s[acc].unroll(oc_chunk)
    s[acc].tensorize(oc_lane, intrin)
    s[acc].unroll(ow)
    s[acc].unroll(oc_group)
    return s


def _schedule_1x1_int8(s, cfg, data_vec, kernel_vec, conv_out, last):
    """TVM's x86 NCHWc int8 1x1 conv schedule, or the per-tile one (``per_tile_accumulators``)
    where :func:`policy` says so for the target being compiled."""
    from tvm.target.x86 import get_simd_32bit_lanes
    from tvm.topi.generic import conv2d as conv2d_generic
    from tvm.topi.utils import get_const_tuple

    chosen, accumulators, chunks, _ = _chosen_schedule("1x1")
    lanes, intrin = _dot_for_block(get_const_tuple(conv_out.shape)[-1])
    if chosen == "per_tile" and _tileable(kernel_vec, conv_out, last):
        return _schedule_1x1_int8_per_tile(s, cfg, data_vec, conv_out, last, lanes, intrin, accumulators, chunks)
    if lanes != get_simd_32bit_lanes():  # TVM's form, with the narrow block's intrinsic (8-lane VNNI)
        return conv2d_generic.schedule_conv_NCHWc_cpu_1x1_int8(
            s, cfg, data_vec, kernel_vec, conv_out, last, int32_lanes=lanes, intrin=intrin)
    return _SAVED["schedule_1x1"](s, cfg, data_vec, kernel_vec, conv_out, last)


def _short_reduction_budget(conv_out, accumulators: int) -> int:
    """``accumulators``, or the class's budget for a 1x1 conv whose reduction over at most
    :data:`.int8_policy.SHORT_REDUCTION` input channels LLVM unrolls into the tile loop beside the
    epilogue (``tile_budget_1x1``)."""
    from tvm.topi.utils import get_const_int

    target = _current_target()
    short = policy(target).tile_accumulators_1x1 if target is not None else 0
    if not short:
        return accumulators
    channels = 1
    for axis in conv_out.op.reduce_axis[2:]:  # kh, kw, then the input channels' outer, middle and inner
        channels *= get_const_int(axis.dom.extent)
    return min(accumulators, short) if channels <= SHORT_REDUCTION else accumulators


def _schedule_1x1_int8_per_tile(s, cfg, data_vec, conv_out, last, lanes, intrin, accumulators, max_chunks=1):
    """``per_tile_accumulators`` for 1x1 convs: the conv computed per tile of ``rows x cols`` output pixels
    (:func:`tvm_ext.x86.tile_rules.tile_shape`), accumulators in registers, the epilogue applied per tile.

    TVM's 1x1 form accumulates a block of ``tile_oh`` whole rows into a buffer, copies it into the
    conv's output buffer, and runs the epilogue over that: two extra passes over int32 values per
    output. With ``max_chunks`` (``tile_oc_chunks``) > 1 a tile may also span several output-channel chunks
    (:func:`tile_chunks_shape`), so each data word loaded serves several dot products; where the width
    leaves few pixels per tile, the tile may instead take its accumulator groups in turn
    (:func:`groups_in_turn`). Same products, summed in the same order per output: bit-identical to
    TVM's schedule.
    """
    from tvm.topi.utils import get_const_int, get_const_tuple

    _, oc_chunks, out_height, out_width, oc_bn = get_const_tuple(conv_out.shape)
    groups = _registers(oc_bn, lanes)
    accumulators = _short_reduction_budget(conv_out, accumulators)
    wanted_rows = cfg["tile_oh"] if isinstance(cfg["tile_oh"], int) else cfg["tile_oh"].val
    wanted_cols = _wanted_width(cfg)
    target = _current_target()
    store_run = narrow_by_packs.GROUP if target is not None and narrow_by_packs.applies(target) else 1
    chunks, rows, cols = tile_chunks_shape(out_height, out_width, oc_chunks, groups, (wanted_rows, wanted_cols),
                                           max_chunks, accumulators, store_run)

    # groups in turn split the tile's dot products by lane group: not a 24-lane dot's zmm and ymm halves
    in_turn = groups_in_turn(out_height, out_width, groups, rows * cols, accumulators) \
        if chunks == 1 and oc_bn // lanes > 1 else None
    if in_turn:
        rows, cols = in_turn

    block = 0 if in_turn else _weights_once_rows(conv_out, rows, chunks)
    acc = _tile_stages(s, data_vec, conv_out, last, block or rows, cols, chunks, weights_once=bool(block))
    _, oc_chunk, oh, ow, oc_block = s[acc].op.axis
    kh, kw, ic_outer, ic_f_inner, ic_s_inner = s[acc].op.reduce_axis
    oc_group, oc_lane = s[acc].split(oc_block, factor=lanes)
    if block:  # weights_once: each pass's input blocks of weights serve every tile of the block's rows
        oh_outer, oh = s[acc].split(oh, factor=rows)
        ow_outer, ow = s[acc].split(ow, factor=cols)
        ic_pass, ic_outer = s[acc].split(ic_outer, factor=pass_blocks(
            get_const_int(ic_outer.dom.extent), get_const_int(ic_f_inner.dom.extent)))
        s[acc].reorder(kh, kw, ic_pass, oh_outer, ow_outer, ic_outer, ic_f_inner, oc_chunk, oh, ow, oc_group,
                       oc_lane, ic_s_inner)
        if chunks > 1:
            s[acc].unroll(oc_chunk)
    elif in_turn:  # one group's accumulators at a time, each its own pass over the reduction
        s[acc].reorder(oc_group, kh, kw, ic_outer, ic_f_inner, oh, ow, oc_lane, ic_s_inner)
    elif chunks == 1:
        s[acc].reorder(kh, kw, ic_outer, ic_f_inner, oh, ow, oc_group, oc_lane, ic_s_inner)
    else:  # every reduction step updates the whole tile: rows x cols pixels x C chunks
        s[acc].reorder(kh, kw, ic_outer, ic_f_inner, oc_chunk, oh, ow, oc_group, oc_lane, ic_s_inner)
        s[acc].unroll(oc_chunk)
    s[acc].tensorize(oc_lane, intrin)
    s[acc].unroll(oh)
    s[acc].unroll(ow)
    if not in_turn:
        s[acc].unroll(oc_group)
    return s


def _current_target():
    import tvm

    return tvm.target.Target.current(allow_none=True)
