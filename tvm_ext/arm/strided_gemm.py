"""NHWC 1x1 convs with a stride on aarch64: the strided pixels taken before TVM's GEMM, while tvm-ext builds.

Design note
-----------
TVM 0.19 computes an aarch64 NHWC conv as a GEMM over the output pixels
(``tvm.topi.arm_cpu.conv2d_gemm.compute_conv2d_gemm_without_weight_transform``, the int8 and float32
NHWC strategies of ``arm_cpu``). For a 1x1 kernel it skips im2col and reshapes the padded input to
``(batch, OH * OW, IC)`` directly, which is right only at stride 1: at stride 2 the reshape keeps the
first ``OH * OW`` input pixels instead of every second row and column, and the conv computes the
wrong pixels (int8 and float32 alike; docs/tvm-bugs.md). A 1x1 conv reads one pixel per output, so::

    # conv1x1(x, w, stride s, padding p)  ->  conv1x1(pad(x, p)[:, ::sh, ::sw, :], w, stride 1, padding 0)

:func:`strided_one_by_one` puts that in front of TVM's compute for as long as it is entered: the
padded input's strided pixels are one stage (``data_strided``) that the GEMM reads as TVM's 1x1
reshape expects; every other conv keeps TVM's compute unchanged. The products and sums are those of
the conv, so results equal the definition's. Process-wide while entered, re-entrant and shared by
threads (:class:`tvm_ext._patch.Patch`); TVM's function comes back on the outermost exit.
"""
from __future__ import annotations

import functools
import logging

from .._patch import Patch

logger = logging.getLogger(__name__)

__all__ = ["strided_one_by_one", "strided_pixels"]

_SAVED: dict = {}


def _pair(strides) -> tuple:
    """``(sh, sw)`` of a conv's ``strides`` (one number or two)."""
    return tuple(int(s) for s in (strides if isinstance(strides, (tuple, list)) else (strides, strides)))


def strided_pixels(data, strides, padding):
    """The pixels a 1x1 conv with ``strides`` and ``padding`` reads from NHWC ``data``, as an NHWC
    tensor whose stride-1 1x1 conv is the strided one (zero padding, as TVM's conv pads)."""
    from tvm import te, topi
    from tvm.topi.nn.utils import get_pad_tuple
    from tvm.topi.utils import get_const_tuple

    sh, sw = _pair(strides)
    top, left, down, right = (int(p) for p in get_pad_tuple(padding, (1, 1)))
    if top or left or down or right:
        data = topi.nn.pad(data, [0, top, left, 0], [0, down, right, 0], name="data_pad")
    n, h, w, c = get_const_tuple(data.shape)
    oh, ow = (h - 1) // sh + 1, (w - 1) // sw + 1
    return te.compute((n, oh, ow, c), lambda b, y, x, i: data[b, y * sh, x * sw, i], name="data_strided",
                      tag="injective")


def _wrap(original):
    """TVM's GEMM conv compute, with a strided 1x1 conv's input strided first (module note)."""
    from tvm.topi.utils import get_const_tuple

    @functools.wraps(original)
    def wrapped(cfg, data, b_interleaved_t, strides, padding, dilation, out_dtype, kernel_size, output_channels,
                interleave_a, *rest, **kw):
        kh, kw_ = get_const_tuple(kernel_size)
        sh, sw = _pair(strides)
        if (kh, kw_) != (1, 1) or (sh, sw) == (1, 1):
            return original(cfg, data, b_interleaved_t, strides, padding, dilation, out_dtype, kernel_size,
                            output_channels, interleave_a, *rest, **kw)
        logger.debug("strided_one_by_one: NHWC 1x1 conv at stride %s on %s: strided pixels first", (sh, sw),
                     tuple(get_const_tuple(data.shape)))
        return original(cfg, strided_pixels(data, (sh, sw), padding), b_interleaved_t, (1, 1), 0, dilation,
                        out_dtype, kernel_size, output_channels, interleave_a, *rest, **kw)

    wrapped._tvm_ext_change = "strided_one_by_one"  # pylint: disable=protected-access
    return wrapped


def _install():
    import tvm.topi.arm_cpu.conv2d as arm_conv2d  # the caller, which imported the compute by name

    _SAVED["compute"] = arm_conv2d.compute_conv2d_gemm_without_weight_transform
    arm_conv2d.compute_conv2d_gemm_without_weight_transform = _wrap(_SAVED["compute"])


def _uninstall():
    import tvm.topi.arm_cpu.conv2d as arm_conv2d

    arm_conv2d.compute_conv2d_gemm_without_weight_transform = _SAVED.pop("compute")


_PATCH = Patch(_install, _uninstall)


def strided_one_by_one():
    """Enter to build strided NHWC 1x1 convs on aarch64 from their strided pixels (module note)."""
    return _PATCH.entered()
