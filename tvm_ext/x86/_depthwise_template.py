"""Another compute and schedule for some of TVM's x86 ``depthwise_conv2d_NCHWc`` convs, under TVM's
AutoTVM task (same name, workload and config knobs), the others left to TVM's own.

Leaf module: :mod:`tvm_ext.x86.depthwise_taps` and the study ``benchmarks/lab/depthwise_tap_groups.py``
put their forms in front of TVM's with these two wrappers.
"""
from __future__ import annotations

import functools
import logging

logger = logging.getLogger(__name__)

__all__ = ["TASK", "wrap_compute", "wrap_schedule", "row_loops", "geometry", "define_knobs"]

TASK = "depthwise_conv2d_NCHWc.x86"


def wrap_compute(original, choose, change: str):
    """TVM's depthwise compute ``original``, with another compute where ``choose`` gives one.

    ``choose(data, kernel, strides, padding, dilation, out_dtype, target)`` returns a function
    ``compute(cfg)`` -> the conv tensor, or a string saying why TVM's compute stays (logged at DEBUG).
    """
    import tvm
    from tvm.autotvm.task import DispatchContext
    from tvm.autotvm.task.task import args_to_workload
    from tvm.autotvm.task.topi_integration import TaskExtractEnv

    @functools.wraps(original)
    def wrapped(data, kernel, strides, padding, dilation, layout, out_layout, out_dtype=None):
        args = (data, kernel, strides, padding, dilation, layout, out_layout, out_dtype)
        out_dtype = data.dtype if out_dtype is None else out_dtype
        target = tvm.target.Target.current(allow_none=True)
        compute = choose(data, kernel, strides, padding, dilation, out_dtype, target)
        if isinstance(compute, str):
            logger.debug("%s: TVM's depthwise conv for %s: %s", change, tuple(data.shape), compute)
            return original(*args)
        task_env = TaskExtractEnv.current
        if task_env is not None and task_env.tracing:
            task_env.add_task(TASK, args)
        workload = args_to_workload(args, TASK)
        node = compute(DispatchContext.current.query(target, workload))
        attrs = dict(node.op.attrs.items())
        attrs["workload"] = workload
        return tvm.te._ffi_api.ComputeOp(node.op.name, node.op.tag, attrs,  # pylint: disable=protected-access
                                         node.op.axis, node.op.body).output(0)

    wrapped._tvm_ext_change = change  # pylint: disable=protected-access
    return wrapped


def wrap_schedule(original, tag: str, schedule, change: str):
    """TVM's depthwise schedule ``original``, with ``schedule(cfg, s, conv, output)`` for the convs whose
    compute has ``tag``."""
    import tvm
    from tvm import te
    from tvm.autotvm.task import DispatchContext
    from tvm.autotvm.task.topi_integration import get_workload
    from tvm.topi.utils import traverse_inline

    @functools.wraps(original)
    def wrapped(outs):
        outs = [outs] if isinstance(outs, te.Tensor) else list(outs)
        found = []
        traverse_inline(te.create_schedule([x.op for x in outs]), outs[0].op,
                        lambda op: found.append(op) if op.tag == tag else None)
        if not found:
            return original(outs)
        cfg = DispatchContext.current.query(tvm.target.Target.current(), get_workload(outs, TASK))
        s = te.create_schedule([x.op for x in outs])
        traverse_inline(s, outs[0].op, lambda op: schedule(cfg, s, op.output(0), outs[0]) if op.tag == tag else None)
        return s

    wrapped._tvm_ext_change = change  # pylint: disable=protected-access
    return wrapped


def row_loops(cfg, s, conv, output, tile_ow: int = 0, scope: str = "global"):
    """TVM's depthwise loop order for ``conv`` and its fused ``output`` in ``s``: rows x channel blocks in
    parallel, ``tile_ow`` pixels of a row (the config's, unless given) accumulated in a cached stage of
    ``scope``, the epilogue per row.

    Returns the cached stage's ``(axes, reduce axes)``; its loops are the caller's to order."""
    tile_ow = tile_ow or cfg["tile_ow"].size[-1]
    cc = s.cache_write(conv, scope)
    for stage in (conv, output) if conv != output else (conv,):
        _, chunk, oh, ow, blk = s[stage].op.axis
        ow_chunk, ow_block = s[stage].split(ow, factor=tile_ow)
        s[stage].reorder(chunk, oh, ow_chunk, ow_block, blk)
        s[stage].vectorize(blk)
        if scope == "local":  # constant offsets into the local tile: LLVM keeps it in registers
            s[stage].unroll(ow_block)
        fused = s[stage].fuse(chunk, oh)
        s[stage].parallel(fused)
        if stage == conv:
            s[cc].compute_at(s[conv], ow_chunk)
    if conv != output:
        s[conv].compute_at(s[output], fused)
    return cc, s[cc].op.axis, s[cc].op.reduce_axis


def geometry(data, kernel, strides, padding, dilation) -> dict:
    """The geometry of a depthwise conv on NCHWc ``data`` with kernel ``[c, 1, kh, kw, 1, b]``: ``n``,
    ``chunks``, ``height``, ``width``, ``block``, ``kh``, ``kw``, ``sh``, ``sw``, ``dh``, ``dw``, ``top``,
    ``left``, ``down``, ``out_h``, ``out_w``."""
    from tvm.topi.nn.utils import get_pad_tuple
    from tvm.topi.utils import get_const_tuple

    n, chunks, height, width, block = get_const_tuple(data.shape)
    _, _, kh, kw, _, _ = get_const_tuple(kernel.shape)
    sh, sw = (int(v) for v in (strides if isinstance(strides, (tuple, list)) else (strides, strides)))
    dh, dw = (int(v) for v in (dilation if isinstance(dilation, (tuple, list)) else (dilation, dilation)))
    top, left, down, right = (int(v) for v in get_pad_tuple(padding, ((kh - 1) * dh + 1, (kw - 1) * dw + 1)))
    out_h = (height + top + down - (kh - 1) * dh - 1) // sh + 1
    out_w = (width + left + right - (kw - 1) * dw - 1) // sw + 1
    return dict(n=n, chunks=chunks, height=height, width=width, block=block, kh=kh, kw=kw, sh=sh, sw=sw, dh=dh,
                dw=dw, top=top, left=left, down=down, out_h=out_h, out_w=out_w)


def define_knobs(cfg, data, kernel, strides, padding, dilation, out_dtype) -> dict:
    """Define TVM's depthwise knobs in ``cfg`` (and, untuned, TVM's fallback config); returns
    :func:`geometry`."""
    import tvm.topi.x86.depthwise_conv2d as depthwise
    from tvm import te

    g = geometry(data, kernel, strides, padding, dilation)
    channels = g["chunks"] * g["block"]
    cfg.define_split("tile_ic", channels, num_outputs=2)
    cfg.define_split("tile_oc", channels, num_outputs=2)
    cfg.define_split("tile_ow", g["out_w"], num_outputs=2, filter=lambda y: y.size[-1] <= 64)
    cfg.define_knob("unroll_kw", [True, False])
    if cfg.is_fallback:
        wkl = depthwise._get_workload(  # pylint: disable=protected-access
            te.placeholder((g["n"], channels, g["height"], g["width"]), dtype=data.dtype),
            te.placeholder((channels, 1, g["kh"], g["kw"]), dtype=kernel.dtype), (g["sh"], g["sw"]),
            (g["top"], g["down"]), (g["dh"], g["dw"]), out_dtype)
        depthwise._fallback_schedule(cfg, wkl)  # pylint: disable=protected-access
    return g
