"""Graphs TVM 0.19 mis-handles, detected up front so the user gets a clear error instead.

Each entry is a TVM bug that a differentially fuzzed graph (``tvm_ext.testing.fuzz``) or a real
model triggers. For those tvm-ext cannot route around without changing TVM itself,
:func:`check_module` looks for the triggering construct in a typed module for a given target
and raises :class:`UnsupportedByTVM` (a ``ValueError``) naming the op, the shapes, the TVM source
at fault and a workaround. It is called by :func:`tvm_ext.build` before relay.build's prefix
(after the ``start`` passes). The others :func:`tvm_ext.build` recognises by their error and
builds again without the pass at fault (:func:`is_llvm_debug_info_error`,
:func:`is_inline_function_copy_error`, :func:`is_integer_scale_fold_error`). Graphs TVM cannot lower as given
but can in another form (a fused function holding an 8-bit conv2d, a dilated 8-bit conv2d) are rebuilt in that
form before :func:`check_module` (:mod:`tvm_ext.core.tvm_reroutes`).

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
           "prefix_workaround", "NO_TIR_CSE", "COPIES_INLINE_FUNCTIONS", "FOLDS_INTEGER_SCALES"]

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
