"""Which int8 workloads of one build may keep TVM's saturating ``vpmaddubsw``: recorded per build.

:class:`RecordWeights` (an instrument) reads every int8 conv's and dense's constant weights right
before ``FuseOps``, keyed by the shapes TVM's kernel cache also keys on (:func:`conv_key`,
:func:`dense_key`), into the record of the enclosing :func:`recording`. Two layers of one shape
share one kernel, so a workload saturates only if every layer of that shape fits int16 pairs
(:func:`tvm_ext.x86.exact_dot.pairs_fit_int16`); a workload not recorded is exact.
:func:`saturating` forces TVM's form everywhere (to measure what exactness costs, never to deploy).
The dispatcher (:mod:`tvm_ext.x86.exact_int8`) reads the context variables here.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging

import tvm
from tvm import relay

from .exact_dot import pairs_fit_int16

logger = logging.getLogger(__name__)

__all__ = ["RecordWeights", "recording", "saturating", "conv_key", "dense_key", "shape_of", "RECORD", "WORKLOAD",
           "ELEMS", "SATURATING"]

def shape_of(t) -> tuple:
    """A tensor's static shape as a tuple of ints."""
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


#: The record of the build in progress (:func:`recording`), the workload being scheduled, the
#: reduction group of its kernel (4, or 2 when packed in pairs), and whether :func:`saturating` is on.
RECORD: contextvars.ContextVar = contextvars.ContextVar("tvm_ext_exact_int8_record", default=None)
WORKLOAD: contextvars.ContextVar = contextvars.ContextVar("tvm_ext_exact_int8_workload", default=None)
ELEMS: contextvars.ContextVar = contextvars.ContextVar("tvm_ext_exact_int8_elems", default=4)
SATURATING: contextvars.ContextVar = contextvars.ContextVar("tvm_ext_exact_int8_saturating", default=False)


@contextlib.contextmanager
def saturating():
    """Enter to build every non-VNNI int8 dot product in TVM's saturating form, whatever its weights
    (no conv is packed in pairs): wrong where a pair overflows int16. For measuring what exactness
    costs (``make bench``), never for deployment."""
    token = SATURATING.set(True)
    try:
        yield
    finally:
        SATURATING.reset(token)


@contextlib.contextmanager
def recording():
    """Enter around one build: :class:`RecordWeights` notes the build's workloads here, and the
    dispatcher lets a workload saturate only when every layer noted under its key fits int16."""
    token = RECORD.set(_Record())
    try:
        yield RECORD.get()
    finally:
        RECORD.reset(token)


def _const_int8(expr):
    return isinstance(expr, relay.Constant) and expr.data.dtype == "int8"


def _typedshape_of(expr):
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
            shapes = _typedshape_of(data), _typedshape_of(weight), _typedshape_of(call)
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
        record = RECORD.get()
        if record is None or info.name != "FuseOps":
            return
        for _, func in mod.functions.items():
            if isinstance(func, relay.Function):
                _WeightVisitor(record).visit(func)
