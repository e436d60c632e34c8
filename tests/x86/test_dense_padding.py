"""``tvm_ext.x86.dense_padding``: 8-bit denses padded to 16 outputs take TVM's int8 dense.

``uint8 x int8 -> int32`` denses with 1000, 10, 17 and 1001 outputs, full-range inputs, built by
``tvm_ext.build`` with tvm-ext's kernels at the host's AVX-512 VNNI target and at AVX-512 without VNNI
(``x86-64-v4``: the exact form, and ``vpmaddubsw`` where the weights allow it), executed only where the
host has the instructions, against numpy's int64 arithmetic; with a float epilogue against a plain
``llvm`` build. The structure, compiled for AVX-512 VNNI CPUs of both vendors and read back: the padded
dense is ``dense_int8.x86`` (``vpdpbusd``, ``NC16n4c`` weights of 16 x ceil(N / 16) outputs) and its slice
and epilogue are in its kernel (``FuseSlicedInt8Dense``); a multiple of 16, AVX2 code, a reduction 4
does not divide and a plain ``relay.build`` are unchanged.
"""
import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_ext.core.build import build
from tvm_ext.x86 import dense_padding
from tvm_ext.x86.isa import runs_on_host
from tvm_ext.x86.target import host_target

from ._dense_cases import _dense, _dense_weight_shapes, _inputs, _kernels, _run
from ._int8_cases import HOST_VNNI, needs_vnni

VNNI_CPUS = ("llvm -mcpu=cascadelake", "llvm -mcpu=znver4")
AVX512 = "llvm -mcpu=x86-64-v4"
needs_avx512 = pytest.mark.skipif(not runs_on_host(AVX512), reason=f"host lacks instructions of '{AVX512}'")


def test_padded_outputs():
    assert [dense_padding.padded_outputs(n) for n in (1, 10, 16, 17, 1000, 1001, 1024)] == \
        [16, 16, 16, 32, 1008, 1008, 1024]


@pytest.mark.parametrize("target, applies", [
    ("llvm -mcpu=cascadelake", True),
    ("llvm -mcpu=znver4", True),
    ("llvm -mcpu=x86-64-v4", True),    # AVX-512 without VNNI: the exact form
    ("llvm -mcpu=sapphirerapids", False),  # AMX kept: TVM's AMX dense
    ("llvm -mcpu=x86-64-v3", False),   # AVX2: TVM's dense never takes dense_int8.x86
])
def test_applies_per_class(target, applies):
    assert dense_padding.applies(tvm.target.Target(target)) is applies
    assert not dense_padding.applies(None)


@needs_vnni
@pytest.mark.parametrize("units", [1000, 10, 17, 1001])
@pytest.mark.parametrize("batch, reduced", [(1, 2048), (3, 64)])
def test_exact_against_numpy(units, batch, reduced):
    mod, w = _dense(units, reduced, batch)
    x = _inputs(batch, reduced)
    factory = build(mod, target=host_target(allow_vnni=True), kernels=True)
    assert _dense_weight_shapes(factory) == [(-(-units // 16), reduced // 4, 16, 4)], "the dense was not padded"
    expected = x.astype(np.int64) @ w.astype(np.int64).T
    np.testing.assert_array_equal(_run(factory, x=x), expected)


@needs_avx512
@pytest.mark.parametrize("units", [1000, 10, 17, 1001])
@pytest.mark.parametrize("weight_max", [128, 64])  # 64: every weight pair fits vpmaddubsw's int16 sums
def test_avx512_without_vnni_exact_against_numpy(units, weight_max):
    mod, w = _dense(units, 512, 2, weight_max=weight_max)
    x = _inputs(2, 512)
    factory = build(mod, target=AVX512, kernels=True)
    assert _dense_weight_shapes(factory) == [(-(-units // 16), 128, 16, 4)], "the dense was not padded"
    assert "vpmaddubsw" in factory.get_lib().get_source("asm")
    np.testing.assert_array_equal(_run(factory, x=x), x.astype(np.int64) @ w.astype(np.int64).T)


@needs_vnni
@pytest.mark.parametrize("units", [1000, 17])
def test_epilogue_against_plain_llvm(units):
    mod, _ = _dense(units, 512, epilogue=True)
    x = _inputs(1, 512)
    with tvm.transform.PassContext(opt_level=3):
        plain = relay.build(mod, target="llvm")
    factory = build(mod, target=host_target(allow_vnni=True), kernels=True)
    np.testing.assert_array_equal(_run(factory, x=x), _run(plain, x=x))


@pytest.mark.parametrize("target", VNNI_CPUS)
def test_padded_dense_is_the_vnni_dense(target):
    factory = build(_dense(1000, 2048, epilogue=True)[0], target=target, kernels=True)
    assert _dense_weight_shapes(factory) == [(63, 512, 16, 4)]  # NC16n4c, 1008 outputs
    # the slice and the epilogue in the dense's kernel: one kernel, no int32 tensor between kernels
    (name, shape), = _kernels(factory)
    assert "dense_pack_strided_slice_add_cast_multiply" in name and shape == (1, 1000), name
    assert "vpdpbusd" in factory.get_lib().get_source("asm")
    assert factory.kernel_report.int_crossings() == []


@pytest.mark.parametrize("target", VNNI_CPUS[:1])
def test_without_padding_tvm_takes_the_generic_dense(target):
    """The oracle of the structure test: without the padding (a plain ``relay.build``) the same
    dense compiles to TVM's ``dense_pack`` with no ``vpdpbusd``."""
    mod, _ = _dense(1000, 2048, epilogue=True)
    with tvm.transform.PassContext(opt_level=3):
        factory = relay.build(mod, target=target)
    assert [shape for name, shape in _kernels(factory) if "dense" in name] == [(1, 1000)]
    assert "vpdpbusd" not in factory.get_lib().get_source("asm")


@pytest.mark.parametrize("units, reduced, target, why", [
    (1024, 2048, VNNI_CPUS[0], "a multiple of 16"),
    (1000, 2046, VNNI_CPUS[0], "a reduction 4 does not divide"),
    (1000, 2048, "llvm -mcpu=x86-64-v3", "AVX2 code"),
])
def test_unchanged(units, reduced, target, why):
    mod, _ = _dense(units, reduced, epilogue=True)
    factory = build(mod, target=target, kernels=True)
    kernels = _kernels(factory)
    assert len(kernels) == 1 and not any("strided_slice" in name for name, _ in kernels), (why, kernels)
    assert [shape for name, shape in kernels if "dense" in name] == [(1, units)], why


def test_weight_not_constant_is_unchanged():
    mod, _ = _dense(1000, 256, weight_var=True)
    factory = build(mod, target=VNNI_CPUS[0], kernels=True)
    assert not any("strided_slice" in name for name, _ in _kernels(factory))


@pytest.mark.skipif(not HOST_VNNI, reason="host CPU has no AVX-512 VNNI")
def test_weight_not_constant_stays_exact():
    mod, w = _dense(1000, 256, weight_var=True)
    x = _inputs(1, 256)
    factory = build(mod, target=host_target(allow_vnni=True), kernels=True)
    np.testing.assert_array_equal(_run(factory, x=x, w=w), x.astype(np.int64) @ w.astype(np.int64).T)


def test_without_kernels_the_dense_is_relay_builds():
    """``tvm_ext.build`` without tvm-ext's kernels does not pad."""
    factory = build(_dense(1000, 256)[0], target=VNNI_CPUS[0], kernels=False)
    assert not any("strided_slice" in name for name, _ in _kernels(factory))


def test_context_restores_tvms_legalization():
    import tvm.topi.x86.dense_alter_op as dense_alter_op

    before = dense_alter_op.int8_int8_legalize
    with dense_padding.padded_int8_denses():
        with dense_padding.padded_int8_denses():
            assert dense_alter_op.int8_int8_legalize is not before
        assert dense_alter_op.int8_int8_legalize is not before
    assert dense_alter_op.int8_int8_legalize is before

