"""FoldPadIntoConv: an explicit ``nn.pad`` in front of a convolution becomes the convolution's padding.

Design note
-----------
One rule per convolution op, tried on every convolution whose data argument is an ``nn.pad``::

    # conv(pad(x, 0, [.., (t, b) on H, (l, r) on W, ..]), w, padding=p)      -> conv(x, w, padding=p + (t, l, b, r))
    # qnn.conv2d(pad(x, zp_x, ...), w, zp_x, zp_w, s_x, s_w, padding=p)      -> qnn.conv2d(x, w, zp_x, ..., padding=p + ...)

``nn.conv2d``, ``nn.contrib_conv2d_NCHWc`` and ``nn.contrib_depthwise_conv2d_NCHWc`` pad with 0,
so only a zero pad value folds into them (a non-zero one:
:mod:`~tvm_ext.passes.fold_zero_point_pad_into_conv`); ``qnn.conv2d`` pads with the input zero
point, so the pad value must equal it. Either way every element the convolution reads is the same as before: the rewrite is exact (bit for bit).

Why. The QNN conv lowering (``src/relay/qnn/op/convolution.cc``, ``Conv2DPadInput``) pads the
input with its zero point *explicitly* and calls ``nn.conv2d`` with ``padding=0``. When that
value is 0 (uint8 activations after a ReLU), the ``nn.pad`` is a kernel of its own after FuseOps
(an injective op in front of an out-elemwise-fusable conv cannot fuse into it): 16 of ResNet-50's
74 kernels. TVM's ``FoldExplicitPadding`` handles the same pattern but is not in relay.build's
prefix, and on blocked layouts it leaves the pad in place (its ``get_padding`` compares the
layout *string* ``"NCHW16c"``, 7 characters, with the pad's rank, 5). This pass parses blocked
layouts (``NCHW16c``: axes
``N C H W 16c``), so it runs after ``AlterOpLayout`` (stage ``before_fuse``) on the
``nn.contrib_conv2d_NCHWc`` calls that stage contains, and also before the prefix on
``nn.conv2d`` / ``qnn.conv2d``.

The pad is not required to have a single user: each convolution reading it reads ``x`` instead,
and the pad stays only while another consumer needs it (a dead pad disappears with the rebuild).

Rejected with a logged reason (the convolution is left as is): pad mode other than
``"constant"``, a pad value that is not a constant scalar or not the value the convolution pads
with, padding on a non-spatial axis (batch, channels, the ``16c`` block), non-constant pad widths,
a layout without exactly the H and W spatial axes, padding attributes of unexpected length,
dynamic shapes. Functions with ``If``/``Let``/``Match``/references/closures are skipped; an
untyped function raises :class:`~tvm_ext.passes._util.UntypedModuleError`. Folds are logged at
INFO and rejections at DEBUG on ``tvm_ext.passes.FoldPadIntoConv``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from tvm_ext.registry import register_pass

from ._util import (
    Reject,
    constant_scalar,
    conv_padding,
    dataflow_nodes,
    function_pass,
    int_list,
    op_name,
    pass_logger,
    rebuild,
    static_tensor_type,
    with_body,
)

__all__ = ["FoldPadIntoConv", "RULES", "spatial_axes"]

PASS_NAME = "FoldPadIntoConv"
_log = pass_logger(PASS_NAME)
_SPATIAL = ("H", "W")


def spatial_axes(layout: str):
    """Indices of the ``H`` and ``W`` axes of a (possibly blocked) layout, or a Reject.

    ``"NCHW16c"`` has axes ``N, C, H, W, 16c`` -> ``(2, 3)``; ``"NHWC"`` -> ``(1, 2)``.
    """
    axes = re.findall(r"\d*[A-Za-z]", layout)
    if "".join(axes) != layout:
        return Reject(f"cannot parse layout {layout!r}")
    try:
        return tuple(axes.index(a) for a in _SPATIAL), len(axes)
    except ValueError:
        return Reject(f"layout {layout!r} has no H and W axes")


@dataclass(frozen=True)
class Rule:
    """Fold rule for one convolution op: ``pad_value(conv)`` is the value the conv pads with."""

    name: str
    op: str
    pad_value: Callable  # conv call -> expected pad value (python scalar) or a Reject


def _zero(conv):  # nn.conv2d / nn.contrib_conv2d_NCHWc pad with 0
    return 0


def _input_zero_point(conv):  # qnn.conv2d pads with its input zero point (args[2])
    zp = constant_scalar(conv.args[2])
    return Reject("input zero point is not a constant scalar") if zp is None else zp


#: Ordered rule table (order is priority).
RULES = (
    # conv(pad(x, 0), w)                         -> conv(x, w, padding += pad)
    Rule(f"{PASS_NAME}.conv2d", "nn.conv2d", _zero),
    # conv_NCHWc(pad(x, 0), w)                   -> conv_NCHWc(x, w, padding += pad)
    Rule(f"{PASS_NAME}.conv2d_NCHWc", "nn.contrib_conv2d_NCHWc", _zero),
    # depthwise_conv_NCHWc(pad(x, 0), w)         -> depthwise_conv_NCHWc(x, w, padding += pad)
    Rule(f"{PASS_NAME}.depthwise_conv2d_NCHWc", "nn.contrib_depthwise_conv2d_NCHWc", _zero),
    # qnn.conv2d(pad(x, zp_x), w, zp_x, ...)     -> qnn.conv2d(x, w, zp_x, ..., padding += pad)
    Rule(f"{PASS_NAME}.qnn_conv2d", "qnn.conv2d", _input_zero_point),
)
_RULE_BY_OP = {r.op: r for r in RULES}
_MAX_CHAIN = 16  # pads folded into one convolution at most (a chain longer than that is left)


def _fold(rule: Rule, conv, pad, old=None):
    """The padding [t, l, b, r] of ``conv`` (or ``old``) with ``pad`` folded in, or a Reject."""
    attrs = pad.attrs
    if str(attrs.pad_mode) != "constant":
        return Reject(f"pad mode {attrs.pad_mode!r} (only 'constant' folds)")
    value = constant_scalar(pad.args[1])
    if value is None:
        return Reject("pad value is not a constant scalar")
    expected = rule.pad_value(conv)
    if isinstance(expected, Reject):
        return expected
    if value != expected:
        return Reject(f"pad value {value} but {rule.op} pads with {expected}")
    for e in (pad.args[0], pad, conv):
        ok = static_tensor_type(e)
        if not ok:
            return ok
    layout = str(conv.attrs.data_layout)
    axes = spatial_axes(layout)
    if not axes:
        return axes
    (h, w), rank = axes
    widths = [int_list(p) for p in attrs.pad_width]
    if any(p is None or len(p) != 2 for p in widths):
        return Reject("pad widths are not constant (before, after) pairs")
    if len(widths) != rank:
        return Reject(f"pad has {len(widths)} axes but layout {layout!r} has {rank}")
    for i, p in enumerate(widths):
        if i not in (h, w) and p != [0, 0]:
            return Reject(f"pads non-spatial axis {i} of {layout!r} by {p}")
    old = conv_padding(conv.attrs) if old is None else old
    if old is None:
        return Reject(f"conv padding {list(conv.attrs.padding)} is not 1, 2 or 4 constants")
    # (t, l, b, r) + (pad_H.before, pad_W.before, pad_H.after, pad_W.after)
    return [old[0] + widths[h][0], old[1] + widths[w][0], old[2] + widths[h][1], old[3] + widths[w][1]]


def _with_padding(conv, padding, data):
    """``conv`` reading ``data`` (below its pads), with ``padding``; every other attribute kept."""
    from tvm import relay

    a = conv.attrs
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


def _run(func):
    from tvm import relay

    nodes = dataflow_nodes(func, PASS_NAME)
    if nodes is None:
        return func
    subst: dict = {}
    for node in nodes:
        if not isinstance(node, relay.Call):
            continue
        rule = _RULE_BY_OP.get(op_name(node))
        if rule is None or not node.args:
            continue
        # conv(pad(pad(x))) -> conv(x): every foldable pad of a chain at once (idempotence)
        data, padding = node.args[0], None
        for _ in range(_MAX_CHAIN):
            if not (isinstance(data, relay.Call) and op_name(data) == "nn.pad"):
                break
            folded = _fold(rule, node, data, padding)
            if isinstance(folded, Reject):
                _log.debug("%s: pad not folded: %s", rule.name, folded)
                break
            padding, data = folded, data.args[0]
        if padding is None:
            continue
        _log.info("%s: folded pad into %s padding=%s", rule.name, rule.op, padding)
        subst[node] = _with_padding(node, padding, data)
    return with_body(func, rebuild(func.body, subst))


@register_pass(PASS_NAME)
def FoldPadIntoConv():  # pylint: disable=invalid-name
    """Fold an explicit ``nn.pad`` into the padding of the convolution that reads it.

    ``conv(pad(x, v), w)`` becomes ``conv(x, w)`` with the pad widths added to the conv's
    ``padding``, for ``nn.conv2d``, ``nn.contrib_conv2d_NCHWc`` and
    ``nn.contrib_depthwise_conv2d_NCHWc`` when ``v == 0`` and for
    ``qnn.conv2d`` when ``v`` equals its input zero point, padding only on the H and W axes (blocked
    layouts such as ``NCHW16c`` understood). Exact. Removes the lone pad kernels the QNN conv
    lowering leaves in front of 3x3 convolutions; the pad stays when another consumer reads it.

    Use at stage ``before_fuse`` (after relay.build's prefix has lowered QNN and altered
    layouts); it also works at ``start`` on ``nn.conv2d`` / ``qnn.conv2d``.

    Returns
    -------
    tvm.transform.Pass
        A Relay function pass named ``"FoldPadIntoConv"`` (opt_level 1).

    Raises
    ------
    tvm_ext.passes._util.UntypedModuleError
        When run on a module that was not type-inferred.

    Notes
    -----
    Rejections (non-constant or other pad value, non-spatial padding, other pad modes, dynamic
    shapes) are logged at DEBUG on ``tvm_ext.passes.FoldPadIntoConv``, folds at INFO.
    """
    return function_pass(PASS_NAME, _run)
