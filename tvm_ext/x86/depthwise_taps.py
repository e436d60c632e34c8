"""8-bit depthwise convs on AVX-512 VNNI as one ``vpdpbusd`` per 4 taps (``depthwise_taps``).

TVM's x86 depthwise conv multiplies one widened tap per 32-bit lane (``vpdpwssd``: a quarter of
``vpdpbusd``'s products). Here 4 taps share a lane, in one of two forms. Where the target has AVX-512
VBMI, 4 adjacent pixels of a row (``4 x block`` contiguous bytes of the NCHWc input) are loaded as one
vector and permuted in registers into ``[channel][tap]`` order (one ``vpermb``)::

    out[n, c, y, x, i] = sum_{ky, q, j < 4} xp[n, c, y*sh + ky, x*sw + 4q + j, i] * wp[c, ky, 4q + j, i]

Without VBMI that permute is two port-5 µops (``vpermd`` + ``vpshufb``), so the input is regrouped once,
in the padded copy, into groups of 4 pixels in ``[channel][pixel]`` order, and each output meets its
groups through the kernel shifted by its phase ``p = x*sw mod 4``, ``D`` dots per kernel row::

    xg[n, c, r, g, i, j]  = xp[n, c, r, 4g + j, i]
    wt[c, ky, p, d, i, j] = w[c, ky, 4d + j - p, i]   (0 outside the kernel row)
    out[n, c, y, x, i]    = sum_{ky, d < D, j} xg[n, c, y*sh + ky, x*sw // 4 + d, i, j] * wt[c, ky, x*sw % 4, d, i, j]

``xp`` is the input with its zero padding, written once per conv by whole-row vector copies. Both forms
sum TVM's products (zero taps add 0): results are identical. :func:`regroups` gives the target's form;
the knob :data:`FORM_KNOB` lets ``tvm-ext tune`` time the other one on the machine at hand. They apply
to uint8 x int8 -> int32 depthwise convs (channel multiplier 1, dilation 1) with 8- or 16-channel blocks
whose input is the kernel's own argument, on classes whose policy has ``depthwise_taps``; the others keep
TVM's compute, with a DEBUG log saying why. docs/x86-kernels.md ("Depthwise convs in tap groups") has the measurements.
"""
from __future__ import annotations

import math

from . import _depthwise_template

__all__ = ["taps_compute", "taps_schedule", "TAG", "FORM_KNOB", "regroups", "dots_per_kernel_row"]

TAG = "depthwise_conv2d_NCHWc_taps"
#: taps per 32-bit lane of ``vpdpbusd``
TAPS = 4
#: AutoTVM knob choosing the form: ``[regroups(target), not regroups(target)]``, so untuned builds take
#: the target's form
FORM_KNOB = "regroup_taps"
#: a padded input of at most this many bytes is written by one thread: a parallel region costs
#: about as much as copying it (5-6 us per region at 2 threads, Zen 5)
SERIAL_PAD_BYTES = 256 * 1024


def _why_not(data, kernel, strides, padding, dilation, out_dtype, target) -> str:
    """Why the tap form does not apply to these TOPI arguments ("" when it does)."""
    import tvm

    from .int8_policy import policy
    from .isa import llvm_features

    if target is None or not policy(target).depthwise_taps:
        return "the target's class keeps TVM's depthwise conv"
    if not {"avx512vnni", "avx512vl", "avx512bw"} <= llvm_features(target):
        return "no AVX-512 VNNI with 256-bit forms"
    if len(data.shape) != 5 or len(kernel.shape) != 6:
        return "not an NCHWc conv"
    if not isinstance(data.op, tvm.te.PlaceholderOp):
        return "its input is computed in the same kernel"
    if any(not isinstance(s, (int, tvm.tir.IntImm)) for s in tuple(data.shape) + tuple(kernel.shape)):
        return "a dimension is not a compile-time constant"
    block = data.shape[-1]
    if int(kernel.shape[1]) * int(kernel.shape[4]) != 1 or int(kernel.shape[-1]) != int(block):
        return "channel multiplier is not 1"
    if int(block) not in (8, 16):
        return f"channel block {block} is not 8 or 16"
    if (str(data.dtype), str(kernel.dtype), str(out_dtype)) != ("uint8", "int8", "int32"):
        return f"dtypes {data.dtype} x {kernel.dtype} -> {out_dtype} are not uint8 x int8 -> int32"
    dil = dilation if isinstance(dilation, (tuple, list)) else (dilation, dilation)
    if any(int(d) != 1 for d in dil):
        return f"dilation {tuple(int(d) for d in dil)}"
    rows, cols, top, left = _plane(data, kernel, strides, padding, regroups(target))
    if rows <= top or cols <= left:
        return "it reads only padding"
    return ""


def regroups(target) -> bool:
    """Whether ``target``'s tap form regroups the input once (no AVX-512 VBMI: a byte permute in registers
    would be ``vpermd`` + ``vpshufb``, two µops on port 5 per 4 taps) rather than permuting in registers."""
    from .isa import llvm_features

    return "avx512vbmi" not in llvm_features(target)


def _phases(kernel_w: int, stride_w: int, out_w: int) -> tuple:
    """``(D, groups)`` of the regrouped form: dots per kernel row (the most groups of 4 pixels one output's
    taps meet, over the phases ``x * stride_w mod 4`` its outputs take) and groups per padded row."""
    phases = {(x * stride_w) % TAPS for x in range(min(out_w, TAPS))}
    dots = max(-(-(p + kernel_w) // TAPS) for p in phases)
    return dots, ((out_w - 1) * stride_w) // TAPS + dots


def dots_per_kernel_row(kernel_w: int, stride_w: int, out_w: int, target) -> int:
    """``vpdpbusd`` per output, channel block and kernel row in ``target``'s tap form: ``ceil(kw / 4)``
    permuted in registers, ``D`` regrouped (:func:`regroups`). Together they multiply the row's ``kw`` taps
    that carry a weight (``tvm_ext.tools.mca`` credits each dot with its share of them)."""
    if regroups(target):
        return _phases(kernel_w, stride_w, out_w)[0]
    return -(-kernel_w // TAPS)


#: vector registers a regrouped tile may fill: its accumulators, the kernel row's vectors (``D`` per phase) and
#: its groups of 4 pixels, with two of AVX-512's 32 to spare
GROUPED_REGISTERS = 30


def grouped_tile(width: int, stride_w: int, dots: int) -> int:
    """Outputs per register tile of the regrouped form in an output row of ``width`` pixels (instead of the
    config's ``tile_ow``): the most (dividing ``width``) whose accumulators, kernel vectors and pixel groups
    fit :data:`GROUPED_REGISTERS`::

        # T + phases * D + (T * sw) // 4 + D <= 30,  phases = 4 / gcd(sw, 4)
    """
    phases = TAPS // math.gcd(stride_w, TAPS)
    fits = [t for t in range(1, width + 1) if width % t == 0
            and t + phases * dots + (t * stride_w) // TAPS + dots <= GROUPED_REGISTERS]
    return max(fits, default=1)


def _plane(data, kernel, strides, padding, grouped: bool) -> tuple:
    """(rows, columns, top, left) of the padded plane the conv reads: up to the last tap group's 4th tap,
    or the last group of 4 pixels (``grouped``)."""
    g = _depthwise_template.geometry(data, kernel, strides, padding, (1, 1))
    rows = (g["out_h"] - 1) * g["sh"] + g["kh"]
    if grouped:
        cols = TAPS * _phases(g["kw"], g["sw"], g["out_w"])[1]
    else:
        cols = (g["out_w"] - 1) * g["sw"] + -(-g["kw"] // TAPS) * TAPS
    return rows, cols, g["top"], g["left"]


def _pieces(n: int) -> list:
    """Vector sizes in elements covering ``n``: 64 at a time, then powers of two."""
    out, size = [], 64
    while n:
        while size > n:
            size //= 2
        out.append(size)
        n -= size
    return out


def _padded_plane(shape_in, row_stride, shape_out, top, left, dtype):
    """Tensor intrinsic for one channel block's padded plane: ``out[r, x, i] = in[r - top, x - left, i]``
    inside the input, 0 outside, written as whole-row vector copies and zero fills; with ``shape_out``
    ``(rows, groups, block, 4)`` regrouped, ``out[r, g, i, j] = in[r - top, 4g + j - left, i]``: each row
    copied, then each group of 4 pixels permuted in place. ``in`` is the part of the input plane the conv
    reads (``shape_in``), its rows ``row_stride`` elements apart."""
    import tvm
    from tvm import te

    height, width, block = shape_in
    grouped = len(shape_out) == 4
    rows, cols = shape_out[0], shape_out[1] * (TAPS if grouped else 1)
    inp = te.placeholder(shape_in, dtype=dtype, name="plane")
    if grouped:
        out = te.compute(shape_out, lambda r, g, i, j: _pixel(inp, r, g * TAPS + j, i, top, left, height, width),
                         name="grouped")
    else:
        out = te.compute(shape_out, lambda r, x, i: _pixel(inp, r, x, i, top, left, height, width), name="padded")
    lead = [0] * (len(shape_out) - 1)
    group = TAPS * block
    by_channel = [tvm.tir.IntImm("int32", j * block + i) for i in range(block) for j in range(TAPS)]

    def body(ins, outs):
        ib = tvm.tir.ir_builder.create()
        src, dst, row, pitch = ins[0], outs[0], cols * block, row_stride

        def copy(dst_at, count, src_at=None):  # count elements from src_at, or zeros
            pos = 0
            for size in _pieces(count):
                kind = dtype if size == 1 else f"{dtype}x{size}"
                value = tvm.tir.const(0, kind) if src_at is None else src.vload([0, 0, src_at + pos], kind)
                ib.emit(dst.vstore(lead + [dst_at + pos], value))
                pos += size

        def zero_rows(first, count):
            if count > 0:
                with ib.for_range(0, count, name="r") as r:
                    copy((first + r) * row, row)

        zero_rows(0, top)
        with ib.for_range(0, height, name="y") as y:
            at = (top + y) * row
            if left:
                copy(at, left * block)
            with ib.for_range(0, width * block // 64, name="v") as v:
                ib.emit(dst.vstore(lead + [at + left * block + v * 64],
                                   src.vload([0, 0, y * pitch + v * 64], f"{dtype}x64")))
            done = width * block // 64 * 64
            copy(at + left * block + done, width * block - done, y * pitch + done)
            copy(at + (left + width) * block, (cols - left - width) * block)
            if grouped:  # [4 pixels][block] -> [block][4 pixels], in place (zero rows need none)
                with ib.for_range(0, cols // TAPS, name="g") as g:
                    pixels = dst.vload(lead + [at + g * group], f"{dtype}x{group}")
                    ib.emit(dst.vstore(lead + [at + g * group], tvm.tir.Shuffle([pixels], by_channel)))
        zero_rows(top + height, rows - top - height)
        return ib.get()

    binds = {inp: tvm.tir.decl_buffer(inp.shape, dtype, name="plane_buf", offset_factor=1,
                                      strides=[row_stride, block, 1])}
    return te.decl_tensor_intrin(out.op, body, binds=binds, default_buffer_params={"offset_factor": 1})


def _pixel(data, r, x, i, top, left, height, width, lead=()):
    """The padded input at row ``r``, column ``x``: ``data[lead..., r - top, x - left, i]`` or 0."""
    import tvm
    from tvm import te

    yy, xx = r - top, x - left
    inside = tvm.tir.all(yy >= 0, yy < height, xx >= 0, xx < width)
    value = data[(*lead, te.max(te.min(yy, height - 1), 0), te.max(te.min(xx, width - 1), 0), i)]
    return tvm.tir.Select(inside, value, tvm.tir.const(0, data.dtype))


def _tap_dot(lanes: int, data_t: str, kernel_t: str, grouped: bool = False):
    """Tensor intrinsic ``acc[i] += sum_{j < 4} data[j, i] * kernel[j, i]`` (4 pixels x ``lanes`` channels
    each): both operands permuted in registers to ``[i][j]``, then one ``vpdpbusd``; ``grouped``: operands
    already ``[i][j]`` (``data[i, j]``, ``kernel[i, j]``), one ``vpdpbusd``."""
    import tvm
    from tvm import te

    shape = (lanes, TAPS) if grouped else (TAPS, lanes)
    data = te.placeholder(shape, dtype=data_t, name="data")
    kernel = te.placeholder(shape, dtype=kernel_t, name="kernel")
    j = te.reduce_axis((0, TAPS), name="j")

    def at(t, i):
        return t[i, j] if grouped else t[j, i]

    out = te.compute((lanes,), lambda i: te.sum(at(data, i).astype("int32") * at(kernel, i).astype("int32"), axis=j),
                     name="C")
    binds = {t: tvm.tir.decl_buffer(t.shape, dtype=t.dtype, name=t.name + "_buf", offset_factor=1)
             for t in (data, kernel)}
    if grouped:  # the accumulators: a tile-sized local buffer (LLVM keeps it in registers, with no memset)
        binds[out] = tvm.tir.decl_buffer(out.shape, dtype=out.dtype, name="acc_buf", offset_factor=1, scope="local")
    acc_t = f"int32x{lanes}"
    order = [tvm.tir.IntImm("int32", j * lanes + i) for i in range(lanes) for j in range(TAPS)]

    def by_lane(buf, dtype):
        value = buf.vload([0, 0], f"{dtype}x{lanes * TAPS}")
        return value if grouped else tvm.tir.Shuffle([value], order)

    def body(ins, outs):
        def emit(kind):  # "body": acc = dot, "reset": acc = 0, "update": acc += dot
            ib = tvm.tir.ir_builder.create()
            acc = outs[0].vload([0], acc_t) if kind == "update" else tvm.tir.const(0, acc_t)
            value = acc if kind == "reset" else tvm.tir.call_llvm_pure_intrin(
                acc_t, f"llvm.x86.avx512.vpdpbusd.{32 * lanes}", tvm.tir.const(3, "uint32"), acc,
                by_lane(ins[0], data_t), by_lane(ins[1], kernel_t))
            ib.emit(outs[0].vstore(0, value))
            return ib.get()

        return emit("body"), emit("reset"), emit("update")

    return te.decl_tensor_intrin(out.op, body, binds=binds, default_buffer_params={"offset_factor": 1})


def _tuned_form(cfg, grouped: bool, data, kernel, strides, padding) -> bool:
    """The form ``cfg`` picks with :data:`FORM_KNOB` (``grouped``, the target's form, first); the target's form
    for a record tuned without the knob, or where the other form's padded plane would hold no input."""
    cfg.define_knob(FORM_KNOB, [grouped, not grouped])
    try:
        picked = bool(cfg[FORM_KNOB].val)
    except KeyError:  # a record from before the knob: its config has no entry for it
        return grouped
    rows, cols, top, left = _plane(data, kernel, strides, padding, picked)
    return picked if rows > top and cols > left else grouped


def taps_compute(cfg, data, kernel, strides, padding, out_dtype, grouped: bool = False):
    """The conv in tap groups (module note) for NCHWc ``data`` and kernel ``[c, 1, kh, kw, 1, block]``,
    permuted in registers or regrouped once (``grouped``: the target's form, which the tuned knob
    :data:`FORM_KNOB` may swap); ``cfg`` gets TVM's knobs and, untuned, TVM's fallback config."""
    import tvm
    from tvm import te

    g = _depthwise_template.define_knobs(cfg, data, kernel, strides, padding, (1, 1), out_dtype)
    grouped = _tuned_form(cfg, grouped, data, kernel, strides, padding)
    n, chunks, height, width, block = (g[k] for k in ("n", "chunks", "height", "width", "block"))
    kh, kw, sh, sw, top, left = (g[k] for k in ("kh", "kw", "sh", "sw", "top", "left"))
    out_h, out_w = g["out_h"], g["out_w"]
    # the padded plane: what the conv reads (a stride may leave the input's last rows and columns unread)
    rows, cols, _, _ = _plane(data, kernel, strides, padding, grouped)
    read_h, read_w = min(height, rows - top), min(width, cols - left)
    attrs = {"pad": (top, left), "read": (read_h, read_w)}
    ky = te.reduce_axis((0, kh), name="ky")
    j = te.reduce_axis((0, TAPS), name="j")
    if grouped:
        return _grouped_compute(g, data, kernel, out_dtype, (rows, cols // TAPS), attrs, ky, j)
    groups = -(-kw // TAPS)
    xp = te.compute((n, chunks, rows, cols, block),
                    lambda b, c, r, x, i: _pixel(data, r, x, i, top, left, read_h, read_w, lead=(b, c)),
                    name="taps_padded_data", attrs=attrs)
    wp = te.compute((chunks, kh, groups * TAPS, block),
                    lambda c, y, x, i: tvm.tir.Select(x < kw, kernel[c, 0, y, te.min(x, kw - 1), 0, i],
                                                      tvm.tir.const(0, kernel.dtype)), name="taps_padded_kernel")
    q = te.reduce_axis((0, groups), name="q")
    return te.compute(
        (n, chunks, out_h, out_w, block),
        lambda b, c, y, x, i: te.sum(xp[b, c, y * sh + ky, x * sw + q * TAPS + j, i].astype(out_dtype)
                                     * wp[c, ky, q * TAPS + j, i].astype(out_dtype), axis=[ky, q, j]),
        name="DepthwiseConv2dTaps", tag=TAG)


def _grouped_compute(g, data, kernel, out_dtype, plane, attrs, ky, j):
    """:func:`taps_compute`'s regrouped form (module note): the padded plane in groups of 4 pixels, the kernel
    row shifted per phase, ``D`` dots per kernel row."""
    import tvm
    from tvm import te

    n, chunks, block, kh, kw, sh, sw = (g[k] for k in ("n", "chunks", "block", "kh", "kw", "sh", "sw"))
    (rows, groups), dots = plane, _phases(kw, sw, g["out_w"])[0]
    top, left, (read_h, read_w) = g["top"], g["left"], attrs["read"]
    xg = te.compute((n, chunks, rows, groups, block, TAPS),
                    lambda b, c, r, q, i, t: _pixel(data, r, q * TAPS + t, i, top, left, read_h, read_w, lead=(b, c)),
                    name="taps_grouped_data", attrs=attrs)
    # the kernel row between TAPS - 1 zero taps on each side, so that wt is a pure index of it (TVM 0.19's
    # simplifier folds "4d + t - p < 4" to "d < 1": docs/tvm-bugs.md)
    span = (dots + 1) * TAPS - 1
    kp = te.compute((chunks, kh, span, block), lambda c, y, u, i: tvm.tir.Select(
        tvm.tir.all(u >= TAPS - 1, u < kw + TAPS - 1), kernel[c, 0, y, te.max(te.min(u - (TAPS - 1), kw - 1), 0), 0, i],
        tvm.tir.const(0, kernel.dtype)), name="taps_padded_kernel")
    wt = te.compute((chunks, kh, TAPS, dots, block, TAPS),
                    lambda c, y, p, d, i, t: kp[c, y, d * TAPS + t - p + TAPS - 1, i], name="taps_phase_kernel")
    d = te.reduce_axis((0, dots), name="d")
    return te.compute(
        (n, chunks, g["out_h"], g["out_w"], block),
        lambda b, c, y, x, i: te.sum(
            xg[b, c, y * sh + ky, tvm.tir.floordiv(x * sw, TAPS) + d, i, j].astype(out_dtype)
            * wt[c, ky, tvm.tir.floormod(x * sw, TAPS), d, i, j].astype(out_dtype), axis=[ky, d, j]),
        name="DepthwiseConv2dTaps", tag=TAG, attrs={"stride_w": sw})


def taps_schedule(cfg, s, conv, output):
    """Schedule ``conv`` (:func:`taps_compute`) and its fused ``output``: the padded input by whole planes
    (one thread up to :data:`SERIAL_PAD_BYTES`), then TVM's depthwise loop order, ``tile_ow`` accumulators per
    row, parallel over channel blocks x rows, one :func:`_tap_dot` per 4 taps and channel block."""
    xp, wp = conv.op.input_tensors
    data = xp.op.input_tensors[0]
    block = int(conv.shape[-1])
    grouped = xp.op.name == "taps_grouped_data"
    b, c, y = s[xp].op.axis[:3]
    outer = s[xp].fuse(b, c)
    size = 1
    for dim in xp.shape:
        size *= int(dim)
    if size > SERIAL_PAD_BYTES:
        s[xp].parallel(outer)
    top, left = (int(v) for v in xp.op.attrs["pad"])
    read_h, read_w = (int(v) for v in xp.op.attrs["read"])
    plane = (read_h, read_w, block)
    s[xp].tensorize(y, _padded_plane(plane, int(data.shape[3]) * block, tuple(int(v) for v in xp.shape[2:]),
                                     top, left, data.dtype))
    if grouped:
        _grouped_loops(cfg, s, conv, output, xp, wp)
        return
    s[wp].vectorize(s[wp].op.axis[-1])
    cc, (_, chunk, oh, ow, blk), (ky, q, j) = _depthwise_template.row_loops(cfg, s, conv, output)
    s[cc].reorder(chunk, oh, ky, q, ow, j, blk)
    if cfg["unroll_kw"].val:
        s[cc].unroll(q)
    s[cc].unroll(ow)
    s[cc].tensorize(j, _tap_dot(block, xp.dtype, wp.dtype))


def _grouped_loops(cfg, s, conv, output, xg, wt):
    """:func:`taps_schedule`'s loops for the regrouped form: the shifted kernel built vector-wise, then a register
    tile of its own (:func:`grouped_tile`, the kernel row's phase vectors and pixel groups beside it) in a local
    stage, every dot of a kernel row with the tile's outputs sharing each group of 4 pixels."""
    kp = wt.op.input_tensors[0]
    s[kp].vectorize(s[kp].op.axis[-1])
    axes = s[wt].op.axis
    s[wt].reorder(*axes[:-2], axes[-1], axes[-2])
    s[wt].vectorize(axes[-2])
    width = grouped_tile(int(conv.shape[3]), int(conv.op.attrs["stride_w"]), int(wt.shape[3]))
    cc, (_, chunk, oh, ow, blk), (ky, d, j) = _depthwise_template.row_loops(cfg, s, conv, output, width, "local")
    s[cc].reorder(chunk, oh, ky, d, ow, blk, j)
    s[cc].unroll(d)
    s[cc].unroll(ow)
    s[cc].tensorize(blk, _tap_dot(int(conv.shape[-1]), xg.dtype, wt.dtype, grouped=True))


def _choose(data, kernel, strides, padding, dilation, out_dtype, target):
    """:func:`taps_compute` for these TOPI arguments, or why TVM's compute stays."""
    why = _why_not(data, kernel, strides, padding, dilation, out_dtype, target)
    grouped = not why and regroups(target)
    return why or (lambda cfg: taps_compute(cfg, data, kernel, strides, padding, out_dtype, grouped))


def wrap_compute(original):
    """TVM's ``depthwise_conv2d_NCHWc`` compute, with :func:`taps_compute` where the form applies: the same
    AutoTVM task name, workload and config as TVM's template."""
    return _depthwise_template.wrap_compute(original, _choose, "depthwise_taps")


def wrap_schedule(original):
    """TVM's ``schedule_depthwise_conv2d_NCHWc``, with :func:`taps_schedule` for convs of :func:`taps_compute`."""
    return _depthwise_template.wrap_schedule(original, TAG, taps_schedule, "depthwise_taps")
