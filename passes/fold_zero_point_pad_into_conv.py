"""FoldZeroPointPadIntoConv: a non-zero (zero-point) pad in front of an integer conv folds into it.

Rewrites::

    # conv(pad(x, z), w)                   -> add(conv(x, w, padding=p + pad), cast(C, int32))
    # conv(layout_transform(pad(x, z)), w) -> add(conv(layout_transform(x), w, padding=p + pad), cast(C, int32))

As data: :data:`RULES`, rules of the shared shape (``tvm_ext._rules.Rule``): a dataflow pattern, a
check (named side conditions, then the border constant), a rewrite.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``FoldZeroPointPadIntoConv``.
"""
from __future__ import annotations

import functools
import operator

import numpy as np

import tvm
from tvm import relay
from tvm.relay import dataflow_pattern as dfp

from tvm_ext._rules import Rule, first_rewrite
from ._registry import register_pass

from . import _layout
from ._doc import factory_sections
from ._util import (
    Reject,
    constant_scalar,
    conv_padding,
    fixed_point,
    function_pass,
    int_list,
    op_calls,
    op_name,
    pass_logger,
    static_shape,
    static_tensor_type,
    substitute,
)

__all__ = ["CONV_OPS", "FoldZeroPointPadIntoConv", "block", "border_constant", "unblock"]

PASS_NAME = "FoldZeroPointPadIntoConv"
_log = pass_logger(PASS_NAME)
#: Sweeps before giving up (one pad of a chain of pads in front of a conv folds per sweep).
MAX_ROUNDS = 8

#: The convolutions the rules are rooted at (their data input is read through a pad).
CONV_OPS = ("nn.conv2d", "nn.contrib_conv2d_NCHWc", "nn.contrib_depthwise_conv2d_NCHWc")
_NARROW = (("int8", -128, 127), ("int16", -32768, 32767), ("int32", -(2**31), 2**31 - 1))


# --- layouts ----------------------------------------------------------------------------------
def unblock(arr: np.ndarray, layout: str, primal: str) -> np.ndarray:
    """``arr`` stored in (blocked) ``layout`` as an array of axes ``primal`` (e.g. "OIHW")."""
    groups = _layout.primal_groups(layout, primal)
    perm = [i for g in groups for i in g]
    moved = np.transpose(arr, perm)
    sizes, k = [], 0
    for g in groups:
        sizes.append(int(np.prod(moved.shape[k:k + len(g)])))
        k += len(g)
    return moved.reshape(sizes)


def block(arr: np.ndarray, primal: str, layout: str) -> np.ndarray:
    """The inverse of :func:`unblock`: ``arr`` of axes ``primal`` stored in ``layout``."""
    axes = _layout.axes(layout)
    groups = _layout.primal_groups(layout, primal)
    split_shape, perm_src = [], []
    for p, g in zip(primal, groups):
        factors = [axes[i][1] for i in g[1:]]
        total = arr.shape[primal.index(p)]
        inner = int(np.prod(factors)) if factors else 1
        if total % inner:
            raise ValueError(f"axis {p} of size {total} does not split by {factors} ({layout!r})")
        split_shape += [total // inner, *factors]
        perm_src += g
    split = arr.reshape(split_shape)
    # split's axis j holds layout position perm_src[j]; put them in layout order
    inverse = [perm_src.index(pos) for pos in range(len(axes))]
    return np.ascontiguousarray(np.transpose(split, inverse))


# --- the constant -----------------------------------------------------------------------------
def border_constant(weight_oihw: np.ndarray, value: int, in_hw, pad_hw, conv_padding, strides, dilation,
                    out_hw) -> np.ndarray:
    """``conv(pad(zeros, value), w)`` in NCHW without batch: an int64 array (O, OH, OW).

    ``in_hw``: the padded tensor's (H, W) as the conv reads it; ``pad_hw``: ((top, bottom),
    (left, right)) of the value-pad inside it; ``conv_padding``: the conv's own zero padding
    (top, left, bottom, right); ``weight_oihw``: (O, I/groups, KH, KW).
    """
    wsum = weight_oihw.astype(np.int64).sum(axis=1)  # (O, KH, KW): every input channel holds `value`

    def band(n_out, size, before_after, q_before, stride, dil, k):
        o = np.arange(n_out)[:, None]
        r = o * stride + np.arange(k)[None, :] * dil - q_before  # row of the padded tensor
        inside = (r >= 0) & (r < size)
        core = (r >= before_after[0]) & (r < size - before_after[1])
        return inside.astype(np.int64), core.astype(np.int64)

    kh, kw = wsum.shape[1:]
    th, xh = band(out_hw[0], in_hw[0], pad_hw[0], conv_padding[0], strides[0], dilation[0], kh)
    tw, xw = band(out_hw[1], in_hw[1], pad_hw[1], conv_padding[1], strides[1], dilation[1], kw)
    # taps inside the padded tensor minus taps inside x = taps in the value-pad region
    taps = np.einsum("okl,yk,xl->oyx", wsum, th, tw) - np.einsum("okl,yk,xl->oyx", wsum, xh, xw)
    return value * taps


# --- matching ---------------------------------------------------------------------------------
def _hw(layout: str):
    """Positions of the plain H and W axes of ``layout``, or a Reject (H/W split, missing)."""
    try:
        axes = _layout.axes(layout)
    except ValueError as err:
        return Reject(str(err))
    if any(a in "HW" and f for a, f in axes):
        return Reject(f"layout {layout!r} splits H or W")
    pos = [i for i, (a, f) in enumerate(axes) if a in "HW" and not f]
    if len(pos) != 2:
        return Reject(f"layout {layout!r} has no H and W axes")
    return tuple(sorted(pos, key=lambda i: axes[i][0]))  # (H, W)


# --- side conditions (in the order they are tried; the first rejection is logged) --------------
def _constant_mode(conv, pad, lt, users):
    mode = str(pad.attrs.pad_mode)
    return True if mode == "constant" else Reject(f"pad mode {mode!r} (only 'constant' folds)")


def _nonzero_integer_value(conv, pad, lt, users):
    value = constant_scalar(pad.args[1])
    if value is None or value != int(value):
        return Reject("pad value is not a constant integer scalar")
    if value == 0:
        return Reject("pad value 0: FoldPadIntoConv's case")
    return True


def _static_shapes(conv, pad, lt, users):
    for e in (pad.args[0], pad, conv, conv.args[1]) + ((lt,) if lt is not None else ()):
        ok = static_tensor_type(e)
        if not ok:
            return ok
    return True


def _exact_integer_conv(conv, pad, lt, users):
    """Integer input and weight, int32 output, a pad value the input dtype holds."""
    xdt, wdt = pad.args[0].checked_type.dtype, conv.args[1].checked_type.dtype
    if not (xdt.startswith(("int", "uint")) and wdt.startswith(("int", "uint"))):
        return Reject(f"not an integer conv ({xdt} x {wdt})")
    if conv.checked_type.dtype != "int32":
        return Reject(f"conv output {conv.checked_type.dtype}, not int32")
    try:
        info = np.iinfo(xdt)
    except (TypeError, ValueError):
        return Reject(f"input dtype {xdt} has no numpy integer type")
    value = constant_scalar(pad.args[1])
    if not info.min <= value <= info.max:
        return Reject(f"pad value {value} does not fit {xdt}")
    return True


def _constant_weight(conv, pad, lt, users):
    return True if isinstance(conv.args[1], relay.Constant) else Reject("the weight is not a constant")


def _layout_transform_keeps_hw(conv, pad, lt, users):
    if lt is None:
        return True
    for layout in (str(lt.attrs.src_layout), str(lt.attrs.dst_layout)):
        hw = _hw(layout)
        if not hw:
            return Reject(f"layout_transform between pad and conv: {hw}")
    if str(lt.attrs.dst_layout) != str(conv.attrs.data_layout):
        return Reject("layout_transform's destination is not the conv's data layout")
    return True


def _pad_hw(conv, pad, lt):
    """((top, bottom), (left, right)) the pad adds on H and W, or a Reject when it pads another axis."""
    pad_layout = str(lt.attrs.src_layout) if lt is not None else str(conv.attrs.data_layout)
    hw = _hw(pad_layout)
    if not hw:
        return hw
    widths = [int_list(p) for p in pad.attrs.pad_width]
    if any(p is None or len(p) != 2 for p in widths) or len(widths) != len(_layout.axes(pad_layout)):
        return Reject("pad widths are not constant (before, after) pairs, one per axis")
    for i, p in enumerate(widths):
        if i not in hw and p != [0, 0]:
            return Reject(f"pads non-spatial axis {i} of {pad_layout!r} by {p}")
    return tuple(widths[hw[0]]), tuple(widths[hw[1]])


def _spatial_only(conv, pad, lt, users):
    return _pad_hw(conv, pad, lt)


def _only_conv_readers(conv, pad, lt, users):
    """Every reader of the pad (and of the layout_transform) is a conv: else its kernel stays, and
    the constant would be read for nothing."""
    for node in (pad, lt) if lt is not None else (pad,):
        readers = users.get(node, [])
        if any(op_name(r) not in CONV_OPS and not (lt is not None and r.same_as(lt)) for r, _ in readers):
            return Reject("the pad has readers other than convolutions: its kernel would stay")
    return True


_CHECKS = (_constant_mode, _nonzero_integer_value, _static_shapes, _exact_integer_conv, _constant_weight,
           _layout_transform_keeps_hw, _spatial_only, _only_conv_readers)


def _constant(conv, pad_hw, value):
    """The int32 correction C in the conv's output layout (numpy), or a Reject."""
    a = conv.attrs
    data_layout = str(a.data_layout)
    out_layout = str(a.out_layout) or data_layout
    # only the layouts whose primal axes are in the order NCHW / OIHW (ONNX's and TVM's x86 NCHWc
    # forms): other kernel layouts (depthwise HWOI...) give I and O other meanings
    for layout, order in ((data_layout, "NCHW"), (out_layout, "NCHW"), (str(a.kernel_layout), "OIHW")):
        try:
            primal = "".join(x for x, f in _layout.axes(layout) if not f)
        except ValueError as err:
            return Reject(str(err))
        if primal != order:
            return Reject(f"layout {layout!r}: only {order} (blocked or not) is supported")
    try:
        w = unblock(conv.args[1].data.numpy(), str(a.kernel_layout), "OIHW")
    except ValueError as err:
        return Reject(f"kernel layout: {err}")
    in_shape = [int(d) for d in conv.args[0].checked_type.shape]
    out_shape = [int(d) for d in conv.checked_type.shape]
    hin, hout = _hw(data_layout), _hw(out_layout)
    if not hin or not hout:
        return Reject(f"conv layouts {data_layout!r} / {out_layout!r} lack plain H and W")
    q = conv_padding(a)
    strides, dilation = int_list(a.strides), int_list(a.dilation)
    if q is None or strides is None or dilation is None or len(strides) != 2 or len(dilation) != 2:
        return Reject("conv strides / dilation / padding are not constants")
    kh, kw = (int(k) for k in a.kernel_size) if a.kernel_size else w.shape[2:]
    if (kh, kw) != tuple(w.shape[2:]):
        return Reject(f"kernel_size {(kh, kw)} does not match the weights {w.shape}")
    c = border_constant(w, value, (in_shape[hin[0]], in_shape[hin[1]]), pad_hw, (q[0], q[1]), strides, dilation,
                        (out_shape[hout[0]], out_shape[hout[1]]))
    try:
        # (O, OH, OW) -> NCHW -> the output layout
        full = block(c[None], "NCHW", out_layout)
    except ValueError as err:
        return Reject(f"output layout: {err}")
    if list(full.shape) != out_shape:
        return Reject(f"constant shape {list(full.shape)} does not match the conv output {out_shape}")
    return full


def _rebuilt_conv(conv, data, padding):
    a = conv.attrs
    common = dict(strides=a.strides, padding=padding, dilation=a.dilation, groups=a.groups, channels=a.channels,
                  kernel_size=a.kernel_size, data_layout=str(a.data_layout), kernel_layout=str(a.kernel_layout),
                  out_layout=str(a.out_layout), out_dtype=str(a.out_dtype))
    name = op_name(conv)
    if name == "nn.conv2d":
        new = relay.nn.conv2d(data, conv.args[1], **common)
    elif name == "nn.contrib_conv2d_NCHWc":
        new = relay.nn.contrib_conv2d_nchwc(data, conv.args[1], **common)
    else:
        new = relay.nn.contrib_depthwise_conv2d_nchwc(data, conv.args[1], **common)
    return relay.Call(new.op, new.args, new.attrs, conv.type_args, conv.span)


def _operands(conv):
    """``(pad, layout_transform or None)`` under ``conv`` (the rules' patterns matched one of them)."""
    lt = conv.args[0] if op_name(conv.args[0]) == "layout_transform" else None
    return (lt.args[0] if lt is not None else conv.args[0]), lt


def _folds(conv, users):
    """The rules' check: ``(pad_hw, the border constant C, its narrowest dtype)``, or the first
    side condition's Reject."""
    pad, lt = _operands(conv)
    for check in _CHECKS:
        ok = check(conv, pad, lt, users)
        if not ok:
            return ok
    pad_hw = _pad_hw(conv, pad, lt)
    full = _constant(conv, pad_hw, int(constant_scalar(pad.args[1])))
    if isinstance(full, Reject):
        return full
    lo, hi = int(full.min()), int(full.max())
    if lo == hi == 0:
        return pad_hw, full, None
    if lo < _NARROW[-1][1] or hi > _NARROW[-1][2]:
        return Reject(f"border constant [{lo}, {hi}] exceeds int32")
    return pad_hw, full, next(name for name, tlo, thi in _NARROW if tlo <= lo and hi <= thi)


def _folded(conv, found, users):
    """The rules' rewrite: ``conv`` reading ``x`` with the pad in its padding, plus the border
    constant (none when it is zero), cast to int32."""
    pad_hw, full, dtype = found
    pad, lt = _operands(conv)
    q = conv_padding(conv.attrs)
    padding = [q[0] + pad_hw[0][0], q[1] + pad_hw[1][0], q[2] + pad_hw[0][1], q[3] + pad_hw[1][1]]
    x = pad.args[0]
    data = relay.Call(lt.op, [x], lt.attrs, lt.type_args, lt.span) if lt is not None else x
    new = _rebuilt_conv(conv, data, padding)
    if dtype is None:
        return new
    const = relay.const(tvm.nd.array(full.astype(dtype)))
    return relay.add(new, const if dtype == "int32" else relay.cast(const, "int32"))


# --- the rules --------------------------------------------------------------------------------
def _conv(data):
    return functools.reduce(operator.or_, (dfp.is_op(op) for op in CONV_OPS))(data, dfp.wildcard())


def _pad():
    return dfp.is_op("nn.pad")(dfp.wildcard(), dfp.wildcard())  # pad(x, value); widths, mode: attributes


#: Ordered rule table (order is priority). C = conv(pad(zeros_like(x), z), w), a constant.
RULES = (
    # conv(pad(x, z), w)                   -> add(conv(x, w, padding=p + pad), cast(C, int32))
    Rule(f"{PASS_NAME}.pad", lambda: _conv(_pad()), _folds, _folded, depth=2),
    # conv(layout_transform(pad(x, z)), w) -> add(conv(layout_transform(x), w, padding=p + pad), cast(C, int32))
    Rule(f"{PASS_NAME}.layout_transform_of_pad", lambda: _conv(dfp.is_op("layout_transform")(_pad())),
         _folds, _folded, depth=3),
)


# --- the pass ---------------------------------------------------------------------------------
def _run(func):
    """Sweeps of :func:`_sweep` until none folds, at most :data:`MAX_ROUNDS` (then an error)."""
    return fixed_point(func, _sweep, PASS_NAME, MAX_ROUNDS)


def _sweep(func):
    """One rebuild: every conv the rules match and the checks accept, folded."""
    return substitute(func, PASS_NAME, _collect)


def _collect(nodes, users, body):
    subst: dict = {}
    for conv in op_calls(nodes, CONV_OPS):
        found = first_rewrite(RULES, conv, _log, users)
        if not found:
            continue
        _, full, dtype = found.found
        _log.info("%s: %s %s: zero-point pad folded; border constant %s x %d added in the epilogue",
                  found.rule.name, op_name(conv), list(static_shape(conv)), dtype or "int8", full.size if dtype else 0)
        subst[conv] = found.new
    return subst


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def FoldZeroPointPadIntoConv():  # pylint: disable=invalid-name
    """Fold a non-zero constant pad (the input zero point) into the integer convolution reading it.

    ``conv(pad(x, z), w)`` becomes ``conv(x, w, padding += pad) + cast(C, int32)`` with
    ``C = conv(pad(zeros_like(x), z), w)`` computed at compile time (non-zero only on the output
    border, stored as int8/int16/int32, whichever holds it), for ``nn.conv2d``,
    ``nn.contrib_conv2d_NCHWc`` and ``nn.contrib_depthwise_conv2d_NCHWc`` with integer input and
    weights and int32 output, any stride, dilation, groups and (blocked) layout, also through a
    ``layout_transform`` between pad and conv. The addition fuses into the conv's kernel: the
    pad kernel QNN lowering leaves for an input zero point ``z != 0`` disappears. Exact for exact
    integer convs (see docs/passes.md for x86 without VNNI).

    Use at stage ``before_fuse`` (after relay.build's prefix has lowered QNN).

    Notes
    -----
    Rejections (zero or non-constant pad values, float convs, pads with other readers, layouts
    splitting H/W, dynamic shapes) are logged at DEBUG on ``tvm_ext.passes.FoldZeroPointPadIntoConv``,
    folds at INFO.
    """
    return function_pass(PASS_NAME, _run)
