"""QDQToInteger: TVM's FakeQuantizationToInteger for QDQ graphs, with one rounding per add.

Rewrites::

    # quantize(add(dequantize(a), dequantize(b)))        -> unchanged (float add, one rounding)
    # quantize(avg_pool(dequantize(a)))                  -> unchanged (float pool, one rounding)
    # quantize(...op(v, c)...),  c a float constant, v not an anchor's output
    #                                                    -> unchanged (float, as stock TVM)
    # quantize(...sigmoid(v)...)  (tanh, exp, ...)        -> unchanged (float, fuses into the conv)
    # quantize(batch_matmul(dequantize(a), dequantize(b))), a and b both computed (not constants)
    #                                                    -> unchanged (float, as stock TVM)
    # conv2d(v, dq(w, s[O])), a per-channel weight scale, output channels not on axis 1 (NHWC)
    #                                                    -> unchanged (float: FQ2I misreads the channel axis)
    # quantize(conv2d(...)), groups 1, channels % 16 != 0, small, x86 without 8-channel int8 blocks
    #                                                    (see _padded_int8_conv)
    #                                                    -> unchanged (float, as stock TVM)
    # quantize(f(dequantize(x), dequantize(w), ...))     -> qnn form of f       (TVM's FQ2I rules)

As data: :data:`KEEP_FLOAT` (``tvm.relay.dataflow_pattern``); data movement of any length is walked by hand.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``QDQToInteger``.
"""
from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import tvm
from tvm import relay
from tvm.relay import dataflow_pattern as dfp

from ._registry import register_pass

from ._util import (
    ANCHOR_OPS,
    Reject,
    describe,
    op_name,
    pass_logger,
    post_order,
    require_typed,
    unsupported_construct,
)

__all__ = ["KEEP_FLOAT", "QDQToInteger", "is_qdq_graph"]

PASS_NAME = "QDQToInteger"
_log = pass_logger(PASS_NAME)


def is_qdq_graph(func):
    """True when a float conv/dense reads a ``qnn.dequantize`` output, else a Reject."""
    def name(node):
        return op_name(node) if isinstance(node, relay.Call) else None

    for node in post_order(func.body):
        if name(node) in ANCHOR_OPS and str(node.checked_type.dtype).startswith("float"):
            if any(name(arg) == "qnn.dequantize" for arg in node.args):
                return True
    return Reject("no float conv2d/dense reads a qnn.dequantize (not a QDQ graph)")


#: binary ops whose float-constant operand FQ2I quantizes with the other operand's parameters
_CONST_BINOPS = ("add", "multiply", "subtract")
#: producers whose constant operand FQ2I handles well (a bias at the accumulator's scale)
_BIAS_PRODUCERS = ANCHOR_OPS + ("nn.bias_add",)
#: unary ops FQ2I turns into a table lookup (``take``, which does not fuse into a conv epilogue)
_TABLE_UNARY = ("sigmoid", "tanh", "exp", "erf", "sqrt", "rsqrt", "log", "abs")
#: products FQ2I makes integer with ``sum`` reductions for zero points when both operands are computed
_PRODUCTS = ("nn.batch_matmul", "nn.matmul", "nn.dense")
#: single-input data movement the ONNX importer puts between a MatMul's dequantize and its product
_MOVEMENT = ("reshape", "transpose", "squeeze", "expand_dims", "layout_transform", "nn.batch_flatten")
#: average pools kept in float (one rounding, as ONNX Runtime computes them)
_AVG_POOLS = ("nn.global_avg_pool2d", "nn.avg_pool2d")

#: Multiply-accumulates from which a padded int8 conv pays for its slice kernel (:func:`_padded_int8_conv`).
PADDED_INT8_MIN_MACS = 1 << 24
#: The same per int8 instruction class (:func:`tvm_ext.families.isa_class` of the current target)
#: where it differs: every conv converts where the padding costs no kernel. AVX2 and AVX-512 VNNI take
#: 8-channel int8 blocks (no padding); aarch64 pads to 8 channels, and ``FoldChannelRepadIntoConv`` lets
#: the next conv read the padded channels, so no slice/re-pad kernel stays between them (docs/arm.md);
#: ``opencl`` legalizes no int8 conv (TVM pads channels at cuda, vulkan and rocm only; docs/gpu.md).
PADDED_INT8_MIN_MACS_BY_ISA = {"avx2": 0, "avx512_vnni": 0, "aarch64_neon": 0, "aarch64_dotprod": 0,
                               "aarch64_i8mm": 0, "opencl": 0}
#: The output-channel multiple x86's int8 legalization pads a conv to (``conv2d_alter_int8_common``).
PADDED_INT8_CHANNELS = 16
#: A padded conv also converts when each output sums at least this many products and the conv
#: has at least :data:`PADDED_INT8_LONG_MIN_MACS` (:func:`_padded_int8_conv`).
PADDED_INT8_LONG_REDUCTION = 48
PADDED_INT8_LONG_MIN_MACS = 1 << 20


def _min_macs() -> int:
    """:data:`PADDED_INT8_MIN_MACS` for the target being compiled (the default without one)."""
    return PADDED_INT8_MIN_MACS_BY_ISA.get(_target_class(), PADDED_INT8_MIN_MACS)


def _target_class() -> str | None:
    tgt = tvm.target.Target.current(allow_none=True)
    if tgt is None:
        return None
    from tvm_ext.families import isa_class

    return isa_class(tgt)


# --- side conditions: True (or a reason, logged) keeps the op in float, a Reject leaves it to FQ2I ---
def _float_constant_operand(call):
    """One operand a float constant, the other no anchor's (or bias_add's) output."""
    consts = [a for a in call.args if isinstance(a, relay.Constant)]
    others = [a for a in call.args if not isinstance(a, relay.Constant)]
    if len(consts) != 1 or len(others) != 1:
        return Reject(f"{len(consts)} constant operands, not one")
    if not str(consts[0].data.dtype).startswith("float"):
        return Reject(f"the constant is {consts[0].data.dtype}, not float")
    if op_name(others[0]) in _BIAS_PRODUCERS:
        return Reject(f"a bias of {op_name(others[0])}: FQ2I quantizes it at the accumulator's scale")
    return True


def _computed_dequantize(arg) -> bool:
    """``qnn.dequantize(v, ...)`` of a computed ``v`` (not a constant weight), possibly moved
    (``reshape``/``transpose``/...: attention's heads split and ``K`` transposed on the way)."""
    while isinstance(arg, relay.Call) and op_name(arg) in _MOVEMENT:
        arg = arg.args[0]
    return (isinstance(arg, relay.Call) and op_name(arg) == "qnn.dequantize"
            and not isinstance(arg.args[0], relay.Constant))


def _product_of_activations(call):
    """Both operands dequantized activations (a constant weight's product converts)."""
    for i, arg in enumerate(call.args[:2]):
        if not _computed_dequantize(arg):
            return Reject(f"operand {i} ({describe(arg)}) is not a dequantized activation")
    return True


def _padded_int8_conv(call):
    """True for a small conv that x86's int8 legalization pads to a multiple of
    :data:`PADDED_INT8_CHANNELS` output channels.

    A ``groups=1`` conv whose output channels that multiple does not divide is computed for the next
    multiple and sliced back (x86: ``topi/generic/conv2d.py::conv2d_alter_int8_common``): the
    ``strided_slice`` is a kernel of its own and an int32 crossing more. Such a conv stays float
    below :func:`_min_macs` multiply-accumulates, unless every output sums at least
    :data:`PADDED_INT8_LONG_REDUCTION` products over at least :data:`PADDED_INT8_LONG_MIN_MACS`.
    Measured reason: on AVX-512 without VNNI and SSE targets (16-channel int8 blocks) the slice
    costs a small or short-reduction conv more than int8 saves, while AVX2 and AVX-512 VNNI
    targets take 8-channel blocks, so there every conv converts (numbers in ``docs/passes.md``), and
    so does every conv at aarch64, where ``FoldChannelRepadIntoConv`` removes the slice's kernel
    (numbers in ``docs/arm.md``).

    A dynamic output dimension (``relay.Any()`` batch, symbolic spatial size) counts as 1: the
    conv is judged by the fewest MACs it can run, as with a static batch of 1. Output channels and
    the weight's shape must be static (else a Reject: whether x86 pads is unknown).
    """
    attrs = call.attrs
    if int(attrs.groups) != 1:
        return Reject(f"groups={int(attrs.groups)}: not padded")
    shape = call.checked_type.shape
    axis = str(attrs.out_layout or attrs.data_layout).find("C")
    if axis < 0:
        return Reject(f"layout {attrs.out_layout or attrs.data_layout} has no C axis")
    weight = call.args[1].checked_type.shape
    if not _static(shape[axis]) or not all(_static(d) for d in weight):
        return Reject(f"output channels {shape[axis]} or weight shape {list(weight)} not static: padding unknown")
    channels = int(shape[axis])
    multiple = PADDED_INT8_CHANNELS
    if channels % multiple == 0:
        return Reject(f"{channels} output channels: a multiple of {multiple}, not padded")
    reduction = int(np.prod([int(d) for d in weight])) // channels  # products per output (any kernel layout)
    # a dynamic (batch or spatial) dim counts as 1: ``macs`` is the fewest the conv can run
    macs = int(np.prod([int(d) if _static(d) else 1 for d in shape])) * reduction
    least = "" if all(_static(d) for d in shape) else f" (at least: output shape {list(shape)})"
    if reduction >= PADDED_INT8_LONG_REDUCTION and macs >= PADDED_INT8_LONG_MIN_MACS:
        return Reject(f"{reduction} products per output, {macs} MACs{least}: int8 pays for the slice")
    if macs >= _min_macs():
        return Reject(f"{macs} MACs{least} >= {_min_macs()} for this target: int8 pays for the slice")
    return True


def _misread_channel_axis(call):
    """A conv whose weight ``qnn.dequantize`` is per-channel and whose output channel axis TVM 0.19's
    FQ2I misreads: a reason to keep it in float (a str, logged), else a Reject.

    FQ2I's ``nn.conv2d`` rule (``relay/transform/fake_quantization_to_integer.py``) gives the output's
    per-channel scale the axis ``bijective_layout(out_layout, "NCHW").backward_index([0, 1, 2, 3])[1]``,
    that is ``"NCHW".index(out_layout[1])``: the channel axis only where ``out_layout[1]`` is ``C``. In
    NHWC it is 2 (W), and the ``qnn.requantize`` FQ2I builds on it fails type inference (a scale of O
    values on an axis of W). A per-tensor weight scale has no axis to misread and converts.
    """
    weight = call.args[1]
    while isinstance(weight, relay.Call) and op_name(weight) in _MOVEMENT:
        weight = weight.args[0]
    if not (isinstance(weight, relay.Call) and op_name(weight) == "qnn.dequantize"):
        return Reject(f"the weight is {describe(weight)}, not a qnn.dequantize")
    if all(len(a.checked_type.shape) == 0 for a in weight.args[1:3]):
        return Reject("per-tensor weight scale and zero point")
    layout = str(call.attrs.out_layout or call.attrs.data_layout)
    channel = layout.find("C")
    fq2i_axis = "NCHW".find(layout[1]) if len(layout) == 4 else -1
    if channel == fq2i_axis:
        return Reject(f"layout {layout}: FQ2I takes the output channel axis {channel} right")
    return (f"per-channel weight scale and output layout {layout}: the channel axis is {channel}, TVM 0.19's "
            f"FQ2I would requantize along axis {fq2i_axis}")


def _static(dim) -> bool:
    """A constant dimension (not ``relay.Any()`` or a symbolic variable)."""
    return isinstance(dim, tvm.tir.IntImm)


def _dequantized_inputs(call):
    """Every input a ``qnn.dequantize`` (the pattern's inputs are wildcards with ``shared_dequantize``)."""
    for arg in call.args:
        if not (isinstance(arg, relay.Call) and op_name(arg) == "qnn.dequantize"):
            return Reject(f"input {describe(arg)} is not a qnn.dequantize")
    return True


# --- the table --------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeepFloat:
    """A region FQ2I is to leave in float. ``pattern(dfp, shared_dequantize)`` builds the pattern of
    its op from the module ``tvm.relay.dataflow_pattern`` (built on first use: importing the pass
    builds no pattern); ``check(op)`` is the side condition on the matched op (None: none; a str
    accepts and is logged as the reason). Of the rows an op matches, the first that accepts marks it. With
    ``in_quantize`` the op must be read by a ``qnn.quantize`` and the marker goes between them;
    otherwise it goes around the op."""

    name: str
    pattern: Callable
    check: Callable | None
    in_quantize: bool


def _any_op(dfp, names):
    return functools.reduce(operator.or_, (dfp.is_op(n) for n in names))


def _dq(dfp, shared_dequantize):
    if shared_dequantize:  # the dequantizes are the match's inputs (checked), not inner nodes
        return dfp.wildcard()
    return dfp.is_op("qnn.dequantize")(dfp.wildcard(), dfp.wildcard(), dfp.wildcard())


#: Ordered rule table (order is priority); ``sf`` is ``annotation.stop_fusion``, ``dq`` ``qnn.dequantize``.
KEEP_FLOAT = (
    # op(v, c) -> sf(op(v, c))      op add/multiply/subtract, c a float constant, v no anchor's output
    KeepFloat(f"{PASS_NAME}.float_constant_operand",
              lambda dfp, shared: (_any_op(dfp, _CONST_BINOPS)(dfp.wildcard(), dfp.is_constant())
                                   | _any_op(dfp, _CONST_BINOPS)(dfp.is_constant(), dfp.wildcard())),
              _float_constant_operand, in_quantize=False),
    # f(v) -> sf(f(v))              f sigmoid/tanh/exp/erf/sqrt/rsqrt/log/abs (FQ2I: a table lookup)
    KeepFloat(f"{PASS_NAME}.table_lookup_unary",
              lambda dfp, shared: _any_op(dfp, _TABLE_UNARY)(dfp.wildcard()), None, in_quantize=False),
    # p(a, b) -> sf(p(a, b))        p batch_matmul/matmul/dense, a and b dequantized activations
    KeepFloat(f"{PASS_NAME}.product_of_activations",
              lambda dfp, shared: _any_op(dfp, _PRODUCTS)(dfp.wildcard(), dfp.wildcard()),
              _product_of_activations, in_quantize=False),
    # conv2d(v, dq(w, s[O])) -> sf(conv2d(v, dq(w, s[O])))     channel axis not 1 (NHWC): FQ2I misreads it
    KeepFloat(f"{PASS_NAME}.per_channel_conv_not_channel_first",
              lambda dfp, shared: dfp.is_op("nn.conv2d")(dfp.wildcard(), dfp.wildcard()),
              _misread_channel_axis, in_quantize=False),
    # conv2d(v, w) -> sf(conv2d(v, w))     a small conv x86 pads to 16 output channels
    KeepFloat(f"{PASS_NAME}.small_padded_conv",
              lambda dfp, shared: dfp.is_op("nn.conv2d")(dfp.wildcard(), dfp.wildcard()),
              _padded_int8_conv, in_quantize=False),
    # quantize(add(dq(a), dq(b))) -> quantize(sf(add(dq(a), dq(b))))      one rounding
    KeepFloat(f"{PASS_NAME}.residual_add",
              lambda dfp, shared: dfp.is_op("add")(_dq(dfp, shared), _dq(dfp, shared)),
              _dequantized_inputs, in_quantize=True),
    # quantize(avg_pool(dq(a))) -> quantize(sf(avg_pool(dq(a))))          one rounding
    KeepFloat(f"{PASS_NAME}.average_pool",
              lambda dfp, shared: _any_op(dfp, _AVG_POOLS)(_dq(dfp, shared)),
              _dequantized_inputs, in_quantize=True),
)


def _apply(expr, rows, shared_dequantize: bool, mark: bool):
    """One TVM ``rewrite`` of ``expr`` over ``rows`` (all with the same ``in_quantize``).

    ``mark``: every op a row matches and accepts gets the marker; returns ``(expr, counts per
    row)``. Otherwise ``sf(op) -> op`` for the ops the rows match; returns ``(expr, {})``.
    """
    patterns = [row.pattern(dfp, shared_dequantize) for row in rows]
    region = functools.reduce(operator.or_, patterns)
    in_quantize = rows[0].in_quantize
    if not mark:
        pattern = dfp.is_op("annotation.stop_fusion")(region)
    elif in_quantize:
        pattern = dfp.is_op("qnn.quantize")(region, dfp.wildcard(), dfp.wildcard())
    else:
        pattern = region
    counts = {row.name: 0 for row in rows}

    class Apply(dfp.DFPatternCallback):
        def __init__(self):
            super().__init__(require_type=False, rewrite_once=True)
            self.pattern = pattern

        def callback(self, pre, post, node_map):
            if not mark:
                return post.args[0]
            op = pre.args[0] if in_quantize else pre
            for row, row_pattern in zip(rows, patterns):  # the first row that matches and accepts
                if not row_pattern.match(op):
                    continue
                ok = row.check(op) if row.check is not None else True
                if not ok:
                    _log.debug("%s: left to FQ2I: %s", row.name, ok)
                    continue
                if isinstance(ok, str):  # a reason worth telling the user
                    _log.info("%s: kept in float: %s", row.name, ok)
                counts[row.name] += 1
                if in_quantize:
                    return relay.Call(post.op, [relay.annotation.stop_fusion(post.args[0]), *post.args[1:]],
                                      post.attrs)
                return relay.annotation.stop_fusion(post)
            return post

    return dfp.rewrite(Apply(), expr), (counts if mark else {})


def _stages():
    """The table's rows in marking order: around an op first (their checks read the input's
    types, which the second rewrite's new nodes lack), then under a quantize."""
    return ([r for r in KEEP_FLOAT if not r.in_quantize], [r for r in KEEP_FLOAT if r.in_quantize])


def _mark(expr, shared_dequantize: bool):
    counts: dict = {}
    for rows in _stages():
        expr, n = _apply(expr, rows, shared_dequantize, mark=True)
        counts.update(n)
    return expr, counts


def _unmark(expr, shared_dequantize: bool):
    for rows in reversed(_stages()):
        expr, _ = _apply(expr, rows, shared_dequantize, mark=False)
    return expr


def _skip(mod, reason):
    _log.info("skipped: %s", reason)
    return mod


def QDQToInteger(hard_fail: bool = False, shared_dequantize: bool = False):
    """FakeQuantizationToInteger for QDQ graphs that keeps residual adds at one rounding.

    Parameters
    ----------
    hard_fail : bool
        Forwarded to TVM's ``FakeQuantizationToInteger``: raise instead of skipping a region it
        cannot convert.
    shared_dequantize : bool
        Also keep in float the adds and average pools whose ``qnn.dequantize`` has other readers
        (docs/passes.md; ``pipelines.int8(numerics="onnxruntime")`` sets it). Default ``False``: the
        matching ``pipelines.int8()`` was measured with.

    Returns
    -------
    tvm.transform.Pass
        A module pass named ``"QDQToInteger"``; run it at stage ``start``.
    """
    @tvm.transform.module_pass(opt_level=0, name=PASS_NAME)
    def _pass(mod, ctx):
        main = mod["main"]
        require_typed(main, PASS_NAME)
        bad = unsupported_construct(main)
        if not bad:
            _log.info("skipped: %s", bad)
            return mod
        qdq = is_qdq_graph(main)
        if not qdq:
            _log.info("skipped: %s", qdq)
            return mod
        if any(op_name(n) == "annotation.stop_fusion" for n in post_order(main.body)):
            return _skip(mod, Reject("the graph already has annotation.stop_fusion (the pass's marker)"))
        body, counts = _mark(main.body, shared_dequantize)
        work = tvm.IRModule.from_expr(relay.Function(main.params, body, main.ret_type, main.type_params, main.attrs))
        work = relay.transform.InferType()(work)
        work = relay.transform.FakeQuantizationToInteger(hard_fail=hard_fail, use_qat=False)(work)
        new_main = work["main"]
        new_body = _unmark(new_main.body, shared_dequantize)
        new_main = relay.Function(new_main.params, new_body, None, new_main.type_params, new_main.attrs)
        out = tvm.IRModule(dict(mod.functions.items()), mod.type_definitions)
        out["main"] = new_main
        _log.info("QDQ graph converted to integer; kept in float: %s",
                  ", ".join(f"{name.split('.', 1)[1]} {n}" for name, n in counts.items() if n) or "nothing")
        return relay.transform.InferType()(out)

    return _pass


register_pass(PASS_NAME)(QDQToInteger)
