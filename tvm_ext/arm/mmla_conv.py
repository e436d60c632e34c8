"""An int8 NCHWc convolution for aarch64's 8-bit matrix multiply (``smmla``/``ummla``/``usmmla``, +i8mm).

One ``smmla`` multiplies a 2 x 8 int8 matrix by the transpose of another 2 x 8 and adds the 2 x 2
int32 result to an accumulator register: 32 multiply-adds, where ``sdot`` does 16. TVM 0.19 uses it
only in its NHWC GEMM schedule; the NCHWc convolutions that tvm-ext's int8 networks use get ``sdot``.

Here the two rows of A are two neighbouring output pixels and the two rows of B two output
channels, each over 8 input channels, with data in NCHW8c and weights in ``OIHW8o8i``::

    # C2[n, o, y, x2, c2, p, q] = sum_{i, ky, kx, k} X[n, i, y*sh + ky*dh, (2*x2 + p)*sw + kx*dw, k]
    #                                             * W[o, i, ky, kx, 2*c2 + q, k]             (exact int32)
    # out[n, o, y, x, c] = C2[n, o, y, x // 2, c // 2, x % 2, c % 2]

The register tile is ``R`` pixel pairs by the 4 channel pairs of a block of 8, its accumulators
kept across the whole reduction and the requantize epilogue computed from them in the same kernel.
Operand types follow the instruction: int8 x int8 ``smmla``, uint8 x uint8 ``ummla``, uint8 data
with int8 weights ``usmmla``. Odd widths, strides and the register budget: docs/arm-kernels.md.
"""
from __future__ import annotations

from tvm import te, topi
from tvm.topi.nn.utils import get_pad_tuple
from tvm.topi.utils import get_const_tuple, traverse_inline

from ._mmla import MMLA_INSTRUCTION, mmla_intrin

__all__ = ["BLOCK", "conv2d_nchwc_mmla", "conv2d_nchw_mmla", "schedule_conv2d_mmla",
           "pixel_pairs", "reduction_unroll"]

#: Channels per NCHWc block of data and weights (8 int8 per row of a 2 x 8 operand).
BLOCK = 8

#: The tag of the convolution stage, which the schedule looks for.
TAG = "conv2d_nchwc_mmla"

#: Vector registers the tile may hold: its accumulators, the 4 channel pairs of B and two rows of A
#: (one multiplied, the next loading); LLVM streams A through the tile.
_REGISTERS = 30
_PAIRS_PER_BLOCK = BLOCK // 2
#: Dispatch slots of one 16-byte operand load, counted in ``smmla`` (one slot): LLVM pairs the tile's
#: loads into ``ldp q``, 3 micro-ops per two registers in the Neoverse-V2 model (6 dispatched per cycle).
_LOAD_COST = 1.5
#: Tiles whose cost is within this share of the cheapest count as ties, won by the fewest padding columns.
_TIE = 0.02
#: Input-channel blocks a 1x1 conv's reduction steps by per loop iteration, when it has this many times
#: as many blocks (fewer: LLVM unrolls the whole reduction itself, or the loop would be too short).
_UNROLL, _UNROLL_MIN_TRIPS = 4, 4


def _tile_cost(pairs: int, r: int) -> float:
    """Dispatch slots for a row of ``pairs`` pixel pairs in tiles of ``r``: padded pairs x (``smmla`` +
    loads) per ``smmla``."""
    padded = -(-pairs // r) * r
    mmla = _PAIRS_PER_BLOCK * r
    return padded * (mmla + _LOAD_COST * (r + _PAIRS_PER_BLOCK)) / mmla


def pixel_pairs(pairs: int) -> int:
    """The register tile's pixel pairs ``R`` for a row of ``pairs`` output pixel pairs.

    Among tiles that fit :data:`_REGISTERS` (``4R`` accumulators, 4 B and 2 A registers), the least
    :func:`_tile_cost`; within :data:`_TIE` of it, the fewest padding columns, then the larger tile.
    """
    fits = [r for r in range(1, pairs + 1) if _PAIRS_PER_BLOCK * r + _PAIRS_PER_BLOCK + 2 <= _REGISTERS]
    best = min(_tile_cost(pairs, r) for r in fits)
    ties = [r for r in fits if _tile_cost(pairs, r) <= best * (1 + _TIE)]
    return min(ties, key=lambda r: (-(-pairs // r) * r, -r))


def reduction_unroll(ic_chunks: int, kh: int, kw: int) -> int:
    """Input-channel blocks per iteration of the reduction loop: :data:`_UNROLL` for a 1x1 conv with at
    least :data:`_UNROLL_MIN_TRIPS` times as many blocks, else 1 (one block: 4R ``smmla``, whose loads
    and loop counter would take a third of the dispatch slots on Neoverse-V2)."""
    if kh * kw == 1 and ic_chunks % _UNROLL == 0 and ic_chunks >= _UNROLL * _UNROLL_MIN_TRIPS:
        return _UNROLL
    return 1


def conv2d_nchwc_mmla(data, kernel, strides, padding, dilation, out_dtype="int32"):
    """An NCHW8c int8 convolution with ``OIHW8o8i`` weights, as 2 x 2 matrix products (module note).

    Parameters
    ----------
    data : te.Tensor
        ``[N, C/8, H, W, 8]``, int8 or uint8.
    kernel : te.Tensor
        ``[O/8, C/8, KH, KW, 8, 8]``, int8 or uint8 (see :data:`tvm_ext.arm._mmla.MMLA_INSTRUCTION`).
    strides, padding, dilation
        As ``nn.conv2d`` (padding: 1, 2 or 4 values).
    out_dtype : str
        int32.

    Returns
    -------
    te.Tensor
        ``[N, O/8, OH, OW, 8]`` int32.
    """
    n, ic_chunks, height, width, ic_block = get_const_tuple(data.shape)
    oc_chunks, k_chunks, kh, kw, oc_block, k_block = get_const_tuple(kernel.shape)
    if (ic_block, oc_block, k_block) != (BLOCK,) * 3 or k_chunks != ic_chunks:
        raise ValueError(f"conv2d_nchwc_mmla: data {get_const_tuple(data.shape)} and kernel "
                         f"{get_const_tuple(kernel.shape)} are not NCHW8c and OIHW8o8i with the same channels")
    if (data.dtype, kernel.dtype) not in MMLA_INSTRUCTION or out_dtype != "int32":
        raise ValueError(f"conv2d_nchwc_mmla: no matrix-multiply instruction takes {data.dtype} x "
                         f"{kernel.dtype} -> {out_dtype}")
    sh, sw = strides if isinstance(strides, (tuple, list)) else (strides, strides)
    dh, dw = dilation if isinstance(dilation, (tuple, list)) else (dilation, dilation)
    pt, pl, pb, pr = get_pad_tuple(padding, ((kh - 1) * dh + 1, (kw - 1) * dw + 1))
    out_h = (height + pt + pb - (kh - 1) * dh - 1) // sh + 1
    out_w = (width + pl + pr - (kw - 1) * dw - 1) // sw + 1
    pairs = -(-out_w // 2)
    tile = pixel_pairs(pairs)
    pairs = -(-pairs // tile) * tile  # whole tiles: the extra columns read zero padding and are dropped
    columns = (2 * pairs - 1) * sw + (kw - 1) * dw + 1
    pr = max(pr, columns - width - pl)
    if pt or pb or pl or pr:
        data = topi.nn.pad(data, [0, 0, pt, pl, 0], [0, 0, pb, pr, 0], name="data_pad")
    ic = te.reduce_axis((0, ic_chunks), name="ic")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    rk = te.reduce_axis((0, BLOCK), name="rk")
    if sw == 1:
        def _a(b, i, y, x, kx, k):
            return data[b, i, y, x + kx * dw, k]
    else:
        gathered = te.compute((n, ic_chunks, data.shape[2], kw, 2 * pairs, BLOCK),
                              lambda b, i, y, kx, x, k: data[b, i, y, x * sw + kx * dw, k], name="data_cols")

        def _a(b, i, y, x, kx, k):
            return gathered[b, i, y, kx, x, k]
    c2 = te.compute(
        (n, oc_chunks, out_h, pairs, _PAIRS_PER_BLOCK, 2, 2),
        lambda b, o, y, x2, c2, p, q: te.sum(
            _a(b, ic, y * sh + ry * dh, 2 * x2 + p, rx, rk).astype("int32")
            * kernel[o, ic, ry, rx, 2 * c2 + q, rk].astype("int32"), axis=[ic, ry, rx, rk]),
        name="conv_mmla_tiles")
    return te.compute((n, oc_chunks, out_h, out_w, BLOCK),
                      lambda b, o, y, x, c: c2[b, o, y, x // 2, c // 2, x % 2, c % 2],
                      name="conv_mmla", tag=TAG, attrs={"pixel_pairs": tile})


def conv2d_nchw_mmla(data, kernel, strides, padding, dilation, out_dtype="int32"):
    """The same convolution on NCHW data and OIHW weights (channels multiples of 8), packing both first.

    The layout pass normally rewrites the conv to :func:`conv2d_nchwc_mmla` with the weights packed
    at build time; this form is what runs without it.
    """
    n, channels, height, width = get_const_tuple(data.shape)
    out_channels, _, kh, kw = get_const_tuple(kernel.shape)
    if channels % BLOCK or out_channels % BLOCK:
        raise ValueError(f"conv2d_nchw_mmla: channels {channels} -> {out_channels} are not multiples of {BLOCK}")
    packed = te.compute((n, channels // BLOCK, height, width, BLOCK),
                        lambda b, i, y, x, k: data[b, i * BLOCK + k, y, x], name="data_vec")
    weights = te.compute((out_channels // BLOCK, channels // BLOCK, kh, kw, BLOCK, BLOCK),
                         lambda o, i, y, x, oo, ii: kernel[o * BLOCK + oo, i * BLOCK + ii, y, x], name="kernel_vec")
    out = conv2d_nchwc_mmla(packed, weights, strides, padding, dilation, out_dtype)
    return te.compute((n, out_channels) + get_const_tuple(out.shape)[2:4],
                      lambda b, c, y, x: out[b, c // BLOCK, y, x, c % BLOCK], name="conv_mmla_nchw",
                      tag="injective")


def _schedule_tiles(s, c2, tile, data_dtype, kernel_dtype, acc_scope):
    """The reduction outside, the tile's pixel and channel pairs unrolled, one instruction per 2 x 2."""
    b, o, y, x2, c2_, p, q = s[c2].op.axis
    ic, ry, rx, rk = s[c2].op.reduce_axis
    x2o, x2i = s[c2].split(x2, factor=tile)
    s[c2].reorder(b, o, y, x2o, ic, ry, rx, x2i, c2_, p, q, rk)
    unroll = reduction_unroll(*(int(ax.dom.extent) for ax in (ic, ry, rx)))
    if unroll > 1:
        _, ici = s[c2].split(ic, factor=unroll)
        s[c2].unroll(ici)
    s[c2].unroll(x2i)
    s[c2].unroll(c2_)
    s[c2].tensorize(p, mmla_intrin(data_dtype, kernel_dtype, acc_scope, rows_apart=False))  # rows 8 bytes apart


def _schedule_producers(s, conv):
    """Padding, column gathering and (without the layout pass) packing: whole tensors, in parallel."""
    stack = list(conv.op.input_tensors)
    while stack:
        t = stack.pop()
        if isinstance(t.op, te.ComputeOp) and t.op.name in ("data_pad", "data_cols", "data_vec", "kernel_vec"):
            axes = s[t].op.axis
            s[t].parallel(s[t].fuse(*axes[:3]))
            stack.extend(t.op.input_tensors)


def schedule_conv2d_mmla(outs):
    """Schedule :func:`conv2d_nchwc_mmla` (or its NCHW form) with its fused epilogue."""
    outs = [outs] if isinstance(outs, te.Tensor) else outs
    s = te.create_schedule([x.op for x in outs])

    def _callback(op):
        if op.tag != TAG:
            return
        conv = op.output(0)
        c2 = op.input_tensors[0]
        tile = int(op.attrs["pixel_pairs"])
        a_dtype = c2.op.input_tensors[0].dtype
        k_dtype = c2.op.input_tensors[-1].dtype
        _schedule_producers(s, c2)
        last = outs[0]
        if len(last.shape) == 5:  # NCHW8c: tiles computed per tile of the output, in registers
            if conv.op != last.op:
                s[conv].compute_inline()
            s[c2].set_scope("local")
            b, o, y, x, c = s[last].op.axis
            xo, xi = s[last].split(x, factor=2 * tile)
            s[last].reorder(b, o, y, xo, xi, c)
            s[last].parallel(s[last].fuse(b, o, y))
            s[last].vectorize(c)
            s[last].unroll(xi)  # constant indices: the tile stays in registers, its 2 x 2 blocks unpacked by shuffles
            s[c2].compute_at(s[last], xo)
            scope = "local"
        else:  # NCHW: whole tensors, the unpacked output with its epilogue in parallel rows
            if conv.op != last.op:
                s[conv].compute_inline()
            b, o, y, *_ = s[c2].op.axis
            s[c2].parallel(s[c2].fuse(b, o, y))
            b, c, y, x = s[last].op.axis
            s[last].parallel(s[last].fuse(b, c, y))
            scope = "global"
        _schedule_tiles(s, c2, tile, a_dtype, k_dtype, scope)

    traverse_inline(s, outs[0].op, _callback)
    return s
