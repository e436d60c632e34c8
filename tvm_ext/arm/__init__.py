"""aarch64 code generation: what tvm-ext changes in TVM 0.19's ARM lowering while it builds.

``requantize`` (exact fixed-point requantization on aarch64). Leaves below :mod:`tvm_ext.core`,
beside :mod:`tvm_ext.x86`: nothing here imports the core or the tools.
"""
