"""The 8-bit matrix-multiply instruction (+i8mm) as a TE tensor intrinsic, shared by the conv and dense kernels.

``C[2, 2] += A[2, 8] x B[2, 8]^T`` in one ``smmla``/``ummla``/``usmmla``: 32 exact int32 multiply-adds.
"""
from __future__ import annotations

import tvm
from tvm import te

__all__ = ["MMLA_INSTRUCTION", "mmla_intrin"]

#: The LLVM intrinsic per (A, B) dtype: A is the unsigned operand of ``usmmla``.
MMLA_INSTRUCTION = {
    ("int8", "int8"): "llvm.aarch64.neon.smmla",
    ("uint8", "uint8"): "llvm.aarch64.neon.ummla",
    ("uint8", "int8"): "llvm.aarch64.neon.usmmla",
}

_ROW = 8


def mmla_intrin(a_dtype: str, b_dtype: str, acc_scope: str, rows_apart: bool):
    """The intrinsic; ``rows_apart``: the two rows of A and of B lie anywhere (two 8-byte loads each),
    else each operand's rows are adjacent (one 16-byte load). C's four int32 are adjacent, in ``acc_scope``."""
    a = te.placeholder((2, _ROW), a_dtype, name="a")
    b = te.placeholder((2, _ROW), b_dtype, name="b")
    k = te.reduce_axis((0, _ROW), name="k")
    c = te.compute((2, 2), lambda i, j: te.sum(a[i, k].astype("int32") * b[j, k].astype("int32"), axis=k),
                   name="c")

    def _strides(name):
        return [te.var(name), 1] if rows_apart else [_ROW, 1]

    binds = {a: tvm.tir.decl_buffer(a.shape, a_dtype, name="a_buf", offset_factor=1, strides=_strides("sa")),
             b: tvm.tir.decl_buffer(b.shape, b_dtype, name="b_buf", offset_factor=1, strides=_strides("sb")),
             c: tvm.tir.decl_buffer(c.shape, "int32", name="c_buf", offset_factor=1, strides=[2, 1],
                                    scope=acc_scope)}
    instruction = MMLA_INSTRUCTION[(a_dtype, b_dtype)]
    halves = [tvm.tir.const(i, "int32") for i in range(2 * _ROW)]

    def _operand(buf, dtype):
        if rows_apart:
            return tvm.tir.Shuffle([buf.vload([r, 0], f"{dtype}x{_ROW}") for r in range(2)], halves)
        return buf.vload([0, 0], f"{dtype}x{2 * _ROW}")

    def _body(ins, outs):
        def _emit(kind):
            ib = tvm.tir.ir_builder.create()
            if kind == "reset":
                ib.emit(outs[0].vstore([0, 0], tvm.tir.const(0, "int32x4")))
                return ib.get()
            acc = tvm.tir.const(0, "int32x4") if kind == "body" else outs[0].vload([0, 0], "int32x4")
            ib.emit(outs[0].vstore([0, 0], tvm.tir.call_llvm_pure_intrin(
                "int32x4", instruction, tvm.tir.const(3, "uint32"), acc, _operand(ins[0], a_dtype),
                _operand(ins[1], b_dtype))))
            return ib.get()

        return _emit("body"), _emit("reset"), _emit("update")

    return te.decl_tensor_intrin(c.op, _body, binds=binds, default_buffer_params={"offset_factor": 1})
