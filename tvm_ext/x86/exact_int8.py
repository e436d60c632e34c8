"""TVM's x86 int8 dot-product dispatcher, replaced while the x86 kernel policy is entered.

:func:`install` makes TVM's ``dot_16x1x16_uint8_int8_int32`` (looked up by its conv, dense and
batch_matmul schedules) choose per workload: VNNI as TVM does; a kernel packed in pairs
(:mod:`tvm_ext.x86.pair_pack`) the int16 form; TVM's saturating ``vpmaddubsw`` only for a workload
whose weights all fit int16 pairs (:mod:`tvm_ext.x86.exact_record`); else the exact form
(:mod:`tvm_ext.x86.exact_dot`). It wraps the schedule entry points so the dispatcher knows the
workload it compiles. :func:`tvm_ext.x86.int8_conv.kernels` calls :func:`install` and
:func:`uninstall`.
"""
from __future__ import annotations

import logging

from tvm import te

from .exact_dot import dot_u8s8_exact, dot_u8s8_int16_pairs, dot_u8s8_saturating
from .exact_record import ELEMS, RECORD, SATURATING, WORKLOAD, conv_key, dense_key, shape_of

logger = logging.getLogger(__name__)

__all__ = ["install", "uninstall"]


_SAVED: dict = {}


def _dispatch():
    """Replaces TVM's ``dot_16x1x16_uint8_int8_int32``: VNNI as TVM dispatches it, otherwise the
    saturating form only for a workload whose weights all fit int16, else the exact form."""
    from tvm.target.x86 import get_simd_32bit_lanes, target_has_features

    if ELEMS.get() == 2:  # a kernel packed in pairs: int16 vpmaddwd, exact on every class
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
        try:
            return schedule(s, cfg, data_vec, kernel_vec, conv_out, last)
        finally:
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


def _pairs_compute(compute):
    """TOPI's ``conv2d_NCHWc_int8`` with the reduction group the kernel is packed in: TVM's x86
    compute always asks for groups of 4; a kernel packed in pairs (last axis 2) needs 2."""

    def wrapped(data, kernel, *args, **kwargs):
        if len(kernel.shape) == 7 and int(kernel.shape[-1]) == 2 and "n_elems" not in kwargs and len(args) < 7:
            kwargs["n_elems"] = 2
        return compute(data, kernel, *args, **kwargs)

    wrapped.__wrapped__ = compute
    return wrapped


def _modules():
    import tvm.topi.x86.conv2d_avx_1x1 as one_by_one
    import tvm.topi.x86.conv2d_avx_common as common
    import tvm.topi.x86.dense as dense
    import tvm.topi.x86.tensor_intrin as intrin

    return intrin, common, one_by_one, dense


def install():
    """Replace TVM's int8 dot-product dispatcher with :func:`_dispatch` wherever TVM's x86
    schedules look it up, and tell it the workload each conv and dense schedule compiles."""
    import tvm.topi.nn as topi_nn

    intrin, common, one_by_one, dense = _modules()
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

    intrin, common, one_by_one, dense = _modules()
    topi_nn.conv2d_NCHWc_int8 = _SAVED.pop("compute")
    dispatch = _SAVED.pop("dispatch")
    for module in (intrin, common, one_by_one, dense):
        module.dot_16x1x16_uint8_int8_int32 = dispatch
    common._schedule_conv_NCHWc_int8, one_by_one._schedule_conv_NCHWc_int8, dense.dense_int8_schedule = \
        _SAVED.pop("schedules")
