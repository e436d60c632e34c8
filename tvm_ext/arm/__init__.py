"""aarch64 code generation: what tvm-ext changes in TVM 0.19's ARM lowering while it builds.

``int8_policy`` (the int8 kernel policy table, per instruction-set class), ``int8_conv`` (which
applies it), ``dot_conv`` (NCHW4c int8 convs in register tiles: ``sdot``, or ``smull`` + ``sadalp``),
``mmla_conv`` (the 8-bit matrix-multiply conv, +i8mm),
``int8_dense`` (8-bit dot-product and matrix-multiply denses), ``requantize`` (exact fixed-point
requantization on aarch64). Leaves below :mod:`tvm_ext.core`, beside :mod:`tvm_ext.x86`: nothing
here imports the core or the tools.
"""
