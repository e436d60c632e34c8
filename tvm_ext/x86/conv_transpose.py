"""Transposed convolutions whose stride equals their kernel, computed without the zeros.

TVM 0.19's x86 ``conv2d_transpose_nchw`` dilates its input with ``stride - 1`` zeros between
pixels and runs a dense conv over the result: for a ``k x k`` kernel with stride ``k`` (the
upsampling heads of segmentation and text detection) ``k*k - 1`` of every ``k*k``
multiply-accumulates read a zero. With stride ``(kh, kw)`` equal to the kernel, no padding and no
output padding, every output pixel reads exactly one input pixel::

    # out[n, co, y, x] = sum_ci data[n, ci, y // kh, x // kw] * w[ci, co, y % kh, x % kw]

:func:`conv2d_transpose_nchw` computes that directly and :func:`schedule_conv2d_transpose_nchw`
schedules it per output row, computing the stages that produce the conv's data once per row into a
row buffer. Other transposed convolutions (overlapping windows, padding) keep TVM's compute and
schedule. The products, their types and their order are TVM's non-zero terms: integer results are
identical, float ones hold the same terms in the same order.

:func:`tvm_ext.x86.int8_conv.kernels` installs both functions while it is entered (``schedule=True``);
the change is named ``conv_transpose_without_zeros`` there. The schedule in full and its
measurements: docs/x86-kernels.md ("Transposed convs whose stride equals their kernel").
"""
from __future__ import annotations

__all__ = ["conv2d_transpose_nchw", "schedule_conv2d_transpose_nchw", "TAG", "stride_equals_kernel"]

#: Tag of the direct compute (``te.ComputeOp.tag``).
TAG = "conv2d_transpose_nchw_stride_eq_kernel"
#: Input columns per vector of the direct schedule.
VECTOR = 16


def stride_equals_kernel(kernel_shape, strides, padding, output_padding) -> bool:
    """True when a transposed conv's windows tile its output exactly (stride = kernel, no padding)."""
    try:
        kh, kw = (int(d) for d in kernel_shape[2:4])
        sh, sw = (int(s) for s in strides)
        pads = [int(p) for p in padding]
        opad = [int(p) for p in output_padding]
    except (TypeError, ValueError):  # symbolic shapes: TVM's compute
        return False
    return (sh, sw) == (kh, kw) and not any(pads) and not any(opad)


def conv2d_transpose_nchw(fallback):
    """``fallback`` (TVM's x86 ``conv2d_transpose_nchw``), computing stride-equals-kernel transposed
    convolutions directly (module note)."""
    import functools

    from tvm import te

    @functools.wraps(fallback)
    def wrapped(data, kernel, strides, padding, out_dtype, output_padding):
        if not stride_equals_kernel(kernel.shape, strides, padding, output_padding) or len(data.shape) != 4:
            return fallback(data, kernel, strides, padding, out_dtype, output_padding)
        n, ci_n, h, w = data.shape
        _, co_n, kh, kw = (int(d) for d in kernel.shape)
        ci = te.reduce_axis((0, ci_n), name="ci")
        # out[n, co, y, x] = sum_ci data[n, ci, y // kh, x // kw] * w[ci, co, y % kh, x % kw]
        return te.compute(
            (n, co_n, h * kh, w * kw),
            lambda b, co, y, x: te.sum(
                data[b, ci, y // kh, x // kw].astype(out_dtype) * kernel[ci, co, y % kh, x % kw].astype(out_dtype),
                axis=ci),
            name="conv2d_transpose_nchw", tag=TAG)

    wrapped._tvm_ext_change = "conv_transpose_without_zeros"  # pylint: disable=protected-access
    return wrapped


def _find(outs, tag):
    """The compute op tagged ``tag`` among ``outs`` and their producers (one fused group), or None."""
    from tvm import te

    seen, stack = set(), [o.op for o in outs]
    while stack:
        op = stack.pop()
        if op in seen or not isinstance(op, te.ComputeOp):
            continue
        seen.add(op)
        if op.tag == tag:
            return op
        stack.extend(t.op for t in op.input_tensors)
    return None


def schedule_conv2d_transpose_nchw(fallback):
    """``fallback`` (TVM's x86 ``schedule_conv2d_transpose_nchw``), scheduling the direct compute of
    :func:`conv2d_transpose_nchw` per output row (module note)."""
    import functools

    from tvm import te
    from tvm.topi import tag
    from tvm.topi.utils import traverse_inline

    @functools.wraps(fallback)
    def wrapped(outs):
        outs = [outs] if isinstance(outs, te.tensor.Tensor) else list(outs)
        if _find(outs, TAG) is None:
            return fallback(outs)
        s = te.create_schedule([o.op for o in outs])
        last = outs[0]

        def callback(op):
            if op.tag != TAG:
                return
            conv = op.output(0)
            kw = int(op.input_tensors[1].shape[3])
            data = op.input_tensors[0].op
            if isinstance(data, te.ComputeOp) and tag.is_injective(data.tag):
                # a grouped input chain: computed once per output row into a row buffer (all input
                # channels of input row y // kh), not per read (per output channel and phase)
                for t in data.input_tensors:
                    _inline_producers(s, t.op)
                row = _row_loops(s, last, kw, channels_inside=True)
                s[data].compute_at(s[last], row)
                _, wi = s[data].split(list(s[data].op.axis)[3], factor=VECTOR)
                s[data].vectorize(wi)
            else:
                row = _row_loops(s, last, kw)
            if conv.op != last.op:
                s[conv].compute_at(s[last], row)
                _vector_loops(s, conv, kw, list(s[conv].op.axis)[3], reduce=True)

        traverse_inline(s, last.op, callback)
        return s

    wrapped._tvm_ext_change = "conv_transpose_without_zeros"  # pylint: disable=protected-access
    return wrapped


def _inline_producers(s, op):
    """Inline ``op`` and the elementwise/injective stages computing it (TVM's ``traverse_inline``
    stops at the conv): the dequantize, BatchNorm, ReLU that
    :mod:`~tvm_ext.passes.dequantize_in_conv_transpose` groups into the kernel, computed inside the
    row buffer's stage."""
    from tvm import te
    from tvm.topi import tag

    stack, seen = [op], set()
    while stack:
        op = stack.pop()
        if op in seen or not isinstance(op, te.ComputeOp) or not tag.is_injective(op.tag):
            continue
        seen.add(op)
        s[op].compute_inline()
        stack.extend(t.op for t in op.input_tensors)


def _row_loops(s, out, kw, channels_inside=False):
    """Parallel rows of ``out`` (n, c, y fused; or n, y with the channels inside each row), its
    columns split into phases and vectors; the fused row loop (where the conv is computed for an
    epilogue)."""
    n, c, y, x = s[out].op.axis
    if channels_inside:
        s[out].reorder(n, y, c, x)
        row = s[out].fuse(n, y)
    else:
        row = s[out].fuse(n, c, y)
    s[out].parallel(row)
    _vector_loops(s, out, kw, x, reduce=out.op.tag == TAG)
    return row


def _vector_loops(s, t, kw, x, reduce):
    """Columns ``x = w * kw + j`` of stage ``t``: phase ``j`` outside, ``VECTOR`` columns ``w`` per
    vector innermost (after the ``ci`` reduction when ``t`` is the conv itself)."""
    w, j = s[t].split(x, factor=kw)
    wo, wi = s[t].split(w, factor=VECTOR)
    red = list(s[t].op.reduce_axis) if reduce else []
    s[t].reorder(j, wo, *red, wi)
    s[t].vectorize(wi)
