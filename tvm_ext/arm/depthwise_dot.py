"""8-bit depthwise convs in NCHWbc blocks (b = 4 or 8) for aarch64 with a dot product: ``sdot``/``udot``
(+dotprod), ``usdot`` for uint8 x int8 (+i8mm), one instruction per 4 channels and 4 adjacent taps.

Four adjacent pixels of a row are ``4b`` contiguous bytes: one load, permuted in registers (``tbl``) to
channel-major order, then one dot per 4 channels. Taps past ``kw`` have zero weights::

    xp[n, C, y, x, c] = x[n, C, y - top, x - left, c]     (zero outside; once per conv, a vector copy)
    wg[C, q, ky, c, t] = w[C, 0, ky, 4q + t, 0, c]          (zero for 4q + t >= kw)
    out[n, C, y, x, c] = sum_{q, ky, t} xp[n, C, y*sh + ky, x*sw + 4q + t, c] * wg[C, q, ky, c, t]

A tile of ``R`` output rows of one pixel keeps its accumulators in registers: each of its
``(R - 1)*sh + kh`` input rows is loaded and permuted once and feeds the dots of every output row
that reads it (:func:`tile_rows`). That loop runs over a segment of a row (up to 16 pixels), then the
fused epilogue over the segment's outputs. Measurements and the rule: docs/arm-kernels.md, "Depthwise
convs as a dot over 4 taps".
"""
from __future__ import annotations

import tvm
from tvm import te, topi
from tvm.topi.nn.utils import get_pad_tuple
from tvm.topi.utils import get_const_tuple, traverse_inline

__all__ = ["TAPS", "INSTRUCTIONS", "check", "tile_rows", "depthwise_conv2d_nchwc_dot",
           "schedule_depthwise_conv2d_nchwc_dot"]

#: Taps (and channels) per 32-bit lane of one dot instruction.
TAPS = 4
#: ``(data dtype, kernel dtype) -> (LLVM intrinsic, needs +i8mm)``.
INSTRUCTIONS = {("int8", "int8"): ("llvm.aarch64.neon.sdot", False),
                ("uint8", "uint8"): ("llvm.aarch64.neon.udot", False),
                ("uint8", "int8"): ("llvm.aarch64.neon.usdot", True)}
#: Channel blocks the kernel takes (whole 4-channel lane groups).
BLOCKS = (4, 8)
#: Output rows per tile at most, and vector registers a tile may hold (accumulators, weights, the loaded
#: row, its permutations and their byte indices), of 32.
_MAX_ROWS = 8
_REGISTERS = 28
#: Output pixels of a row per segment at most: the tile's loop runs over a segment's pixels, storing each
#: pixel's accumulators, then the fused epilogue runs over the segment's ``R x segment`` outputs.
_SEGMENT = 16
_TAG = "depthwise_conv2d_nchwc_dot"


def check(data_shape, kernel_shape, data_dtype, kernel_dtype, out_dtype, dilation, has_i8mm) -> str:
    """Why the kernel cannot take this ``contrib_depthwise_conv2d_NCHWc``, or ``""``."""
    if len(data_shape) != 5 or data_shape[4] not in BLOCKS:
        return f"data {tuple(data_shape)} is not NCHW4c or NCHW8c"
    if len(kernel_shape) != 6 or kernel_shape[1] != 1 or kernel_shape[4] != 1 or kernel_shape[5] != data_shape[4]:
        return f"weights {tuple(kernel_shape)} are not OIHW1i{data_shape[4]}o with channel multiplier 1"
    if tuple(dilation) != (1, 1):
        return f"dilation {tuple(dilation)}"
    form = INSTRUCTIONS.get((data_dtype, kernel_dtype))
    if form is None or out_dtype not in ("int32", ""):
        return f"no dot instruction takes {data_dtype} x {kernel_dtype} -> {out_dtype}"
    if form[1] and not has_i8mm:
        return f"{data_dtype} x {kernel_dtype} needs usdot (+i8mm)"
    return ""


def tile_rows(out_height: int, kernel_height: int, block: int) -> int:
    """Output rows per tile: the largest divisor of ``out_height`` up to :data:`_MAX_ROWS` whose
    registers fit (``R`` accumulators and ``kh`` weights per 4 channels, the row and its permutations)."""
    groups = block // TAPS
    fits = [r for r in range(1, _MAX_ROWS + 1)
            if out_height % r == 0 and groups * (r + kernel_height + 3) <= _REGISTERS]
    return max(fits, default=1)


def _intrin(rows: int, sh: int, kh: int, block: int, data_dtype: str, kernel_dtype: str):
    """``out[r, 0, c] (+)= sum_{ky, t} d[r*sh + ky, t, c] * w[ky, c, t]`` for one pixel of ``rows`` output
    rows and one block: each input row loaded and permuted once (module note)."""
    in_rows = (rows - 1) * sh + kh
    d = te.placeholder((in_rows, TAPS, block), data_dtype, name="d")
    w = te.placeholder((kh, block, TAPS), kernel_dtype, name="w")
    ky, t = te.reduce_axis((0, kh), name="ky"), te.reduce_axis((0, TAPS), name="t")
    out = te.compute((rows, 1, block), lambda r, z, c: te.sum(
        d[r * sh + ky, t, c].astype("int32") * w[ky, c, t].astype("int32"), axis=[ky, t]), name="out")
    binds = {d: tvm.tir.decl_buffer(d.shape, d.dtype, name="d_buf", offset_factor=1,
                                    strides=[te.var("row_stride"), block, 1]),
             w: tvm.tir.decl_buffer(w.shape, w.dtype, name="w_buf", offset_factor=1, strides=[block * TAPS, TAPS, 1]),
             out: tvm.tir.decl_buffer(out.shape, "int32", name="out_buf", offset_factor=1, scope="local",
                                      strides=[te.var("out_stride"), te.var("pixel_stride"), 1])}
    name, _ = INSTRUCTIONS[(data_dtype, kernel_dtype)]
    groups, zero = block // TAPS, tvm.tir.const(0, "int32x4")
    # a row's 4 pixels x b channels [t][c] -> channel group g's [c][t]: one tbl per group
    orders = [[tvm.tir.const(t * block + TAPS * g + c, "int32") for c in range(TAPS) for t in range(TAPS)]
              for g in range(groups)]

    def _emit(ins, outs, kind):
        ib = tvm.tir.ir_builder.create()
        if kind == "reset":
            for r in range(rows):
                for g in range(groups):
                    ib.emit(outs[0].vstore([r, 0, TAPS * g], zero))
            return ib.get()
        acc = [[outs[0].vload([r, 0, TAPS * g], "int32x4") if kind == "update" else zero for g in range(groups)]
               for r in range(rows)]
        weights = [[ins[1].vload([k, TAPS * g, 0], f"{kernel_dtype}x16") for g in range(groups)] for k in range(kh)]
        for i in range(in_rows):
            row = ins[0].vload([i, 0, 0], f"{data_dtype}x{TAPS * block}")
            taps = [tvm.tir.Shuffle([row], orders[g]) for g in range(groups)]
            for r in range(rows):
                k = i - r * sh
                if 0 <= k < kh:
                    for g in range(groups):
                        acc[r][g] = tvm.tir.call_llvm_pure_intrin("int32x4", name, tvm.tir.const(3, "uint32"),
                                                                  acc[r][g], taps[g], weights[k][g])
        for r in range(rows):
            for g in range(groups):
                ib.emit(outs[0].vstore([r, 0, TAPS * g], acc[r][g]))
        return ib.get()

    return te.decl_tensor_intrin(out.op, lambda ins, outs: tuple(_emit(ins, outs, k) for k in ("body", "reset",
                                                                                                 "update")),
                                 binds=binds, default_buffer_params={"offset_factor": 1})


def depthwise_conv2d_nchwc_dot(data, kernel, strides, padding, dilation, out_dtype="int32"):
    """The depthwise conv of the module note.

    Parameters
    ----------
    data : te.Tensor
        ``[N, C/b, H, W, b]``, b 4 or 8, int8 or uint8.
    kernel : te.Tensor
        ``[C/b, 1, KH, KW, 1, b]`` (``OIHW1i<b>o``), int8 or uint8.
    strides, padding, dilation
        As ``nn.conv2d`` (padding: 1, 2 or 4 values; dilation 1).
    out_dtype : str
        int32.

    Returns
    -------
    te.Tensor
        ``[N, C/b, OH, OW, b]`` int32.

    Raises
    ------
    ValueError
        Operands the kernel does not take (:func:`check`; ``usdot`` is not checked here).
    """
    n, chunks, height, width, block = get_const_tuple(data.shape)
    _, _, kh, kw, _, _ = get_const_tuple(kernel.shape)
    sh, sw = strides if isinstance(strides, (tuple, list)) else (strides, strides)
    dilation = dilation if isinstance(dilation, (tuple, list)) else (dilation, dilation)
    why = check(get_const_tuple(data.shape), get_const_tuple(kernel.shape), data.dtype, kernel.dtype,
                out_dtype, get_const_tuple(dilation), True)
    if why:
        raise ValueError(f"depthwise_conv2d_nchwc_dot: {why}")
    top, left, bottom, right = get_pad_tuple(padding, (kh, kw))
    out_h, out_w = (height + top + bottom - kh) // sh + 1, (width + left + right - kw) // sw + 1
    quads = -(-kw // TAPS)
    # rows and columns every window reads: the 4th tap of a 3x3 and the padded taps of a 5x5 (zero weights)
    bottom = max(bottom, (out_h - 1) * sh + kh - height - top)
    right = max(right, (out_w - 1) * sw + TAPS * quads - width - left)
    xp = topi.nn.pad(data, [0, 0, top, left, 0], [0, 0, bottom, right, 0], name="depthwise_pad")

    def _weight(c, q, y, i, t):
        tap = q * TAPS + t
        return tvm.tir.Select(tap < kw, kernel[c, 0, y, tvm.te.min(tap, kw - 1), 0, i],
                              tvm.tir.const(0, kernel.dtype))

    wg = te.compute((chunks, quads, kh, block, TAPS), _weight, name="depthwise_taps")
    rq, ry, rt = (te.reduce_axis((0, e), name=nm) for e, nm in ((quads, "q"), (kh, "ky"), (TAPS, "t")))
    acc = te.compute((n, chunks, out_h, out_w, block), lambda b, c, y, x, i: te.sum(
        xp[b, c, y * sh + ry, x * sw + TAPS * rq + rt, i].astype("int32") * wg[c, rq, ry, i, rt].astype("int32"),
        axis=[rq, ry, rt]), name="depthwise_acc")
    segment = max(d for d in range(1, _SEGMENT + 1) if out_w % d == 0)
    return te.compute(acc.shape, lambda *i: acc(*i), name="depthwise_dot", tag=_TAG,
                      attrs={"rows": tile_rows(out_h, kh, block), "segment": segment, "sh": sh, "kh": kh})


def schedule_depthwise_conv2d_nchwc_dot(outs):
    """Schedule :func:`depthwise_conv2d_nchwc_dot` with its fused epilogue: per channel block and tile of
    output rows (in parallel) and segment of a row, per output pixel the tile's accumulators in registers
    across the taps, then the epilogue over the segment."""
    outs = [outs] if isinstance(outs, te.Tensor) else outs
    s = te.create_schedule([x.op for x in outs])

    def _callback(op):
        if op.tag != _TAG:
            return
        conv, acc = op.output(0), op.input_tensors[0]
        xp, wg = acc.op.input_tensors
        rows, segment, sh, kh = (int(op.attrs[k]) for k in ("rows", "segment", "sh", "kh"))
        s[xp].storage_align(s[xp].op.axis[2], 16, 0)  # rows of 16-byte multiples: loads at immediate offsets
        for stage in (xp, wg):  # once per conv: rows in parallel, a vector per pixel
            axes = s[stage].op.axis
            s[stage].parallel(s[stage].fuse(*axes[:3]))
            s[stage].vectorize(s[stage].fuse(*axes[-2:]) if stage is wg else axes[-1])
        last = outs[0]
        if conv.op != last.op:
            s[conv].compute_inline()
        s[acc].set_scope("local")
        b, c, y, x, i = s[last].op.axis
        yo, yi = s[last].split(y, factor=rows)
        xo, xi = s[last].split(x, factor=segment)
        s[last].reorder(b, c, yo, xo, yi, xi, i)
        s[last].parallel(s[last].fuse(b, c, yo))
        s[last].vectorize(i)
        s[acc].compute_at(s[last], xo)
        _, _, ay, ax, ai = s[acc].op.axis
        rq, ry, rt = s[acc].op.reduce_axis
        s[acc].reorder(ax, rq, ay, ry, ai, rt)
        s[acc].unroll(rq)
        s[acc].tensorize(ay, _intrin(rows, sh, kh, int(acc.shape[-1]), xp.dtype, wg.dtype))

    traverse_inline(s, outs[0].op, _callback)
    return s
