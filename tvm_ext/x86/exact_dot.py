"""Exact uint8 x int8 dot products on x86 without VNNI: TVM tensor intrinsics of three forms.

``vpmaddubsw`` saturates its int16 pair sums (a pair reaches 2 * 255 * 127 = 64770), so:

* :func:`dot_u8s8_saturating`: TVM's form, exact only where :func:`pairs_fit_int16`;
* :func:`dot_u8s8_exact`: each data byte split into its low seven bits and its top bit, one
  ``vpmaddubsw`` + ``vpmaddwd`` per part: exact for any weights, twice the multiplies::

      # a*w0 + b*w1 = (a & 127)*w0 + (b & 127)*w1  +  (a & 128)*w0 + (b & 128)*w1

* :func:`dot_u8s8_int16_pairs`: a kernel packed in pairs of input channels (:func:`pair_kernel`)
  multiplied as int16 with one ``vpmaddwd``: exact, as many multiplies as the saturating form;
* :func:`dot_int16_pairs`: the same product with both operands already int16 in memory (the kernel
  widened at compile time, the data by the conv before its loops): the loop only loads them.

docs/x86-kernels.md ("Exact int8 dot products without VNNI") has the measurements.
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import te

__all__ = ["PAIR_LIMIT", "pairs_fit_int16", "pair_kernel", "dot_u8s8_exact", "dot_u8s8_int16_pairs",
           "dot_int16_pairs", "dot_u8s8_saturating"]

#: The largest sum of same-sign weights a ``vpmaddubsw`` pair may have so that 255 times it fits
#: int16: 255 * 128 = 32640 <= 32767 and -255 * 128 >= -32768.
PAIR_LIMIT = 128

#: ``(int16 vector, int8 vector, int32 vector, vpmaddubsw, vpmaddwd)`` per count of int32 lanes.
_INSTRUCTIONS = {
    4: ("int16x8", "int8x16", "int32x4", "llvm.x86.ssse3.pmadd.ub.sw.128", "llvm.x86.sse2.pmadd.wd"),
    8: ("int16x16", "int8x32", "int32x8", "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"),
    16: ("int16x32", "int8x64", "int32x16", "llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512"),
}


def pairs_fit_int16(weight) -> bool:
    """True when no ``vpmaddubsw`` pair of ``weight`` can saturate against uint8 data.

    ``weight`` is an int8 array laid out as the kernel reads it: its last axis holds the 4 bytes
    reduced into one int32 lane (AlterOpLayout's ``...4i`` / ``...4c``), paired as (0, 1) and
    (2, 3). A pair fits when its positive weights sum to at most :data:`PAIR_LIMIT` and its
    negative ones to at least ``-PAIR_LIMIT``.
    """
    w = np.asarray(weight)
    if w.dtype != np.int8:
        raise TypeError(f"pairs_fit_int16: weights must be int8, got {w.dtype}")
    if w.ndim == 0 or w.shape[-1] % 2:
        raise ValueError(f"pairs_fit_int16: the last axis must hold whole pairs, got shape {w.shape}")
    pairs = w.astype(np.int32).reshape(-1, 2)
    positive = np.clip(pairs, 0, None).sum(axis=1)
    negative = np.clip(pairs, None, 0).sum(axis=1)
    return bool((positive <= PAIR_LIMIT).all() and (negative >= -PAIR_LIMIT).all())



def pair_kernel(weight) -> np.ndarray:
    """A packed int8 conv kernel ``[..., ic/4, oc, 4]`` repacked in pairs ``[..., ic/2, oc, 2]``: the
    same weight for every (input channel, output channel), input channel ``4f + j`` at ``2f + j // 2,
    j % 2``."""
    w = np.asarray(weight)
    if w.ndim != 7 or w.shape[-1] != 4:
        raise ValueError(f"pair_kernel: expected a kernel [..., ic/4, oc, 4], got shape {w.shape}")
    *outer, quads, oc, _ = w.shape
    return np.ascontiguousarray(w.reshape(*outer, quads, oc, 2, 2).swapaxes(-3, -2).reshape(*outer, 2 * quads, oc, 2))



def _declare(lanes: int, group: int, body, data_t: str = "uint8", kernel_t: str = "int8"):
    """The tensor intrinsic ``int32[lanes] += sum_k data_t[group] * kernel_t[lanes][group]`` (TVM's
    buffers and body/reset/update protocol, so TVM's int8 schedules tensorize with it unchanged);
    ``body(data, kernel)`` returns the int32 vector of one dot product from the ``data_t x group``
    data vector and the kernel's ``kernel_t x (group * lanes)`` values."""
    if lanes not in _INSTRUCTIONS:
        raise ValueError(f"exact_dot: int32 lanes must be one of {sorted(_INSTRUCTIONS)}, got {lanes}")
    data = te.placeholder((group,), dtype=data_t, name="data")
    kernel = te.placeholder((lanes, group), dtype=kernel_t, name="kernel")
    k = te.reduce_axis((0, group), name="k")
    out = te.compute((lanes,), lambda i: te.sum(data[k].astype("int32") * kernel[i, k].astype("int32"), axis=k),
                     name="C")
    a_buf = tvm.tir.decl_buffer(data.shape, dtype=data_t, name="a_buffer", offset_factor=1, strides=[1])
    b_buf = tvm.tir.decl_buffer(kernel.shape, dtype=kernel_t, name="b_buffer", offset_factor=1,
                                strides=[te.var("ldw"), 1])
    acc_t = _INSTRUCTIONS[lanes][2]

    def intrin_func(ins, outs):
        def emit(kind):  # "body": c = dot, "reset": c = 0, "update": c += dot
            ib = tvm.tir.ir_builder.create()
            if kind == "reset":
                ib.emit(outs[0].vstore(0, tvm.tir.const(0, acc_t)))
                return ib.get()
            dot = body(ins[0].vload([0], f"{data_t}x{group}"), ins[1].vload([0, 0], f"{kernel_t}x{group * lanes}"))
            if kind == "update":
                dot = dot + outs[0].vload([0], acc_t)
            ib.emit(outs[0].vstore(0, dot))
            return ib.get()

        return emit("body"), emit("reset"), emit("update")

    return te.decl_tensor_intrin(out.op, intrin_func, binds={data: a_buf, kernel: b_buf},
                                 default_buffer_params={"offset_factor": 1})


def _word(data):
    """The 4 data bytes as one int32 scalar."""
    return tvm.tir.call_intrin("int32", "tir.reinterpret", data)


def _pair_sums(lanes: int, word, b):
    """int32 vector of ``vpmaddwd(vpmaddubsw(broadcast(word), b), 1)``."""
    pairs_t, bytes_t, acc_t, maddubs, maddwd = _INSTRUCTIONS[lanes]
    a = tvm.tir.call_intrin(bytes_t, "tir.reinterpret", word.astype(acc_t))
    pairs = tvm.tir.call_llvm_pure_intrin(pairs_t, maddubs, tvm.tir.const(2, "uint32"), a, b)
    return tvm.tir.call_llvm_pure_intrin(acc_t, maddwd, tvm.tir.const(2, "uint32"), pairs,
                                         tvm.tir.const(1, pairs_t))


def dot_u8s8_exact(lanes: int):
    """The exact ``uint8[4] x int8[lanes][4]`` dot product: each data byte split into its low seven
    bits and its top bit, one ``vpmaddubsw`` + ``vpmaddwd`` for each part (the module's note).
    ``lanes``: 4 (SSE), 8 (AVX2), 16 (AVX-512)."""

    def body(data, b):
        low = _word(data) & tvm.tir.const(0x7F7F7F7F, "int32")
        top = _word(data) & tvm.tir.const(-0x7F7F7F80, "int32")  # 0x80808080 as int32
        return _pair_sums(lanes, low, b) + _pair_sums(lanes, top, b)

    return _declare(lanes, 4, body)


def dot_u8s8_int16_pairs(lanes: int):
    """The exact ``int32[lanes] += sum_k uint8[2] * int8[lanes][2]`` as one ``vpmaddwd`` on int16:
    the two data bytes zero-extended and broadcast as one int32, the kernel's ``lanes x 2`` bytes
    sign-extended. For convs whose kernel is packed in pairs (``...{oc}o2i``, :func:`pair_kernel`):
    as many multiplies per product as the saturating form, and no saturation. ``lanes``: 4 (SSE),
    8 (AVX2), 16 (AVX-512)."""

    def body(data, b):
        pairs_t, _, acc_t, _, maddwd = _INSTRUCTIONS[lanes]
        word = tvm.tir.call_intrin("int32", "tir.reinterpret", data.astype("int16x2"))
        a = tvm.tir.call_intrin(pairs_t, "tir.reinterpret", word.astype(acc_t))
        return tvm.tir.call_llvm_pure_intrin(acc_t, maddwd, tvm.tir.const(2, "uint32"), a, b.astype(pairs_t))

    return _declare(lanes, 2, body)


def dot_int16_pairs(lanes: int):
    """The exact ``int32[lanes] += sum_k int16[2] * int16[lanes][2]`` as one ``vpmaddwd``: the data
    pair loaded as one int32 and broadcast, the kernel's ``lanes x 2`` values loaded as they are.
    For convs whose kernel is packed in int16 pairs (``PairPackInt8Convs``) and whose data the conv
    widens to int16 before its loops: the loop widens nothing (``vpbroadcastd`` from memory and
    ``vpmaddwd`` with a memory operand are loads, not shuffles). Exact for int16 values whose pair
    products sum within int32 (int8 weights and uint8 data: at most 2 * 255 * 128). ``lanes``: 4
    (SSE), 8 (AVX2), 16 (AVX-512)."""

    def body(data, b):
        pairs_t, _, acc_t, _, maddwd = _INSTRUCTIONS[lanes]
        word = tvm.tir.call_intrin("int32", "tir.reinterpret", data)
        a = tvm.tir.call_intrin(pairs_t, "tir.reinterpret", word.astype(acc_t))
        return tvm.tir.call_llvm_pure_intrin(acc_t, maddwd, tvm.tir.const(2, "uint32"), a, b)

    return _declare(lanes, 2, body, data_t="int16", kernel_t="int16")


def dot_u8s8_saturating(lanes: int):
    """TVM's ``vpmaddubsw`` + ``vpmaddwd`` dot product, exact only where :func:`pairs_fit_int16`."""
    return _declare(lanes, 4, lambda data, b: _pair_sums(lanes, _word(data), b))
