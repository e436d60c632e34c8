"""tvm_ext.arm.int8_policy: the aarch64 int8 kernel policy table, and int8_conv following it.

Compiled only (aarch64 code does not run here): the table's records per class, then builds at two
classes whose implementation choices must change when the table's record changes.
"""
import dataclasses

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.target import codegen

from tvm_ext.arm import int8_conv, int8_policy
from tvm_ext.core.tvm_bugs import NO_TIR_CSE
from tvm_ext.arm.isa import ISA_CLASSES
from tvm_ext.testing.aarch64 import TARGETS

needs_aarch64 = pytest.mark.skipif("aarch64" not in list(codegen.llvm_get_targets()),
                                   reason="this TVM's LLVM has no AArch64 back end")


def test_table_lists_every_class_in_order():
    assert tuple(p.isa for p in int8_policy.POLICIES) == ISA_CLASSES


@pytest.mark.parametrize("cls, dot, mmla, dense, int8_operands, conv_tile", [
    ("aarch64_i8mm", "smmla", True, ("mmla", "dot"), False, "sdot"),
    ("aarch64_dotprod", "sdot", False, ("dot",), False, "sdot"),
    ("aarch64_neon", "smull", False, (), True, "smull"),
])
def test_table_contents_per_class(cls, dot, mmla, dense, int8_operands, conv_tile):
    p = int8_policy.policy_for(cls)
    assert (p.dot, p.mmla_conv, p.dense_kernels, p.int8_operands) == (dot, mmla, dense, int8_operands)
    assert p.conv_tile == conv_tile
    assert p.mixed_sign_dot == (cls == "aarch64_i8mm")
    assert p.mmla_block == (8 if mmla else 0)
    assert p.few_channel_nchwc and p.float_stem_nchwc and p.depthwise_nchwc
    assert p.depthwise_dot == (dot != "smull")  # a dot instruction over 4 taps needs +dotprod
    assert p.few_channel_pad == int8_policy.INT8_LANES == 4
    assert p.evidence


@pytest.mark.parametrize("cpu, cls", [("cortex-a72", "aarch64_neon"), ("neoverse-n1", "aarch64_dotprod"),
                                      ("neoverse-v1", "aarch64_i8mm")])
def test_policy_of_a_target_is_its_class_record(cpu, cls):
    assert int8_policy.policy(tvm.target.Target(TARGETS[cpu])) is int8_policy.policy_for(cls)


def test_malformed_records_and_unknown_classes_are_refused():
    with pytest.raises(ValueError, match="not an aarch64 class"):
        int8_policy.KernelPolicy("avx2", "sdot", False, False, (), False, "-")
    with pytest.raises(ValueError, match="unknown dense kernels"):
        int8_policy.KernelPolicy("aarch64_dotprod", "sdot", False, False, ("gemm",), False, "-")
    with pytest.raises(ValueError, match="unknown conv tile form"):
        int8_policy.KernelPolicy("aarch64_neon", "smull", True, False, (), False, "-", conv_tile="smlal")
    with pytest.raises(ValueError, match="needs an mmla_block"):
        int8_policy.KernelPolicy("aarch64_i8mm", "smmla", False, True, (), True, "-")
    with pytest.raises(ValueError, match="no aarch64 int8 policy"):
        int8_policy.policy_for("aarch64_sve2")


def _conv(channels=16, size=6):
    rng = np.random.default_rng(0)
    x = relay.var("x", shape=(1, channels, size, size), dtype="int8")
    w = relay.const(rng.integers(-127, 128, (channels, channels, 3, 3)).astype("int8"))
    y = relay.nn.conv2d(x, w, padding=(1, 1), channels=channels, kernel_size=(3, 3), out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([x], y))


def _dense():
    rng = np.random.default_rng(1)
    x = relay.var("x", shape=(4, 32), dtype="int8")
    y = relay.nn.dense(x, relay.const(rng.integers(-127, 128, (16, 32)).astype("int8")), out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([x], y))


def _implementations(mod, cpu) -> set:
    """The implementation names the build's ops took, read from the compile engine's choices."""
    names = set()
    select = relay.backend.te_compiler.select_implementation

    def _spy(op, attrs, inputs, out_type, target, use_autotvm=True):
        impl, outs = select(op, attrs, inputs, out_type, target, use_autotvm)
        names.add(impl.name)
        return impl, outs

    relay.backend.te_compiler.select_implementation = _spy
    try:
        # without TIR CSE, as tvm_ext.build at +i8mm (tvm_ext.arm.backend)
        with int8_conv.kernels(), tvm.transform.PassContext(opt_level=3, config={NO_TIR_CSE: True}):
            relay.build(mod, target=TARGETS[cpu])
    finally:
        relay.backend.te_compiler.select_implementation = select
    return names


def _with_record(monkeypatch, cls, **changes):
    by_class = dict(int8_policy._BY_CLASS)
    by_class[cls] = dataclasses.replace(by_class[cls], **changes)
    monkeypatch.setattr(int8_policy, "_BY_CLASS", by_class)


@needs_aarch64
@pytest.mark.parametrize("cpu, expected", [("neoverse-v1", int8_conv.NCHWC_MMLA),
                                           ("neoverse-n1", int8_conv.NCHWC_TILES + ".sdot"),
                                           ("cortex-a72", int8_conv.NCHWC_TILES + ".smull")])
def test_conv_takes_the_tables_kernel_per_class(cpu, expected):
    """A 16-channel int8 conv: the smmla kernel at the class whose record has ``mmla_conv``, the register
    tile of the class's ``conv_tile`` form at the others."""
    names = _implementations(_conv(), cpu)
    assert expected in names, names
    assert len({int8_conv.NCHWC_MMLA, int8_conv.NCHWC_TILES + ".sdot", int8_conv.NCHWC_TILES + ".smull"}
               & names) == 1, names


@needs_aarch64
def test_conv_follows_a_changed_record(monkeypatch):
    """Without ``mmla_conv`` in the +i8mm record, the same conv at Neoverse-V1 keeps the dot product; with
    the +dotprod record's ``conv_tile`` cleared, Neoverse-N1's conv is TVM's NCHWc int8 kernel again."""
    _with_record(monkeypatch, "aarch64_i8mm", mmla_conv=False)
    names = _implementations(_conv(), "neoverse-v1")
    assert int8_conv.NCHWC_MMLA not in names, names
    _with_record(monkeypatch, "aarch64_dotprod", conv_tile="")
    names = _implementations(_conv(), "neoverse-n1")
    assert not any(n.startswith(int8_conv.NCHWC_TILES) for n in names) and "conv2d_NCHWc_int8.arm_cpu" in names, names


@needs_aarch64
@pytest.mark.parametrize("cpu, cls, expected", [("neoverse-v1", "aarch64_i8mm", int8_conv.DENSE_MMLA),
                                                ("neoverse-n1", "aarch64_dotprod", int8_conv.DENSE_DOT)])
def test_dense_follows_the_tables_order(monkeypatch, cpu, cls, expected):
    assert expected in _implementations(_dense(), cpu)
    _with_record(monkeypatch, cls, dense_kernels=())
    names = _implementations(_dense(), cpu)
    assert not {int8_conv.DENSE_MMLA, int8_conv.DENSE_DOT} & names, names
    if cls == "aarch64_i8mm":
        _with_record(monkeypatch, cls, dense_kernels=("dot", "mmla"))
        assert int8_conv.DENSE_DOT in _implementations(_dense(), cpu)
