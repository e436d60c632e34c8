"""FoldChannelRepadIntoConv: a conv reading a channel slice of ``x`` padded back reads ``x``.

Rewrites (as data: :data:`RULES`, the shared shape ``tvm_ext._rules.Rule``)::

    # conv_NCHWc(lt(pad(lt(strided_slice(x, n/k blocks), NCHWkc -> NCHW), C' - n), NCHW -> NCHWkc), w)
    #     -> conv_NCHWc(x, w')                                      (aarch64, n a multiple of k)
    # conv_NCHWc(lt(pad(strided_slice(lt(x, NCHWkc -> NCHW), n), C' - n), NCHW -> NCHWkc), w)
    #     -> conv_NCHWc(x, w')                                      (aarch64, n no multiple of k)
    # conv2d(pad(strided_slice(x, n), C' - n), w)  ->  conv2d(x, w')                      (NCHW)
    #
    #   provided w[:, c] == 0 for n <= c < C' (int8 legalization zero-pads the weights on the
    #   input channels it pads), so  sum_c d[c] * w[:, c] == sum_{c < n} x[c] * w[:, c]  whatever
    #   the pad writes, and whatever x holds in its channels from n on;
    #   w' = w with zero input channels added up to x's channel count C_x >= C' (w' = w when C_x == C')

Where it comes from: int8 legalization (``conv2d_alter_int8_common``) computes a conv whose output
channels are no multiple of the target's block for the next multiple, then slices them back
(``strided_slice``); the next conv's legalization pads its input channels again (``nn.pad``). After
``EpilogueBeforeChannelSlice`` has moved the first conv's requantize in front of the slice, ``x`` is
the 8-bit blocked output of the first conv, and the slice, the pad and the layout transforms
around them are a kernel of their own (a squeeze-excite block's 1x1 convs at aarch64).

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``FoldChannelRepadIntoConv``.
"""
from __future__ import annotations

import re

import numpy as np

from tvm import relay
from tvm.relay import dataflow_pattern as dfp

from tvm_ext._rules import Rule, rewrites
from ._registry import register_pass

from . import _layout
from ._doc import factory_sections
from ._util import (
    Check,
    Reject,
    int_list,
    op_name,
    pass_logger,
    static_shape,
    static_tensor_type,
    substitution_pass,
)

__all__ = ["FoldChannelRepadIntoConv", "RULES", "MAX_WIDENING"]

PASS_NAME = "FoldChannelRepadIntoConv"
_log = pass_logger(PASS_NAME)

#: The conv may read at most this many times the input channels it read before (``C_x <= 2 C'``):
#: a channel count padded to 4 that ``x`` holds padded to 8 (a 2-channel squeeze-excite conv at aarch64).
MAX_WIDENING = 2


# --- the chain below the conv ----------------------------------------------------------------------
def _prefix_slice(sl) -> Check:
    """True for a slice of the leading entries of axis 1 alone (from 0, step 1), else a Reject."""
    a = sl.attrs
    begin = int_list(a.begin)
    strides = [1] if a.strides is None else int_list(a.strides)
    if a.axes is not None or begin is None or any(b != 0 for b in begin) or strides is None \
            or any(s != 1 for s in strides):
        return Reject("the slice does not start at 0 with step 1 on every axis")
    full, out = static_shape(sl.args[0]), static_shape(sl)
    if len(full) != len(out) or any(f != o for i, (f, o) in enumerate(zip(full, out)) if i != 1):
        return Reject(f"the slice cuts other axes than channels: {list(full)} -> {list(out)}")
    return True


def _trailing_channel_pad(pad) -> Check:
    """True for a pad of axis 1 alone, after its last entry, else a Reject (its value is not read)."""
    widths = [int_list(p) for p in pad.attrs.pad_width]
    if any(p is None or len(p) != 2 for p in widths):
        return Reject("the pad widths are not constant (before, after) pairs")
    if any(p != [0, 0] for i, p in enumerate(widths) if i != 1) or widths[1][0] != 0:
        return Reject(f"the pad widths {widths} pad more than the channels' end")
    return True


def _block(layout) -> int | None:
    m = re.fullmatch(r"NCHW(\d+)c", str(layout))
    return int(m.group(1)) if m else None


def _unblocks(lt, k=None) -> Check:
    """True for ``layout_transform(NCHW<k>c -> NCHW)`` (any k when ``k`` is None), else a Reject."""
    src, dst = str(lt.attrs.src_layout), str(lt.attrs.dst_layout)
    if dst != "NCHW" or _block(src) is None:
        return Reject(f"layout_transform {src} -> {dst}, not NCHW<k>c -> NCHW")
    if k is not None and _block(src) != k:
        return Reject(f"x is {src}, the conv reads NCHW{k}c (a layout change would stay)")
    return True


def _blocks_to(lt, layout: str) -> Check:
    src, dst = str(lt.attrs.src_layout), str(lt.attrs.dst_layout)
    if src != "NCHW" or dst != layout:
        return Reject(f"the conv reads layout_transform {src} -> {dst}, not NCHW -> its data layout {layout}")
    return True


def _transforms_fit(conv, outer, inner) -> Check:
    """``outer`` blocks NCHW into the conv's data layout and ``inner`` unblocks that layout's block."""
    ok = _blocks_to(outer, str(conv.attrs.data_layout))
    return _unblocks(inner, _block(conv.attrs.data_layout)) if ok else ok


def _chain_blocked_slice(conv):
    """``(x, slice, pad)`` of ``lt(pad(lt(strided_slice(x))))`` under an NCHWc conv, or a Reject."""
    outer = conv.args[0]
    pad = outer.args[0]
    inner = pad.args[0]
    sl = inner.args[0]
    ok = _transforms_fit(conv, outer, inner)
    if not ok:
        return ok
    return sl.args[0], sl, pad


def _chain_channel_slice(conv):
    """``(x, slice, pad)`` of ``lt(pad(strided_slice(lt(x))))`` under an NCHWc conv, or a Reject."""
    outer = conv.args[0]
    pad = outer.args[0]
    sl = pad.args[0]
    inner = sl.args[0]
    ok = _transforms_fit(conv, outer, inner)
    if not ok:
        return ok
    return inner.args[0], sl, pad


def _chain_nchw(conv):
    """``(x, slice, pad)`` of ``pad(strided_slice(x))`` under an NCHW conv, or a Reject."""
    if str(conv.attrs.data_layout) != "NCHW":
        return Reject(f"conv2d data layout {conv.attrs.data_layout}, not NCHW")
    pad = conv.args[0]
    sl = pad.args[0]
    return sl.args[0], sl, pad


def _channels(expr) -> int:
    """Channels of an NCHW or NCHW<k>c tensor."""
    shape = static_shape(expr)
    return shape[1] * (shape[4] if len(shape) == 5 else 1)


# --- the weights ------------------------------------------------------------------------------------
def _input_channels_last(w: np.ndarray, layout: str):
    """``(w with its input channel axes moved last and merged, how to undo that)``, or a Reject."""
    try:
        groups = _layout.primal_groups(layout, "OIHW")
    except ValueError as err:
        return Reject(str(err))
    i_axes = groups[1]
    moved = np.moveaxis(w, i_axes, range(w.ndim - len(i_axes), w.ndim))
    lead, inner = moved.shape[:w.ndim - len(i_axes)], moved.shape[w.ndim - len(i_axes):]
    sub = int(np.prod(inner[1:], dtype=np.int64))

    def back(flat: np.ndarray) -> np.ndarray:
        shaped = flat.reshape(*lead, flat.shape[-1] // sub, *inner[1:])
        return np.ascontiguousarray(np.moveaxis(shaped, range(w.ndim - len(i_axes), w.ndim), i_axes))

    return moved.reshape(*lead, -1), sub, back


def _widened_weight(conv, n: int, c_read: int, c_x: int):
    """``w'``: the conv's weight with zero input channels up to ``c_x``; a Reject unless the weight is a
    constant that is zero on input channels ``n .. c_read - 1``."""
    w = conv.args[1]
    if not isinstance(w, relay.Constant):
        return Reject(f"the weight is a {type(w).__name__}, not a constant")
    found = _input_channels_last(w.data.numpy(), str(conv.attrs.kernel_layout))
    if isinstance(found, Reject):
        return found
    flat, sub, back = found
    if flat.shape[-1] != c_read:
        return Reject(f"the weight has {flat.shape[-1]} input channels, the conv reads {c_read}")
    nonzero = np.flatnonzero(flat[..., n:].reshape(-1, c_read - n).any(axis=0))
    if nonzero.size:
        return Reject(f"the weight is not zero on padded input channel {n + int(nonzero[0])} (of {n} .. {c_read - 1})")
    if c_x == c_read:
        return w
    if c_x % sub:
        return Reject(f"x's {c_x} channels are no multiple of the weight's input block {sub}")
    widths = [(0, 0)] * (flat.ndim - 1) + [(0, c_x - c_read)]
    return relay.const(back(np.pad(flat, widths)), dtype=str(w.data.dtype))


def _fold(chain):
    """The rule's check: ``(x, w', n, C', C_x)`` for the ``x`` that ``chain(conv)`` finds, or a Reject."""
    def check(conv):
        if int(conv.attrs.groups) != 1:
            return Reject(f"groups={int(conv.attrs.groups)}: only a dense conv's weights are padded per input channel")
        found = chain(conv)
        if isinstance(found, Reject):
            return found
        x, sl, pad = found
        for e in (x, sl, pad, conv.args[0], conv):
            ok = static_tensor_type(e)
            if not ok:
                return ok
        for ok in (_prefix_slice(sl), _trailing_channel_pad(pad)):
            if not ok:
                return ok
        if static_shape(x)[0] != static_shape(conv.args[0])[0] or static_shape(x)[2:] != static_shape(conv.args[0])[2:]:
            return Reject(f"x {list(static_shape(x))} and the conv's data {list(static_shape(conv.args[0]))} differ "
                          "in more than channels")
        n, c_read, c_x = _channels(sl), _channels(conv.args[0]), _channels(x)
        if not n <= c_read <= c_x <= MAX_WIDENING * c_read:
            return Reject(f"channels: {n} kept, the conv reads {c_read}, x holds {c_x} "
                          f"(need kept <= read <= x <= {MAX_WIDENING} x read)")
        weight = _widened_weight(conv, n, c_read, c_x)
        if isinstance(weight, Reject):
            return weight
        return x, weight, n, c_read, c_x

    return check


def _reads_x(rule_name: str):
    """The rule's rewrite: ``conv`` reading ``x`` with ``w'``, every attribute kept."""
    def rewrite(conv, found):
        x, weight, n, c_read, c_x = found
        _log.info("%s: %s reads the %d-channel tensor below the slice to %d and the pad to %d", rule_name,
                  op_name(conv), c_x, n, c_read)
        return relay.Call(conv.op, [x, weight, *conv.args[2:]], conv.attrs, conv.type_args, conv.span)

    return rewrite


def _pad(data):
    return dfp.is_op("nn.pad")(data, dfp.wildcard())  # pad(d, value); widths: attributes


def _lt(data):
    return dfp.is_op("layout_transform")(data)


def _sl(data):
    return dfp.is_op("strided_slice")(data)


def _conv(op, data):
    return dfp.is_op(op)(data, dfp.wildcard())


_NCHWC = "nn.contrib_conv2d_NCHWc"

#: Ordered rule table (order is priority); ``lt`` is ``layout_transform``.
RULES = (
    # conv_NCHWc(lt(pad(lt(strided_slice(x, n/k blocks), NCHWkc -> NCHW)), NCHW -> NCHWkc), w) -> conv_NCHWc(x, w')
    Rule(f"{PASS_NAME}.blocked_slice",
         lambda: _conv(_NCHWC, _lt(_pad(_lt(_sl(dfp.wildcard()))))),
         _fold(_chain_blocked_slice), _reads_x(f"{PASS_NAME}.blocked_slice"), depth=5),
    # conv_NCHWc(lt(pad(strided_slice(lt(x, NCHWkc -> NCHW), n)), NCHW -> NCHWkc), w) -> conv_NCHWc(x, w')
    Rule(f"{PASS_NAME}.channel_slice",
         lambda: _conv(_NCHWC, _lt(_pad(_sl(_lt(dfp.wildcard()))))),
         _fold(_chain_channel_slice), _reads_x(f"{PASS_NAME}.channel_slice"), depth=5),
    # conv2d(pad(strided_slice(x, n), C' - n), w) -> conv2d(x, w')
    Rule(f"{PASS_NAME}.nchw",
         lambda: _conv("nn.conv2d", _pad(_sl(dfp.wildcard()))),
         _fold(_chain_nchw), _reads_x(f"{PASS_NAME}.nchw"), depth=3),
)


def _collect(nodes, users, body) -> dict:
    """Each conv the rules rewrite, reading the tensor below its channel slice and pad."""
    return rewrites(nodes, RULES, _log)


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def FoldChannelRepadIntoConv():  # pylint: disable=invalid-name
    """Let a conv read the tensor whose channels were sliced off and padded back in front of it.

    ``conv(pad(strided_slice(x)), w)`` over channels becomes ``conv(x, w')`` when the slice keeps the
    first ``n`` channels, the pad brings them back to the ``C'`` the conv reads, and ``w`` is zero on
    input channels ``n`` to ``C' - 1``: those channels add nothing, whatever the pad or ``x`` holds
    there. ``w'`` is ``w``, or ``w`` with zero input channels added when ``x`` holds more than ``C'``
    channels (up to :data:`MAX_WIDENING` times ``C'``). Forms (:data:`RULES`): aarch64's NCHWc convs,
    with the layout transforms around the slice and pad (which go too), and NCHW ``nn.conv2d``.
    Exact.

    This is what int8 legalization leaves between two convs when the first has output channels
    that are no multiple of the target's channel block (squeeze-excite 1x1 convs): one kernel of
    ``layout_transform, strided_slice, nn.pad, layout_transform``, which this removes.

    Use at stage ``before_fuse``, after ``EpilogueBeforeChannelSlice`` (which moves the first conv's
    requantize in front of the slice, so that ``x`` is the first conv's 8-bit output).

    Notes
    -----
    Rejections (non-constant or non-zero weights on the padded channels, a slice or pad of other
    axes, other layouts, grouped convs, dynamic shapes) are logged at DEBUG on
    ``tvm_ext.passes.FoldChannelRepadIntoConv``, rewrites at INFO.
    """
    return substitution_pass(PASS_NAME, _collect)
