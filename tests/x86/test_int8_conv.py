"""tvm_ext.x86.int8_conv: each named kernel change (docs/x86-kernels.md) against TVM's own.

VNNI builds run in a child process: if ``vnni_operand_types`` did not apply, LLVM would abort the
test session.
Code is executed only where the host has every instruction it was compiled for
(:func:`tvm_ext.x86.isa.runs_on_host`); other CPUs are checked by compiling and reading the assembly.
"""
import subprocess
import sys

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.x86 import int8_conv as x86_int8
from tvm_ext.x86 import int8_policy
from tvm_ext.x86.isa import runs_on_host
from tvm_ext.x86.target import host_target

from ._int8_cases import (NON_VNNI_TARGETS, _conv_depthwise_conv, _kernel_names,
                          _layout_kernels, _narrow_blocks_graph, _requantize, _run, _runnable, needs_vnni)


def test_kernels_restores_tvm_functions_even_on_error():
    import tvm.topi.generic.conv2d as generic
    import tvm.topi.x86 as x86
    import tvm.topi.x86.conv2d_alter_op as alter_op
    import tvm.topi.x86.conv2d_avx_common as common
    import tvm.topi.x86.conv2d_int8 as conv2d_int8
    import tvm.topi.x86.depthwise_conv2d as depthwise
    import tvm.topi.x86.tensor_intrin as intrin

    def now():
        return (intrin.dot_16x1x16_uint8_int8_int32_cascadelake, common._schedule_conv_NCHWc_int8,
                depthwise._fallback_schedule, generic.fallback_schedule_cpu_1x1_int8,
                generic.fallback_schedule_cpu_common_int8, x86.schedule_pool, alter_op.conv2d_alter_int8_common,
                x86.conv2d_NCHWc_int8, conv2d_int8.conv2d_NCHWc_int8, x86.conv2d_transpose_nchw,
                x86.schedule_conv2d_transpose_nchw, x86.depthwise_conv2d_NCHWc, x86.schedule_depthwise_conv2d_NCHWc)

    before = now()
    with pytest.raises(RuntimeError):
        with x86_int8.kernels():
            with x86_int8.kernels():  # nested: still installed after the inner exit
                pass
            assert common._schedule_conv_NCHWc_int8 is not before[1]
            assert depthwise._fallback_schedule is not before[2]
            assert all(f is not g for f, g in zip(now()[3:], before[3:]))
            assert x86_int8.active()
            raise RuntimeError("boom")
    assert now() == before
    assert not x86_int8.active()


_CHILD = r"""
import sys, numpy as np, tvm
from tvm import relay
from tvm.contrib import graph_executor
sys.path.insert(0, sys.argv[1])
from x86._int8_cases import _conv_epilogue, _run
from tvm_ext.x86 import int8_conv as x86_int8
import tvm_ext
mod = _conv_epilogue(int(sys.argv[2]))
x = np.random.default_rng(1).integers(0, 256, (1, 64, 14, 14)).astype("uint8")
outs = {}
with x86_int8.kernels(schedule=False), tvm.transform.PassContext(opt_level=3):
    outs["tvm_schedule"] = _run(relay.build(mod, target="llvm -mcpu=x86-64-v4 -mattr=+avx512vnni"), x)
outs["tvm_ext"] = _run(tvm_ext.build(mod, target="llvm -mcpu=x86-64-v4 -mattr=+avx512vnni"), x)
conv = _conv_epilogue(int(sys.argv[2]), epilogue=False)  # int32 out: no float rounding to differ in
outs["conv_vnni"] = _run(tvm_ext.build(conv, target="llvm -mcpu=x86-64-v4 -mattr=+avx512vnni"), x)
with tvm.transform.PassContext(opt_level=3):  # exact reference: no int8 intrinsics at all
    outs["conv_generic"] = _run(relay.build(conv, target="llvm"), x)
np.savez(sys.argv[3], **outs)
print("OK")
"""


@needs_vnni
# [3]: the 3x3 conv through the same child's four builds; [1] checks the VNNI operand types in the default tier,
# and test_tile_chains.py::test_chained_tiles_are_exact runs 3x3 convs at AVX-512 VNNI against numpy and plain llvm
@pytest.mark.parametrize("k", [pytest.param(3, marks=pytest.mark.slow), 1])
def test_vnni_builds_and_is_exact(k, tmp_path):
    """``vnni_operand_types``: VNNI builds (no abort) and equals TVM's schedule and the
    intrinsic-free build."""
    import os

    out = tmp_path / "outs.npz"
    r = subprocess.run([sys.executable, "-c", _CHILD, os.path.dirname(os.path.dirname(__file__)), str(k), str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
    outs = np.load(out)
    assert np.array_equal(outs["tvm_ext"], outs["tvm_schedule"]), "per-row schedule changed results"
    assert np.array_equal(outs["conv_vnni"], outs["conv_generic"]), "VNNI must accumulate exactly"


def test_masked_path_saturates_in_stock_tvm_and_is_exact_in_tvm_ext():
    """Without VNNI, stock TVM's int16 pair sums saturate (VNNI, tested above, does not);
    tvm_ext.build at the same target computes the exact sum (:mod:`tvm_ext.x86.exact_int8`)."""
    masked = host_target()  # VNNI masked: vpmaddubsw + vpmaddwd at the host's vector width
    x = relay.var("x", shape=(1, 64, 4, 4), dtype="uint8")
    w = relay.const(np.full((16, 64, 1, 1), 127, "int8"))
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.nn.conv2d(x, w, channels=16, kernel_size=1,
                                                                      out_dtype="int32")))
    xs = np.full((1, 64, 4, 4), 255, "uint8")
    exact = 64 * 255 * 127
    with tvm.transform.PassContext(opt_level=3):
        got = _run(relay.build(mod, target=masked), xs)
    assert (got < exact).all(), "vpmaddubsw: 255*127*2 = 64770 saturates to 32767 per pair"
    assert (_run(tvm_ext.build(mod, target=masked), xs) == exact).all()


@pytest.mark.parametrize("target", [
    "llvm -mcpu=x86-64-v3",
    # AVX-512, with and without VNNI: TVM's rule already blocks the depthwise conv like its neighbours (no kernel
    # fewer). [llvm -mcpu=x86-64-v3] checks the int8 block in the default tier,
    # test_depthwise_int8_block_is_bit_identical[avx512] builds it at AVX-512 and
    # test_depthwise_taps.py::test_depthwise_in_a_model_keeps_its_kernel_count counts this graph's kernels against
    # TVM's at AVX-512 VNNI
    pytest.param("llvm -mcpu=x86-64-v4 -mattr=+avx512vnni", marks=pytest.mark.slow),
    pytest.param("llvm -mcpu=skylake-avx512", marks=pytest.mark.slow)])
def test_depthwise_int8_conv_takes_the_int8_conv_block(target):
    """Compiled only (``depthwise_int8_block``): no layout_transform kernel around an 8-bit
    depthwise conv; TVM's own rule puts two there on AVX2 (block 8 between convs blocked by 16),
    none on AVX-512."""
    mod = _conv_depthwise_conv()

    def names(**kw):
        with x86_int8.kernels(**kw), tvm.transform.PassContext(opt_level=3):
            return _kernel_names(relay.build(mod, target=target))

    ours, tvms = names(), names(schedule=False)
    # the only re-blockings left: into the first conv and out of the last one
    assert sum("layout_transform" in n for n in ours) == 2, ours
    avx2 = int8_policy.policy(tvm.target.Target(target)).vector_bits == 256
    assert len(tvms) - len(ours) == (2 if avx2 else 0), (tvms, ours)


def test_depthwise_block_leaves_float_convs_alone():
    mod = _conv_depthwise_conv(dtype="float32")
    with x86_int8.kernels(), tvm.transform.PassContext(opt_level=3):
        ours = relay.build(mod, target="llvm -mcpu=x86-64-v3")
    with tvm.transform.PassContext(opt_level=3):
        stock = relay.build(mod, target="llvm -mcpu=x86-64-v3")
    assert _kernel_names(ours) == _kernel_names(stock)
    assert ours.get_graph_json() == stock.get_graph_json()


@pytest.mark.parametrize("target", [_runnable(t) for t in NON_VNNI_TARGETS.values()], ids=list(NON_VNNI_TARGETS))
def test_depthwise_int8_block_is_bit_identical(target):
    mod = _conv_depthwise_conv(channels=48, size=10)
    x = np.random.default_rng(3).integers(0, 256, (1, 48, 10, 10)).astype("uint8")
    with x86_int8.kernels(schedule=False), tvm.transform.PassContext(opt_level=3):
        stock = relay.build(mod, target=target)
    with x86_int8.kernels(), tvm.transform.PassContext(opt_level=3):
        ours = relay.build(mod, target=target)
    assert np.array_equal(_run(ours, x), _run(stock, x))


def _int8_float_int8(seed=0, size=10, mid=24):
    """int8 conv (16 -> 48 channels) -> dequantize -> float conv (48 -> ``mid``) -> quantize -> int8
    conv (``mid`` -> 32): a float conv an int8 pipeline keeps in float, between int8 convs."""
    rng = np.random.default_rng(seed)
    x = relay.var("x", shape=(1, 16, size, size), dtype="uint8")

    def conv(y, cin, cout, dtype):
        w = rng.integers(-128, 128, (cout, cin, 1, 1)).astype(dtype)
        if dtype == "float32":
            w = w * np.float32(1e-2)
        return relay.nn.conv2d(y, relay.const(w), channels=cout, kernel_size=1,
                               out_dtype="int32" if dtype == "int8" else "float32")

    y = _requantize(conv(x, 16, 48, "int8"), 48, rng)
    y = relay.cast(y, "float32") * relay.const(np.float32(0.05))  # dequantize
    y = conv(y, 48, mid, "float32")
    y = relay.cast(relay.clip(relay.round(y), 0, 255), "uint8")  # quantize
    y = conv(y, mid, 32, "int8")
    return tvm.IRModule.from_expr(relay.Function([x], y))


@pytest.mark.parametrize("target,removed", [
    ("llvm -mcpu=x86-64-v3", 1), ("llvm -mcpu=x86-64-v4 -mattr=+avx512vnni", 2),
    # AVX-512 without VNNI: one re-blocking fewer, as at AVX2 ([llvm -mcpu=x86-64-v3-1] in the default tier)
    pytest.param("llvm -mcpu=x86-64-v4", 1, marks=pytest.mark.slow)])
def test_float_conv_in_an_int8_graph_takes_int8_blocks(target, removed):
    """Compiled only (``int8_graph_float_conv_blocks``): the float conv reads the int8 conv's
    NCHW16c output as it is; TVM's rule (and kernels() without int8_graph) re-blocks it to the
    float conv's input block first. On AVX-512 VNNI (``narrow_channel_blocks``) the int8 conv
    reads the float conv's 24 channels blocked by 8, which TVM's float rule writes blocked by 12
    (the largest divisor up to 16 lanes): with int8_graph the float conv writes them blocked by 8,
    a second re-blocking kernel fewer."""
    mod = _int8_float_int8()

    def names(**kw):
        with x86_int8.kernels(**kw), tvm.transform.PassContext(opt_level=3):
            return _kernel_names(relay.build(mod, target=target))

    ours, tvms = names(int8_graph=True), names()
    assert sum("layout_transform" in n for n in tvms) - sum("layout_transform" in n for n in ours) == removed
    float_conv = next(i for i, n in enumerate(ours) if "conv2d" in n and "round" in n)  # its quantize
    assert "conv2d" in ours[float_conv - 1], ours  # read straight from the int8 conv


def test_one_pixel_float_conv_takes_the_int8_output_block_on_avx2():
    """SE-block convs (one output pixel): on AVX2 the output block 12 (36 channels) is taken too,
    so neither side of the float conv is re-blocked; at 10x10 the output side keeps TVM's 6.
    (24 channels, as in PP-OCRv4 det, are blocked by 8 on AVX2: ``narrow_channel_blocks``.)"""
    def layouts(mod, **kw):
        with x86_int8.kernels(**kw), tvm.transform.PassContext(opt_level=3):
            return sum("layout_transform" in n for n in _kernel_names(relay.build(mod, target="llvm -mcpu=x86-64-v3")))

    one_pixel, ten = _int8_float_int8(size=1, mid=36), _int8_float_int8(size=10, mid=36)
    assert layouts(one_pixel) - layouts(one_pixel, int8_graph=True) == 2
    assert layouts(ten) - layouts(ten, int8_graph=True) == 1


# The default tier runs a diagonal, each size once and each class once ([1-avx512], [10-avx2]); the slow tier adds
# the one-pixel graph at AVX2 and the 10x10 one at AVX-512 (the same blocks at the other class)
@pytest.mark.parametrize("size, target", [
    pytest.param(size, target, id=f"{size}-{name}", marks=[*_runnable(target).marks, *(
        [] if (size, name) in {(1, "avx512"), (10, "avx2")} else [pytest.mark.slow])])
    for size in (1, 10) for name, target in NON_VNNI_TARGETS.items()])
def test_float_conv_int8_blocks_are_bit_identical(target, size):
    mod = _int8_float_int8(seed=1, size=size)
    x = np.random.default_rng(4).integers(0, 256, (1, 16, size, size)).astype("uint8")
    with x86_int8.kernels(schedule=False), tvm.transform.PassContext(opt_level=3):
        stock = relay.build(mod, target=target)
    with x86_int8.kernels(int8_graph=True), tvm.transform.PassContext(opt_level=3):
        ours = relay.build(mod, target=target)
    assert np.array_equal(_run(ours, x), _run(stock, x))


def test_int8_block():
    assert [x86_int8.int8_block(c) for c in (48, 24, 360, 40, 6, 42)] == [16, 12, 12, 8, None, None]
    # narrow_channel_blocks: on AVX2 no block wider than a register but the int8 conv block,
    # and on AVX-512 VNNI the same (an 8-lane vpdpbusd); elsewhere TVM's rule
    for target in ("llvm -mcpu=x86-64-v3", "llvm -mcpu=x86-64-v4 -mattr=+avx512vnni"):
        narrow = [x86_int8.int8_block(c, target) for c in (48, 24, 360, 40, 12, 36, 20, 6)]
        assert narrow == [16, 8, 8, 8, 12, 12, 4, None], target
    for target in ("llvm -mcpu=x86-64-v4", "llvm -mcpu=skylake-avx512", "llvm"):
        assert [x86_int8.int8_block(c, target) for c in (48, 24, 12)] == [16, 12, 12], target


@pytest.mark.parametrize("target", [
    "llvm -mcpu=x86-64-v3",
    # the whole graph at AVX-512 VNNI: [llvm -mcpu=x86-64-v3] checks it at AVX2 in the default tier, and there
    # test_vnni_int8_conv_takes_8_channel_blocks reads the 8-channel blocks' code at AVX-512 VNNI and
    # test_vnni_8_channel_blocks_are_bit_identical runs them against TVM's own build
    pytest.param("llvm -mcpu=x86-64-v4 -mattr=+avx512vnni", marks=pytest.mark.slow),
    # AVX-512 without VNNI, where nothing changes: test_int8_block checks that the class keeps TVM's blocks and
    # test_vnni_int8_conv_takes_8_channel_blocks that its 24-channel conv keeps TVM's padding
    pytest.param("llvm -mcpu=x86-64-v4", marks=pytest.mark.slow)])
def test_narrow_channel_blocks_on_avx2_and_vnni(target, monkeypatch):
    """``narrow_channel_blocks``, compiled for AVX2, AVX-512 VNNI and AVX-512. On AVX2 and VNNI the
    float conv's 24 output channels are read by the int8 conv blocked by 8, as the float conv writes
    them (TVM's int8 rule: 12, a re-blocking kernel), and the 24-channel int8 conv takes output block 8
    (neither padded to 32 nor sliced), so the SE conv reads the pool's NCHW8c output as it is:
    only the graph's input and output are re-blocked. On AVX-512 without VNNI nothing changes.
    Where the host runs the code: the same bits."""
    mod = _narrow_blocks_graph()
    # the 8-channel blocks alone: the wider 24-channel output block (vnni_24_lanes) re-blocks its readers and has
    # its own tests (test_vnni_24_lanes.py)
    blocks = int8_policy._NARROW_BLOCKS
    out_blocks = {isa: tuple(b for b in v if b <= 16) for isa, v in int8_policy._NARROW_OUT_BLOCKS.items()}

    def build(narrow=True, outputs=True):
        monkeypatch.setattr(int8_policy, "_NARROW_BLOCKS", blocks if narrow else {})
        monkeypatch.setattr(int8_policy, "_NARROW_OUT_BLOCKS", out_blocks if outputs else {})
        with x86_int8.kernels(int8_graph=True), tvm.transform.PassContext(opt_level=3):
            return relay.build(mod, target=target)

    tvm_blocks, ours = build(narrow=False, outputs=False), build()
    if int8_policy.policy(tvm.target.Target(target)).isa not in ("avx2", "avx512_vnni"):
        assert ours.get_graph_json() == tvm_blocks.get_graph_json()
        return
    blocks_only = build(outputs=False)
    names, tvm_names, in_only = _kernel_names(ours), _kernel_names(tvm_blocks), _kernel_names(blocks_only)
    # AVX2: the float conv writes 24 channels blocked by 8 (its lanes), TVM's int8 rule reads 12;
    # AVX-512 VNNI: both sides 12 with TVM's blocks, both 8 with narrow ones (the int8 conv's output
    # block 8 needs that)
    avx2 = int8_policy.policy(tvm.target.Target(target)).isa == "avx2"
    assert len(tvm_names) - len(in_only) == (1 if avx2 else 0), (tvm_names, in_only)
    assert _layout_kernels(names) == ["tvmgen_default_fused_layout_transform",
                                      "tvmgen_default_fused_layout_transform_1"], names
    assert len(tvm_names) - len(names) == (3 if avx2 else 2), (tvm_names, names)
    if runs_on_host(target):
        x = np.random.default_rng(5).integers(0, 256, (1, 32, 8, 8)).astype("uint8")
        want = _run(tvm_blocks, x)
        assert np.array_equal(_run(ours, x), want)
        assert np.array_equal(_run(blocks_only, x), want)


def test_build_blocks_float_convs_by_int8_rule_only_in_8bit_graphs():
    from tvm_ext.core.build import _has_8bit_tensors

    assert _has_8bit_tensors(_int8_float_int8())
    assert not _has_8bit_tensors(_conv_depthwise_conv(dtype="float32"))
    a, b = relay.var("a", shape=(1, 4), dtype="uint8"), relay.var("b", shape=(1, 3), dtype="uint8")
    ill_typed = tvm.IRModule.from_expr(relay.Function([a, b], a + b))
    assert not _has_8bit_tensors(ill_typed)  # says False; the build itself reports the type error


def _float_conv(k, cin, cout, size, stride, seed=0):
    """A float conv with a per-channel scale, bias and relu (what float models and the float convs
    of int8 pipelines compile)."""
    rng = np.random.default_rng(seed)
    x = relay.var("x", shape=(1, cin, size, size), dtype="float32")
    w = relay.const(rng.standard_normal((cout, cin, k, k)).astype("float32"))
    y = relay.nn.conv2d(x, w, strides=stride, padding=k // 2, channels=cout, kernel_size=k)
    y = relay.nn.relu(y * relay.const(rng.random((cout, 1, 1)).astype("float32"))
                      + relay.const(rng.random((cout, 1, 1)).astype("float32")))
    return tvm.IRModule.from_expr(relay.Function([x], y))


_FLOAT_CASES = [(3, 16, 32, 56, 1), (7, 3, 32, 64, 2), (1, 32, 32, 28, 1), (3, 8, 8, 13, 1)]


# The default tier runs the 3x3 conv, whose tile test_float_conv_register_tile_only_on_avx2 shows changed; the stem,
# the 1x1 conv and a prime width (the same tile rule on other shapes) are slow
@pytest.mark.parametrize("case", [pytest.param(case, id=name, marks=() if name == "3x3" else pytest.mark.slow)
                                  for case, name in zip(_FLOAT_CASES, ["3x3", "7x7-stem", "1x1", "prime-width"])])
@pytest.mark.skipif(not runs_on_host("llvm -mcpu=x86-64-v3"), reason="host lacks AVX2")
def test_float_conv_register_tile_is_bit_identical_on_avx2(case):
    """``fallback_register_tile``: untuned float convs on AVX2 take a tile that fits the 16 ymm
    registers; same bits."""
    k, cin, cout, size, stride = case
    mod = _float_conv(k, cin, cout, size, stride)
    xs = np.random.default_rng(1).standard_normal((1, cin, size, size)).astype("float32")
    outs = []
    for schedule in (False, True):
        with x86_int8.kernels(schedule=schedule), tvm.transform.PassContext(opt_level=3):
            outs.append(_run(relay.build(mod, target="llvm -mcpu=x86-64-v3"), xs))
    assert np.array_equal(outs[0], outs[1])


# The default tier: each kernel size once and each register file once ([3-llvm -mcpu=x86-64-v3-True],
# [1-llvm -mcpu=x86-64-v4-False]); the slow tier adds the other pairs, and AVX-512 VNNI, which has AVX-512's 32 zmm
# registers and no float instruction more
@pytest.mark.parametrize("k, target, changed", [
    pytest.param(k, target, changed, id=f"{k}-{target}-{changed}",
                 marks=() if (k, target) in {(3, "llvm -mcpu=x86-64-v3"), (1, "llvm -mcpu=x86-64-v4")}
                 else pytest.mark.slow)
    for k in (3, 1) for target, changed in (("llvm -mcpu=x86-64-v3", True),
                                            ("llvm -mcpu=x86-64-v4 -mattr=+avx512vnni", False),
                                            ("llvm -mcpu=x86-64-v4", False))])
def test_float_conv_register_tile_only_on_avx2(target, changed, k):
    """Compiled only: ``fallback_register_tile`` changes a float conv's code on AVX2 (TVM's fallback tile of 28
    pixels spills 16 ymm registers) and leaves AVX-512's (32 zmm) alone."""
    mod = _float_conv(k, 16, 32, 56, 1)

    def asm(schedule):
        with x86_int8.kernels(schedule=schedule), tvm.transform.PassContext(opt_level=3):
            return relay.build(mod, target=target).get_lib().get_source("asm")

    assert (asm(True) != asm(False)) == changed


def _depthwise(dtype, channels, size, k, seed=0):
    """A depthwise conv as mobile nets have them: 8-bit (QOperator's qnn.conv2d with a requantize)
    or float (with relu)."""
    rng = np.random.default_rng(seed)
    h, w = size
    x = relay.var("x", shape=(1, channels, h, w), dtype=dtype)
    if dtype == "uint8":
        wt = relay.const(rng.integers(-127, 128, (channels, 1, k, k)).astype("int8"))
        y = relay.qnn.op.conv2d(x, wt, relay.const(3), relay.const(0), relay.const(0.02), relay.const(0.01),
                                kernel_size=(k, k), channels=channels, groups=channels, padding=(k // 2, k // 2),
                                out_dtype="int32")
        y = relay.qnn.op.requantize(y, relay.const(0.0002), relay.const(0), relay.const(0.05), relay.const(5),
                                    out_dtype="uint8")
    else:
        wt = relay.const(rng.standard_normal((channels, 1, k, k)).astype("float32"))
        y = relay.nn.relu(relay.nn.conv2d(x, wt, kernel_size=(k, k), channels=channels, groups=channels,
                                          padding=(k // 2, k // 2)))
    return tvm.IRModule.from_expr(relay.Function([x], y))


def _depthwise_build(mod, target, register_tile, monkeypatch):
    """relay.build inside kernels(), with or without ``fallback_register_tile`` for depthwise convs."""
    with monkeypatch.context() as mp:
        if not register_tile:
            mp.setattr(x86_int8, "_depthwise_register_tile", lambda fallback: fallback)
        with x86_int8.kernels(), tvm.transform.PassContext(opt_level=3):
            return relay.build(mod, target=target)


_DEPTHWISE_CASES = [("uint8", 88, (3, 96), 5), ("float32", 64, (28, 28), 3), ("uint8", 24, (7, 7), 3)]


@pytest.mark.parametrize("case", [
    pytest.param(_DEPTHWISE_CASES[0], id="u8-5x5-wide"), pytest.param(_DEPTHWISE_CASES[1], id="f32-3x3"),
    # a 7-wide row, which the tile leaves as TVM's; [u8-5x5-wide] runs the 8-bit tile in the default tier
    pytest.param(_DEPTHWISE_CASES[2], id="u8-prime-width", marks=pytest.mark.slow)])
@pytest.mark.skipif(not runs_on_host("llvm -mcpu=x86-64-v3"), reason="host lacks AVX2")
def test_depthwise_register_tile_is_bit_identical_on_avx2(case, monkeypatch):
    """``fallback_register_tile``: untuned depthwise convs on AVX2 take a tile that fits the 16 ymm
    registers (TVM's fallback: 24 pixels of one vector each for a width of 96); same bits,
    different code."""
    dtype, channels, size, k = case
    mod = _depthwise(dtype, channels, size, k)
    rng = np.random.default_rng(1)
    shape = (1, channels, *size)
    x = rng.integers(0, 256, shape).astype("uint8") if dtype == "uint8" else rng.standard_normal(shape).astype(dtype)
    libs = [_depthwise_build(mod, "llvm -mcpu=x86-64-v3", tile, monkeypatch) for tile in (False, True)]
    outs = [_run(lib, x) for lib in libs]
    assert outs[0].tobytes() == outs[1].tobytes() and np.abs(outs[0]).max() > 0
    if size[1] > 12:  # a wide row: the fallback's tile spills, fallback_register_tile cuts it
        assert libs[0].get_lib().get_source("asm") != libs[1].get_lib().get_source("asm")


@pytest.mark.parametrize("target,changed", [
    ("llvm -mcpu=x86-64-v3", True),
    # another AVX2 CPU (test_isa.py::test_isa_class puts alderlake in x86-64-v3's class); [llvm -mcpu=x86-64-v3-True]
    # checks the class in the default tier
    pytest.param("llvm -mcpu=alderlake", True, marks=pytest.mark.slow),
    ("llvm -mcpu=x86-64-v4 -mattr=+avx512vnni", False),
    # AVX-512 without VNNI, the same 32 zmm registers as [llvm -mcpu=x86-64-v4 -mattr=+avx512vnni-False] (default tier)
    pytest.param("llvm -mcpu=skylake-avx512", False, marks=pytest.mark.slow)])
def test_depthwise_register_tile_only_on_avx2(target, changed, monkeypatch):
    """Compiled only: ``fallback_register_tile`` changes a depthwise conv's code on AVX2 and leaves
    AVX-512's alone."""
    mod = _depthwise("uint8", 88, (3, 96), 5)
    asm = [_depthwise_build(mod, target, tile, monkeypatch).get_lib().get_source("asm") for tile in (False, True)]
    assert (asm[0] != asm[1]) == changed


def _int8_conv_24(k, size=10, seed=3, cin=32):
    """uint8 x int8 conv ``cin`` -> 24 channels (x86 pads 24 to 32 and slices, unless the block is 8 or, on
    AVX-512 VNNI over more than 16 input channels, 24), with a requantize epilogue."""
    rng = np.random.default_rng(seed)
    x = relay.var("x", shape=(1, cin, size, size), dtype="uint8")
    w = relay.const(rng.integers(-128, 128, (24, cin, k, k)).astype("int8"))
    y = relay.nn.conv2d(x, w, padding=k // 2, channels=24, kernel_size=k, out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([x], _requantize(y, 24, rng)))


# The default tier runs a diagonal, each kernel size once and each schedule once ([True-3], [per_row-1]); the slow
# tier the 1x1 conv in the policy's schedule and the 3x3 conv in TVM's form
@pytest.mark.parametrize("schedule, k", [(True, 3), pytest.param(True, 1, marks=pytest.mark.slow),
                                         pytest.param("per_row", 3, marks=pytest.mark.slow), ("per_row", 1)])
def test_vnni_int8_conv_takes_8_channel_blocks(k, schedule):
    """``narrow_channel_blocks`` on AVX-512 VNNI, compiled only: at an AVX-512 VNNI target a 24-channel int8
    conv over 16 input channels (a short reduction: no 24-channel block) takes output block 8 and the ymm
    vpdpbusd (no slice kernel, no zmm vpdpbusd), in the policy's schedules and in TVM's form
    (``schedule="per_row"`` forces TVM's for 1x1 convs); AVX-512 without VNNI keeps the padding."""
    import re

    mod = _int8_conv_24(k, cin=16)

    def build(target, **kw):
        with x86_int8.kernels(**kw), tvm.transform.PassContext(opt_level=3):
            return relay.build(mod, target=target)

    ours = build("llvm -mcpu=x86-64-v4 -mattr=+avx512vnni", schedule=schedule)
    asm = ours.get_lib().get_source("asm")
    assert re.search(r"vpdpbusd\s+[^\n]*%ymm", asm), "8-lane VNNI expected"
    assert not re.search(r"vpdpbusd\s+[^\n]*%zmm", asm), "no 16-lane VNNI for an 8-channel block"
    assert not any("strided_slice" in n for n in _kernel_names(ours)), _kernel_names(ours)
    stock = build("llvm -mcpu=x86-64-v4 -mattr=+avx512vnni", schedule=False)
    assert any("strided_slice" in n for n in _kernel_names(stock)), "TVM pads 24 to 32 and slices"
    masked = build("llvm -mcpu=x86-64-v4", schedule=schedule)
    assert any("strided_slice" in n for n in _kernel_names(masked)), "no VNNI: TVM's padding stays"


_CHILD_NARROW = r"""
import sys, numpy as np, tvm
from tvm import relay
sys.path.insert(0, sys.argv[1])
from x86.test_int8_conv import _int8_conv_24, _run
from tvm_ext.x86 import int8_conv as x86_int8
outs = {}
for cin in (16, 32):
    x = np.random.default_rng(4).integers(0, 256, (1, cin, 10, 10)).astype("uint8")
    for k in (3, 1):
        mod = _int8_conv_24(k, cin=cin)
        for name, kw in (("stock", dict(schedule=False)), ("policy", dict()), ("forced", dict(schedule="per_row"))):
            with x86_int8.kernels(**kw), tvm.transform.PassContext(opt_level=3):
                lib = relay.build(mod, target="llvm -mcpu=x86-64-v4 -mattr=+avx512vnni")
            outs[f"{name}{k}-{cin}"] = _run(lib, x)
np.savez(sys.argv[2], **outs)
print("OK")
"""


@needs_vnni
def test_vnni_8_channel_blocks_are_bit_identical(tmp_path):
    """``narrow_channel_blocks`` executed (host with AVX-512 VNNI, child process): the 8-lane (16 input channels)
    and 24-lane (32) vpdpbusd builds equal TVM's own (padded, 16-lane) build bit for bit, 3x3 and 1x1,
    policy and TVM's form."""
    import os

    out = tmp_path / "outs.npz"
    r = subprocess.run([sys.executable, "-c", _CHILD_NARROW, os.path.dirname(os.path.dirname(__file__)), str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
    outs = np.load(out)
    for key in (f"{k}-{cin}" for k in (3, 1) for cin in (16, 32)):
        assert np.array_equal(outs[f"policy{key}"], outs[f"stock{key}"]), key
        assert np.array_equal(outs[f"forced{key}"], outs[f"stock{key}"]), key
