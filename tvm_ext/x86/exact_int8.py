"""Exact uint8 x int8 dot products on x86 without VNNI.

Design note
-----------
Without VNNI, TVM 0.19's x86 int8 conv, dense and batch_matmul kernels multiply with
``vpmaddubsw`` (``pmaddubsw`` on SSE): each int16 lane gets ``a0*w0 + a1*w1`` for two uint8 data
bytes and two int8 weights, *saturated* to [-32768, 32767], and ``vpmaddwd`` adds two such lanes
into int32. With full-range weights one pair reaches 2 * 255 * 127 = 64770, so the result is not
the integer dot product (stock TVM and ONNX Runtime's default share this).

Weights are constants, so the choice is made per workload at build time:

* **pairs that fit int16** (:func:`pairs_fit_int16`): for every pair the kernel adds, the sum of
  its positive weights is at most 128 and the sum of its negative ones at least -128, so
  ``255 * 128 = 32640`` bounds the pair for any data. Such workloads keep ``vpmaddubsw``
  (``saturating``).
* **convs whose pairs do not fit**: :func:`PairPackInt8Convs` (run by ``tvm_ext.build`` right
  before ``FuseOps`` on x86 targets without VNNI) packs their constant kernel in pairs of input
  channels (``OIHW{ic/2}i{oc}o2i``), and :func:`dot_u8s8_int16_pairs` multiplies each pair as int16
  with one ``vpmaddwd``: exact, and as many multiplies per product as the saturating form::

      # conv(x: u8, w: i8[..., ic/4, oc, 4])  ->  conv(x, w': i8[..., ic/2, oc, 2])   (same products)

* **every other workload** (dense, batch_matmul, a kernel that is not a constant, a ``relay.build``
  inside :func:`tvm_ext.x86.int8_conv.kernels`) takes :func:`dot_u8s8_exact`, which splits each data
  byte into its low seven bits and its top bit::

      # a*w0 + b*w1 = (a & 127)*w0 + (b & 127)*w1  +  (a & 128)*w0 + (b & 128)*w1
      #   low part in [-32512, 32512], top part in {0, 128} * (w0 + w1), in [-32768, 32512]

  Both ``vpmaddubsw`` are exact for any int8 weights, and each goes through its own
  ``vpmaddwd`` into int32: twice the multiplies of the saturating form.

The choice reaches the schedule through a per-build record (:func:`recording`): the
:class:`RecordWeights` instrument reads every int8 conv's and dense's constant weights in the
module right before ``FuseOps`` (after AlterOpLayout packed them the way the kernel reads them),
keyed by the shapes TVM's kernel cache also keys on (:func:`conv_key`, :func:`dense_key`; two
layers of one shape share one compiled kernel, so the workload is saturating only if *every* layer
of that shape fits). A kernel whose workload was not recorded -- a weight that is not a constant,
a plain ``relay.build`` inside :func:`tvm_ext.x86.int8_conv.kernels`, batch_matmul -- is exact.
VNNI (``vpdpbusd``) accumulates exactly and is left alone.

:func:`install` / :func:`uninstall` replace TVM's dispatcher ``dot_16x1x16_uint8_int8_int32``
where its schedules look it up, and wrap the schedule entry points so the dispatcher knows the
workload it is compiling; :func:`tvm_ext.x86.int8_conv.kernels` calls them.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import re

import numpy as np
import tvm
from tvm import relay, te
from tvm.relay.dataflow_pattern import DFPatternCallback, is_constant, is_op, rewrite, wildcard

from .._reject import Reject
from .isa import isa_class

logger = logging.getLogger(__name__)

__all__ = ["PAIR_LIMIT", "pairs_fit_int16", "pair_kernel", "PairPackInt8Convs", "packs_pairs", "dot_u8s8_exact",
           "dot_u8s8_int16_pairs", "dot_u8s8_saturating", "RecordWeights", "recording", "saturating", "conv_key",
           "dense_key", "install", "uninstall"]

#: The largest sum of same-sign weights a ``vpmaddubsw`` pair may have so that 255 times it fits
#: int16: 255 * 128 = 32640 <= 32767 and -255 * 128 >= -32768.
PAIR_LIMIT = 128

#: ``(int16 vector, int8 vector, int32 vector, vpmaddubsw, vpmaddwd)`` per count of int32 lanes.
_INSTRUCTIONS = {
    4: ("int16x8", "int8x16", "int32x4", "llvm.x86.ssse3.pmadd.ub.sw.128", "llvm.x86.sse2.pmadd.wd"),
    8: ("int16x16", "int8x32", "int32x8", "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"),
    16: ("int16x32", "int8x64", "int32x16", "llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512"),
}


def pairs_fit_int16(weight) -> bool:
    """True when no ``vpmaddubsw`` pair of ``weight`` can saturate against uint8 data.

    ``weight`` is an int8 array laid out as the kernel reads it: its last axis holds the 4 bytes
    reduced into one int32 lane (AlterOpLayout's ``...4i`` / ``...4c``), paired as (0, 1) and
    (2, 3). A pair fits when its positive weights sum to at most :data:`PAIR_LIMIT` and its
    negative ones to at least ``-PAIR_LIMIT``.
    """
    w = np.asarray(weight)
    if w.dtype != np.int8:
        raise TypeError(f"pairs_fit_int16: weights must be int8, got {w.dtype}")
    if w.ndim == 0 or w.shape[-1] % 2:
        raise ValueError(f"pairs_fit_int16: the last axis must hold whole pairs, got shape {w.shape}")
    pairs = w.astype(np.int32).reshape(-1, 2)
    positive = np.clip(pairs, 0, None).sum(axis=1)
    negative = np.clip(pairs, None, 0).sum(axis=1)
    return bool((positive <= PAIR_LIMIT).all() and (negative >= -PAIR_LIMIT).all())


def _declare(lanes: int, group: int, body):
    """The tensor intrinsic ``int32[lanes] += sum_k uint8[group] * int8[lanes][group]`` (TVM's
    buffers and body/reset/update protocol, so TVM's int8 schedules tensorize with it unchanged);
    ``body(data, kernel)`` returns the int32 vector of one dot product from the ``uint8 x group``
    data vector and the kernel's ``int8 x (group * lanes)`` bytes."""
    if lanes not in _INSTRUCTIONS:
        raise ValueError(f"exact_int8: int32 lanes must be one of {sorted(_INSTRUCTIONS)}, got {lanes}")
    data = te.placeholder((group,), dtype="uint8", name="data")
    kernel = te.placeholder((lanes, group), dtype="int8", name="kernel")
    k = te.reduce_axis((0, group), name="k")
    out = te.compute((lanes,), lambda i: te.sum(data[k].astype("int32") * kernel[i, k].astype("int32"), axis=k),
                     name="C")
    a_buf = tvm.tir.decl_buffer(data.shape, dtype="uint8", name="a_buffer", offset_factor=1, strides=[1])
    b_buf = tvm.tir.decl_buffer(kernel.shape, dtype="int8", name="b_buffer", offset_factor=1,
                                strides=[te.var("ldw"), 1])
    acc_t = _INSTRUCTIONS[lanes][2]

    def intrin_func(ins, outs):
        def emit(kind):  # "body": c = dot, "reset": c = 0, "update": c += dot
            ib = tvm.tir.ir_builder.create()
            if kind == "reset":
                ib.emit(outs[0].vstore(0, tvm.tir.const(0, acc_t)))
                return ib.get()
            dot = body(ins[0].vload([0], f"uint8x{group}"), ins[1].vload([0, 0], f"int8x{group * lanes}"))
            if kind == "update":
                dot = dot + outs[0].vload([0], acc_t)
            ib.emit(outs[0].vstore(0, dot))
            return ib.get()

        return emit("body"), emit("reset"), emit("update")

    return te.decl_tensor_intrin(out.op, intrin_func, binds={data: a_buf, kernel: b_buf},
                                 default_buffer_params={"offset_factor": 1})


def _word(data):
    """The 4 data bytes as one int32 scalar."""
    return tvm.tir.call_intrin("int32", "tir.reinterpret", data)


def _pair_sums(lanes: int, word, b):
    """int32 vector of ``vpmaddwd(vpmaddubsw(broadcast(word), b), 1)``."""
    pairs_t, bytes_t, acc_t, maddubs, maddwd = _INSTRUCTIONS[lanes]
    a = tvm.tir.call_intrin(bytes_t, "tir.reinterpret", word.astype(acc_t))
    pairs = tvm.tir.call_llvm_pure_intrin(pairs_t, maddubs, tvm.tir.const(2, "uint32"), a, b)
    return tvm.tir.call_llvm_pure_intrin(acc_t, maddwd, tvm.tir.const(2, "uint32"), pairs,
                                         tvm.tir.const(1, pairs_t))


def dot_u8s8_exact(lanes: int):
    """The exact ``uint8[4] x int8[lanes][4]`` dot product: each data byte split into its low seven
    bits and its top bit, one ``vpmaddubsw`` + ``vpmaddwd`` for each part (the module's note).
    ``lanes``: 4 (SSE), 8 (AVX2), 16 (AVX-512)."""

    def body(data, b):
        low = _word(data) & tvm.tir.const(0x7F7F7F7F, "int32")
        top = _word(data) & tvm.tir.const(-0x7F7F7F80, "int32")  # 0x80808080 as int32
        return _pair_sums(lanes, low, b) + _pair_sums(lanes, top, b)

    return _declare(lanes, 4, body)


def dot_u8s8_int16_pairs(lanes: int):
    """The exact ``int32[lanes] += sum_k uint8[2] * int8[lanes][2]`` as one ``vpmaddwd`` on int16:
    the two data bytes zero-extended and broadcast as one int32, the kernel's ``lanes x 2`` bytes
    sign-extended. For convs whose kernel is packed in pairs (``...{oc}o2i``, :func:`pair_kernel`):
    as many multiplies per product as the saturating form, and no saturation. ``lanes``: 4 (SSE),
    8 (AVX2), 16 (AVX-512)."""

    def body(data, b):
        pairs_t, _, acc_t, _, maddwd = _INSTRUCTIONS[lanes]
        word = tvm.tir.call_intrin("int32", "tir.reinterpret", data.astype("int16x2"))
        a = tvm.tir.call_intrin(pairs_t, "tir.reinterpret", word.astype(acc_t))
        return tvm.tir.call_llvm_pure_intrin(acc_t, maddwd, tvm.tir.const(2, "uint32"), a, b.astype(pairs_t))

    return _declare(lanes, 2, body)


def dot_u8s8_saturating(lanes: int):
    """TVM's ``vpmaddubsw`` + ``vpmaddwd`` dot product, exact only where :func:`pairs_fit_int16`."""
    return _declare(lanes, 4, lambda data, b: _pair_sums(lanes, _word(data), b))


# ---------------------------------------------------------------------------------------------
# convs packed in pairs

#: The instruction-set classes whose int8 dot product is ``vpmaddubsw`` (no VNNI).
SATURATING_CLASSES = ("avx512", "avx2", "sse")
_KERNEL_LAYOUT = re.compile(r"^OIHW(\d+)i(\d+)o4i$")


def packs_pairs(target) -> bool:
    """True when ``tvm_ext.build`` runs :func:`PairPackInt8Convs` for ``target``: an x86 target
    whose int8 dot product saturates (VNNI's ``vpdpbusd`` does not), outside :func:`saturating`."""
    return isa_class(target) in SATURATING_CLASSES and not _SATURATING.get()


def pair_kernel(weight) -> np.ndarray:
    """A packed int8 conv kernel ``[..., ic/4, oc, 4]`` repacked in pairs ``[..., ic/2, oc, 2]``: the
    same weight for every (input channel, output channel), input channel ``4f + j`` at ``2f + j // 2,
    j % 2``."""
    w = np.asarray(weight)
    if w.ndim != 7 or w.shape[-1] != 4:
        raise ValueError(f"pair_kernel: expected a kernel [..., ic/4, oc, 4], got shape {w.shape}")
    *outer, quads, oc, _ = w.shape
    return np.ascontiguousarray(w.reshape(*outer, quads, oc, 2, 2).swapaxes(-3, -2).reshape(*outer, 2 * quads, oc, 2))


def _pairs_check(call, weight) -> bool | Reject:
    """Whether the conv ``call`` with constant kernel ``weight`` is packed in pairs, or why not."""
    attrs = call.attrs
    if call.args[0].checked_type.dtype != "uint8" or weight.dtype != np.int8:
        return Reject(f"not uint8 x int8 ({call.args[0].checked_type.dtype} x {weight.dtype})")
    if attrs.out_dtype not in ("int32", ""):
        return Reject(f"output {attrs.out_dtype}, not int32")
    if int(attrs.groups) != 1:
        return Reject(f"grouped conv ({int(attrs.groups)} groups): TVM's int8 template is for groups=1")
    if weight.ndim != 7 or not _KERNEL_LAYOUT.match(str(attrs.kernel_layout)):
        return Reject(f"kernel layout {attrs.kernel_layout} is not TVM's int8 OIHW{{i}}i{{o}}o4i")
    if pairs_fit_int16(weight):
        return Reject("every weight pair fits int16: vpmaddubsw is exact")
    return True


class _PairPack(DFPatternCallback):
    # conv(x: u8, w: const i8[..., ic/4, oc, 4]) -> conv(x, pair_kernel(w): i8[..., ic/2, oc, 2])
    #   where some pair of w can saturate vpmaddubsw's int16 (not pairs_fit_int16(w))
    def __init__(self):
        super().__init__(require_type=True)
        self.data, self.weight = wildcard(), is_constant()
        self.pattern = is_op("nn.contrib_conv2d_NCHWc")(self.data, self.weight)
        self.packed = 0

    def callback(self, pre, post, node_map):
        weight = node_map[self.weight][0].data.numpy()
        ok = _pairs_check(pre, weight)
        if not ok:
            logger.debug("PairPackInt8Convs: conv with kernel %s kept: %s", weight.shape, ok)
            return post
        attrs = pre.attrs
        ic_quads, oc_bn = (int(v) for v in _KERNEL_LAYOUT.match(str(attrs.kernel_layout)).groups())
        self.packed += 1
        return relay.nn.contrib_conv2d_nchwc(
            node_map[self.data][0], relay.const(pair_kernel(weight)), strides=attrs.strides,
            padding=attrs.padding, dilation=attrs.dilation, groups=attrs.groups, channels=attrs.channels,
            kernel_size=attrs.kernel_size, data_layout=attrs.data_layout,
            kernel_layout=f"OIHW{2 * ic_quads}i{oc_bn}o2i", out_layout=attrs.out_layout, out_dtype=attrs.out_dtype)


def PairPackInt8Convs():  # noqa: N802  (a pass factory, named as the pass)
    """Pack the kernels of int8 NCHWc convs whose ``vpmaddubsw`` pairs can saturate in pairs of input
    channels, for the exact int16 ``vpmaddwd`` kernel (:func:`dot_u8s8_int16_pairs`).

    Runs on the module after relay.build's prefix (AlterOpLayout's ``nn.contrib_conv2d_NCHWc`` with
    constant kernels ``OIHW{i}i{o}o4i``); ``tvm_ext.build`` runs it last before ``FuseOps`` on x86
    targets without VNNI (:func:`packs_pairs`). Convs whose pairs fit int16, that are not uint8 x
    int8, grouped, or already packed in pairs are kept (logged at DEBUG with the reason); untyped
    modules are typed first. Pure and idempotent.

    Returns
    -------
    tvm.transform.Pass
    """

    @relay.transform.function_pass(opt_level=0, name="PairPackInt8Convs")
    def pair_pack(func, mod, ctx):
        callback = _PairPack()
        out = rewrite(callback, func)
        if callback.packed:
            logger.info("PairPackInt8Convs: %d int8 conv(s) packed in pairs (exact int16 vpmaddwd)", callback.packed)
            return out
        return func

    return tvm.transform.Sequential([relay.transform.InferType(), pair_pack], name="PairPackInt8Convs")


# ---------------------------------------------------------------------------------------------
# which workloads may saturate: recorded per build, read by the dispatcher


def _shape(t) -> tuple:
    return tuple(int(d) for d in t.shape)


def conv_key(data_shape, kernel_shape, out_shape) -> tuple:
    """Workload key of an NCHWc int8 conv: unpadded data, packed kernel and output shapes."""
    return ("conv2d_NCHWc_int8", tuple(data_shape), tuple(kernel_shape), tuple(out_shape))


def dense_key(data_shape, weight_shape) -> tuple:
    """Workload key of a packed int8 dense (``NC16n4c`` weights)."""
    return ("dense_int8", tuple(data_shape), tuple(weight_shape))


class _Record:
    """Workload keys seen with weights that fit int16 and keys seen with weights that do not."""

    def __init__(self):
        self.fit: set = set()
        self.saturate: set = set()

    def note(self, key, fits: bool):
        (self.fit if fits else self.saturate).add(key)

    def saturating_allowed(self, key) -> bool:
        return key in self.fit and key not in self.saturate


_RECORD: contextvars.ContextVar = contextvars.ContextVar("tvm_ext_exact_int8_record", default=None)
_WORKLOAD: contextvars.ContextVar = contextvars.ContextVar("tvm_ext_exact_int8_workload", default=None)
_ELEMS: contextvars.ContextVar = contextvars.ContextVar("tvm_ext_exact_int8_elems", default=4)
_SATURATING: contextvars.ContextVar = contextvars.ContextVar("tvm_ext_exact_int8_saturating", default=False)


@contextlib.contextmanager
def saturating():
    """Enter to build every non-VNNI int8 dot product in TVM's saturating form, whatever its weights
    (no conv is packed in pairs): wrong where a pair overflows int16. For measuring what exactness
    costs (``make bench``), never for deployment."""
    token = _SATURATING.set(True)
    try:
        yield
    finally:
        _SATURATING.reset(token)


@contextlib.contextmanager
def recording():
    """Enter around one build: :class:`RecordWeights` notes the build's workloads here, and the
    dispatcher lets a workload saturate only when every layer noted under its key fits int16."""
    token = _RECORD.set(_Record())
    try:
        yield _RECORD.get()
    finally:
        _RECORD.reset(token)


def _const_int8(expr):
    return isinstance(expr, relay.Constant) and expr.data.dtype == "int8"


def _typed_shape(expr):
    ty = expr.checked_type
    return tuple(int(d) for d in ty.shape) if all(isinstance(d, tvm.tir.IntImm) for d in ty.shape) else None


class _WeightVisitor(relay.ExprVisitor):
    def __init__(self, record: _Record):
        super().__init__()
        self.record = record
        self.conv = relay.op.get("nn.contrib_conv2d_NCHWc")
        self.dense = relay.op.get("nn.contrib_dense_pack")

    def visit_call(self, call):
        super().visit_call(call)
        if call.op not in (self.conv, self.dense) or len(call.args) != 2:
            return
        data, weight = call.args
        try:
            if data.checked_type.dtype != "uint8" or not _const_int8(weight):
                return
            shapes = _typed_shape(data), _typed_shape(weight), _typed_shape(call)
        except ValueError:  # untyped: nothing recorded, the kernel stays exact
            return
        if None in shapes:
            return
        w = weight.data.numpy()
        if w.shape[-1] != 4:
            return
        key = conv_key(*shapes) if call.op == self.conv else dense_key(shapes[0], shapes[1])
        fits = pairs_fit_int16(w)
        self.record.note(key, fits)
        logger.debug("exact_int8: %s weights %s int16 pairs", key, "fit" if fits else "overflow")


@tvm.instrument.pass_instrument
class RecordWeights:
    """Notes, right before ``FuseOps``, whether each int8 conv's and dense's constant weights fit
    int16 pairs, in the record of the enclosing :func:`recording` (nothing outside one)."""

    def run_before_pass(self, mod, info):
        record = _RECORD.get()
        if record is None or info.name != "FuseOps":
            return
        for _, func in mod.functions.items():
            if isinstance(func, relay.Function):
                _WeightVisitor(record).visit(func)


# ---------------------------------------------------------------------------------------------
# TVM's dispatcher and schedule entry points

_SAVED: dict = {}


def _dispatch():
    """Replaces TVM's ``dot_16x1x16_uint8_int8_int32``: VNNI as TVM dispatches it, otherwise the
    saturating form only for a workload whose weights all fit int16, else the exact form."""
    from tvm.target.x86 import get_simd_32bit_lanes, target_has_features

    if _ELEMS.get() == 2:  # a kernel packed in pairs: int16 vpmaddwd, exact on every class
        return dot_u8s8_int16_pairs(get_simd_32bit_lanes())
    if target_has_features("avx512vnni") or target_has_features("avxvnni"):
        return _SAVED["dispatch"]()
    lanes = get_simd_32bit_lanes()
    record, key = _RECORD.get(), _WORKLOAD.get()
    if _SATURATING.get():
        return dot_u8s8_saturating(lanes)
    if record is not None and key is not None and record.saturating_allowed(key):
        logger.debug("exact_int8: %s keeps vpmaddubsw (every weight pair fits int16)", key)
        return dot_u8s8_saturating(lanes)
    return dot_u8s8_exact(lanes)


def _data_shape(data_vec) -> tuple:
    """The conv's data before padding (the schedule's ``data_vec`` may be the pad stage)."""
    if isinstance(data_vec.op, te.tensor.ComputeOp) and "pad" in data_vec.op.tag:
        data_vec = data_vec.op.input_tensors[0]
    return _shape(data_vec)


def _conv_schedule(schedule):
    def wrapped(s, cfg, data_vec, kernel_vec, conv_out, last):
        token = _WORKLOAD.set(conv_key(_data_shape(data_vec), _shape(kernel_vec), _shape(conv_out)))
        elems = _ELEMS.set(_shape(kernel_vec)[-1])
        try:
            return schedule(s, cfg, data_vec, kernel_vec, conv_out, last)
        finally:
            _ELEMS.reset(elems)
            _WORKLOAD.reset(token)

    wrapped.__wrapped__ = schedule
    return wrapped


def _dense_schedule(schedule):
    def wrapped(cfg, s, gemm, out, *args, **kwargs):
        data, weight = gemm.op.input_tensors[:2]
        token = _WORKLOAD.set(dense_key(_shape(data), _shape(weight)))
        try:
            return schedule(cfg, s, gemm, out, *args, **kwargs)
        finally:
            _WORKLOAD.reset(token)

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
