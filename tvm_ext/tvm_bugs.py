"""Graphs TVM 0.19 mis-handles, detected up front so the user gets a clear error instead.

Design note
-----------
Each entry is a TVM bug found by differential fuzzing (``tvm_ext.testing.fuzz``) that tvm-ext
cannot route around without changing TVM itself. :func:`check_module` looks for the triggering
construct in a typed module for a given target and raises :class:`UnsupportedByTVM` (a
``ValueError``) naming the op, the shapes, the TVM source at fault and a workaround. It is called
by :func:`tvm_ext.build` before relay.build's prefix (after the ``start`` passes).

Known bugs::

    # int8 x int8 nn.dense / qnn.dense, units % 16 != 0, x86 target with AVX-512BW (or AMX-INT8)
    #   topi/x86/dense_alter_op.py::int8_int8_legalize pads the weight to a multiple of 16 rows
    #   but re-creates the dense with the old ``units`` attribute: the type checker rejects it
    #   ("Tensor[(16, K), int8] does not match Tensor[(N, K), int8]") deep inside relay.build.
"""
from __future__ import annotations

__all__ = ["UnsupportedByTVM", "check_module"]


class UnsupportedByTVM(ValueError):
    """The module hits a known TVM 0.19 bug for this target; the message says which and what to do."""


def _x86_int8_gemm(target) -> bool:
    from tvm.target.codegen import target_has_features

    if target is None or target.kind.name != "llvm":
        return False
    with target:
        return bool(target_has_features(["avx512bw", "avx512f"]) or target_has_features("amx-int8"))


def check_module(mod, target) -> None:
    """Raise :class:`UnsupportedByTVM` when ``mod`` (typed) would trip a known TVM bug on ``target``."""
    import tvm
    from tvm import relay

    if not _x86_int8_gemm(target):
        return
    found: list = []

    def visit(node):
        if found or not isinstance(node, relay.Call) or not isinstance(node.op, tvm.ir.Op):
            return
        if node.op.name not in ("nn.dense", "qnn.dense"):
            return
        data, weight = node.args[0].checked_type, node.args[1].checked_type
        if str(data.dtype) != "int8" or str(weight.dtype) != "int8":
            return
        units = weight.shape[0]
        if isinstance(units, tvm.tir.IntImm) and int(units) % 16:
            found.append((node.op.name, [int(d) if isinstance(d, tvm.tir.IntImm) else str(d) for d in weight.shape]))

    for gv in mod.get_global_vars():
        func = mod[gv]
        if isinstance(func, relay.Function):
            relay.analysis.post_order_visit(func, visit)
    if found:
        op, wshape = found[0]
        raise UnsupportedByTVM(
            f"{op} with int8 data and int8 weight {wshape}: TVM 0.19 cannot build it for {target.attrs.get('mcpu', 'this CPU')} "
            f"with AVX-512 (x86 int8 dense legalization pads the weight to a multiple of 16 rows but keeps "
            f"units={wshape[0]}, topi/x86/dense_alter_op.py); use uint8 data, units divisible by 16, "
            f"or a target with -mattr=-avx512bw"
        )
