"""Kernel reports for Relax builds: the same :class:`tvm_ext.core.report.KernelReport`, read from Relax.

Design note
-----------
On Relax the truth is the lowered ``main``: after ``FuseTIR`` and ``RewriteDataflowReshape`` (which
``relax.build`` runs; it turns reshape kernels back into views) every ``R.call_tir`` /
``R.call_dps_packed`` in ``main`` is one kernel launch, so ``num_kernels`` equals their number.
A kernel's ops are the PrimFuncs ``LegalizeOps`` produced that ``FuseTIR`` merged into it (read
from the module *before* ``FuseTIR``: the fused Relax function of the same name calls them), named
as ``LegalizeOps`` names them (``conv2d``, ``add``, ``relu``, ``matmul``; numeric suffixes
dropped). The *anchor* is the op whose PrimFunc ``op_pattern`` (set by ``AnnotateTIROpPattern``, the
TIR counterpart of Relay's ``TOpPattern``) is highest, when it is ``kCommReduce`` (3) or above.

*Crossing tensors*: a kernel output read by another kernel (directly or through reshape views),
counted once; ``main``'s parameters read by kernels are ``inputs`` and its result ``outputs``;
constants (weights) are not counted, as Relay's params are not.
"""
from __future__ import annotations

import re

from tvm_ext.core.report import Kernel, KernelReport, _traffic

__all__ = ["kernel_report", "kernel_ops"]

_K_COMM_REDUCE = 3


def _prim_name(gv) -> str:
    return re.sub(r"\d+$", "", gv.name_hint) or gv.name_hint


def _pattern(mod, gv) -> int:
    func = mod[gv]
    attrs = func.attrs
    return int(attrs["op_pattern"]) if attrs is not None and "op_pattern" in attrs else 8


def _call_tir_target(call):
    import tvm
    from tvm import relax

    if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name in (
            "relax.call_tir", "relax.call_tir_inplace", "relax.call_dps_packed"):
        return call.args[0]
    return None


def kernel_ops(mod_before_fusetir) -> dict:
    """``{kernel name: [(op name, op_pattern), ...]}`` from a module after FuseOps, before FuseTIR."""
    from tvm import relax, tir

    out = {}
    for gv, func in mod_before_fusetir.functions.items():
        if isinstance(func, tir.PrimFunc):
            out[gv.name_hint] = [(_prim_name(gv), _pattern(mod_before_fusetir, gv))]
        elif isinstance(func, relax.Function) and func.attrs is not None and "Primitive" in func.attrs:
            ops = []

            def visit(e, ops=ops):  # called by post_order_visit below, in this iteration
                t = _call_tir_target(e)
                if isinstance(t, relax.GlobalVar) and isinstance(mod_before_fusetir[t], tir.PrimFunc):
                    ops.append((_prim_name(t), _pattern(mod_before_fusetir, t)))

            relax.analysis.post_order_visit(func.body, visit)
            out[gv.name_hint] = ops
    return out


def _tensors(sinfo) -> list:
    from tvm import relax

    if isinstance(sinfo, relax.TensorStructInfo):
        shape = sinfo.shape
        if isinstance(shape, relax.ShapeExpr):
            return [(tuple(int(d) for d in shape.values), str(sinfo.dtype))]
        raise ValueError(f"kernel report: dynamic shape {shape} (only static shapes are reported)")
    if isinstance(sinfo, relax.TupleStructInfo):
        return [t for f in sinfo.fields for t in _tensors(f)]
    return []


def kernel_report(mod, ops_by_kernel=None, func_name: str = "main") -> KernelReport:
    """Report of a lowered Relax module (after ``FuseTIR``; reshape views allowed).

    Parameters
    ----------
    mod : tvm.IRModule
        The module whose ``main`` calls the kernels.
    ops_by_kernel : dict, optional
        :func:`kernel_ops` of the module before ``FuseTIR`` (else ops are the kernel names).
    """
    import tvm
    from tvm import relax

    if func_name not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise ValueError(f"kernel report: module has no function {func_name!r}")
    main = mod[func_name]
    if not isinstance(main, relax.Function):
        raise ValueError(f"kernel report: {func_name} is not a Relax function")
    ops_by_kernel = ops_by_kernel or {}
    params = set(main.params)
    alias: dict = {}  # var -> the var it views (reshape) or itself
    producer: dict = {}  # var -> kernel index
    kernels, readers, outputs_of = [], {}, {}

    def root(v):
        while v in alias:
            v = alias[v]
        return v

    def read(expr, k):
        if isinstance(expr, relax.Var):
            readers.setdefault(root(expr), set()).add(k)
        elif isinstance(expr, relax.Tuple):
            for f in expr.fields:
                read(f, k)

    for block in main.body.blocks:
        for b in block.bindings:
            if not isinstance(b, relax.VarBinding):
                continue
            v = b.value
            target = _call_tir_target(v)
            if target is not None:
                name = target.name_hint if isinstance(target, relax.GlobalVar) else str(target)
                pairs = (ops_by_kernel.get(name)
                         or [(_prim_name(target) if isinstance(target, relax.GlobalVar) else name, 8)])
                ops = tuple(o for o, _ in pairs)
                best = max(pairs, key=lambda p: p[1])
                anchor = best[0] if best[1] >= _K_COMM_REDUCE else None
                outs = tuple(_tensors(b.var.struct_info))
                k = len(kernels)
                kernels.append(Kernel(k, name, name, ops, anchor, outs))
                producer[b.var] = k
                outputs_of[k] = outs
                read(v.args[1], k)
            elif (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)
                  and v.op.name in ("relax.reshape", "relax.memory.view")):
                if isinstance(v.args[0], relax.Var):
                    alias[b.var] = v.args[0]
            elif isinstance(v, relax.Var):
                alias[b.var] = v
            elif isinstance(v, relax.TupleGetItem) and isinstance(v.tuple_value, relax.Var):
                alias[b.var] = v.tuple_value

    crossing = []
    for var, k in producer.items():
        if readers.get(var, set()) - {k}:
            crossing.extend(outputs_of[k])
    inputs = [t for p in main.params if readers.get(p) for t in _tensors(p.struct_info)]
    outputs = _tensors(main.body.body.struct_info)
    del params
    return KernelReport(kernels, _traffic(crossing), _traffic(inputs), _traffic(outputs))
