"""What TVM 0.19 emits for an int8 conv at each ARM target class (compile only; no emulator needed).

The graph is ``qnn.conv2d`` (uint8 x int8, 64 channels: TVM's arm_cpu int8 strategies need at least
64 input channels) with a bias and a ``qnn.requantize`` to uint8, as a quantized network has it.
Required at every class: the conv kernel (the fused function holding ``conv2d``, requantize
epilogue included) multiplies and accumulates in integers and converts nothing to or from float.
Per class: Cortex-A72 (+neon) has no dot-product instruction, so none may appear (the library must
run there); Neoverse-N1 (+dotprod) uses ``sdot``/``udot``; Neoverse-V1 (+i8mm) uses an int8 dot or
matrix instruction. What TVM 0.19 emits (docs/arm.md): a scalar ``madd``/``smaddl`` loop with one
``smlal`` at Cortex-A72 (an NCHW conv on operands widened to int16), ``sdot`` in the NCHWc
dot-product schedule at N1 and V1, and no ``smmla``/``ummla``/``usmmla`` at V1 (TVM 0.19 uses i8mm
only in its NHWC interleaved schedule); the counts are recorded as test properties.
"""
import collections
import re

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.target import codegen

from tvm_ext.testing.aarch64 import TARGETS

pytestmark = pytest.mark.skipif("aarch64" not in list(codegen.llvm_get_targets()),
                                reason="this TVM's LLVM has no AArch64 back end")

INT_MAC = {"sdot", "udot", "usdot", "smmla", "ummla", "usmmla", "smlal", "smlal2", "umlal", "umlal2", "sadalp",
           "uadalp", "mla", "madd", "smaddl", "umaddl"}
DOT = {"sdot", "udot", "usdot"}
MATRIX = {"smmla", "ummla", "usmmla"}
FLOAT = re.compile(r"^([su]cvtf|fcvt\w*|fmul\w*|fadd\w*|fsub\w*|fmla\w*|fmls\w*|fmadd|fmsub|fdiv|frint\w*|fnmadd)$")


def _conv_requantize():
    rng = np.random.default_rng(0)
    x = relay.var("x", shape=(1, 64, 14, 14), dtype="uint8")
    w = relay.const(rng.integers(-127, 128, (64, 64, 3, 3)).astype("int8"))
    y = relay.qnn.op.conv2d(x, w, relay.const(77), relay.const(0), relay.const(0.02), relay.const(0.01),
                            kernel_size=(3, 3), channels=64, padding=(1, 1), out_dtype="int32")
    y = relay.nn.bias_add(y, relay.const(rng.integers(-1000, 1000, 64).astype("int32")))
    y = relay.qnn.op.requantize(y, relay.const(0.0002), relay.const(0), relay.const(0.05), relay.const(3),
                                out_dtype="uint8")
    return tvm.IRModule.from_expr(relay.Function([x], y))


def _mnemonics_per_function(asm: str) -> dict:
    """Function label -> Counter of instruction mnemonics (GNU assembler text from LLVM)."""
    funcs, current = collections.defaultdict(collections.Counter), None
    for line in asm.splitlines():
        label = re.match(r"^([A-Za-z_][\w.$]*):", line)
        if label:
            current = label.group(1)
            continue
        op = re.match(r"^\s+([a-z][a-z0-9.]*)\s", line)
        if op and current:
            funcs[current][op.group(1)] += 1
    return funcs


@pytest.mark.parametrize("cpu", list(TARGETS))
def test_int8_conv_instructions(cpu, record_property):
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(_conv_requantize(), target=TARGETS[cpu])
    funcs = _mnemonics_per_function(lib.get_lib().get_source("asm"))
    conv, everything = collections.Counter(), collections.Counter()
    for name, ops in funcs.items():
        everything += ops
        if "conv2d" in name:
            conv += ops
    assert conv, f"no conv2d function in the assembly: {sorted(funcs)}"
    record_property("conv_int_mac", dict(sorted((k, v) for k, v in conv.items() if k in INT_MAC)))
    record_property("conv_dot_matrix", {k: conv[k] for k in sorted(DOT | MATRIX) if conv[k]})

    assert INT_MAC & set(conv), f"{cpu}: no integer multiply-accumulate in the conv kernel: {dict(conv)}"
    floats = {k: v for k, v in conv.items() if FLOAT.match(k)}
    assert not floats, f"{cpu}: float instructions in the int8 conv kernel (requantize included): {floats}"
    if cpu == "cortex-a72":  # +neon only: the library must run without FEAT_DotProd / FEAT_I8MM
        assert not (DOT | MATRIX) & set(everything), {k: everything[k] for k in DOT | MATRIX if everything[k]}
    elif cpu == "neoverse-n1":  # +dotprod, no i8mm
        assert DOT & set(conv), f"no sdot/udot at {TARGETS[cpu]}: {dict(conv)}"
        assert not MATRIX & set(everything)
    else:  # +i8mm: an int8 dot or matrix instruction (TVM 0.19's NCHWc schedule gives sdot)
        assert (DOT | MATRIX) & set(conv), f"no int8 dot/matrix instruction at {TARGETS[cpu]}: {dict(conv)}"
