"""8-bit denses whose output count 16 does not divide, on TVM's int8 dense (``int8_dense_padding``).

Design note
-----------
TVM 0.19's x86 dense takes its AVX-512 int8 kernel (``dense_int8.x86``, weights packed ``NC16n4c``,
``vpdpbusd`` with VNNI) only for a ``uint8 x int8 -> int32`` dense whose output count ``N`` is a
multiple of 16 and whose reduction ``K`` a multiple of 4; any other ``N`` takes the generic
``dense_pack.x86`` (ResNet-50's 1000 classes).
TVM's own legalization pads only ``int8 x int8`` denses. While :func:`padded_int8_denses` is entered,
the x86 dense legalization also pads the constant weight of a ``uint8 x int8`` dense to the next
multiple of 16 outputs (zero rows, folded at compile time) and slices the result back::

    # dense(x: u8[M, K], w: i8[N, K]) -> dense(x, pad(w, N' - N zero rows))[:, :N],  N' = 16 * ceil(N / 16)

The zero rows add nothing to the ``N`` outputs kept, so the result is the same integers. The slice is
injective, and FuseOps fuses none into a dense: :func:`tvm_ext.x86.fuse_sliced_dense.FuseSlicedInt8Dense`
puts it and the dense's epilogue in the dense's kernel (measured in docs/x86-kernels.md, "8-bit denses
padded to 16 outputs"). Only where the target's class is in
:data:`CLASSES`, ``K`` is a multiple of 4 (else the data would need padding at run time) and the
weight is a constant; anything else keeps TVM's legalization, and the reason is logged.
:class:`tvm_ext.x86.backend.X86` enters the context, and adds the pass, for builds with tvm-ext's kernels.
"""
from __future__ import annotations

import functools
import logging

from .._patch import Patch
from .isa import isa_class

logger = logging.getLogger(__name__)

__all__ = ["padded_int8_denses", "padded_outputs", "applies", "static_dims", "CLASSES", "BLOCK"]

#: Output block of TVM's VNNI dense (``NC16n4c``: 16 outputs x 4 reduced elements per ``vpdpbusd``).
BLOCK = 16
#: Instruction-set classes whose padded dense is measured to win (docs/x86-kernels.md): ``vpdpbusd``
#: with VNNI, the exact ``vpmaddubsw`` + ``vpmaddwd`` form of :mod:`tvm_ext.x86.exact_int8` without. AVX2
#: and SSE never take ``dense_int8.x86`` (TVM asks for AVX-512); AMX targets keep TVM's choice.
CLASSES = ("avx512_vnni", "avx512")


def padded_outputs(units: int) -> int:
    """``units`` rounded up to a multiple of :data:`BLOCK`."""
    return -(-int(units) // BLOCK) * BLOCK


def applies(target) -> bool:
    """True when 8-bit denses for ``target`` are padded to :data:`BLOCK` outputs (its class is in
    :data:`CLASSES`)."""
    return target is not None and isa_class(target) in CLASSES


def static_dims(shape):
    """``shape`` as ints, or None when a dimension is not a compile-time integer."""
    import tvm

    if not all(isinstance(d, (int, tvm.tir.IntImm)) for d in shape):
        return None
    return tuple(int(d) for d in shape)


def _why_not(inputs, arg_types) -> str:
    """Why a dense keeps TVM's legalization, or ``""`` when it is padded."""
    import tvm
    from tvm import relay

    data, weight, out = arg_types
    if (str(data.dtype), str(weight.dtype), str(out.dtype)) != ("uint8", "int8", "int32"):
        return f"not uint8 x int8 -> int32 ({data.dtype} x {weight.dtype} -> {out.dtype})"
    data_shape, weight_shape = static_dims(data.shape), static_dims(weight.shape)
    if data_shape is None or weight_shape is None or len(data_shape) != 2 or len(weight_shape) != 2:
        return f"not a static 2-D dense ({data.shape} x {weight.shape})"
    units, reduced = weight_shape
    if units % BLOCK == 0:
        return f"{units} outputs: already a multiple of {BLOCK}"
    if reduced % 4:
        return f"reduction of {reduced}: not a multiple of 4"
    if not isinstance(inputs[1], relay.Constant):
        return "the weight is not a constant"
    if not applies(tvm.target.Target.current(allow_none=True)):
        return f"the target's class is not one of {CLASSES}"
    return ""


def _padded(inputs, arg_types, attrs):
    """``dense(x, pad(w))[:, :N]`` for the dense of ``inputs``, or None (reason logged)."""
    from tvm import relay

    reason = _why_not(inputs, arg_types)
    if reason:
        logger.debug("int8_dense_padding: dense %s x %s kept: %s", arg_types[0].shape, arg_types[1].shape, reason)
        return None
    data, weight = inputs
    units = int(arg_types[1].shape[0])
    padded = padded_outputs(units)
    weight = relay.nn.pad(weight, pad_width=((0, padded - units), (0, 0)), pad_value=0)
    out = relay.nn.dense(data, weight, units=padded, out_dtype=str(arg_types[2].dtype))
    logger.debug("int8_dense_padding: dense %s x %s padded to %d outputs", arg_types[0].shape,
                 arg_types[1].shape, padded)
    return relay.strided_slice(out, begin=[0], end=[units], axes=[1])


def _pad_dense_outputs(legalize):
    """``legalize`` (TVM's ``int8_int8_legalize``, which x86's dense and batch_matmul legalizations
    call), with ``uint8 x int8`` denses padded to :data:`BLOCK` outputs first (:func:`_padded`)."""
    from tvm import relay

    @functools.wraps(legalize)
    def wrapped(inputs, arg_types, op, attrs, *args, **kwargs):
        if op is relay.nn.dense and len(arg_types) == 3:
            out = _padded(inputs, arg_types, attrs)
            if out is not None:
                return out
        return legalize(inputs, arg_types, op, attrs, *args, **kwargs)

    wrapped._tvm_ext_change = "int8_dense_padding"  # pylint: disable=protected-access
    return wrapped


_SAVED: dict = {}


def _install():
    import tvm.topi.x86.dense_alter_op as dense_alter_op

    _SAVED["legalize"] = dense_alter_op.int8_int8_legalize
    dense_alter_op.int8_int8_legalize = _pad_dense_outputs(dense_alter_op.int8_int8_legalize)


def _uninstall():
    import tvm.topi.x86.dense_alter_op as dense_alter_op

    dense_alter_op.int8_int8_legalize = _SAVED.pop("legalize")


_PATCH = Patch(_install, _uninstall)


def padded_int8_denses():
    """Context: while entered, x86 builds pad ``uint8 x int8`` denses to :data:`BLOCK` outputs where
    the target's class takes it (module note). Re-entrant; TVM's legalization is restored when the
    outermost entry exits."""
    return _PATCH.entered()
