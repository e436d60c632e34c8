"""Kernel names as TVM 0.19's TE compiler gives them, without compiling.

The Primitive functions TVM's own FuseOps makes of the module are named as LowerTE names them
(``te_compiler_cache.cc``, ``name_supply.cc``), and each replay kernel takes the name of the TVM
kernel with its ops and outputs.
"""
from __future__ import annotations

from dataclasses import replace

from ._ops import _fn_ops, _outputs


def _tvm_fused_functions(mod, tgt, opt_level, cfg) -> list:
    """The Primitive functions TVM's FuseOps makes of ``mod``'s main, one per call, in the order
    LowerTE lowers (and names) them: post-order of the calls."""
    import tvm
    from tvm import relay

    from ._fusion_nodes import is_primitive_function

    with tgt, tvm.transform.PassContext(opt_level=opt_level, config=cfg):
        fused = relay.transform.FuseOps()(relay.transform.InferType()(mod))
    fns = []
    relay.analysis.post_order_visit(
        fused["main"], lambda e: fns.append(e.op) if isinstance(e, relay.Call) and is_primitive_function(e.op)
        and int(e.op.attrs["Primitive"]) == 1 else None)
    return fns


# -- kernel names, as TVM's TE compiler gives them ---------------------------------------------------
# TVM 0.19: LowerToTECompute (src/relay/backend/te_compiler_cache.cc) names a Primitive function
# "fused" + "_<op>" per op call in post-order, truncated past kMaxFuncNameLength; TECompiler's
# GlobalVarSupply (src/ir/name_supply.cc, prefix "tvmgen_<mod_name>" from relay.build's
# mangle_module_name) prefixes it, turns '.' into '_' and appends "_1", "_2", ... to a name taken by
# another kernel; structurally equal functions share one lowered kernel (the CCacheKey cache).
_MAX_FUNC_NAME = 80  # kMaxFuncNameLength


_U64 = (1 << 64) - 1


def _std_hash(text: str) -> int:
    """libstdc++'s ``std::hash<std::string>`` on 64-bit (``_Hash_bytes``, seed 0xc70f6907), which TVM
    appends to a truncated kernel name."""
    data = text.encode()
    mul = (0xC6A4A793 << 32) + 0x5BD1E995

    def shift_mix(v):
        return v ^ (v >> 47)

    h = (0xC70F6907 ^ (len(data) * mul)) & _U64
    aligned = len(data) & ~7
    for i in range(0, aligned, 8):
        h = ((h ^ (shift_mix(int.from_bytes(data[i:i + 8], "little") * mul & _U64) * mul & _U64)) * mul) & _U64
    if len(data) & 7:
        h = ((h ^ int.from_bytes(data[aligned:], "little")) * mul) & _U64
    return shift_mix(shift_mix(h) * mul & _U64)


def _candidate_name(ops) -> str:
    """LowerToTECompute's ``candidate_name_`` for a function calling ``ops`` (post-order)."""
    name = "_".join(["fused", *ops])
    if len(name) > _MAX_FUNC_NAME:
        name = f"{name[:_MAX_FUNC_NAME]}_{_std_hash(name):x}_"
    return name


class _NameSupply:
    """TVM's ``NameSupply::FreshName`` with ``add_prefix`` and ``add_underscore``."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.taken: dict = {}

    def fresh(self, name: str) -> str:
        base = (f"{self.prefix}_{name}" if self.prefix else name).replace(".", "_")
        if base not in self.taken:
            self.taken[base] = 0
            return base
        new = base
        while new in self.taken:
            self.taken[base] += 1
            new = f"{base}_{self.taken[base]}"
        self.taken[new] = 0
        return new


def _tvm_kernel_names(fns, mod_name: str = "default") -> list:
    """``[(function name, graph executor name)]`` for ``fns`` (:func:`_tvm_fused_functions`), as
    ``relay.build(..., mod_name=mod_name)`` names them."""
    import tvm

    supply = _NameSupply(f"tvmgen_{mod_name}" if mod_name else "tvmgen")
    cache: dict = {}  # structural hash -> [(function, name)]
    out = []
    for fn in fns:
        bucket = cache.setdefault(tvm.ir.structural_hash(fn), [])
        name = next((n for f, n in bucket if tvm.ir.structural_equal(f, fn)), None)
        if name is None:
            name = supply.fresh(_candidate_name(_fn_ops(fn)))
            bucket.append((fn, name))
        # GraphExecutorCodegen: a reshape-only kernel aliases its input and becomes "__nop"
        reshape = "relay.reshape_only" in fn.attrs and int(fn.attrs["relay.reshape_only"]) == 1
        out.append((name, "__nop" if reshape and len(fn.params) == 1 else name))
    return out


def _name_kernels(kernels, fns, names) -> tuple:
    """Give each replay kernel the name of its TVM kernel: the first unnamed one with the same ops
    and outputs, in lowering order. Returns (kernels, number left without a TVM kernel)."""
    pool: dict = {}
    for fn, nm in zip(fns, names):
        ret = fn.ret_type if fn.ret_type is not None else fn.body.checked_type
        key = (tuple(sorted(_fn_ops(fn))), _outputs(ret))
        pool.setdefault(key, []).append(nm)
    out, unmatched = [], 0
    for k in kernels:
        got = pool.get((tuple(sorted(k.ops)), k.outputs))
        if got:
            name, func_name = got.pop(0)
            out.append(replace(k, name=name, func_name=func_name))
        else:
            out.append(replace(k, name=None, func_name=None))
            unmatched += 1
    return out, unmatched


def _check_report_names(kernels, report) -> str:
    """'' when the kernels' graph executor names are the built module's, name for name; else what differs."""
    from collections import Counter

    mine, built = Counter(k.func_name for k in kernels), Counter(k.func_name for k in report.kernels)
    if mine == built:
        return ""
    missing, extra = sorted((built - mine).elements()), sorted(str(n) for n in (mine - built).elements())
    return (f"graph executor has {report.num_kernels} kernels, replay {len(kernels)}; names only built: "
            f"{', '.join(missing[:3]) or '-'}; only predicted: {', '.join(extra[:3]) or '-'}")
