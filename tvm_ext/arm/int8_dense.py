"""Int8 dense kernels for aarch64's 8-bit dot product (+dotprod) and matrix multiply (+i8mm).

TVM 0.19 gives an int8 ``nn.dense`` on aarch64 its x86 ``dense_pack`` schedule, which LLVM turns
into widening multiplies (``smull``/``smlal``): exact, but 8 multiply-adds per instruction where
``sdot`` does 16 and ``smmla`` 32. Both kernels here read the weights as they are (``[N, K]``,
row-major), so nothing is repacked at build time or at run time.

**Dot product** (``sdot``/``udot``; ``usdot`` for uint8 x int8 at +i8mm): 16 bytes of a data row
and 16 of a weight row per instruction, four partial sums summed at the end; a data row is loaded
once for ``T`` weight rows. K must be a multiple of 16.

**Matrix multiply** (``smmla``/``ummla``/``usmmla``, +i8mm) for two or more rows of data: a 2 x 8
block of data rows times a 2 x 8 block of weight rows, 32 multiply-adds. An odd row count reads a
zero row of padding; a single row takes the dot product. K must be a multiple of 8 and N even.

The kernels' equations: docs/arm-kernels.md.
"""
from __future__ import annotations

import tvm
from tvm import te
from tvm.topi.utils import get_const_tuple, traverse_inline

from ._mmla import MMLA_INSTRUCTION, mmla_intrin

__all__ = ["DOT_INSTRUCTION", "dense_dot", "dense_mmla", "schedule_dense_int8"]

#: The dot-product intrinsic per (data, weight) dtype (``usdot`` needs +i8mm).
DOT_INSTRUCTION = {
    ("int8", "int8"): "llvm.aarch64.neon.sdot",
    ("uint8", "uint8"): "llvm.aarch64.neon.udot",
    ("uint8", "int8"): "llvm.aarch64.neon.usdot",
}

TAG_DOT = "dense_int8_dot"
TAG_MMLA = "dense_int8_mmla"

#: Vector registers a tile may hold (accumulators and the loads they share), of 32.
_REGISTERS = 28


def _largest_divisor(n: int, fits) -> int:
    return max(d for d in range(1, n + 1) if n % d == 0 and fits(d))


def _dot_intrin(data_dtype, weight_dtype, acc_scope):
    """P[4] += per group of 4 lanes, the dot product of 16 bytes of A and B (one instruction)."""
    a = te.placeholder((16,), data_dtype, name="a")
    b = te.placeholder((16,), weight_dtype, name="b")
    j = te.reduce_axis((0, 4), name="j")
    p = te.compute((4,), lambda i: te.sum(a[4 * i + j].astype("int32") * b[4 * i + j].astype("int32"), axis=j),
                   name="p")
    binds = {t: tvm.tir.decl_buffer(t.shape, t.dtype, name=t.op.name + "_buf", offset_factor=1,
                                    scope=acc_scope if t is p else "global") for t in (a, b, p)}
    instruction = DOT_INSTRUCTION[(data_dtype, weight_dtype)]

    def _body(ins, outs):
        def _emit(kind):
            ib = tvm.tir.ir_builder.create()
            if kind == "reset":
                ib.emit(outs[0].vstore([0], tvm.tir.const(0, "int32x4")))
                return ib.get()
            acc = tvm.tir.const(0, "int32x4") if kind == "body" else outs[0].vload([0], "int32x4")
            lhs, rhs = ins[0].vload([0], f"{data_dtype}x16"), ins[1].vload([0], f"{weight_dtype}x16")
            ib.emit(outs[0].vstore([0], tvm.tir.call_llvm_pure_intrin(  # usdot: (acc, unsigned, signed)
                "int32x4", instruction, tvm.tir.const(3, "uint32"), acc, lhs, rhs)))
            return ib.get()

        return _emit("body"), _emit("reset"), _emit("update")

    return te.decl_tensor_intrin(p.op, _body, binds=binds, default_buffer_params={"offset_factor": 1})


def _check(name, data, weight, out_dtype, table, k_multiple):
    (m, k), (n, k2) = get_const_tuple(data.shape), get_const_tuple(weight.shape)
    if k != k2 or k % k_multiple:
        raise ValueError(f"{name}: data {data.shape} and weight {weight.shape} need one reduction length, "
                         f"a multiple of {k_multiple}")
    if (data.dtype, weight.dtype) not in table or out_dtype != "int32":
        raise ValueError(f"{name}: no instruction takes {data.dtype} x {weight.dtype} -> {out_dtype}")
    return m, n, k


def dense_dot(data, weight, out_dtype="int32"):
    """``data[M, K] x weight[N, K]^T`` in int32 with the 8-bit dot product (module note); K % 16 == 0."""
    m, n, k = _check("dense_dot", data, weight, out_dtype, DOT_INSTRUCTION, 16)
    b = te.reduce_axis((0, k // 16), name="b")
    j = te.reduce_axis((0, 4), name="j")
    partial = te.compute(
        (m, n, 4), lambda y, x, lane: te.sum(data[y, 16 * b + 4 * lane + j].astype("int32")
                                             * weight[x, 16 * b + 4 * lane + j].astype("int32"), axis=[b, j]),
        name="dense_dot_lanes")
    lane = te.reduce_axis((0, 4), name="lane")
    return te.compute((m, n), lambda y, x: te.sum(partial[y, x, lane], axis=lane), name="dense_dot", tag=TAG_DOT)


def dense_mmla(data, weight, out_dtype="int32"):
    """``data[M, K] x weight[N, K]^T`` in int32 with the 8-bit matrix multiply (module note); K % 8 == 0, N even."""
    m, n, k = _check("dense_mmla", data, weight, out_dtype, MMLA_INSTRUCTION, 8)
    if n % 2:
        raise ValueError(f"dense_mmla: {n} output units are not even")
    if m % 2:
        rows = data
        zero = tvm.tir.const(0, rows.dtype)
        data = te.compute((m + 1, k), lambda y, x: tvm.tir.if_then_else(y < m, rows[y, x], zero),
                          name="dense_rows_even")
    b = te.reduce_axis((0, k // 8), name="b")
    r = te.reduce_axis((0, 8), name="r")
    tiles = te.compute(
        ((m + 1) // 2, n // 2, 2, 2),
        lambda y2, x2, p, q: te.sum(data[2 * y2 + p, 8 * b + r].astype("int32")
                                    * weight[2 * x2 + q, 8 * b + r].astype("int32"), axis=[b, r]),
        name="dense_mmla_tiles")
    return te.compute((m, n), lambda y, x: tiles[y // 2, x // 2, y % 2, x % 2], name="dense_mmla", tag=TAG_MMLA)


def _schedule_dot(s, out, last):
    partial = out.op.input_tensors[0]
    data, weight = partial.op.input_tensors
    rows = _largest_divisor(int(out.shape[1]), lambda t: 2 * t + 1 <= _REGISTERS)
    y, x = s[last].op.axis
    xo, xi = s[last].split(x, factor=rows)
    s[last].reorder(xo, y, xi)
    s[last].parallel(xo)
    s[partial].set_scope("local")
    s[partial].compute_at(s[last], y)
    if out.op != last.op:
        s[out].compute_at(s[last], y)
    py, px, lane = s[partial].op.axis
    b, j = s[partial].op.reduce_axis
    s[partial].reorder(py, b, px, lane, j)
    s[partial].unroll(px)
    s[partial].tensorize(lane, _dot_intrin(data.dtype, weight.dtype, "local"))


def _schedule_mmla(s, out, last):
    tiles = out.op.input_tensors[0]
    data, weight = tiles.op.input_tensors
    if isinstance(data.op, te.ComputeOp):  # the padding row: computed once, before the tiles
        data = data.op.input_tensors[0]
    m_pairs, n_pairs = get_const_tuple(tiles.shape)[:2]
    rows = _largest_divisor(m_pairs, lambda r: r <= 4)
    cols = _largest_divisor(n_pairs, lambda t: rows * t + rows + t <= _REGISTERS)
    y, x = s[last].op.axis
    yo, yi = s[last].split(y, factor=2 * rows)
    xo, xi = s[last].split(x, factor=2 * cols)
    s[last].reorder(yo, xo, yi, xi)
    fused = s[last].fuse(yo, xo)
    s[last].parallel(fused)
    s[tiles].set_scope("local")
    s[tiles].compute_at(s[last], fused)
    ty, tx, p, q = s[tiles].op.axis
    b, r = s[tiles].op.reduce_axis
    s[tiles].reorder(b, ty, tx, p, q, r)
    s[tiles].unroll(ty)
    s[tiles].unroll(tx)
    s[tiles].tensorize(p, mmla_intrin(data.dtype, weight.dtype, "local", rows_apart=True))  # rows K bytes apart


def schedule_dense_int8(outs):
    """Schedule :func:`dense_dot` or :func:`dense_mmla` with its fused epilogue."""
    outs = [outs] if isinstance(outs, te.Tensor) else outs
    s = te.create_schedule([x.op for x in outs])

    def _callback(op):
        if op.tag == TAG_DOT:
            _schedule_dot(s, op.output(0), outs[0])
        elif op.tag == TAG_MMLA:
            out = op.output(0)
            if out.op != outs[0].op:
                s[out].compute_inline()
            _schedule_mmla(s, out, outs[0])

    traverse_inline(s, outs[0].op, _callback)
    return s
