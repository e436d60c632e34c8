"""FoldPadIntoConv: an explicit ``nn.pad`` in front of a convolution becomes the convolution's padding.

Rewrites::

    # conv2d(pad(x, 0), w, padding=p)                      -> conv2d(x, w, padding=p + pad)
    # conv2d_NCHWc(pad(x, 0), w, padding=p)                -> conv2d_NCHWc(x, w, padding=p + pad)
    # depthwise_conv2d_NCHWc(pad(x, 0), w, padding=p)      -> depthwise_conv2d_NCHWc(x, w, padding=p + pad)
    # qnn.conv2d(pad(x, zx), w, zx, zw, sx, sw, padding=p) -> qnn.conv2d(x, w, zx, zw, sx, sw, padding=p + pad)

As data: :data:`RULES`, rules of the shared shape (``tvm_ext._rules.Rule``: a
``tvm.relay.dataflow_pattern``, a check giving the folded padding or a Reject, a rewrite), run by
the shared driver once per pad of a chain.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``FoldPadIntoConv``.
"""
from __future__ import annotations

from tvm import relay
from tvm.relay import dataflow_pattern as dfp

from tvm_ext._rules import Rule, first_rewrite, root_ops
from ._registry import register_pass

from . import _layout
from ._doc import factory_sections
from ._util import (
    Reject,
    constant_scalar,
    conv_padding,
    int_list,
    op_calls,
    op_name,
    pass_logger,
    static_tensor_type,
    substitution_pass,
)

__all__ = ["MAX_FOLDS", "RULES", "FoldPadIntoConv", "spatial_axes"]

PASS_NAME = "FoldPadIntoConv"
_log = pass_logger(PASS_NAME)
_SPATIAL = ("H", "W")
#: Folds into one convolution at most (pads of a longer chain stay, with a warning).
MAX_FOLDS = 16
#: Levels of calls a rule's pattern spans (conv -> pad -> x).
_DEPTH = 2


def spatial_axes(layout: str):
    """Indices of the ``H`` and ``W`` axes of a (possibly blocked) layout, or a Reject.

    ``"NCHW16c"`` has axes ``N, C, H, W, 16c`` -> ``(2, 3)``; ``"NHWC"`` -> ``(1, 2)``.
    """
    try:
        parsed = _layout.axes(layout)
    except ValueError as err:
        return Reject(str(err))
    try:
        return tuple(parsed.index((a, 0)) for a in _SPATIAL), len(parsed)
    except ValueError:
        return Reject(f"layout {layout!r} has no H and W axes")


# --- side conditions --------------------------------------------------------------------------
def _zero(conv):  # nn.conv2d and the NCHWc convs pad with 0
    return 0


def _input_zero_point(conv):  # qnn.conv2d pads with its input zero point (args[2])
    zp = constant_scalar(conv.args[2])
    return Reject("input zero point is not a constant scalar") if zp is None else zp


def _constant_mode(conv, pad, pad_value):
    mode = str(pad.attrs.pad_mode)
    return True if mode == "constant" else Reject(f"pad mode {mode!r} (only 'constant' folds)")


def _pads_with_conv_value(conv, pad, pad_value):
    value = constant_scalar(pad.args[1])
    if value is None:
        return Reject("pad value is not a constant scalar")
    expected = pad_value(conv)
    if isinstance(expected, Reject):
        return expected
    if value != expected:
        return Reject(f"pad value {value} but {op_name(conv)} pads with {expected}")
    return True


def _static_shapes(conv, pad, pad_value):
    for e in (pad.args[0], pad, conv):
        ok = static_tensor_type(e)
        if not ok:
            return ok
    return True


def _spatial_widths(conv, pad):
    """The pad's ((top, bottom), (left, right)) in ``conv``'s data layout, or a Reject when it pads
    another axis or its widths or the layout cannot be read."""
    layout = str(conv.attrs.data_layout)
    axes = spatial_axes(layout)
    if not axes:
        return axes
    (h, w), rank = axes
    widths = [int_list(p) for p in pad.attrs.pad_width]
    if any(p is None or len(p) != 2 for p in widths):
        return Reject("pad widths are not constant (before, after) pairs")
    if len(widths) != rank:
        return Reject(f"pad has {len(widths)} axes but layout {layout!r} has {rank}")
    for i, p in enumerate(widths):
        if i not in (h, w) and p != [0, 0]:
            return Reject(f"pads non-spatial axis {i} of {layout!r} by {p}")
    return tuple(widths[h]), tuple(widths[w])


def _conv_padding(conv):
    """``conv``'s padding as [top, left, bottom, right], or a Reject."""
    old = conv_padding(conv.attrs)
    return old if old is not None else Reject(f"conv padding {list(conv.attrs.padding)} is not 1, 2 or 4 constants")


def _folded_padding(pad_value):
    """The rule's check: ``conv``'s padding with the pad it reads added ([t, l, b, r]), or the first
    side condition's Reject; ``pad_value(conv)`` is the value that conv pads with, or a Reject."""
    def check(conv):
        pad = conv.args[0]
        for condition in (_constant_mode, _pads_with_conv_value, _static_shapes):
            ok = condition(conv, pad, pad_value)
            if not ok:
                return ok
        hw = _spatial_widths(conv, pad)
        if not hw:
            return hw
        old = _conv_padding(conv)
        if not old:
            return old
        (top, bottom), (left, right) = hw
        return [old[0] + top, old[1] + left, old[2] + bottom, old[3] + right]

    return check


# --- the rewrite ------------------------------------------------------------------------------
def _with_padding(conv, padding):
    """The rules' rewrite: ``conv`` reading the input of its pad, with ``padding``; every other
    attribute kept."""
    a = conv.attrs
    data = conv.args[0].args[0]
    common = dict(strides=a.strides, padding=padding, dilation=a.dilation, groups=a.groups,
                  channels=a.channels, kernel_size=a.kernel_size, data_layout=str(a.data_layout),
                  kernel_layout=str(a.kernel_layout), out_layout=str(a.out_layout),
                  out_dtype=str(a.out_dtype))
    name = op_name(conv)
    if name == "nn.conv2d":
        new = relay.nn.conv2d(data, conv.args[1], **common)
    elif name == "nn.contrib_conv2d_NCHWc":
        new = relay.nn.contrib_conv2d_nchwc(data, conv.args[1], **common)
    elif name == "nn.contrib_depthwise_conv2d_NCHWc":
        new = relay.nn.contrib_depthwise_conv2d_nchwc(data, conv.args[1], **common)
    else:  # qnn.conv2d
        new = relay.qnn.op.conv2d(data, *conv.args[1:], **common)
    return relay.Call(new.op, new.args, new.attrs, conv.type_args, conv.span)


# --- the rules --------------------------------------------------------------------------------
def _pad():
    return dfp.is_op("nn.pad")(dfp.wildcard(), dfp.wildcard())  # pad(x, value); widths, mode: attributes


def _conv(op, n_operands):
    """``op(pad(x, value), ...)``: a conv of ``op`` reading a pad, with ``n_operands`` more operands."""
    return dfp.is_op(op)(_pad(), *(dfp.wildcard() for _ in range(n_operands)))


#: Ordered rule table (order is priority); each rule's check gives the folded padding.
RULES = (
    # conv2d(pad(x, 0), w, padding=p)                      -> conv2d(x, w, padding=p + pad)
    Rule(f"{PASS_NAME}.conv2d", lambda: _conv("nn.conv2d", 1),
         _folded_padding(_zero), _with_padding, depth=_DEPTH),
    # conv2d_NCHWc(pad(x, 0), w, padding=p)                -> conv2d_NCHWc(x, w, padding=p + pad)
    Rule(f"{PASS_NAME}.conv2d_NCHWc", lambda: _conv("nn.contrib_conv2d_NCHWc", 1),
         _folded_padding(_zero), _with_padding, depth=_DEPTH),
    # depthwise_conv2d_NCHWc(pad(x, 0), w, padding=p)      -> depthwise_conv2d_NCHWc(x, w, padding=p + pad)
    Rule(f"{PASS_NAME}.depthwise_conv2d_NCHWc", lambda: _conv("nn.contrib_depthwise_conv2d_NCHWc", 1),
         _folded_padding(_zero), _with_padding, depth=_DEPTH),
    # qnn.conv2d(pad(x, zx), w, zx, zw, sx, sw, padding=p) -> qnn.conv2d(x, w, zx, zw, sx, sw, padding=p + pad)
    Rule(f"{PASS_NAME}.qnn_conv2d", lambda: _conv("qnn.conv2d", 5),
         _folded_padding(_input_zero_point), _with_padding, depth=_DEPTH),
)


# --- the pass ---------------------------------------------------------------------------------
def _fold_all(conv):
    """``conv`` with every pad the rules accept folded in, one after the other (a pad of a pad)."""
    new = conv
    for folds in range(MAX_FOLDS + 1):
        found = first_rewrite(RULES, new, _log)
        if not found:
            break
        if folds == MAX_FOLDS:
            _log.warning("%s: %d pads folded into one %s; the rest of the chain stays", found.rule.name, MAX_FOLDS,
                         op_name(conv))
            break
        _log.info("%s: folded pad into %s padding=%s", found.rule.name, op_name(conv), found.found)
        relay.transform.InferTypeLocal(found.new)  # the next match's checks read its type
        new = found.new
    return new


def _collect(nodes, users, body):
    """{conv: conv with its pads folded} for every call of a rule's root op that folds."""
    subst: dict = {}
    for conv in op_calls(nodes, frozenset().union(*map(root_ops, RULES))):
        new = _fold_all(conv)
        if new is not conv:
            subst[conv] = new
    return subst


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def FoldPadIntoConv():  # pylint: disable=invalid-name
    """Fold an explicit ``nn.pad`` into the padding of the convolution that reads it.

    ``conv(pad(x, v), w)`` becomes ``conv(x, w)`` with the pad widths added to the conv's
    ``padding``, for ``nn.conv2d``, ``nn.contrib_conv2d_NCHWc`` and
    ``nn.contrib_depthwise_conv2d_NCHWc`` when ``v == 0`` and for
    ``qnn.conv2d`` when ``v`` equals its input zero point, padding only on the H and W axes (blocked
    layouts such as ``NCHW16c`` understood). Exact. Removes the lone pad kernels the QNN conv
    lowering leaves in front of 3x3 convolutions; the pad stays when another consumer reads it.
    A pad of a pad folds too.

    Use at stage ``before_fuse`` (after relay.build's prefix has lowered QNN and altered
    layouts); it also works at ``start`` on ``nn.conv2d`` / ``qnn.conv2d``.

    Notes
    -----
    Rejections (non-constant or other pad value, non-spatial padding, other pad modes, dynamic
    shapes) are logged at DEBUG on ``tvm_ext.passes.FoldPadIntoConv``, folds at INFO.
    """
    return substitution_pass(PASS_NAME, _collect)
