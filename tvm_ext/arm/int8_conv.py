"""tvm-ext's int8 kernel policy for aarch64: every int8 conv and dense multiplies 8-bit operands.

TVM 0.19's ``arm_cpu`` rules leave several kinds of int8 layer off the 8-bit path (docs/arm.md). Which
kernel each kind takes at a target is data, :mod:`tvm_ext.arm.int8_policy` (one record per
instruction-set class); this module applies it through TVM's registrations:

* QNN legalization: int8 operands without a dot product (``int8_operands``);
* conv2d legalization: up to ``few_channel_pad`` input channels padded to it, not to 8;
* the conv strategy: the NCHWc int8 kernel below 64 channels (``few_channel_nchwc``), a float first
  layer as NCHWc (``float_stem_nchwc``), :mod:`tvm_ext.arm.mmla_conv` (``mmla_conv``), NCHW4c
  convs in :mod:`tvm_ext.arm.dot_conv`'s register tiles (``conv_tile``);
* the layout rule: the ``smmla`` layouts, one channel block among them (``mmla_block``), NCHWc
  depthwise convs after an NCHWkc producer (``depthwise_nchwc``);
* the NCHWc depthwise strategy: :mod:`tvm_ext.arm.depthwise_dot` (``depthwise_dot``);
* the dense strategy: :mod:`tvm_ext.arm.int8_dense`'s kernels (``dense_kernels``).

Everything else stays TVM's: NHWC, float convs with 64 or more input channels, float depthwise convs.
The rules, with their equations and reasons: docs/arm-kernels.md.

:func:`kernels` installs the eight registrations for as long as it is entered and puts TVM's back
on the outermost exit (re-entrant and shared by threads, :class:`tvm_ext._patch.Patch`).
:func:`tvm_ext.build` enters it for aarch64 targets when a tvm-ext pipeline runs (``kernels=True``).
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import re

import tvm
from tvm import relay, topi
from tvm.relay.op import strategy as _strategy
from tvm.relay.op.strategy import arm_cpu as _arm_strategy
from tvm.relay.qnn.op import legalizations as _qnn_legalize
from tvm.topi.nn.utils import get_pad_tuple
from tvm.target import Target

from .._op_pattern import K_BROADCAST, call_pattern
from .._patch import Patch
from . import depthwise_dot, dot_conv, int8_dense, mmla_conv
from ._mmla import MMLA_INSTRUCTION
from .int8_policy import CHANNEL_MULTIPLE, INT8_LANES, MIN_INT8_CHANNELS, policy

logger = logging.getLogger(__name__)

__all__ = ["kernels", "NCHWC_INT8", "NCHWC_MMLA", "NCHWC_TILES", "MIN_INT8_CHANNELS"]

#: The implementation name of TVM's NCHWc int8 conv on aarch64 (``sdot``/``udot``, or ``smull``).
NCHWC_INT8 = "conv2d_nchw_int8.arm_cpu"

#: The implementation names of tvm-ext's NCHW4c int8 convs in register tiles (``conv_tile``): this, a dot
#: and the form (``conv2d_nchwc_tiles.tvm_ext.sdot``, ``....smull``).
NCHWC_TILES = "conv2d_nchwc_tiles.tvm_ext"

#: The implementation name of tvm-ext's NCHW8c matrix-multiply int8 conv (+i8mm).
NCHWC_MMLA = "conv2d_nchwc_mmla.tvm_ext"

#: The implementation names of :mod:`tvm_ext.arm.int8_dense`'s kernels.
DENSE_MMLA = "dense_int8_mmla.tvm_ext"
DENSE_DOT = "dense_int8_dot.tvm_ext"

#: The data and weight layouts of :data:`NCHWC_MMLA` after the layout pass.
MMLA_LAYOUTS = {"data_layout": "NCHW8c", "kernel_layout": "OIHW8o8i", "out_layout": "NCHW8c"}

#: The float conv the policy gives a float first layer (NCHWc after TVM's layout rules).
NCHWC_FLOAT = "conv2d_nchw.x86"

#: The implementation TVM's arm_cpu strategy gives ``contrib_depthwise_conv2d_nchwc`` (the x86 compute),
#: which the policy's layout rule makes of an 8-bit depthwise conv reading an NCHWc tensor.
DEPTHWISE_NCHWC = "depthwise_conv2d_NCHWc.x86"

#: The implementation name of :mod:`tvm_ext.arm.depthwise_dot`'s depthwise conv (``depthwise_dot``).
DEPTHWISE_DOT = "depthwise_conv2d_nchwc_dot.tvm_ext"

_8BIT = ("int8", "uint8")
#: besides elementwise and broadcast ops, these keep their input's layout (a slice of whole blocks)
_KEEP_LAYOUT = ("nn.pad", "strided_slice", "annotation.stop_fusion")
#: pools whose output keeps their input's NCHWkc layout (their ``layout`` attribute after the layout pass)
_POOLS = ("nn.global_avg_pool2d", "nn.global_max_pool2d", "nn.avg_pool2d", "nn.max_pool2d",
          "nn.adaptive_avg_pool2d", "nn.adaptive_max_pool2d")


def _policy():
    """The policy record of the target being built (:func:`tvm_ext.arm.int8_policy.policy`)."""
    return policy(Target.current(allow_none=False))


def _int8_operands() -> bool:
    return _policy().int8_operands and bool(Target.current(allow_none=False).features.has_asimd)


def _qnn_conv2d_legalize(attrs, inputs, types):
    # int8_operands (NEON only): int8 x int8 operands (as at +dotprod) instead of int16 ones, NCHW convs
    if _int8_operands() and attrs["data_layout"] == "NCHW":
        return _qnn_legalize.helper_change_dtypes_to_be_same(attrs, inputs, types, relay.qnn.op.conv2d)
    return _qnn_legalize._qnn_conv2d_legalize_arm_cpu(attrs, inputs, types)


def _qnn_dense_legalize(attrs, inputs, types):
    # int8_operands (NEON only): an int8 x int8 dense (cast to int32 inside the kernel), not int16 operands
    if _int8_operands():
        return _qnn_legalize.helper_change_dtypes_to_be_same(attrs, inputs, types, relay.qnn.op.dense)
    return _qnn_legalize._qnn_dense_legalize_arm_cpu(attrs, inputs, types)


def _few_channels(attrs, kernel):
    """The static input-channel count of an NCHW conv (groups 1) below :data:`MIN_INT8_CHANNELS`, else None
    (other layouts, groups, dynamic counts and wider convs keep TVM's rule)."""
    if attrs.groups != 1 or attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW":
        return None
    channels = kernel.shape[1]
    if not isinstance(channels, tvm.tir.IntImm) or int(channels) >= MIN_INT8_CHANNELS:
        return None
    return int(channels)


def _takes_nchwc_int8(attrs, data, kernel) -> bool:
    """An int8 x int8 conv with few input channels: 4, or a multiple of 8 (the kernel's channel blocks:
    multiples of 8, or all of the channels below 8; 4 is one int32 lane)."""
    c = _few_channels(attrs, kernel)
    return (_policy().few_channel_nchwc and c is not None
            and topi.arm_cpu.conv2d_int8.is_int8_hw_support(data.dtype, kernel.dtype)
            and (c % CHANNEL_MULTIPLE == 0 or c == INT8_LANES))


def _takes_depthwise_int8(attrs, data, kernel) -> bool:
    """An NCHW 8-bit depthwise conv (channel multiplier 1, static shapes) whose channels fill the NCHWc
    blocks of its int8 neighbours (a multiple of :data:`INT8_LANES`)."""
    if attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW" or not _static(data.shape, kernel.shape):
        return False
    if not _policy().depthwise_nchwc:
        return False
    channels, multiplier = int(data.shape[1]), int(kernel.shape[1])
    return (multiplier == 1 and int(attrs.groups) == channels == int(kernel.shape[0]) > 1
            and channels % INT8_LANES == 0 and data.dtype in _8BIT and kernel.dtype in _8BIT)


def _producer_block(expr, max_depth: int = 512, across: bool = False):
    """The channel block k of ``expr`` when it computes an NCHWkc tensor, else None.

    The layout pass hands the layout rule a conv's data already in its producer's new layout; this
    follows the data through the producer's epilogue (elementwise and broadcast ops, a pad, the channel
    slice of a padded conv) to the op that fixes its layout: a layout_transform or an NCHWc conv. A
    quantized hard-swish between them is some 50 such ops; ``max_depth`` only bounds the walk.

    ``across``: also the block of an NCHWkc tensor that a pool kept (a squeeze-excite's global pool) or
    that a ``layout_transform(NCHWkc -> NCHW)`` took apart (a channel slice that no block divides: the
    slice and pad that FoldChannelRepadIntoConv removes when the conv reads NCHWkc)."""
    for _ in range(max_depth):
        if not (isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op)):
            return None
        name = expr.op.name
        if name == "layout_transform":
            unblocks = across and str(expr.attrs.dst_layout) == "NCHW"
            layout = str(expr.attrs.src_layout if unblocks else expr.attrs.dst_layout)
        elif across and name in _POOLS:
            layout = str(expr.attrs.out_layout) or str(expr.attrs.layout)
        elif name in ("nn.contrib_conv2d_NCHWc", "nn.contrib_depthwise_conv2d_NCHWc"):
            layout = str(expr.attrs.out_layout) or str(expr.attrs.data_layout)
        elif name in _KEEP_LAYOUT or call_pattern(expr) <= K_BROADCAST:
            data = [a for a in expr.args if not isinstance(a, relay.Constant)]
            if not data:
                return None
            expr = data[0]
            continue
        else:
            return None
        m = re.fullmatch(r"NCHW(\d+)c", layout)
        return int(m.group(1)) if m else None
    return None


def _float_stem(attrs, data, kernel) -> bool:
    """A float32 conv on an image's channels (up to 4) in an 8-bit graph: the float first layer that
    relay.quantize keeps (``skip_conv_layers``), in front of int8 NCHWc convs. In a float network, or
    deeper (a detector's float head), TVM's NCHW rule stays: NCHWc there would only add layout changes."""
    channels = _few_channels(attrs, kernel)
    return (_policy().float_stem_nchwc and _FLOAT_STEM.get() and channels is not None and channels <= INT8_LANES
            and data.dtype == kernel.dtype == "float32")


def _takes_mmla(attrs, data, kernel) -> bool:
    """An NCHW 8-bit conv (groups 1, no dilation) at +i8mm whose static channel counts are multiples of 8,
    with operand types a matrix-multiply instruction takes, and output rows at least two pixels wide.

    One instruction computes two neighbouring pixels of a row: for a one-pixel row (a squeeze-excite
    conv after a global pool) half of every product would be padding, so the conv keeps the dot
    product, as a one-row dense does."""
    if not _policy().mmla_conv:
        return False
    if attrs.groups != 1 or attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW":
        return False
    if (data.dtype, kernel.dtype) not in MMLA_INSTRUCTION or not _static(data.shape, kernel.shape):
        return False
    if tuple(int(d) for d in attrs.dilation) != (1, 1) or attrs.out_dtype not in ("int32", ""):
        return False
    out_channels, channels = int(kernel.shape[0]), int(kernel.shape[1])
    if channels % mmla_conv.BLOCK or out_channels % mmla_conv.BLOCK:
        return False
    _, left, _, right = get_pad_tuple(attrs.get_int_tuple("padding"), (int(kernel.shape[2]), int(kernel.shape[3])))
    out_width = (int(data.shape[3]) + left + right - int(kernel.shape[3])) // int(attrs.strides[1]) + 1
    return out_width >= 2


def _static(*shapes) -> bool:
    return all(isinstance(d, tvm.tir.IntImm) for shape in shapes for d in shape)


def _mmla_compute(compute):
    def _compute(attrs, inputs, out_type):
        return [compute(inputs[0], inputs[1], attrs.get_int_tuple("strides"), attrs.get_int_tuple("padding"),
                        attrs.get_int_tuple("dilation"), out_type.dtype)]
    return _compute


#: The implementations the policy adds, in order (the first whose check holds), at TVM's int8 priority.
#: The float one is TVM's x86 float conv, which TVM's arm_cpu layout rules turn into NCHWc: the pool and
#: the int8 NCHWc convs after a float first layer then need no layout_transform kernel.
_ADDED = (
    (_takes_nchwc_int8, topi.arm_cpu.conv2d_nchw_int8, topi.arm_cpu.schedule_conv2d_nchw_int8, NCHWC_INT8),
    (_float_stem, topi.x86.conv2d_nchw, topi.x86.schedule_conv2d_nchw, NCHWC_FLOAT),
)


def _conv2d_strategy(attrs, inputs, out_type, target):
    strategy = _arm_strategy.conv2d_strategy_arm_cpu(attrs, inputs, out_type, target)
    data, kernel = inputs
    if _takes_mmla(attrs, data, kernel):
        strategy.add_implementation(_mmla_compute(mmla_conv.conv2d_nchw_mmla),
                                    _strategy.wrap_topi_schedule(mmla_conv.schedule_conv2d_mmla),
                                    name=NCHWC_MMLA, plevel=25)
        return strategy
    for check, compute, schedule, name in _ADDED:
        if check(attrs, data, kernel):
            strategy.add_implementation(_strategy.wrap_compute_conv2d(compute),
                                        _strategy.wrap_topi_schedule(schedule), name=name, plevel=15)
            break
    return strategy


def _conv2d_nchwc_strategy(attrs, inputs, out_type, target):
    if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) == tuple(MMLA_LAYOUTS.values()):
        strategy = relay.op.OpStrategy()
        strategy.add_implementation(_mmla_compute(mmla_conv.conv2d_nchwc_mmla),
                                    _strategy.wrap_topi_schedule(mmla_conv.schedule_conv2d_mmla),
                                    name=NCHWC_MMLA, plevel=25)
        return strategy
    form = _tile_form(attrs, *inputs, out_type, target)
    if form:
        compute, schedule = _TILE_FORMS[form]
        strategy = relay.op.OpStrategy()
        strategy.add_implementation(_mmla_compute(compute), _strategy.wrap_topi_schedule(schedule),
                                    name=f"{NCHWC_TILES}.{form}", plevel=25)
        return strategy
    return _arm_strategy.conv2d_NCHWc_strategy_arm_cpu(attrs, inputs, out_type, target)


#: :mod:`tvm_ext.arm.dot_conv`'s compute and schedule per ``conv_tile`` form.
_TILE_FORMS = {"sdot": (dot_conv.conv2d_nchwc_dot, dot_conv.schedule_conv2d_dot),
               "smull": (dot_conv.conv2d_nchwc_widening, dot_conv.schedule_conv2d_widening)}


def _tile_form(attrs, data, kernel, out_type, target) -> str:
    """The record's ``conv_tile`` form for an NCHW4c int8 conv (``OIHW1i4o4i`` weights, groups 1, static
    shapes, output rows of 4 pixels or more): :mod:`tvm_ext.arm.dot_conv`'s register tile instead of
    TVM's one accumulator; else ``""`` (TVM's schedule)."""
    form = policy(target).conv_tile
    if not form or int(attrs.groups) != 1 or not _static(data.shape, kernel.shape):
        return ""
    if str(attrs.out_layout or attrs.data_layout) not in {f"NCHW{b}c" for b in dot_conv.OUT_BLOCKS}:
        return ""
    data_shape, kernel_shape = tuple(int(d) for d in data.shape), tuple(int(d) for d in kernel.shape)
    out_width = dot_conv.output_width(data_shape[3], kernel_shape[3], int(attrs.strides[1]),
                                      attrs.get_int_tuple("padding"), int(attrs.dilation[1]))
    why = dot_conv.check_operands(data_shape, kernel_shape, data.dtype, kernel.dtype, out_type.dtype, out_width)
    return "" if why else form


def _depthwise_dot_refusal(attrs, data, kernel, out_type, target) -> str:
    """Why an NCHWc depthwise conv keeps TVM's compute at ``target``, or ``""`` (``depthwise_dot``)."""
    if not policy(target).depthwise_dot:
        return f"the {policy(target).isa} policy keeps TVM's depthwise compute"
    if not _static(data.shape, kernel.shape):
        return "dynamic shapes"
    return depthwise_dot.check(tuple(int(d) for d in data.shape), tuple(int(d) for d in kernel.shape), data.dtype,
                               kernel.dtype, out_type.dtype, attrs.get_int_tuple("dilation"),
                               bool(target.features.has_matmul_i8))


def _depthwise_nchwc_strategy(attrs, inputs, out_type, target):
    # depthwise_dot: contrib_depthwise_conv2d_NCHWc(x, w) -> sdot over 4 adjacent taps (tvm_ext.arm.depthwise_dot)
    why = _depthwise_dot_refusal(attrs, *inputs, out_type, target)
    if why:
        logger.debug("depthwise conv %s x %s keeps TVM's compute: %s", inputs[0].shape, inputs[1].shape, why)
        return _arm_strategy.depthwise_conv2d_NCHWc_strategy_arm_cpu(attrs, inputs, out_type, target)
    strategy = relay.op.OpStrategy()
    strategy.add_implementation(_mmla_compute(depthwise_dot.depthwise_conv2d_nchwc_dot),
                                _strategy.wrap_topi_schedule(depthwise_dot.schedule_depthwise_conv2d_nchwc_dot),
                                name=DEPTHWISE_DOT, plevel=25)
    return strategy


def _conv2d_alter_layout(attrs, inputs, tinfos, out_type):
    # the layout pass: a conv that takes the matrix-multiply kernel becomes NCHW8c with OIHW8o8i weights
    target = Target.current(allow_none=False)
    impl, _ = relay.backend.te_compiler.select_implementation(relay.op.get("nn.conv2d"), attrs, tinfos,
                                                              out_type, target)
    if impl.name == NCHWC_MMLA:
        new_attrs = {k: attrs[k] for k in attrs.keys()}
        new_attrs.update(MMLA_LAYOUTS)
        return relay.nn.contrib_conv2d_nchwc(*inputs, **new_attrs)
    block = _producer_block(inputs[0]) if _takes_depthwise_int8(attrs, *tinfos) else None
    if block is not None and int(tinfos[0].shape[1]) % block == 0:
        # conv2d(x in NCHWkc, w[C, 1], groups=C) -> contrib_depthwise_conv2d_nchwc(x, w in OIHW1iko): the
        # producer's blocks, no layout_transform kernel on either side
        new_attrs = {k: attrs[k] for k in attrs.keys()}
        new_attrs.update(channels=int(tinfos[0].shape[1]), data_layout=f"NCHW{block}c",
                         kernel_layout=f"OIHW1i{block}o", out_layout=f"NCHW{block}c")
        return relay.nn.contrib_depthwise_conv2d_nchwc(*inputs, **new_attrs)
    altered = topi.arm_cpu.conv2d_alter_op._alter_conv2d_layout(attrs, inputs, tinfos, out_type)
    if (policy(target).mmla_block and isinstance(altered, relay.Call)
            and altered.op.name == "nn.contrib_conv2d_NCHWc"):
        return _among_mmla(altered, inputs, tinfos, policy(target).mmla_block)
    return altered


def _among_mmla(altered, inputs, tinfos, block):
    """A dot-product (or float) NCHWc conv at +i8mm, re-blocked to the matrix-multiply convs' NCHW8c: it
    writes NCHW8c when its output channels are a multiple of 8, and reads NCHW8c when its input channels
    are and its producer wrote NCHW8c (:func:`_producer_block` across a pool or a channel slice).

    TVM's NCHWc int8 compute takes any input block that is a multiple of 4 (``OIHW<ic/4>i<oc>o4i``
    weights, the dot product over 4 channels at a time), its x86 float compute any block (``OIHW<ic>i<oc>o``)."""
    m = re.fullmatch(r"OIHW(\d+)i(\d+)o(4i)?", str(altered.attrs.kernel_layout))  # int8 dot product, or float
    if m is None:
        return altered
    lanes = INT8_LANES if m.group(3) else 1
    in_block, out_block = int(m.group(1)) * lanes, int(m.group(2))
    in_channels, out_channels = int(tinfos[1].shape[1]), int(tinfos[1].shape[0])
    if out_block == INT8_LANES and out_channels % block == 0:
        out_block = block
    if (in_block != block and in_channels % block == 0 and int(altered.attrs.groups) == 1
            and _producer_block(inputs[0], across=True) == block):
        in_block = block
    new_attrs = {k: altered.attrs[k] for k in altered.attrs.keys()}
    new_attrs.update(data_layout=f"NCHW{in_block}c", out_layout=f"NCHW{out_block}c",
                     kernel_layout=f"OIHW{in_block // lanes}i{out_block}o" + ("4i" if lanes > 1 else ""))
    if all(str(new_attrs[k]) == str(altered.attrs[k]) for k in ("data_layout", "out_layout", "kernel_layout")):
        return altered
    return relay.nn.contrib_conv2d_nchwc(*inputs, **new_attrs)


def _dense_kernel(attrs, data, weight):
    """The :mod:`tvm_ext.arm.int8_dense` kernel for a static 8-bit dense at this target, or None."""
    pol = _policy()
    if len(data.shape) != 2 or not _static(data.shape, weight.shape) or attrs.out_dtype not in ("int32", ""):
        return None
    (m, k), n = (int(d) for d in data.shape), int(weight.shape[0])
    dtypes = (data.dtype, weight.dtype)
    for kind in pol.dense_kernels:  # in the policy's order: the first whose shape rule holds
        if kind == "mmla" and dtypes in MMLA_INSTRUCTION and m >= 2 and k % 8 == 0 and n % 2 == 0:
            return int8_dense.dense_mmla, DENSE_MMLA
        usdot_ok = dtypes != ("uint8", "int8") or pol.mixed_sign_dot
        if kind == "dot" and dtypes in int8_dense.DOT_INSTRUCTION and usdot_ok and k % 16 == 0:
            return int8_dense.dense_dot, DENSE_DOT
    return None


def _dense_strategy(attrs, inputs, out_type, target):
    strategy = _arm_strategy.schedule_dense_arm_cpu(attrs, inputs, out_type, target)
    kernel = _dense_kernel(attrs, *inputs)
    if kernel is not None:
        compute, name = kernel
        strategy.add_implementation(lambda attrs_, inputs_, out_type_: [compute(inputs_[0], inputs_[1],
                                                                                out_type_.dtype)],
                                    _strategy.wrap_topi_schedule(int8_dense.schedule_dense_int8),
                                    name=name, plevel=25)
    return strategy


def _padded_conv_output(expr, max_nodes: int = 512) -> bool:
    """Whether ``expr`` is a conv's output whose channels int8 legalization padded and sliced back
    (``strided_slice(conv2d(...))``), through the conv's epilogue (elementwise and broadcast ops; any of
    their arguments, as Legalize hands them over unfolded: ``add(cast(3), y)``). ``max_nodes`` bounds the walk.

    At +i8mm that conv writes them in NCHW8c blocks; a conv reading them pads its input channels to 8 too,
    so that it can read the NCHW8c tensor below the slice (FoldChannelRepadIntoConv, its weights being zero
    on the padded channels) instead of 4 channels after a layout change::

        # conv2d(f(strided_slice(conv2d(x, w1))[:n]), w2), n <= 4, +i8mm  ->  conv2d(pad(...)[8], pad(w2)[O, 8])
    """
    stack, seen = [expr], set()
    while stack and len(seen) < max_nodes:
        expr = stack.pop()
        if not (isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op)) or expr in seen:
            continue
        seen.add(expr)
        if expr.op.name == "strided_slice":
            conv = expr.args[0]
            if isinstance(conv, relay.Call) and isinstance(conv.op, tvm.ir.Op) and conv.op.name == "nn.conv2d":
                return True
        elif call_pattern(expr) <= K_BROADCAST:
            stack.extend(expr.args)
    return False


def _conv2d_legalize(attrs, inputs, arg_types):
    data_type, kernel_type = arg_types[0], arg_types[1]
    if (attrs["data_layout"] == "NCHW" and attrs["kernel_layout"] == "OIHW" and attrs["groups"] == 1
            and topi.arm_cpu.conv2d_int8.is_int8_hw_support(kernel_type.dtype, kernel_type.dtype)):
        # up to few_channel_pad input channels: padded to it (TVM: 8); more, or a padded conv's channels
        # with mmla_block: to a multiple of 8, as TVM does
        pol, channels = _policy(), int(data_type.shape[1])
        few = channels <= pol.few_channel_pad and not (pol.mmla_block and _padded_conv_output(inputs[0]))
        multiple = pol.few_channel_pad if few else CHANNEL_MULTIPLE
        return topi.generic.conv2d.conv2d_alter_int8_common(
            inputs[0], data_type, inputs[1], kernel_type, arg_types[2], attrs, kernel_type.dtype,
            multiple, CHANNEL_MULTIPLE)
    return topi.arm_cpu.conv2d_alter_op._conv2d_legalize(attrs, inputs, arg_types)


def _install():
    logger.debug("aarch64: tvm-ext int8 kernel policy (8-bit operands at NEON, NCHWc int8 below 64 channels)")
    _qnn_legalize.qnn_conv2d_legalize.register("arm_cpu", _qnn_conv2d_legalize, override=True)
    _qnn_legalize.qnn_dense_legalize.register("arm_cpu", _qnn_dense_legalize, override=True)
    _strategy.conv2d_strategy.register("arm_cpu", _conv2d_strategy, override=True)
    topi.nn.conv2d_legalize.register("arm_cpu", _conv2d_legalize, override=True)
    _strategy.conv2d_NCHWc_strategy.register("arm_cpu", _conv2d_nchwc_strategy, override=True)
    topi.nn.conv2d_alter_layout.register("arm_cpu", _conv2d_alter_layout, override=True)
    _strategy.dense_strategy.register("arm_cpu", _dense_strategy, override=True)
    _strategy.depthwise_conv2d_NCHWc_strategy.register("arm_cpu", _depthwise_nchwc_strategy, override=True)


def _uninstall():
    _qnn_legalize.qnn_conv2d_legalize.register("arm_cpu", _qnn_legalize._qnn_conv2d_legalize_arm_cpu, override=True)
    _qnn_legalize.qnn_dense_legalize.register("arm_cpu", _qnn_legalize._qnn_dense_legalize_arm_cpu, override=True)
    _strategy.conv2d_strategy.register("arm_cpu", _arm_strategy.conv2d_strategy_arm_cpu, override=True)
    topi.nn.conv2d_legalize.register("arm_cpu", topi.arm_cpu.conv2d_alter_op._conv2d_legalize, override=True)
    _strategy.conv2d_NCHWc_strategy.register("arm_cpu", _arm_strategy.conv2d_NCHWc_strategy_arm_cpu, override=True)
    topi.nn.conv2d_alter_layout.register("arm_cpu", topi.arm_cpu.conv2d_alter_op._alter_conv2d_layout,
                                         override=True)
    _strategy.dense_strategy.register("arm_cpu", _arm_strategy.schedule_dense_arm_cpu, override=True)
    _strategy.depthwise_conv2d_NCHWc_strategy.register("arm_cpu", _arm_strategy.depthwise_conv2d_NCHWc_strategy_arm_cpu,
                                                       override=True)


_PATCH = Patch(_install, _uninstall)

#: Whether the build in this context blocks a float first layer (:func:`kernels`' ``int8_graph``).
_FLOAT_STEM = contextvars.ContextVar("tvm_ext_arm_float_stem", default=True)


@contextlib.contextmanager
def kernels(int8_graph: bool = True):
    """Enter to build aarch64 int8 convs and denses with tvm-ext's kernel policy (module note).

    ``int8_graph``: the graph holds 8-bit tensors, so a float first layer is blocked like the int8
    convs after it; False leaves every float conv to TVM."""
    token = _FLOAT_STEM.set(bool(int8_graph))
    try:
        with _PATCH.entered():
            yield
    finally:
        _FLOAT_STEM.reset(token)
