"""Graphs TVM 0.19 mis-handles, detected up front so the user gets a clear error instead.

Each entry is a TVM bug that a differentially fuzzed graph (``tvm_ext.testing.fuzz``) or a real
model triggers. For those tvm-ext cannot route around without changing TVM itself,
:func:`check_module` looks for the triggering construct in a typed module for a given target
and raises :class:`UnsupportedByTVM` (a ``ValueError``) naming the op, the shapes, the TVM source
at fault and a workaround. It is called by :func:`tvm_ext.build` before relay.build's prefix
(after the ``start`` passes). The others :func:`tvm_ext.build` recognises by their error and
builds again without the pass at fault (:func:`is_llvm_debug_info_error`,
:func:`is_inline_function_copy_error`, :func:`is_integer_scale_fold_error`). A fused function TVM cannot
lower as one kernel it builds unfused (:func:`inline_unschedulable_fused`, before :func:`check_module`), and a
dilated 8-bit conv2d TVM's int8 path cannot lower it computes in int16 (:func:`reroute_dilated_int8_convs`).

Known bugs, each with its trigger, the TVM source at fault and what tvm-ext does: docs/tvm-bugs.md
(targets LLVM cannot build for; LLVM 22's verifier and vector ``let`` debug info; int8 x int8
``nn.dense`` whose units are not a multiple of 16 at AVX-512BW; an integer ``clip`` with a bound its
dtype cannot hold; an inline function SimplifyExpr copies; FoldScaleAxis folding an int32 scale into an 8-bit weight;
an 8-bit conv2d inside a fused function; a dilated 8-bit conv2d).

Each workaround by retry is a row of :data:`PREFIX_WORKAROUNDS` (what TVM does wrong, the prefix passes
turned off, how the error is recognised), applied at most once per build.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import UnsupportedByTVM

__all__ = ["UnsupportedByTVM", "check_module", "check_target", "is_llvm_debug_info_error",
           "is_inline_function_copy_error", "is_integer_scale_fold_error", "PrefixWorkaround", "PREFIX_WORKAROUNDS",
           "prefix_workaround", "NO_TIR_CSE", "COPIES_INLINE_FUNCTIONS", "FOLDS_INTEGER_SCALES",
           "inline_unschedulable_fused", "reroute_dilated_int8_convs"]

#: PassContext option that turns TIR's common-subexpression elimination off.
NO_TIR_CSE = "tir.disable_cse_tir"




def is_llvm_debug_info_error(err) -> bool:
    """True when ``err`` is LLVM 22 rejecting TVM 0.19's debug info for a non-pointer, non-int value."""
    return "#dbg_declare must be a pointer or int" in str(err)


#: relay.build prefix passes that can copy an inline function with its parameter Vars
#: (:func:`is_inline_function_copy_error`); optimizations, safe to disable.
COPIES_INLINE_FUNCTIONS = ("SimplifyExpr",)


def is_inline_function_copy_error(err, mod) -> bool:
    """True when ``err`` is relay's well-formedness check failing (a Var bound twice), for a module
    ``mod`` that holds inline functions (what SimplifyExpr's rewrites copy; docs/tvm-bugs.md)."""
    from tvm import relay

    msg = str(err)  # the Var is named in TVM's log; the error holds the check and the marked IR
    if "bound more than once" not in msg and not ("WellFormed" in msg and "-malformed-ir" in msg):
        return False
    found = []

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.op, relay.Function):
            found.append(node)

    _visit_functions(mod, visit)
    return bool(found)


def _visit_functions(mod, visit) -> None:
    """``relay.analysis.post_order_visit`` of every Relay function of ``mod`` (its params and body)."""
    from tvm import relay

    for _, func in mod.functions.items():
        if isinstance(func, relay.Function):
            relay.analysis.post_order_visit(func, visit)


#: relay.build prefix passes that fold an int32 scale into an 8-bit conv weight
#: (:func:`is_integer_scale_fold_error`); optimizations, safe to disable.
FOLDS_INTEGER_SCALES = ("FoldScaleAxis",)
_INTEGER = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")


def is_integer_scale_fold_error(err, mod) -> bool:
    """True when ``err`` is a type-check failure (``DiagnosticError``) and ``mod`` holds what TVM 0.19's
    FoldScaleAxis folds into an ill-typed ``multiply(weight, scale)``: a conv2d (``nn`` or ``qnn``) with
    an 8-bit weight and a ``multiply`` by an integer constant, per channel or scalar (docs/tvm-bugs.md)."""
    import tvm
    from tvm import relay

    if "DiagnosticError" not in f"{type(err).__name__} {err}":
        return False
    seen = {"conv": False, "scale": False}

    def visit(node):
        if not (isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op)):
            return
        if node.op.name in ("nn.conv2d", "qnn.conv2d"):
            weight = getattr(node.args[1], "checked_type", None) if len(node.args) > 1 else None
            seen["conv"] |= str(getattr(weight, "dtype", "")) in ("int8", "uint8")
        elif node.op.name == "multiply":
            seen["scale"] |= any(isinstance(a, relay.Constant) and a.data.dtype in _INTEGER for a in node.args)

    _visit_functions(mod, visit)
    return seen["conv"] and seen["scale"]


@dataclass(frozen=True)
class PrefixWorkaround:
    """A TVM 0.19 bug in relay.build's prefix that ``tvm_ext.build`` recognises by its error and
    avoids by running the prefix again with optimization passes turned off."""

    what: str  #: what TVM does wrong, for the warning
    disable: tuple  #: the prefix passes turned off
    matches: Callable  #: ``matches(err, mod)``: the error is this bug on this module


#: Tried in order on an error in relay.build's prefix; each at most once per build.
PREFIX_WORKAROUNDS = (
    PrefixWorkaround("SimplifyExpr copied an inline function of this module with its parameters (ill-formed IR)",
                     COPIES_INLINE_FUNCTIONS, is_inline_function_copy_error),
    PrefixWorkaround("FoldScaleAxis folded an int32 scale into an 8-bit conv weight (ill-typed)",
                     FOLDS_INTEGER_SCALES, is_integer_scale_fold_error),
)


def prefix_workaround(err, mod, applied=()) -> PrefixWorkaround | None:
    """The first row of :data:`PREFIX_WORKAROUNDS` not in ``applied`` that recognises ``err`` on ``mod``."""
    for row in PREFIX_WORKAROUNDS:
        if row not in applied and row.matches(err, mod):
            return row
    return None


def _x86_int8_gemm(target) -> bool:
    from tvm.target.codegen import target_has_features

    if target is None or target.kind.name != "llvm":
        return False
    with target:
        return bool(target_has_features(["avx512bw", "avx512f"]) or target_has_features("amx-int8"))


def check_module(mod, target, graph_executor: bool = True) -> None:
    """Raise :class:`UnsupportedByTVM` when ``mod`` (typed) would trip a known TVM bug on ``target``.

    With ``graph_executor`` (relay.build's default executor), also what that executor cannot run:
    dynamic shapes, ``If``, ``match``, calls of closures and references (TVM fails on them deep in its codegen).
    """
    import tvm
    from tvm import relay

    check_target(target)
    if graph_executor:
        _check_graph_executor(mod)
    _check_integer_clip_bounds(mod)
    if not _x86_int8_gemm(target):
        return
    found: list = []

    def visit(node):
        if found or not isinstance(node, relay.Call) or not isinstance(node.op, tvm.ir.Op):
            return
        if node.op.name != "nn.dense":  # qnn.dense: its legalization shifts int8 data to uint8 first
            return
        data, weight = node.args[0].checked_type, node.args[1].checked_type
        if str(data.dtype) != "int8" or str(weight.dtype) != "int8":
            return
        units = weight.shape[0]
        if isinstance(units, tvm.tir.IntImm) and int(units) % 16:
            found.append((node.op.name, [int(d) if isinstance(d, tvm.tir.IntImm) else str(d) for d in weight.shape]))

    _visit_functions(mod, visit)
    if found:
        op, wshape = found[0]
        raise UnsupportedByTVM(
            f"{op} with int8 data and int8 weight {wshape}: TVM 0.19 cannot build it for "
            f"{target.attrs.get('mcpu', 'this CPU')} "
            f"with AVX-512 (x86 int8 dense legalization pads the weight to a multiple of 16 rows but keeps "
            f"units={wshape[0]}, topi/x86/dense_alter_op.py); use uint8 data, units divisible by 16, "
            f"or a target with -mattr=-avx512bw"
        )


def _arch_known(arch: str, backends) -> bool:
    import re

    if re.fullmatch(r"i[3-6]86|amd64", arch):
        return True
    return any(arch == b or (arch.startswith(b) and b in ("arm", "armeb", "thumb", "thumbeb", "aarch64"))
               for b in backends)


def check_target(target) -> None:
    """Raise :class:`UnsupportedByTVM` for targets TVM 0.19 + LLVM would crash on or silently ignore.

    Safe to call in the user's process: it only reads the target's attributes and LLVM's lists
    of back ends and CPU names (never LLVM code generation).
    """
    import tvm
    from tvm.target import codegen

    if isinstance(target, str):
        target = tvm.target.Target(target)
    kind = target.kind.name
    if kind != "llvm":
        if (kind not in ("c", "ext_dev", "hybrid")
                and tvm.get_global_func(f"target.build.{kind}", allow_missing=True) is None):
            raise UnsupportedByTVM(f"target kind {kind!r} is not enabled in this TVM build (no target.build.{kind})")
        return
    triple = str(target.attrs.get("mtriple", "") or "")
    if triple:
        backends = [str(b) for b in codegen.llvm_get_targets()]
        arch = triple.split("-")[0]
        if not _arch_known(arch, backends):
            raise UnsupportedByTVM(
                f"-mtriple={triple}: LLVM in this TVM has no back end for {arch!r} (it has {', '.join(backends)}); "
                f"TVM 0.19 would crash building for it"
            )
    mcpu = str(target.attrs.get("mcpu", "") or "")
    if mcpu and mcpu not in ("native", "generic"):
        plain = tvm.target.Target(f"llvm -mtriple={triple}" if triple else "llvm")  # no LLVM warning about mcpu
        cpus = [str(c) for c in codegen.llvm_get_cpu_archlist(plain)]
        if cpus and mcpu not in cpus:
            raise UnsupportedByTVM(
                f"-mcpu={mcpu}: LLVM does not know this CPU (TVM 0.19 would silently build for a generic CPU); "
                f"e.g. {', '.join(c for c in cpus if c.startswith(mcpu[:2])) or ', '.join(cpus[:8])}"
            )


def _check_graph_executor(mod) -> None:
    import tvm
    from tvm import relay

    main = mod["main"]
    for p in main.params:
        ty = p.checked_type
        if isinstance(ty, relay.TensorType) and not all(isinstance(d, tvm.tir.IntImm) for d in ty.shape):
            raise UnsupportedByTVM(
                f"input {p.name_hint!r} has the dynamic shape {[str(d) for d in ty.shape]}: relay.build's graph "
                f"executor needs static shapes (give static shapes, e.g. tvm-ext report --shape, or use relay.vm)"
            )
    found: list = []
    banned = (relay.If, relay.adt.Match, relay.RefCreate, relay.RefRead, relay.RefWrite)

    def visit(node):
        if found:
            return
        if isinstance(node, banned):
            found.append(type(node).__name__)
        elif isinstance(node, relay.Call) and isinstance(node.op, (relay.Var, relay.Call)):
            what = "a let-bound function" if isinstance(node.op, relay.Var) else "a returned function"
            found.append(f"call of a closure ({what})")

    relay.analysis.post_order_visit(main, visit)
    if found:
        raise UnsupportedByTVM(f"main contains {found[0]}: relay.build's graph executor cannot run control flow, "
                               f"closures or references (use relay.vm.compile)")


def _check_integer_clip_bounds(mod) -> None:
    """A ``clip`` of integer data with a bound its dtype cannot hold below (unsigned: negative) or, when
    signed, above: ``topi.clip`` makes each bound a constant of the data's dtype, which TVM refuses."""
    import numpy as np
    import tvm
    from tvm import relay

    found: list = []

    def visit(node):
        if found or not isinstance(node, relay.Call) or not isinstance(node.op, tvm.ir.Op) or node.op.name != "clip":
            return
        dtype = str(node.args[0].checked_type.dtype)
        try:
            info = np.iinfo(dtype)
        except (TypeError, ValueError):  # float, bool, or an integer width numpy has no type for
            return
        for name in ("a_min", "a_max"):
            bound = float(getattr(node.attrs, name))
            if bound < info.min or (info.min < 0 and bound > info.max):
                found.append((dtype, name, bound))
                return

    _visit_functions(mod, visit)
    if found:
        dtype, name, bound = found[0]
        info = np.iinfo(dtype)
        raise UnsupportedByTVM(
            f"clip of {dtype} data with {name}={bound:g}: TVM 0.19 cannot build it (topi.clip makes each bound a "
            f"{dtype} constant, python/tvm/topi/math.py, and {bound:g} is not a {dtype}); give bounds within "
            f"[{info.min}, {info.max}] (a bound past the dtype's range clips nothing)"
        )


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
