"""x86 code generation: instruction sets, safe targets, the int8 kernel policy and tuned records.

``isa`` (what a target compiles for and what this host runs), ``target`` (targets TVM 0.19 with
LLVM 22 builds without aborting), ``int8_policy`` (the per-instruction-set kernel policy tables),
``int8_schedules`` (the int8 conv schedules), ``block_vectors`` (pool and injective schedules over channel
blocks), ``int8_conv`` (the layouts and fallback
configs, and ``kernels()``, which installs them with the schedules while entered),
``conv_transpose``, ``tuning`` (tuned records, applied by ``tvm_ext.build``), ``amx`` (the
opt-in AMX tile path), ``dense_padding`` and ``fuse_sliced_dense`` (8-bit denses whose outputs 16
does not divide: padded to 16 outputs, one kernel with their slice).
Leaves below :mod:`tvm_ext.core`: nothing here imports the core or the tools.
"""
import importlib

_MODULES = ("isa", "target", "int8_policy", "int8_schedules", "block_vectors", "int8_conv", "conv_transpose",
            "tuning", "amx", "dense_padding", "fuse_sliced_dense")


def __getattr__(name):
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
