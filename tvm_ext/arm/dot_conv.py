"""Int8 NCHW4c convolutions for aarch64 in register tiles of several output-channel blocks by
four-pixel groups: ``sdot``/``udot`` (+dotprod) or, without a dot product, ``smull`` + ``sadalp``.

TVM 0.19's arm_cpu NCHWc int8 schedule sums a pixel's whole reduction into one accumulator, so its
dot products form one dependency chain. Here four neighbouring output pixels' 4 input channels
(NCHW4c data) are one 16-byte load and one ``OIHW1i4o4i`` weight load is 4 output by 4 input
channels. With a dot product, the lane-indexed ``sdot v.4s, w.16b, x.4b[p]`` multiplies them for
pixel p; without, ``smull`` multiplies two pixels' 8 bytes by one output channel's 4 weights (``dup``
to both words) and ``sadalp`` adds pairs of the int16 products into int32 accumulators (exact)::

    # T[n, o, y, q, p, c] = sum_{i, ky, kx, k} X[n, i, y*sh + ky*dh, (4q + p)*sw + kx*dw, k]
    #                                        * W[o, i, ky, kx, 0, c, k]               (sdot, exact)
    # U[n, o, y, q, c, 2p + h] = sum_{i, ky, kx, r < 2} X[..., (4q + p)*sw + kx*dw, 2h + r]
    #                                                 * W[o, i, ky, kx, 0, c, 2h + r]  (smull + sadalp)
    # out[n, o, y, x, c] = T[n, o, y, x // 4, x % 4, c] = U[..., x // 4, c, 2(x % 4)] + U[..., 2(x % 4) + 1]

The tile, ``B`` output blocks by ``Q`` pixel groups of ``R`` output rows, keeps its accumulators in
registers across the reduction and the fused epilogue is computed from them in the same kernel. Rows
are padded to whole tiles with columns that are computed and dropped; strided convs gather their
columns first.
Tile rule and measurements: docs/arm-kernels.md.
"""
from __future__ import annotations

import tvm
from tvm import autotvm, te, topi
from tvm.topi.nn.utils import get_pad_tuple
from tvm.topi.utils import get_const_tuple, traverse_inline

from .tuning import DOT_TASK, WIDENING_TASK

__all__ = ["FORMS", "LANES", "OUT_BLOCKS", "check_operands", "output_width", "conv2d_nchwc_dot",
           "conv2d_nchwc_widening", "schedule_conv2d_dot", "schedule_conv2d_widening", "schedule_conv2d_tiles",
           "register_tile"]

#: Channels per NCHWc block of data and output, int8 lanes per dot product, pixels per data load.
LANES = 4
#: Output blocks the kernels write: NCHW4c, or NCHW8c (two 4-channel halves per block) where the
#: 8-bit matrix-multiply convs around it read and write NCHW8c (+i8mm).
OUT_BLOCKS = (LANES, 2 * LANES)

#: The instructions of each form per operand dtype (data and weights alike).
FORMS = {
    "sdot": {"int8": "llvm.aarch64.neon.sdot", "uint8": "llvm.aarch64.neon.udot"},
    "smull": {"int8": ("llvm.aarch64.neon.smull.v8i16", "llvm.aarch64.neon.saddlp.v4i32.v8i16"),
              "uint8": ("llvm.aarch64.neon.umull.v8i16", "llvm.aarch64.neon.uaddlp.v4i32.v8i16")},
}

_TAG = "conv2d_nchwc_tiles"

#: Vector registers a tile may hold (accumulators, weight, broadcast and data registers), of 32.
_REGISTERS = 28
#: Instructions per reduction step besides the tile's own (loop counter, addresses, branch).
_LOOP_COST = 4
#: Taps (input-channel blocks x kernel columns) unrolled per iteration of the reduction loop: a 1x1
#: conv's loop of one tile (16 ``sdot``, 6 other instructions) runs at 89% of Neoverse-N1's peak in
#: llvm-mca's model, four tiles per iteration at 97% or more.
_UNROLL_TAPS = 4


def _registers(form: str, b: int, q: int) -> int:
    if form == "sdot":  # 4 accumulators per block and group, a weight per block, a data load per group
        return LANES * b * q + b + q
    # 8 accumulators per block and group; a weight load and its 4 dups per block; two data loads per group
    return 2 * LANES * b * q + (LANES + 1) * b + 2 * q


def _cycles(form: str, b: int, q: int) -> float:
    """Cycles per reduction step on two vector pipes, three instructions dispatched a cycle, over the
    cycles its multiplies need at the peak (sdot on both pipes, smull on one)."""
    if form == "sdot":
        vector, others, ideal = LANES * b * q, b + q + _LOOP_COST, LANES * b * q / 2
    else:
        vector, others, ideal = 4 * LANES * b * q + LANES * b, b + 2 * q + _LOOP_COST, 2 * LANES * b * q
    return max(vector / 2, (vector + others) / 3, ideal) / ideal


def _tiles(form: str, oc_chunks: int, quads: int, halves: int = 1, out_height: int = 1):
    """``(B, Q, R)`` tiles that fit the registers: R output rows (dividing ``out_height``) of Q groups each,
    whose R x Q groups count as groups of one row."""
    for b in range(halves, oc_chunks + 1, halves):  # whole output blocks of 4 x halves channels
        if oc_chunks % b == 0:
            yield from ((b, q, r) for r in range(1, out_height + 1) if out_height % r == 0
                        for q in range(1, quads + 1) if _registers(form, b, q * r) <= _REGISTERS)


def register_tile(oc_chunks: int, quads: int, form: str = "sdot", halves: int = 1, out_height: int = 1) -> tuple:
    """``(B, Q, R)``: the tile of ``B`` blocks of 4 output channels (dividing ``oc_chunks``, a multiple of
    ``halves``: whole NCHW8c blocks when 2) by ``Q`` four-pixel groups of ``R`` output rows (dividing
    ``out_height``) for rows of ``quads`` groups that costs least: predicted cycles per step over the
    multiplies' own, times the share of the row that is padding. A tile's weights serve its R rows as
    they serve its Q groups, so rows of 7 groups take Q = 1, R = 2 where Q = 2 would compute 8. Ties go to
    more output blocks, then to fewer rows::

        # cost(B, Q, R) = ceil(quads / Q) * Q / quads * cycles(B, Q * R), registers(B, Q * R) <= 28
    """
    def cost(t):
        padded = -(-quads // t[1]) * t[1]
        return round(padded / quads * _cycles(form, t[0], t[1] * t[2]), 9), -t[0], t[2]
    return min(_tiles(form, oc_chunks, quads, halves, out_height), key=cost)


def _intrin(form: str, dtype: str):
    """One reduction step of 4 input channels for 4 pixels and 4 output channels of the form."""
    a = te.placeholder((LANES, LANES), dtype, name="a")  # pixel, input channel
    w = te.placeholder((LANES, LANES), dtype, name="w")  # output channel, input channel
    if form == "sdot":
        k = te.reduce_axis((0, LANES), name="k")
        t = te.compute((LANES, LANES), lambda p, c: te.sum(a[p, k].astype("int32") * w[c, k].astype("int32"),
                                                           axis=k), name="t")
    else:
        r = te.reduce_axis((0, 2), name="r")
        t = te.compute((LANES, 2 * LANES), lambda c, j: te.sum(
            a[j // 2, 2 * (j % 2) + r].astype("int32") * w[c, 2 * (j % 2) + r].astype("int32"), axis=r), name="t")
    binds = {x: tvm.tir.decl_buffer(x.shape, x.dtype, name=x.op.name + "_buf", offset_factor=1,
                                    strides=[int(x.shape[1]), 1], scope="local" if x is t else "global")
             for x in (a, w, t)}
    vec, zero = f"{dtype}x16", tvm.tir.const(0, "int32x4")

    def _lanes(x, lanes):
        return tvm.tir.Shuffle([x], [tvm.tir.const(i, "int32") for i in lanes])

    def _steps(ins, outs, first):
        words = tvm.tir.call_intrin("int32x4", "tir.reinterpret", ins[0 if form == "sdot" else 1].vload([0, 0], vec))
        if form == "sdot":
            weights = ins[1].vload([0, 0], vec)
            for p in range(LANES):  # pixel p's 4 bytes in every lane: LLVM's lane-indexed form, sdot ..., x.4b[p]
                dup = tvm.tir.call_intrin(vec, "tir.reinterpret", _lanes(words, [p] * LANES))
                acc = zero if first else outs[0].vload([p, 0], "int32x4")
                yield [p, 0], tvm.tir.call_llvm_pure_intrin("int32x4", FORMS[form][dtype], tvm.tir.const(3, "uint32"),
                                                            acc, weights, dup)
            return
        mul, pairs = FORMS[form][dtype]
        halves = [ins[0].vload([2 * h, 0], f"{dtype}x8") for h in range(2)]  # pixels 0-1, 2-3: two 8-byte loads
        for c in range(LANES):  # output channel c's 4 weights in both words of a 64-bit register
            dup = tvm.tir.call_intrin(f"{dtype}x8", "tir.reinterpret", _lanes(words, [c] * 2))
            for h in range(2):
                prod = tvm.tir.call_llvm_pure_intrin(f"{dtype[:-1]}16x8", mul, tvm.tir.const(2, "uint32"),
                                                     halves[h], dup)
                summed = tvm.tir.call_llvm_pure_intrin("int32x4", pairs, tvm.tir.const(1, "uint32"), prod)
                yield [c, LANES * h], summed if first else outs[0].vload([c, LANES * h], "int32x4") + summed

    def _body(ins, outs):
        def _emit(kind):
            ib = tvm.tir.ir_builder.create()
            if kind == "reset":
                for i in range(int(t.shape[0])):
                    for j in range(0, int(t.shape[1]), LANES):
                        ib.emit(outs[0].vstore([i, j], zero))
            else:
                for index, value in _steps(ins, outs, kind == "body"):
                    ib.emit(outs[0].vstore(index, value))
            return ib.get()

        return _emit("body"), _emit("reset"), _emit("update")

    return te.decl_tensor_intrin(t.op, _body, binds=binds, default_buffer_params={"offset_factor": 1})


def output_width(width: int, kernel_width: int, stride: int, padding, dilation: int) -> int:
    """The output row width of a conv on rows of ``width`` pixels (``padding`` as ``nn.conv2d`` has it)."""
    _, left, _, right = get_pad_tuple(padding, (kernel_width, kernel_width))
    return (width + left + right - (kernel_width - 1) * dilation - 1) // stride + 1


def check_operands(data_shape, kernel_shape, data_dtype, kernel_dtype, out_dtype="int32", out_width=None) -> str:
    """Why these kernels cannot take the operands, or ``""``: NCHW4c data, ``OIHW1i4o4i`` weights, one dtype,
    output rows of at least 4 pixels (a tile computes groups of 4 neighbours; a narrower row is all tile edge)."""
    if out_width is not None and out_width < LANES:
        return f"output rows of {out_width} pixels are narrower than a group of {LANES}"
    if len(data_shape) != 5 or data_shape[4] != LANES:
        return f"data {tuple(data_shape)} is not NCHW4c"
    if (len(kernel_shape) != 7 or kernel_shape[4] != 1 or kernel_shape[5] not in OUT_BLOCKS
            or kernel_shape[6] != LANES or kernel_shape[1] != data_shape[1]):
        return (f"weights {tuple(kernel_shape)} are not OIHW1i4o4i or OIHW1i8o4i for {data_shape[1] * LANES} "
                "input channels")
    if data_dtype != kernel_dtype or data_dtype not in FORMS["sdot"] or out_dtype not in ("int32", ""):
        return f"no instruction takes {data_dtype} x {kernel_dtype} -> {out_dtype}"
    return ""


def _conv(form, cfg, data, kernel, strides, padding, dilation, out_dtype):
    n, ic_chunks, height, width, _ = get_const_tuple(data.shape)
    oc_chunks, _, kh, kw, _, out_block, _ = get_const_tuple(kernel.shape)
    sh, sw = strides if isinstance(strides, (tuple, list)) else (strides, strides)
    dh, dw = dilation if isinstance(dilation, (tuple, list)) else (dilation, dilation)
    pt, pl, pb, pr = get_pad_tuple(padding, ((kh - 1) * dh + 1, (kw - 1) * dw + 1))
    out_h = (height + pt + pb - (kh - 1) * dh - 1) // sh + 1
    out_w = (width + pl + pr - (kw - 1) * dw - 1) // sw + 1
    why = check_operands(get_const_tuple(data.shape), get_const_tuple(kernel.shape), data.dtype, kernel.dtype,
                         out_dtype, out_w)
    if why:
        raise ValueError(f"conv2d_nchwc_{form}: {why}")
    quads, halves = -(-out_w // LANES), out_block // LANES  # B counts blocks of 4 output channels
    tiles_fit = list(_tiles(form, oc_chunks * halves, quads, halves, out_h))
    cfg.define_knob("tile_blocks", sorted({b for b, _, _ in tiles_fit}))
    cfg.define_knob("tile_quads", sorted({q for _, q, _ in tiles_fit}))
    cfg.define_knob("tile_rows", sorted({r for _, _, r in tiles_fit}))
    if cfg.is_fallback:
        blocks, groups, rows = register_tile(oc_chunks * halves, quads, form, halves, out_h)
        cfg["tile_blocks"] = autotvm.task.space.OtherOptionEntity(blocks)
        cfg["tile_quads"] = autotvm.task.space.OtherOptionEntity(groups)
        cfg["tile_rows"] = autotvm.task.space.OtherOptionEntity(rows)
    blocks, groups = cfg["tile_blocks"].val, cfg["tile_quads"].val
    # a record without the rows knob (its space had none) has one row per tile
    rows = cfg["tile_rows"].val if "tile_rows" in getattr(cfg, "_entity_map", {"tile_rows": 0}) else 1
    if _registers(form, blocks, groups * rows) > _REGISTERS:
        raise autotvm.task.space.InstantiationError(f"tile {blocks} x {groups} x {rows} rows needs more registers")
    if out_h % rows:
        raise autotvm.task.space.InstantiationError(f"{rows} rows per tile do not divide {out_h} output rows")
    quads = -(-quads // groups) * groups  # whole tiles: the extra columns read zero padding and are dropped
    pr = max(pr, (LANES * quads - 1) * sw + (kw - 1) * dw + 1 - width - pl)
    if pt or pb or pl or pr:
        data = topi.nn.pad(data, [0, 0, pt, pl, 0], [0, 0, pb, pr, 0], name="data_pad")
    if sw == 1:
        def _a(b, i, y, x, kx, k):
            return data[b, i, y, x + kx * dw, k]
    else:  # 4 strided pixels gathered next to each other: one 16-byte load
        gathered = te.compute((n, ic_chunks, data.shape[2], kw, LANES * quads, LANES),
                              lambda b, i, y, kx, x, k: data[b, i, y, x * sw + kx * dw, k], name="data_cols")

        def _a(b, i, y, x, kx, k):
            return gathered[b, i, y, kx, x, k]
    ic, ry, rx = (te.reduce_axis((0, e), name=nm) for e, nm in ((ic_chunks, "ic"), (kh, "ry"), (kw, "rx")))

    def _mul(b, o, y, q, p, c, k):  # o: a block of 4 output channels (half o % halves of block o // halves)
        return (_a(b, ic, y * sh + ry * dh, LANES * q + p, rx, k).astype("int32")
                * kernel[o // halves, ic, ry, rx, 0, LANES * (o % halves) + c, k].astype("int32"))

    attrs = {"tile_blocks": blocks, "tile_quads": groups, "tile_rows": rows, "form": form}
    shape = (n, oc_chunks, out_h, out_w, out_block)
    if form == "sdot":
        rk = te.reduce_axis((0, LANES), name="rk")
        tiles = te.compute((n, oc_chunks * halves, out_h, quads, LANES, LANES), lambda b, o, y, q, p, c: te.sum(
            _mul(b, o, y, q, p, c, rk), axis=[ic, ry, rx, rk]), name="conv_tiles")
        return te.compute(shape, lambda b, o, y, x, c: tiles[b, o * halves + c // LANES, y, x // LANES, x % LANES,
                                                               c % LANES],
                          name="conv_nchwc", tag=_TAG, attrs=attrs)
    rr = te.reduce_axis((0, 2), name="rr")
    tiles = te.compute((n, oc_chunks * halves, out_h, quads, LANES, 2 * LANES), lambda b, o, y, q, c, j: te.sum(
        _mul(b, o, y, q, j // 2, c, 2 * (j % 2) + rr), axis=[ic, ry, rx, rr]), name="conv_tiles")

    def _out(b, o, y, x, c):
        t = (b, o * halves + c // LANES, y, x // LANES, c % LANES)
        return tiles[t + (2 * (x % LANES),)] + tiles[t + (2 * (x % LANES) + 1,)]
    return te.compute(shape, _out, name="conv_nchwc", tag=_TAG, attrs=attrs)


@autotvm.register_topi_compute(DOT_TASK)
def conv2d_nchwc_dot(cfg, data, kernel, strides, padding, dilation, out_dtype="int32"):
    """The NCHW4c int8 conv in register tiles with ``sdot``/``udot`` (module note).

    Parameters
    ----------
    cfg : autotvm ConfigEntity
        Knobs ``tile_blocks`` (output blocks per tile) and ``tile_quads`` (four-pixel groups per tile),
        which ``tvm-ext tune --rpc`` searches; the fallback is :func:`register_tile`.
    data : te.Tensor
        ``[N, C/4, H, W, 4]``, int8 or uint8.
    kernel : te.Tensor
        ``[O/4, C/4, KH, KW, 1, 4, 4]``, the data's dtype.
    strides, padding, dilation
        As ``nn.conv2d`` (padding: 1, 2 or 4 values).
    out_dtype : str
        int32.

    Returns
    -------
    te.Tensor
        ``[N, O/4, OH, OW, 4]`` int32.
    """
    return _conv("sdot", cfg, data, kernel, strides, padding, dilation, out_dtype)


@autotvm.register_topi_compute(WIDENING_TASK)
def conv2d_nchwc_widening(cfg, data, kernel, strides, padding, dilation, out_dtype="int32"):
    """The same conv with ``smull``/``umull`` + ``sadalp``/``uadalp`` (no dot product); parameters as
    :func:`conv2d_nchwc_dot`."""
    return _conv("smull", cfg, data, kernel, strides, padding, dilation, out_dtype)


def _unroll_channels(ic_chunks: int, kw: int) -> int:
    """Input-channel blocks unrolled per reduction step: with the row of ``kw`` taps, up to
    :data:`_UNROLL_TAPS` tiles of multiplies per loop iteration where the channels allow it."""
    return max(d for d in range(1, ic_chunks + 1) if ic_chunks % d == 0 and (d == 1 or d * kw <= _UNROLL_TAPS))


def _schedule_producers(s, conv):
    """Padding and column gathering: whole tensors, in parallel."""
    stack = list(conv.op.input_tensors)
    while stack:
        t = stack.pop()
        if isinstance(t.op, te.ComputeOp) and t.op.name in ("data_pad", "data_cols"):
            axes = s[t].op.axis
            s[t].parallel(s[t].fuse(*axes[:3]))
            stack.extend(t.op.input_tensors)


def schedule_conv2d_tiles(outs):
    """Schedule either form with its fused epilogue: per tile of the output, the tile's accumulators in
    registers across the reduction, the reduction outside the tile."""
    outs = [outs] if isinstance(outs, te.Tensor) else outs
    s = te.create_schedule([x.op for x in outs])

    def _callback(op):
        if op.tag != _TAG:
            return
        conv, tiles = op.output(0), op.input_tensors[0]
        blocks, groups, form = int(op.attrs["tile_blocks"]), int(op.attrs["tile_quads"]), str(op.attrs["form"])
        rows = int(op.attrs["tile_rows"])
        _schedule_producers(s, tiles)
        last = outs[0]
        if conv.op != last.op:
            s[conv].compute_inline()
        s[tiles].set_scope("local")
        b, o, y, x, c = s[last].op.axis
        oo, oi = s[last].split(o, factor=blocks * LANES // int(last.shape[4]))
        yo, yi = s[last].split(y, factor=rows)
        xo, xi = s[last].split(x, factor=LANES * groups)
        s[last].reorder(b, oo, yo, xo, oi, yi, xi, c)
        s[last].parallel(s[last].fuse(b, oo, yo))
        s[last].vectorize(c)
        s[tiles].compute_at(s[last], xo)
        tb, to, ty, tq, t1, t2 = s[tiles].op.axis
        ic, ry, rx, rk = s[tiles].op.reduce_axis
        ico, ici = s[tiles].split(ic, factor=_unroll_channels(int(ic.dom.extent), int(rx.dom.extent)))
        s[tiles].reorder(tb, ico, ry, ici, rx, ty, to, tq, t1, t2, rk)
        for axis in (ici, rx, ty, to, tq):
            s[tiles].unroll(axis)
        s[tiles].tensorize(t1, _intrin(form, tiles.op.input_tensors[-1].dtype))

    traverse_inline(s, outs[0].op, _callback)
    return s


@autotvm.register_topi_schedule(DOT_TASK)
def schedule_conv2d_dot(cfg, outs):  # noqa: ARG001 (the tile is in the compute's attributes)
    """Schedule :func:`conv2d_nchwc_dot` (:func:`schedule_conv2d_tiles`)."""
    return schedule_conv2d_tiles(outs)


@autotvm.register_topi_schedule(WIDENING_TASK)
def schedule_conv2d_widening(cfg, outs):  # noqa: ARG001
    """Schedule :func:`conv2d_nchwc_widening` (:func:`schedule_conv2d_tiles`)."""
    return schedule_conv2d_tiles(outs)
