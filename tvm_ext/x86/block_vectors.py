"""Vectorizing over the channel block of ``NCHW[x]c`` tensors on x86: the pool and injective
schedules :func:`tvm_ext.x86.int8_conv.kernels` puts in place of TVM's.

- ``pool_prologue_inline``: a pool's injective producers inlined into it.
- ``global_pool_channel_vector``: a global/adaptive pool vectorized over its channel block.
- ``block_vector_lanes``: a channel block wider than 16 that 16 does not divide (24, 40: the int8 convs'
  24-lane blocks on AVX-512 VNNI) is vectorized in vectors of 8 lanes, not TVM's 16 with a tail. TVM's
  injective schedule splits the innermost axis by 16; with a block of 24 the vector then crosses a
  pixel boundary in its index arithmetic, and LLVM gathers its bytes one by one
  (``vpinsrb``, ``vpscatterqd``): an elementwise kernel on 80x80x24 bytes took 2.2x the time of the
  same values blocked by 8.

None of these changes a value: each element is computed by the same expression in the same order.
Measurements in docs/x86-kernels.md.
"""
from __future__ import annotations

__all__ = ["inline_pool_producers", "vectorize_pool_channel_block", "injective_block_vectors", "vector_lanes"]

#: Widest channel block ``global_pool_channel_vector`` vectorizes a global pool over (TVM's own limit
#: for its pool vectorizer).
_MAX_POOL_VECTOR = 64
#: TVM's x86 injective schedule's vector: the innermost axis split by this many lanes.
_TVM_INJECTIVE_LANES = 16


def vector_lanes(block: int):
    """Lanes of the vectors a channel block of ``block`` channels is computed in where TVM's would not
    fit it (``block_vector_lanes``): 8 for a block wider than 16 that 16 does not divide and 8 does
    (24, 40, 56), else None (TVM's vector stays)."""
    wide = block > _TVM_INJECTIVE_LANES and block % _TVM_INJECTIVE_LANES != 0
    return 8 if wide and block % 8 == 0 else None


def injective_block_vectors(schedule_fn):
    """``schedule_fn`` (TVM's x86 ``schedule_injective_from_existing``), except for an ``NCHW[x]c``
    output (five or more axes) whose innermost axis, the channel block, :func:`vector_lanes` splits
    (24, 40; ``block_vector_lanes``): the same parallel loop over the outer axes, the block split into
    vectors of 8 lanes (a whole number of them per pixel) instead of TVM's 16."""
    import functools

    from tvm import tir

    @functools.wraps(schedule_fn)
    def wrapped(sch, out):
        axes = sch[out].op.axis
        block = axes[-1].dom.extent if len(axes) >= 5 else None
        lanes = vector_lanes(int(block)) if isinstance(block, tir.IntImm) else None
        if lanes is None:
            return schedule_fn(sch, out)
        sch[out].parallel(sch[out].fuse(axes[0], axes[1], axes[2]))
        _, inner = sch[out].split(axes[-1], factor=lanes)
        sch[out].vectorize(inner)
        return sch

    wrapped._tvm_ext_change = "block_vector_lanes"  # pylint: disable=protected-access
    return wrapped


def float_product_summed(op, reader) -> bool:
    """True when ``op`` computes a float product and ``reader`` sums it (a reduction).

    Inlined, the product would feed the sum's add directly, and LLVM (TVM allows floating-point
    contraction) fuses the two into one ``vfmadd``: one rounding where TVM's schedule, which keeps
    the product in its own stage, rounds twice. Such a stage keeps its buffer.
    """
    from tvm import te, tir

    body = op.body[0]
    return (isinstance(reader, te.tensor.ComputeOp) and isinstance(reader.body[0], tir.Reduce)
            and isinstance(body, tir.Mul) and body.dtype.startswith("float"))


def inline_pool_producers(schedule_fn):
    """``schedule_fn`` (a TVM x86 pool schedule), then every injective producer of the pool inlined,
    except a float product the pool's sum reads (:func:`float_product_summed`).

    Inlining an elementwise/injective stage into its reader does not change a value (the same
    expression is evaluated per element) unless the compiler contracts a multiply into the add that
    reads it; it removes the stage's own loop nest and buffer.
    """
    import functools

    from tvm import te
    from tvm.topi import tag

    @functools.wraps(schedule_fn)
    def wrapped(outs, *args, **kwargs):
        s = schedule_fn(outs, *args, **kwargs)
        outs = [outs] if isinstance(outs, te.tensor.Tensor) else list(outs)
        out_ops = {o.op for o in outs}
        seen, stack = set(), [(t, o.op) for o in outs for t in o.op.input_tensors]
        while stack:
            tensor, reader = stack.pop()
            op = tensor.op
            if op in seen or not isinstance(op, te.tensor.ComputeOp):
                continue
            seen.add(op)
            if tag.is_injective(op.tag) and op not in out_ops and not float_product_summed(op, reader):
                s[op].compute_inline()
            stack.extend((t, op) for t in op.input_tensors)
        return s

    wrapped._tvm_ext_change = "pool_prologue_inline"  # pylint: disable=protected-access
    return wrapped


def vectorize_pool_channel_block(schedule_fn):
    """``schedule_fn`` (TVM's x86 ``schedule_adaptive_pool``), then every global/adaptive pool over a
    channel-blocked layout (``NCHW[x]c``) vectorized over its channel block
    (``global_pool_channel_vector``): the reduction loops move outside the block, so each step adds
    one contiguous vector of channels (a block of 24, vectors of :func:`vector_lanes`).

    Every channel's sum runs over the same window positions in the same order as in TVM's schedule:
    the results are bit-identical; only the loop order and the vector width change."""
    import functools

    from tvm import te

    @functools.wraps(schedule_fn)
    def wrapped(outs, *args, **kwargs):
        s = schedule_fn(outs, *args, **kwargs)
        for stage in s.stages:
            op = stage.op
            if not (isinstance(op, te.ComputeOp) and op.tag.startswith("adaptive_pool") and len(op.axis) == 5):
                continue
            block, red = op.axis[4], list(op.reduce_axis)
            leaves = list(stage.leaf_iter_vars)
            if not any(v.same_as(block) for v in leaves) or int(block.dom.extent) > _MAX_POOL_VECTOR:
                continue  # already split or fused by another schedule rule, or too wide a block
            rest = [v for v in leaves if not v.same_as(block) and not any(v.same_as(r) for r in red)]
            stage.reorder(*rest, *red, block)
            lanes = vector_lanes(int(block.dom.extent))
            if lanes is None:
                stage.vectorize(block)
            else:  # a 24-channel block: three vectors of 8
                outer, inner = stage.split(block, factor=lanes)
                stage.unroll(outer)
                stage.vectorize(inner)
        return s

    wrapped._tvm_ext_change = "global_pool_channel_vector"  # pylint: disable=protected-access
    return wrapped
