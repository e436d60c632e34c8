"""Gathers from a register tile as shuffles of its whole vectors (``LocalGatherAsShuffle``), while tvm-ext builds.

Design note
-----------
The ``smmla`` conv (:mod:`tvm_ext.arm.mmla_conv`) keeps its tile of 2 x 2 int32 blocks in a local
buffer and writes NCHW8c rows from it: each output vector takes two lanes of each of four blocks
(``tile[x2, c // 2, x % 2, c % 2]`` for ``c < 8``), a vector load whose index is a constant
non-contiguous vector. LLVM keeps a buffer that is read by element in memory: the tile is stored to
the stack, zeroed there first, and read back 8 bytes at a time with lane moves. The pass rewrites
such a load as the aligned 16-byte vectors of the buffer that hold its lanes and one shuffle::

    # tile[[0, 1, 4, 5, 8, 9, 12, 13]] -> shuffle(tile[0:4], tile[4:8], tile[8:12], tile[12:16]; 0, 1, 4, 5, ...)

Every access to the buffer is then a whole aligned vector, so LLVM keeps the tile in registers and
regroups its blocks with ``zip1``/``zip2``. Only loads from ``local`` buffers whose index lanes are
all constants change (the same values, so the result is exact); any other load is left as it is.
The aarch64 back end adds it to its build's PassContext (``tir.add_lower_pass``, :func:`lower_config`)
at classes with the ``smmla`` conv, after vectorisation.
"""
from __future__ import annotations

__all__ = ["LocalGatherAsShuffle", "lower_config", "PASS_NAME", "LOWER_PHASE", "constant_lanes"]

#: The pass's name in ``tir.add_lower_pass`` (one per PassContext).
PASS_NAME = "tvm_ext.arm.LocalGatherAsShuffle"
#: ``tir.add_lower_pass`` phase: after ``VectorizeLoop`` and buffer flattening (1-D vector indices).
LOWER_PHASE = 3
#: Bytes of one NEON vector register: the aligned pieces a gather is rebuilt from.
_VECTOR_BYTES = 16


def constant_lanes(e, lanes: int):
    """The integer value of each of ``lanes`` lanes of index expression ``e``, or None if one is not a
    constant (only ``IntImm``, ``Broadcast``, ``Ramp``, ``+``, ``-``, ``*``, floor ``//`` and ``%``)."""
    from tvm import tir

    if isinstance(e, tir.IntImm):
        return [int(e.value)] * lanes
    if isinstance(e, tir.Broadcast):
        return constant_lanes(e.value, lanes)
    if isinstance(e, tir.Ramp):
        base, stride = constant_lanes(e.base, 1), constant_lanes(e.stride, 1)
        if base is None or stride is None:
            return None
        return [base[0] + i * stride[0] for i in range(lanes)]
    ops = {tir.Add: lambda a, b: a + b, tir.Sub: lambda a, b: a - b, tir.Mul: lambda a, b: a * b,
           tir.FloorDiv: lambda a, b: a // b if b else None, tir.FloorMod: lambda a, b: a % b if b else None}
    for kind, fn in ops.items():
        if isinstance(e, kind):
            a, b = constant_lanes(e.a, lanes), constant_lanes(e.b, lanes)
            if a is None or b is None:
                return None
            out = [fn(x, y) for x, y in zip(a, b)]
            return None if any(v is None for v in out) else out
    return None


def _as_shuffle(load):
    """``load`` (a vector BufferLoad) as a Shuffle of aligned whole-vector loads, or None."""
    import tvm
    from tvm import tir

    buf = load.buffer
    dtype = tvm.DataType(load.dtype)
    lanes = dtype.lanes
    if lanes <= 1 or len(load.indices) != 1 or buf.scope() != "local" or isinstance(load.indices[0], tir.Ramp):
        return None
    if tvm.DataType(buf.dtype).lanes != 1 or tvm.DataType(load.indices[0].dtype).lanes != lanes:
        return None
    idx = constant_lanes(load.indices[0], lanes)
    width = _VECTOR_BYTES * 8 // dtype.bits
    if idx is None or width < 2 or any(v < 0 for v in idx):
        return None
    pieces = sorted({v // width for v in idx})
    size = constant_lanes(buf.shape[0], 1) if len(buf.shape) == 1 else None
    if size is None or (pieces[-1] + 1) * width > size[0]:  # whole vectors inside the buffer only
        return None
    if len(pieces) * width > 4 * lanes:  # a sparse gather: more data moved than the lanes it keeps
        return None
    vectors = [tir.BufferLoad(buf, [tir.Ramp(tir.const(p * width, "int32"), tir.const(1, "int32"), width)])
               for p in pieces]
    where = {p: i for i, p in enumerate(pieces)}
    return tir.Shuffle(vectors, [tir.const(where[v // width] * width + v % width, "int32") for v in idx])


def _rewrite(func):
    from tvm import tir

    def _post(node):
        if isinstance(node, tir.BufferLoad):
            return _as_shuffle(node)
        return None

    body = tir.stmt_functor.ir_transform(func.body, None, _post, ["tir.BufferLoad"])
    return func if body.same_as(func.body) else func.with_body(body)


def LocalGatherAsShuffle():  # noqa: N802 - named like TVM's pass factories
    """A ``tir.PrimFunc`` pass: constant-index gathers from ``local`` buffers as shuffles of aligned
    vectors (module note). For ``tir.add_lower_pass`` (:func:`lower_config`)."""
    import tvm

    return tvm.tir.transform.prim_func_pass(lambda f, _m, _c: _rewrite(f), opt_level=0, name=PASS_NAME)


def lower_config(config: dict | None = None) -> dict:
    """``config`` (PassContext options) with :func:`LocalGatherAsShuffle` added to ``tir.add_lower_pass``
    once, after the lower passes already there. ``config`` is not modified."""
    from .._lower_pass import with_lower_pass

    return with_lower_pass(config, LOWER_PHASE, PASS_NAME, LocalGatherAsShuffle)
