"""Exact float32 division by a scale inside ``round``, as a product in double, at x86: a study.

The pass is :mod:`tvm_ext._round_reciprocal` (``RoundReciprocal``; its docstring has the exactness
argument), which the aarch64 back end adds to its builds. The x86 back end does not add it: the
conversions cost more than ``vdivps`` in the int8 conv epilogues (llvm-mca at Cascade Lake, timed on
Zen 5; docs/x86-kernels.md). For the study, :func:`lower_config` adds it to an x86 build's
PassContext (``tvm_ext.build(..., config=lower_config())``).
"""
from tvm_ext._round_reciprocal import LOWER_PHASE, PASS_NAME, RoundReciprocal, lower_config

__all__ = ["RoundReciprocal", "lower_config", "PASS_NAME", "LOWER_PHASE"]
