"""Exact fixed-point requantization on x86 in even/odd int32 lanes (``vpmuldq``), while tvm-ext builds.

Design note
-----------
``qnn.requantize`` lowers to ``tir.q_multiply_shift(x, m, 31, s)`` (per tensor) or
``tir.q_multiply_shift_per_axis(x, m, ls, rs, 31, ...)`` (per channel): ``round(x * 2^ls * m / 2^n)``
with ``n = 31 + rs``, rounded half up, in int64. TVM's generic lowering casts each int32 lane to int64,
which LLVM's x86 back end turns into zero extensions, 256-bit extracts/inserts and ``vpmovqd``
narrowings around each ``vpmuldq``: about 14 µops per 16 outputs on the ports the int8 dot products
need. :func:`even_odd_q_multiply_shift` lowers the vectorised call on whole vectors instead::

    # X = int32x2L -> int64xL, the even lanes in the low halves, the odd ones in the high halves
    # pe = vpmuldq(X, M); po = vpmuldq(X >> 32, M >> 32)                     (exact 32x32->64)
    # e = ((pe << ls) + 2^(n-1)) >> n;  o = ((po << ls) + 2^(n-1)) >> (n-32)   (constant n < 32: << (32-n);
    #                                                                         shifts per lane: (... >> n) << 32)
    # q_multiply_shift(x, m, 31, s) = int32x2L(low halves of e | high halves of o)
    # q_multiply_shift(x, m, 31, s) + c: 2^(n-1) + c * 2^n as the rounding term (constant shifts)

The same int64 arithmetic, so the result is bit for bit TVM's (tests/x86/test_requantize.py checks it
against numpy). Scalar calls and TVM's power-of-two form (``m == 2^30``) keep TVM's lowering.
:func:`EvenOddQMultiplyShift` is a TIR pass that the x86 back end adds to its build's PassContext
(``tir.add_lower_pass``, :func:`lower_config`) for AVX2 and AVX-512 targets with tvm-ext's kernels,
after vectorisation and before TVM's own lowering of the intrinsic: other builds, in this thread or
another, never see it. At AVX2 (no ``vpsraq``) LLVM takes the high dword of each sum instead; below
AVX2 it is no faster (docs/x86-kernels.md has the measurements).
"""
from __future__ import annotations

import logging

from .._tir_const import int_value

logger = logging.getLogger(__name__)

__all__ = ["EvenOddQMultiplyShift", "lower_config", "lower_even_odd", "applies", "PASS_NAME", "LOWER_PHASE"]

_OPS = ("tir.q_multiply_shift", "tir.q_multiply_shift_per_axis")
#: The pass's name in ``tir.add_lower_pass`` (one per PassContext).
PASS_NAME = "tvm_ext.x86.EvenOddQMultiplyShift"
#: ``tir.add_lower_pass`` phase: after ``VectorizeLoop`` (the calls have their vector types), before
#: the host pass list's ``LowerIntrin`` (TVM's generic rule, which gets the calls left unchanged).
LOWER_PHASE = 3


def lower_even_odd(x, m, ls, rs, q, addend: int = 0):
    """``round(x * 2^ls * m / 2^(q + rs)) + addend`` per int32 lane of ``x`` (an even number of lanes), in int64.

    ``m``, ``ls``, ``rs``: int32 scalars or vectors like ``x``; ``q``: a constant; ``addend``: a constant
    (the output zero point that follows a requantize) folded into the rounding term, exact because
    ``addend * 2^n`` is a multiple of the divisor::

        # (p + 2^(n-1)) >> n  +  c  =  (p + 2^(n-1) + c * 2^n) >> n

    Returns the int32 vector expression, or None where this form does not apply (an odd lane count or
    fewer than 4 lanes, constant shifts out of range; an ``addend`` with shifts per lane, a left shift, or
    ``|addend| * 2^n`` beyond 2^62, where the sum could leave int64).
    """
    import tvm
    from tvm import tir

    n32 = tvm.DataType(x.dtype).lanes
    # at least 4 lanes: 2 would pair into one int64, a scalar, which TIR's vector forms do not take
    if n32 < 4 or n32 % 2 or tvm.DataType(x.dtype).bits != 32 or int_value(q) is None:
        return None
    i32, i64 = f"int32x{n32}", f"int64x{n32 // 2}"

    def wide(e):  # int32 x 2L -> int64 x L, bit for bit (a scalar: the same value in every lane)
        return tir.reinterpret(i64, e if e.dtype == i32 else tir.Broadcast(e, n32))

    def c64(v):
        return tir.Broadcast(tir.const(v, "int64"), n32 // 2)

    X, q = wide(x), int_value(q)
    mc = int_value(m)
    if mc is not None:  # a constant multiplier: the same in even and odd lanes
        me = mo = c64(mc)
    else:
        M = wide(m)
        me, mo = (M << c64(32)) >> c64(32), M >> c64(32)
    pe = ((X << c64(32)) >> c64(32)) * me  # even lanes, sign-extended: vpmuldq
    po = (X >> c64(32)) * mo  # odd lanes moved down: vpsrlq, vpmuldq

    lsc, rsc = int_value(ls), int_value(rs)
    if lsc is not None and rsc is not None:  # constant shifts: immediate forms
        n = q + rsc
        if not (1 <= n <= 63 and 0 <= lsc <= 62):
            return None
        if addend and (lsc or abs(addend) * 2**n + 2**(n - 1) > 2**62):
            return None
        if lsc:
            pe, po = pe << c64(lsc), po << c64(lsc)
        r = c64((1 << (n - 1)) + addend * 2**n)
        e = (pe + r) >> c64(n)
        o = (po + r) >> c64(n - 32) if n >= 32 else (po + r) << c64(32 - n)
    elif addend:
        return None
    else:  # shifts per lane (per channel): the odd result computed low, then moved up
        LS = c64(0) if lsc == 0 else wide(ls) & c64(0xFFFFFFFF)
        N = c64(q) + (wide(rs) & c64(0xFFFFFFFF) if rsc is None else c64(rsc))
        LSo = c64(0) if lsc == 0 else wide(ls) >> c64(32)
        No = c64(q) + (wide(rs) >> c64(32) if rsc is None else c64(rsc))
        pe, po = pe << LS, po << LSo
        e = (pe + (c64(1) << (N - c64(1)))) >> N
        o = ((po + (c64(1) << (No - c64(1)))) >> No) << c64(32)
    low = c64(0xFFFFFFFF)
    return tir.reinterpret(i32, (e & low) | (o & ~low))


def _lower(op, addend: int = 0):
    """The lowering rule: ``op`` (plus ``addend``) rewritten, or ``op`` itself (TVM's generic rule applies next)."""
    try:
        name = op.op.name
        if name == "tir.q_multiply_shift":
            x, m, q, s = op.args
            mc, sc = int_value(m), int_value(s)
            if mc is None or mc == 1 << 30 or sc is None:  # TVM's own forms (power of two; it needs constants)
                return op
            out = lower_even_odd(x, m, max(sc, 0), max(-sc, 0), q, addend)
        else:
            x, m, ls, rs, q, need_ls = op.args[:6]
            out = lower_even_odd(x, m, ls if int_value(need_ls) != 0 else 0, rs, q, addend)
    except Exception:  # never fail a build over a faster form: TVM's rule is exact
        logger.exception("x86 requantize: %s left to TVM's lowering", op)
        return op
    return op if out is None else out


def EvenOddQMultiplyShift():  # noqa: N802  (a TVM pass, named like TVM's)
    """A ``tir.PrimFunc`` pass: vectorised ``q_multiply_shift`` and ``q_multiply_shift_per_axis``
    calls in even/odd int32 lanes (``vpmuldq``, no int64 widening), with TVM's exact int64 result on
    any CPU; scalar calls and the forms :func:`lower_even_odd` does not take are left to TVM."""
    import tvm
    from tvm import tir

    ops = [tvm.ir.Op.get(name) for name in _OPS]

    def vector_call(node):
        return isinstance(node, tir.Call) and any(node.op.same_as(op) for op in ops) \
            and tvm.DataType(node.dtype).lanes >= 2

    def rewrite(node):
        if not vector_call(node):
            return None
        out = _lower(node)
        return None if out.same_as(node) else out

    def fold(node):  # q_multiply_shift(...) + c, the requantize's output zero point: one rounding term
        for call, c in ((node.a, node.b), (node.b, node.a)):
            addend = int_value(c)
            if vector_call(call) and addend:
                out = _lower(call, addend)
                return None if out.same_as(call) else out
        return None

    def transform(func, _mod, _ctx):
        body = tir.stmt_functor.ir_transform(func.body, None, fold, ["tir.Add"])
        return func.with_body(tir.stmt_functor.ir_transform(body, None, rewrite, ["tir.Call"]))

    return tvm.tir.transform.prim_func_pass(transform, opt_level=0, name=PASS_NAME)


def lower_config(config: dict | None = None) -> dict:
    """``config`` (PassContext options) with :func:`EvenOddQMultiplyShift` added to
    ``tir.add_lower_pass`` once, after the lower passes already there. ``config`` is not modified."""
    from .._lower_pass import with_lower_pass

    return with_lower_pass(config, LOWER_PHASE, PASS_NAME, EvenOddQMultiplyShift)


def applies(target) -> bool:
    """Whether the x86 back end lowers this way for ``target``: AVX2 and AVX-512 (``vpmuldq`` on 256-
    and 512-bit vectors), where convs with a short reduction (64 input channels) spend a large part
    of their time in the epilogue. At SSE4.2 it measured no faster (docs/x86-kernels.md)."""
    from .isa import llvm_features

    features = llvm_features(target)
    return "avx2" in features or "avx512f" in features
