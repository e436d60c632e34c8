"""TVM's x86 int8 dot-product dispatcher, replaced while the x86 kernel policy is entered.

:func:`install` makes TVM's ``dot_16x1x16_uint8_int8_int32`` (looked up by its conv, dense and
batch_matmul schedules) choose per workload: VNNI as TVM does; a kernel packed in pairs
(:mod:`tvm_ext.x86.pair_pack`) the int16 form; TVM's saturating ``vpmaddubsw`` only for a workload
whose weights all fit int16 pairs (:mod:`tvm_ext.x86.exact_record`); else the exact form
(:mod:`tvm_ext.x86.exact_dot`). It wraps the schedule entry points so the dispatcher knows the
workload it compiles. A conv whose kernel is packed in int16 pairs takes TVM's int8 conv
(strategy, compute and schedules) with its data padded and widened to int16 in one stage before
the conv's loops (:func:`_widened_data`). :func:`tvm_ext.x86.int8_conv.kernels` calls
:func:`install` and :func:`uninstall`.
"""
from __future__ import annotations

import contextvars
import logging

from tvm import te

from .exact_dot import dot_int16_pairs, dot_u8s8_exact, dot_u8s8_int16_pairs, dot_u8s8_saturating
from .exact_record import ELEMS, RECORD, SATURATING, WORKLOAD, conv_key, dense_key, shape_of

logger = logging.getLogger(__name__)

__all__ = ["install", "uninstall", "is_int16_pair_conv"]


_SAVED: dict = {}
#: The kernel's element type of the conv being scheduled ("int8", or "int16" when packed in int16 pairs).
_KERNEL_DTYPE: contextvars.ContextVar = contextvars.ContextVar("tvm_ext_exact_int8_kernel_dtype", default="int8")


def is_int16_pair_conv(data_dtype: str, kernel_shape, kernel_dtype: str) -> bool:
    """True for an NCHWc conv of uint8 data with a kernel packed in int16 pairs
    (``[..., ic/2, oc, 2]`` int16, :func:`tvm_ext.x86.pair_pack.PairPackInt8Convs`)."""
    return (str(data_dtype) == "uint8" and str(kernel_dtype) == "int16" and len(kernel_shape) == 7
            and int(kernel_shape[-1]) == 2)


def _dispatch():
    """Replaces TVM's ``dot_16x1x16_uint8_int8_int32``: VNNI as TVM dispatches it, otherwise the
    saturating form only for a workload whose weights all fit int16, else the exact form."""
    from tvm.target.x86 import get_simd_32bit_lanes, target_has_features

    if ELEMS.get() == 2:  # a kernel packed in pairs: int16 vpmaddwd, exact on every class
        if _KERNEL_DTYPE.get() == "int16":
            return dot_int16_pairs(get_simd_32bit_lanes())
        return dot_u8s8_int16_pairs(get_simd_32bit_lanes())
    if target_has_features("avx512vnni") or target_has_features("avxvnni"):
        return _SAVED["dispatch"]()
    lanes = get_simd_32bit_lanes()
    record, key = RECORD.get(), WORKLOAD.get()
    if SATURATING.get():
        return dot_u8s8_saturating(lanes)
    if record is not None and key is not None and record.saturating_allowed(key):
        logger.debug("exact_int8: %s keeps vpmaddubsw (every weight pair fits int16)", key)
        return dot_u8s8_saturating(lanes)
    return dot_u8s8_exact(lanes)


def _conv_data_shape(data_vec) -> tuple:
    """The conv's data before padding (the schedule's ``data_vec`` may be the pad stage)."""
    if isinstance(data_vec.op, te.tensor.ComputeOp) and "pad" in data_vec.op.tag:
        data_vec = data_vec.op.input_tensors[0]
    return shape_of(data_vec)


def _conv_schedule(schedule):
    def wrapped(s, cfg, data_vec, kernel_vec, conv_out, last):
        token = WORKLOAD.set(conv_key(_conv_data_shape(data_vec), shape_of(kernel_vec), shape_of(conv_out)))
        elems = ELEMS.set(shape_of(kernel_vec)[-1])
        dtype = _KERNEL_DTYPE.set(str(kernel_vec.dtype))
        try:
            return schedule(s, cfg, data_vec, kernel_vec, conv_out, last)
        finally:
            _KERNEL_DTYPE.reset(dtype)
            ELEMS.reset(elems)
            WORKLOAD.reset(token)

    wrapped.__wrapped__ = schedule
    return wrapped


def _dense_schedule(schedule):
    def wrapped(cfg, s, gemm, out, *args, **kwargs):
        data, weight = gemm.op.input_tensors[:2]
        token = WORKLOAD.set(dense_key(shape_of(data), shape_of(weight)))
        try:
            return schedule(cfg, s, gemm, out, *args, **kwargs)
        finally:
            WORKLOAD.reset(token)

    wrapped.__wrapped__ = schedule
    return wrapped


def _widened_data(data, padding, kernel_hw, dilation):
    """``data`` (uint8 NCHWc) padded with zeros and widened to int16 in one stage, and the padding
    the conv has left to do (none)::

        # x: u8[n, c, h, w, b] -> x16[n, c, h + pt + pb, w + pl + pr, b] = int16(x) inside, 0 outside

    Tagged ``pad``: every x86 int8 conv schedule computes it as its own loop nest before the conv,
    in parallel over its rows, so the conv's loops load int16 pairs as they are."""
    import tvm
    from tvm.topi.nn.utils import get_pad_tuple
    from tvm.topi.utils import get_const_tuple

    dh, dw = dilation if isinstance(dilation, (tuple, list)) else (dilation, dilation)
    kh, kw = kernel_hw
    top, left, down, right = get_pad_tuple(padding, ((kh - 1) * dh + 1, (kw - 1) * dw + 1))
    n, c, h, w, b = get_const_tuple(data.shape)

    def value(i, j, y, x, k):
        v = data[i, j, y - top, x - left, k].astype("int16")
        if not (top or left or down or right):
            return v
        inside = tvm.tir.all(y >= top, y < top + h, x >= left, x < left + w)
        return tvm.tir.if_then_else(inside, v, tvm.tir.const(0, "int16"))

    widened = te.compute((n, c, h + top + down, w + left + right, b), value, name="data_pad_int16",
                         tag="injective,pad")
    return widened, (0, 0, 0, 0)


def _pairs_compute(compute):
    """TOPI's ``conv2d_NCHWc_int8`` with the reduction group the kernel is packed in: TVM's x86
    compute always asks for groups of 4; a kernel packed in pairs (last axis 2) needs 2. A kernel
    packed in int16 pairs also gets its data padded and widened to int16 (:func:`_widened_data`)."""

    def wrapped(data, kernel, *args, **kwargs):
        if len(kernel.shape) == 7 and int(kernel.shape[-1]) == 2 and "n_elems" not in kwargs and len(args) < 7:
            kwargs["n_elems"] = 2
            if is_int16_pair_conv(data.dtype, kernel.shape, kernel.dtype) and len(args) >= 3:
                stride, padding, dilation, *rest = args
                data, padding = _widened_data(data, padding, (int(kernel.shape[2]), int(kernel.shape[3])), dilation)
                args = (stride, padding, dilation, *rest)
        return compute(data, kernel, *args, **kwargs)

    wrapped.__wrapped__ = compute
    return wrapped


def _config_as_int8(get_default_config):
    """TVM's x86 int8 fallback config (``_get_default_config_int8``) for a kernel packed in int16
    pairs: asked about the int8 weights it holds (TVM's workload check admits uint8 x int8 only;
    the config depends on shapes alone)."""

    def wrapped(cfg, data, kernel, *args, **kwargs):
        if str(data.dtype) == "uint8" and str(kernel.dtype) == "int16":
            kernel = te.placeholder(kernel.shape, dtype="int8", name=kernel.name)
        return get_default_config(cfg, data, kernel, *args, **kwargs)

    wrapped.__wrapped__ = get_default_config
    return wrapped


def _nchwc_strategy(original):
    """x86's ``conv2d_NCHWc`` strategy, with uint8 data x a kernel packed in int16 pairs taking TVM's
    int8 implementation (``conv2d_NCHWc_int8.x86``: its tuning space, compute and schedules;
    TVM's own strategy sends every kernel that is not int8 to the float conv)."""

    def strategy(attrs, inputs, out_type, target):
        from tvm import relay, topi
        from tvm.relay.op.strategy.generic import wrap_compute_conv2d, wrap_topi_schedule

        data, kernel = inputs
        if not is_int16_pair_conv(data.dtype, kernel.shape, kernel.dtype):
            return original(attrs, inputs, out_type, target)
        out = relay.op.OpStrategy()
        out.add_implementation(
            wrap_compute_conv2d(topi.x86.conv2d_NCHWc_int8, need_data_layout=True, need_out_layout=True),
            wrap_topi_schedule(topi.x86.schedule_conv2d_NCHWc_int8), name="conv2d_NCHWc_int8.x86")
        return out

    return strategy


def _modules():
    import tvm.topi.x86.conv2d_avx_1x1 as one_by_one
    import tvm.topi.x86.conv2d_avx_common as common
    import tvm.topi.x86.conv2d_int8 as conv2d_int8
    import tvm.topi.x86.dense as dense
    import tvm.topi.x86.tensor_intrin as intrin

    return intrin, common, one_by_one, dense, conv2d_int8


def install():
    """Replace TVM's int8 dot-product dispatcher with :func:`_dispatch` wherever TVM's x86
    schedules look it up, and tell it the workload each conv and dense schedule compiles."""
    import tvm.topi.nn as topi_nn
    from tvm.relay.op import strategy as _strategy

    intrin, common, one_by_one, dense, conv2d_int8 = _modules()
    _SAVED["config"] = conv2d_int8._get_default_config_int8
    conv2d_int8._get_default_config_int8 = _config_as_int8(conv2d_int8._get_default_config_int8)
    _SAVED["strategy"] = _strategy.x86.conv2d_NCHWc_strategy_cpu
    _strategy.conv2d_NCHWc_strategy.register("cpu", _nchwc_strategy(_SAVED["strategy"]), override=True)
    _SAVED["compute"] = topi_nn.conv2d_NCHWc_int8
    topi_nn.conv2d_NCHWc_int8 = _pairs_compute(topi_nn.conv2d_NCHWc_int8)
    _SAVED["dispatch"] = intrin.dot_16x1x16_uint8_int8_int32
    _SAVED["schedules"] = (common._schedule_conv_NCHWc_int8, one_by_one._schedule_conv_NCHWc_int8,
                           dense.dense_int8_schedule)
    for module in (intrin, common, one_by_one, dense):
        module.dot_16x1x16_uint8_int8_int32 = _dispatch
    common._schedule_conv_NCHWc_int8 = _conv_schedule(common._schedule_conv_NCHWc_int8)
    one_by_one._schedule_conv_NCHWc_int8 = _conv_schedule(one_by_one._schedule_conv_NCHWc_int8)
    dense.dense_int8_schedule = _dense_schedule(dense.dense_int8_schedule)


def uninstall():
    """Undo :func:`install`."""
    import tvm.topi.nn as topi_nn
    from tvm.relay.op import strategy as _strategy

    intrin, common, one_by_one, dense, conv2d_int8 = _modules()
    conv2d_int8._get_default_config_int8 = _SAVED.pop("config")
    _strategy.conv2d_NCHWc_strategy.register("cpu", _SAVED.pop("strategy"), override=True)
    topi_nn.conv2d_NCHWc_int8 = _SAVED.pop("compute")
    dispatch = _SAVED.pop("dispatch")
    for module in (intrin, common, one_by_one, dense):
        module.dot_16x1x16_uint8_int8_int32 = dispatch
    common._schedule_conv_NCHWc_int8, one_by_one._schedule_conv_NCHWc_int8, dense.dense_int8_schedule = \
        _SAVED.pop("schedules")
