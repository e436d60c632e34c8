"""Graphs TVM 0.19 cannot lower as given but can in another form, rebuilt in that form before relay.build.

:func:`reroute` is what :func:`tvm_ext.build` calls after the ``start`` passes and before
:func:`tvm_ext.core.tvm_bugs.check_module`:

- a fused (``Primitive``) function holding an 8-bit conv2d that TVM cannot lower as one kernel is built
  unfused (:func:`inline_unschedulable_fused`): AlterOpLayout and FuseOps never enter a fused function,
  its legalizations do;
- a dilated 8-bit conv2d that TVM's int8 path cannot lower alone is computed as an int16 ``nn.conv2d``
  (:func:`reroute_dilated_int8_convs`): TVM's int8 legalizations skip dilated convs.

Each decision asks TVM itself (its legalizations, or a lowering without code generation, so nothing can
abort) instead of copying its rules. The TVM sources at fault and what each rewrite costs: docs/tvm-bugs.md.
Every rewrite is logged as a warning; the caller's module is never modified.
"""
from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

__all__ = ["reroute", "inline_unschedulable_fused", "reroute_dilated_int8_convs"]


def reroute(mod, target) -> tuple:
    """``(mod', typed)``: ``mod`` with :func:`inline_unschedulable_fused` and :func:`reroute_dilated_int8_convs`
    applied for ``target`` (``mod`` itself when neither rewrote anything), and its typed form. Each rewrite is
    logged as a warning naming the op, its shapes and TVM's error."""
    from tvm import relay

    typed, unfused = inline_unschedulable_fused(relay.transform.InferType()(mod), target)
    for why in unfused:
        logger.warning("tvm_ext.build: TVM 0.19 cannot lower a fused (Primitive) function holding %s at %s "
                       "(tvm_ext.core.tvm_reroutes); building its ops unfused", why, target)
    typed, dilated = reroute_dilated_int8_convs(typed, target)
    for why in dilated:
        logger.warning("tvm_ext.build: TVM 0.19 cannot lower the dilated %s at %s (tvm_ext.core.tvm_reroutes); "
                       "computing it in int16", why, target)
    return (typed if unfused or dilated else mod), typed


# A fused (``Primitive``) function is lowered as one kernel: FuseOps and AlterOpLayout never enter it
# (``src/relay/transforms/alter_op_layout.cc``, ``fuse_ops.cc``), but relay.build's legalization does.
_CONVS = ("nn.conv2d", "qnn.conv2d")


def _sliced_int8_block(conv, target) -> str | None:
    """Why TVM's x86 ``conv2d_nchw_int8`` cannot schedule the uint8 x int8 ``nn.conv2d`` ``conv`` (typed,
    legalized for QNN) inside a fused function at ``target``, or None.

    ``topi/generic/conv2d.py::conv2d_alter_int8_common`` (x86 Legalize) pads the output channels to a
    multiple of 16 and slices them back; outside AlterOpLayout the conv stays NCHW and
    ``conv2d_nchw_int8`` packs it in 16-channel blocks (``conv2d_int8.py``: ``int32_lanes=16``). The
    schedule (``schedule_conv_NCHWc_cpu_common_int8`` / ``_1x1_int8``) computes the conv inside the
    slice's loop over each block, so with fewer than 16 channels left the block is bound to them and
    its tensorized split by ``get_simd_32bit_lanes()`` (16 at AVX-512BW, 8 at AVX2, else 4) fails
    unless they are a multiple of it.
    """
    import tvm
    from tvm.target.x86 import get_simd_32bit_lanes
    from tvm.topi.x86 import is_int8_hw_support

    a = conv.attrs
    data, weight = conv.args[0].checked_type, conv.args[1].checked_type
    if (str(data.dtype), str(weight.dtype)) != ("uint8", "int8") or (a.data_layout, a.kernel_layout) != (
            "NCHW", "OIHW") or int(a.groups) != 1 or [int(d) for d in a.dilation] != [1, 1]:
        return None
    out = weight.shape[0]
    if not isinstance(out, tvm.tir.IntImm):
        return None
    with target:
        if not is_int8_hw_support("uint8", "int8"):
            return None
        lanes = get_simd_32bit_lanes()
    if int(out) < 16 and int(out) % lanes:
        return (f"{int(out)} output channels: x86 int8 Legalize pads them to 16 and slices them back, and "
                f"conv2d_nchw_int8 tensorizes the sliced block with {lanes} lanes (topi/generic/conv2d.py "
                f"conv2d_alter_int8_common, schedule_conv_NCHWc_cpu_*_int8)")
    return None


def _unschedulable_fused(fn, target) -> str | None:
    """Why TVM 0.19 cannot lower the ``Primitive`` function ``fn`` (typed) holding an 8-bit conv2d
    at ``target`` as one kernel, or None (also when legalizing it alone fails: the build reports that).

    Runs relay.build's own legalizations on ``fn``'s body, in the prefix's order: QNN Legalize and
    canonicalization, then the target's Legalize. A kernel takes one op whose pattern is a reduction or
    more (``te_compiler_cache.cc``, ``ScheduleBuilder``: ``anchor_op_pattern_ < kCommReduce``); the
    legalizations add a second one for an int8 x int8 conv (x86: data shifted to uint8 and a ``sum``
    of the weight), a nonzero zero point (its ``sum`` / pool), or uint8 data on aarch64 (shifted to int8).
    """
    import tvm
    from tvm import relay

    from .._op_pattern import K_COMM_REDUCE, call_pattern

    convs: list = []

    def collect(node):
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op) and node.op.name in _CONVS:
            if {str(node.args[0].checked_type.dtype), str(node.args[1].checked_type.dtype)} <= {"int8", "uint8"}:
                convs.append(node)

    relay.analysis.post_order_visit(fn.body, collect)
    if not convs:
        return None
    c = convs[0]
    what = (f"{c.op.name} of {c.args[0].checked_type.dtype}{list(c.args[0].checked_type.shape)} data and "
            f"{c.args[1].checked_type.dtype}{list(c.args[1].checked_type.shape)} weight ({c.attrs.data_layout})")
    body = tvm.IRModule.from_expr(relay.Function(fn.params, fn.body))
    try:
        with target, tvm.transform.PassContext(opt_level=3):
            qnn_free = tvm.transform.Sequential([relay.transform.InferType(), relay.qnn.transform.Legalize(),
                                                 relay.qnn.transform.CanonicalizeOps(),
                                                 relay.transform.InferType()])(body)
            legal = tvm.transform.Sequential([relay.transform.Legalize(), relay.transform.InferType()])(qnn_free)
    except tvm.TVMError:
        return None
    for conv in _calls(qnn_free["main"], ("nn.conv2d",)):
        why = _sliced_int8_block(conv, target)
        if why:
            return f"{what}: {why}"
    anchors = [call.op.name for call in _calls(legal["main"]) if call_pattern(call) >= K_COMM_REDUCE]
    if len(anchors) > 1:
        return (f"{what}: its legalization makes {len(anchors)} ops a kernel schedules by ({', '.join(anchors)}), "
                f"one kernel takes one (src/relay/backend/te_compiler_cache.cc, anchor_op_pattern_)")
    return None


def _calls(func, names=None) -> list:
    import tvm
    from tvm import relay

    found: list = []

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op) and (names is None or node.op.name in names):
            found.append(node)

    relay.analysis.post_order_visit(func, visit)
    return found


def _rewrite_functions(mod, mutator, reasons: list) -> tuple:
    """``(mod', reasons)``: the bodies of ``mod``'s functions that are not fused (``Primitive``) visited by
    ``mutator``, which appends to ``reasons`` what it rewrote; ``mod`` itself when it appended nothing, else a
    new typed module (``mod`` is not modified)."""
    import tvm
    from tvm import relay

    functions = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relay.Function) and not (func.attrs and "Primitive" in func.attrs):
            func = relay.Function(func.params, mutator.visit(func.body), func.ret_type, func.type_params,
                                  func.attrs)
        functions[gv] = func
    if not reasons:
        return mod, []
    out = tvm.IRModule(functions, type_definitions=mod.type_definitions, attrs=mod.attrs)
    return relay.transform.InferType()(out), reasons


def inline_unschedulable_fused(mod, target) -> tuple:
    """``(mod', reasons)``: ``mod`` (typed) with each call of a fused (``Primitive``) function holding an
    8-bit conv2d that TVM 0.19 cannot lower as one kernel at ``target`` replaced by the function's body,
    so relay.build's AlterOpLayout and FuseOps treat its ops as any others; ``reasons`` says why, one per
    function. No such function: ``mod`` itself and ``[]``.

    Inside a fused function, AlterOpLayout never turns the conv into ``conv2d_NCHWc`` but the
    legalizations still rewrite it (:func:`_unschedulable_fused`): TVM fails with ``Bind have an unmet
    assertion ... C.shape[4]``, a tensorize split condition, or ``anchor_op_pattern_`` (docs/tvm-bugs.md).
    """
    from tvm import relay

    if target is None or target.kind.name != "llvm":
        return mod, []
    reasons: list = []

    class _Inline(relay.ExprMutator):
        def visit_call(self, call):
            fn = call.op
            if isinstance(fn, relay.Function) and fn.attrs and "Primitive" in fn.attrs and "Compiler" not in fn.attrs:
                why = _unschedulable_fused(fn, target)
                if why:
                    reasons.append(why)
                    return relay.bind(fn.body, dict(zip(fn.params, [self.visit(a) for a in call.args])))
            return super().visit_call(call)

    return _rewrite_functions(mod, _Inline(), reasons)


def _lowers_alone(conv, target) -> str | None:
    """None when TVM 0.19 lowers the typed conv2d call ``conv`` alone at ``target`` (in the build's contexts:
    the back end's kernels), else TVM's error: relay.build's legalizations, AlterOpLayout, FuseOps and
    each kernel's TE lowering to TIR (``te_compiler``), never LLVM code generation, so it cannot abort."""
    import tvm
    from tvm import relay

    params = [a if isinstance(a, relay.Constant) else relay.var(f"a{i}", type_annotation=a.checked_type)
              for i, a in enumerate(conv.args)]  # constants stay: QNN canonicalization reads its zero points
    free = [p for p in params if isinstance(p, relay.Var)]
    mod = tvm.IRModule.from_expr(relay.Function(free, relay.Call(conv.op, params, conv.attrs)))
    try:
        with target, tvm.transform.PassContext(opt_level=3):
            mod = tvm.transform.Sequential([
                relay.transform.InferType(), relay.qnn.transform.Legalize(), relay.qnn.transform.CanonicalizeOps(),
                relay.transform.Legalize(), relay.transform.FoldConstant(), relay.transform.AlterOpLayout(),
                relay.transform.FoldConstant(), relay.transform.FuseOps(), relay.transform.InferType()])(mod)
            compiler = relay.backend.te_compiler.get()
            try:
                for call in _all_calls(mod["main"]):
                    if isinstance(call.op, relay.Function):  # a kernel FuseOps made
                        compiler.lower(call.op, target)
            finally:
                compiler.clear()  # a failed lowering stays cached and would pass the next time
    except Exception as err:  # noqa: BLE001  TVMError, and what TVM's Python strategies raise (IndexError, ...)
        lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
        line = next((x for x in lines if "Check failed" in x), lines[-1] if lines else "")
        return f"{type(err).__name__}: {line}"[:200]
    return None


def _all_calls(func) -> list:
    from tvm import relay

    found: list = []
    relay.analysis.post_order_visit(func, lambda n: found.append(n) if isinstance(n, relay.Call) else None)
    return found


def _int16_conv(call, args):
    """``call`` (an 8-bit ``nn.conv2d`` or ``qnn.conv2d``, typed) on ``args`` as the ``nn.conv2d`` of int16
    data and weight TVM gives targets without fast int8 (``relay/qnn/op/legalizations.py``,
    ``helper_no_fast_int8_hw_legalization``: zero points subtracted in int16); exact, its int32 output is
    the 8-bit conv's."""
    from tvm import relay
    from tvm.relay.qnn.op.legalizations import helper_no_fast_int8_hw_legalization

    attrs = {k: call.attrs[k] for k in call.attrs.keys()}
    attrs["out_dtype"] = str(call.checked_type.dtype)
    if call.op.name == "qnn.conv2d":
        return helper_no_fast_int8_hw_legalization(call.attrs, args, [a.checked_type for a in call.args],
                                                   relay.nn.conv2d)
    return relay.nn.conv2d(relay.cast(args[0], "int16"), relay.cast(args[1], "int16"), **attrs)


def _dilated_8bit_conv(call) -> bool:
    import tvm
    from tvm import relay

    if not (isinstance(call, relay.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name in _CONVS):
        return False
    data, weight = call.args[0].checked_type, call.args[1].checked_type
    static = all(isinstance(d, tvm.tir.IntImm) for d in (*data.shape, *weight.shape))  # else: check_module's error
    return (static and {str(data.dtype), str(weight.dtype)} <= {"int8", "uint8"} and int(call.attrs.groups) == 1
            and any(int(d) != 1 for d in call.attrs.dilation))


def reroute_dilated_int8_convs(mod, target) -> tuple:
    """``(mod', reasons)``: ``mod`` (typed) with each dilated 8-bit ``nn.conv2d`` / ``qnn.conv2d`` (groups 1)
    outside fused functions that TVM 0.19 cannot lower alone at ``target`` (:func:`_lowers_alone`) computed
    as an int16 ``nn.conv2d`` (:func:`_int16_conv`), off the int8 path; ``reasons`` names each. None such:
    ``mod`` itself and ``[]``. Call it in the build's contexts (the back end's kernels decide what lowers).

    TVM's int8 legalizations skip dilated convs (``topi/generic/conv2d.py::conv2d_alter_int8_common``:
    "Dilation not supported yet"), so the int8 implementations get the conv unprepared: x86's
    ``conv2d_NCHWc_int8`` (``topi/x86/conv2d_int8.py``) has no output-channel split that 16 divides
    (``define_split("tile_oc", ...)``, an ``IndexError`` in AlterOpLayout); aarch64's NHWC int8 GEMM gets
    uint8 data beside int8 weights (``Buffer bind data type mismatch``). docs/tvm-bugs.md.
    """
    from tvm import relay

    if target is None or target.kind.name != "llvm":
        return mod, []
    reasons: list = []

    class _Reroute(relay.ExprMutator):
        def visit_function(self, fn):
            if fn.attrs and "Primitive" in fn.attrs:  # a fused function: inline_unschedulable_fused's
                return fn
            return super().visit_function(fn)

        def visit_call(self, call):
            new = super().visit_call(call)
            if not _dilated_8bit_conv(call):
                return new
            why = _lowers_alone(call, target)
            if why is None:
                return new
            data, weight = call.args[0].checked_type, call.args[1].checked_type
            reasons.append(f"{call.op.name} of {data.dtype}{[int(d) for d in data.shape]} data and {weight.dtype}"
                           f"{[int(d) for d in weight.shape]} weight ({call.attrs.data_layout}, dilation "
                           f"{[int(d) for d in call.attrs.dilation]}): {why}")
            return _int16_conv(call, list(new.args))

    return _rewrite_functions(mod, _Reroute(), reasons)
