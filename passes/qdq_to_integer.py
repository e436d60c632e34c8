"""QDQToInteger: TVM's FakeQuantizationToInteger for QDQ graphs, with one rounding per add.

Design note
-----------
A QDQ model (ONNX ``QuantizeLinear``/``DequantizeLinear`` around float ops) imports as float
convolutions between ``qnn.dequantize`` and ``qnn.quantize``: every tensor between kernels is
float32. TVM's ``FakeQuantizationToInteger`` (FQ2I) rewrites each
``dequantize -> op -> quantize`` region into integer QNN ops, so uint8 flows between kernels.

One of its rewrites changes results more than quantization needs to: a residual add
``quantize(add(dequantize(a), dequantize(b)))`` becomes ``qnn.add``, which requantizes each input
to the output scale and then adds, rounding twice; ONNX Runtime (and TVM's own import of
``QLinearAdd``) add in float and round once. On the zoo's QDQ ResNet-50 that moved outputs by up
to 6 quantization steps and flipped top-1 on 1 of 8 inputs. This pass therefore keeps those add
regions as they are.

A second FQ2I rule is wrong, not only inexact: a binary op with a float *constant* operand
(``add``/``multiply``/``subtract``; hard-sigmoid's ``x * 0.2 + 0.5``, hard-swish's ``x + 3``)
gets the constant quantized with the *other* operand's scale and zero point
(``fake_quantization_to_integer.py::get_binary_types``), which can saturate: on PP-OCR's mobile
classifier ``0.2`` at scale 0.0121, zero point 255 became uint8 255, i.e. ``0.0``, so its SE
gates were constant; and the lowered ``qnn.add``/``qnn.mul`` chains cost extra kernels
(QDQ classifier: 107 kernels against 85 stock). Likewise FQ2I turns ``quantize(sigmoid(dequantize(x)))`` (and tanh, exp, erf, sqrt, rsqrt,
log, abs) into ``qnn.sigmoid``, lowered to a table lookup ``take``: a kInjective op that FuseOps
never fuses into the convolution producing ``x`` (only elementwise epilogues join an anchor), so
every SiLU of a YOLO costs one kernel more than stock TVM, which fuses the float sigmoid into the
convolution. And x86's int8 legalization pads a conv's output channels to a multiple of 16
and slices them back (``strided_slice``: one kernel and an int32 crossing more per conv), which
costs more than int8 saves on a small conv (below 2^24 multiply-accumulates; a large one is far
faster in int8, slice and all). Regions holding such an op stay in float::

    # quantize(add(dequantize(a), dequantize(b)))        -> unchanged (float add, one rounding)
    # quantize(...op(v, c)...),  c a float constant, v not an anchor's output
    #                                                    -> unchanged (float, as stock TVM)
    # quantize(...sigmoid(v)...)  (tanh, exp, ...)        -> unchanged (float, fuses into the conv)
    # quantize(conv2d(...)), groups 1, channels % 16 != 0, < 2^24 MACs
    #                                                    -> unchanged (float, as stock TVM)
    # quantize(batch_matmul(dequantize(a), dequantize(b))), a and b both computed (not constants)
    #                                                    -> unchanged (float, as stock TVM)
    # quantize(f(dequantize(x), dequantize(w), ...))     -> qnn form of f       (TVM's FQ2I rules)

The product of two computed tensors (attention's ``Q K^T`` and ``softmax(.) V``, a
``nn.batch_matmul``, ``nn.matmul`` or ``nn.dense`` whose operands are both dequantized activations)
becomes ``qnn.batch_matmul``/``qnn.dense``, whose zero-point terms are ``sum`` reductions of each
operand (``qnn/op/batch_matmul.cc``): each a kernel of its own with an int32 output crossing into
the product's kernel (PP-OCRv4 rec QDQ, two SVTR blocks: 6 ``sum`` kernels and 0.15 MB of int32
more than stock TVM). Those products stay in float as well (a constant weight's dense converts).

It marks every such op, runs FQ2I (which leaves a region alone when it meets an op it has no
rule for: the marker), and removes its markers again; nothing else of the graph changes.
(``op(anchor(...), c)``, a conv/dense bias, is left to FQ2I: the constant is quantized to int32
at the accumulator's scale, which is exact enough and what makes QDQ convs integer.)

It only acts on QDQ-style graphs, where a float ``nn.conv2d``/``nn.dense`` reads a
``qnn.dequantize``. A QOperator graph (already ``qnn.conv2d``) is returned unchanged, so its
outputs stay bit-identical to stock TVM (FQ2I would otherwise also rewrite the float regions the
ONNX frontend creates for ``QLinearAdd``).

*Shared dequantizes* (``shared_dequantize=True``, what ``pipelines.int8(numerics="onnxruntime")``
uses). The add and pool markers are placed by a dataflow-pattern rewrite whose pattern holds the
``qnn.dequantize`` nodes; TVM's pattern grouper rejects a match whose root does not post-dominate
its inner nodes, so an add or pool whose dequantize is also read on a path that bypasses it is
*not* marked and FQ2I converts it: MobileNetV3's SE pools (the dequantized block output is read by the pool and by the
gating multiply) became integer pools (``requantize`` to int32, int32 pool, ``requantize``:
57.8 % of PP-OCR cls QDQ's first SE pool levels one off ONNX Runtime's, 14 output steps), and
YOLOv8n's residual adds (the block input's dequantize is read by the add and the first conv)
became ``qnn.add`` (two roundings). With ``shared_dequantize=True`` the pattern's inputs are
wildcards and the callback checks that they are dequantizes, so those are kept in float as well.
The default (``False``) keeps the matching ``pipelines.int8()`` has always had (its outputs and
kernels stay as measured); whether it should change is the lead's decision.

Runs at stage ``start`` (the QNN ops must still exist). Untyped input raises
:class:`~tvm_ext.passes._util.UntypedModuleError`; functions with ``If``/``Let``/... are skipped.
"""
from __future__ import annotations

import numpy as np

from tvm_ext.registry import register_pass

from ._util import ANCHOR_OPS, Reject, op_name, pass_logger, post_order, require_typed, unsupported_construct

__all__ = ["QDQToInteger", "is_qdq_graph"]

PASS_NAME = "QDQToInteger"
_log = pass_logger(PASS_NAME)


def is_qdq_graph(func):
    """True when a float conv/dense reads a ``qnn.dequantize`` output, else a Reject."""
    from tvm import relay

    def name(node):
        return op_name(node) if isinstance(node, relay.Call) else None

    for node in post_order(func.body):
        if name(node) in ANCHOR_OPS and str(node.checked_type.dtype).startswith("float"):
            if any(name(arg) == "qnn.dequantize" for arg in node.args):
                return True
    return Reject("no float conv2d/dense reads a qnn.dequantize (not a QDQ graph)")


def _marked_add_pattern(marked: bool, shared_dequantize: bool = False):
    from tvm.relay.dataflow_pattern import is_op, wildcard

    if shared_dequantize:  # the dequantizes are the match's inputs (checked in the callback), not inner nodes
        deq = wildcard
    else:
        deq = lambda: is_op("qnn.dequantize")(wildcard(), wildcard(), wildcard())  # noqa: E731
    add = is_op("add")(deq(), deq()) | is_op("nn.global_avg_pool2d")(deq()) | is_op("nn.avg_pool2d")(deq())
    if marked:
        return is_op("annotation.stop_fusion")(add)
    return is_op("qnn.quantize")(add, wildcard(), wildcard())


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


def _computed_dequantize(arg) -> bool:
    """``qnn.dequantize(v, ...)`` of a computed ``v`` (not a constant weight), possibly moved
    (``reshape``/``transpose``/...: attention's heads split and ``K`` transposed on the way)."""
    from tvm import relay

    while isinstance(arg, relay.Call) and op_name(arg) in _MOVEMENT:
        arg = arg.args[0]
    return isinstance(arg, relay.Call) and op_name(arg) == "qnn.dequantize" and not isinstance(arg.args[0], relay.Constant)


def _const_binop_pattern():
    from tvm.relay.dataflow_pattern import is_constant, is_op, wildcard

    pat = None
    for name in _CONST_BINOPS:
        p = is_op(name)(wildcard(), is_constant()) | is_op(name)(is_constant(), wildcard())
        pat = p if pat is None else pat | p
    for name in _TABLE_UNARY:
        pat = pat | is_op(name)(wildcard())
    for name in _PRODUCTS:
        pat = pat | is_op(name)(wildcard(), wildcard())
    return pat | is_op("nn.conv2d")(wildcard(), wildcard())


#: Multiply-accumulates from which a padded int8 conv pays for its slice kernel (see below).
PADDED_INT8_MIN_MACS = 1 << 24
#: The same per instruction-set class (:func:`tvm_ext.isa.isa_class` of the current target) where
#: it differs: on AVX2 and AVX-512 VNNI every such conv is converted (see :func:`_padded_int8_conv`).
PADDED_INT8_MIN_MACS_BY_ISA = {"avx2": 0, "avx512_vnni": 0}
#: A padded conv also converts when each output sums at least this many products and the conv
#: has at least :data:`PADDED_INT8_LONG_MIN_MACS` (see :func:`_padded_int8_conv`).
PADDED_INT8_LONG_REDUCTION = 48
PADDED_INT8_LONG_MIN_MACS = 1 << 20


def _min_macs() -> int:
    """:data:`PADDED_INT8_MIN_MACS` for the target being compiled (the default without one)."""
    import tvm

    tgt = tvm.target.Target.current(allow_none=True)
    if tgt is None:
        return PADDED_INT8_MIN_MACS
    from tvm_ext.isa import isa_class

    return PADDED_INT8_MIN_MACS_BY_ISA.get(isa_class(tgt), PADDED_INT8_MIN_MACS)


def _padded_int8_conv(call):
    """A *small* conv x86's int8 legalization pads to a multiple of 16 output channels and slices back.

    ``topi/generic/conv2d.py::conv2d_alter_int8_common``: the ``strided_slice`` after the conv is
    injective, so it does not fuse into the conv: one kernel more (unless it fuses into an
    injective reader) per conv. For a small conv that kernel costs more than int8 saves (PP-OCR
    mobile cls at ``-mcpu=znver4``: 29 convs of 2 to 200 output channels and at most a few million
    MACs; converting them all gave 93 kernels where stock TVM has 89 and this rule 77, before
    fix 11 of ``tvm_ext.x86_int8`` took VNNI out of this rule);
    from :data:`PADDED_INT8_MIN_MACS` multiply-accumulates on, the integer conv wins by far
    (PP-OCRv4 det's 96 -> 24-channel 3x3 convs at 80x80, 133 M MACs, 4.7 ms each in float in
    the per-kernel profile; converting every such conv took the detector from 15.8-17.0 to
    12.2-13.0 ms on Zen 4, for two slice kernels more).

    On AVX2 (:data:`PADDED_INT8_MIN_MACS_BY_ISA`) every conv converts: the AVX2 policy gives
    convs whose output channels 8 divides an 8-channel block (no padding, no slice; fix 6 of
    ``tvm_ext.x86_int8``), and converting the rest cost at most one kernel on the models
    measured. Measured at ``-mcpu=znver3``
    (saved builds timed interleaved with ONNX Runtime on AVX2, 2026-11-24): PP-OCRv4 det QDQ 88 ->
    84 kernels, 0.94-0.96x the time; PP-OCR cls QDQ 77 -> 78 kernels (stock: 85), 0.83-0.86x the
    time, outputs closer to ONNX Runtime's (which runs these convs in int8).

    On AVX-512 VNNI too: there 8-channel blocks take the ymm ``vpdpbusd`` (fix 11 of
    ``tvm_ext.x86_int8``), so the same convs are not padded either. Measured at ``-mcpu=znver4``
    (saved builds timed interleaved with ONNX Runtime, 2026-11-25): PP-OCR cls QDQ 77 -> 78
    kernels (stock 89), 0.66 -> 0.55 ms, no float32 between its convs; PP-OCRv4 det QDQ 93 -> 84
    kernels (stock 98), 10.97 -> 10.96 ms; YOLOv8n QDQ 94 kernels and 5.7 ms either way; outputs
    as close to ONNX Runtime's as before (equal for det and YOLOv8n, one step for cls). The
    rules below remain for AVX-512 without VNNI and other targets.

    Elsewhere (AVX-512 without VNNI, SSE, no target) a padded conv also converts when every
    output sums at least :data:`PADDED_INT8_LONG_REDUCTION` products (int8 saves per output in
    proportion to that, the slice costs one copy per output) and the conv is not a tiny one
    (:data:`PADDED_INT8_LONG_MIN_MACS`: squeeze-and-excitation convs on pooled vectors stay
    float). PP-OCRv4 det QDQ at ``-mcpu=znver4`` before fix 11: its 12- to 360-channel convs (48 to 864
    products per output, 2-14 M MACs) convert, 91 -> 93 kernels (stock: 98), 11.96 -> 11.39 ms
    and 11.62 -> 10.18 ms in two sessions of saved builds timed interleaved with ONNX Runtime
    (14.35, 12.16 ms; outputs equal to ONNX Runtime's on them); YOLOv8n QDQ: one 18-channel
    head conv converts, 94 kernels and 6.58 ms either way; PP-OCR cls keeps its float convs (8 to
    32 products per output: converting them added kernels beyond stock's).
    """
    attrs = call.attrs
    if int(attrs.groups) != 1:
        return False
    shape = call.checked_type.shape
    axis = str(attrs.out_layout or attrs.data_layout).find("C")
    if axis < 0 or int(shape[axis]) % 16 == 0:
        return False
    weight = [int(d) for d in call.args[1].checked_type.shape]
    reduction = int(np.prod(weight)) // int(shape[axis])  # products per output (any kernel layout)
    macs = int(np.prod([int(d) for d in shape])) * reduction
    if reduction >= PADDED_INT8_LONG_REDUCTION and macs >= PADDED_INT8_LONG_MIN_MACS:
        return False
    return macs < _min_macs()


def _float_const_operand(call):
    """True for a region FQ2I should leave in float: a table-lookup unary op, a small padded conv, a
    product of two computed tensors, or exactly one float Constant operand and the other no anchor's
    output."""
    from tvm import relay

    if op_name(call) in _TABLE_UNARY:
        return True
    if op_name(call) == "nn.conv2d":
        return _padded_int8_conv(call)
    if op_name(call) in _PRODUCTS:
        return all(_computed_dequantize(a) for a in call.args[:2])
    consts = [a for a in call.args if isinstance(a, relay.Constant)]
    others = [a for a in call.args if not isinstance(a, relay.Constant)]
    if len(consts) != 1 or len(others) != 1 or not str(consts[0].data.dtype).startswith("float"):
        return False
    return op_name(others[0]) not in _BIAS_PRODUCERS


def _mark_const_binops(expr):
    """op(v, c) -> stop_fusion(op(v, c)) (c a float constant), sigmoid(v) -> stop_fusion(sigmoid(v)), ...

    FQ2I has no rule for the marker, so it leaves the region in float.
    """
    from tvm import relay
    from tvm.relay.dataflow_pattern import DFPatternCallback, rewrite

    class Mark(DFPatternCallback):
        def __init__(self):
            super().__init__(require_type=False, rewrite_once=True)
            self.pattern = _const_binop_pattern()
            self.count = 0

        def callback(self, pre, post, node_map):
            if not _float_const_operand(pre):
                return post
            self.count += 1
            return relay.annotation.stop_fusion(post)

    cb = Mark()
    return rewrite(cb, expr), cb.count


def _unmark_const_binops(expr):
    from tvm.relay.dataflow_pattern import DFPatternCallback, is_op, rewrite

    class Unmark(DFPatternCallback):
        def __init__(self):
            super().__init__(require_type=False, rewrite_once=True)
            self.pattern = is_op("annotation.stop_fusion")(_const_binop_pattern())

        def callback(self, pre, post, node_map):
            return post.args[0]

    return rewrite(Unmark(), expr)


def _mark_adds(expr, shared_dequantize: bool = False):
    """quantize(add(dq, dq)) -> quantize(stop_fusion(add(dq, dq))): FQ2I has no rule for the marker."""
    from tvm import relay
    from tvm.relay.dataflow_pattern import DFPatternCallback, rewrite

    class Mark(DFPatternCallback):
        def __init__(self):
            super().__init__(require_type=False, rewrite_once=True)
            self.pattern = _marked_add_pattern(marked=False, shared_dequantize=shared_dequantize)
            self.count = 0

        def callback(self, pre, post, node_map):
            inputs = pre.args[0].args
            if not all(isinstance(a, relay.Call) and op_name(a) == "qnn.dequantize" for a in inputs):
                return post  # (shared_dequantize: the pattern's inputs are wildcards)
            self.count += 1
            return relay.Call(post.op, [relay.annotation.stop_fusion(post.args[0]), *post.args[1:]], post.attrs)

    cb = Mark()
    return rewrite(cb, expr), cb.count


def _unmark_adds(expr, shared_dequantize: bool = False):
    from tvm.relay.dataflow_pattern import DFPatternCallback, rewrite

    class Unmark(DFPatternCallback):
        def __init__(self):
            super().__init__(require_type=False, rewrite_once=True)
            self.pattern = _marked_add_pattern(marked=True, shared_dequantize=shared_dequantize)

        def callback(self, pre, post, node_map):
            return post.args[0]

    return rewrite(Unmark(), expr)


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
        (module note; ``pipelines.int8(numerics="onnxruntime")`` sets it). Default ``False``: the
        matching ``pipelines.int8()`` was measured with.

    Returns
    -------
    tvm.transform.Pass
        A module pass named ``"QDQToInteger"``; run it at stage ``start``.
    """
    import tvm
    from tvm import relay

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
        body, n_const = _mark_const_binops(main.body)  # first: its checks read the (typed) input's types
        body, n_marked = _mark_adds(body, shared_dequantize)
        work = tvm.IRModule.from_expr(relay.Function(main.params, body, main.ret_type, main.type_params, main.attrs))
        work = relay.transform.InferType()(work)
        work = relay.transform.FakeQuantizationToInteger(hard_fail=hard_fail, use_qat=False)(work)
        new_main = work["main"]
        new_body = _unmark_const_binops(_unmark_adds(new_main.body, shared_dequantize))
        new_main = relay.Function(new_main.params, new_body, None, new_main.type_params, new_main.attrs)
        out = tvm.IRModule(dict(mod.functions.items()), mod.type_definitions)
        out["main"] = new_main
        _log.info("QDQ graph converted to integer; %d residual add(s) and %d region(s) with a float "
                  "constant operand kept in float", n_marked, n_const)
        return relay.transform.InferType()(out)

    return _pass


register_pass(PASS_NAME)(QDQToInteger)
