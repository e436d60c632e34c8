"""tvm_ext.x86.int8_conv: each named kernel change (see the module's design note) against TVM's own.

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
from tvm_ext.x86 import int8_policy, int8_schedules
from tvm_ext.x86.isa import llvm_features as _llvm_features
from tvm_ext.x86.isa import runs_on_host
from tvm_ext.x86.target import build_target, host_target

HOST_VNNI = int8_policy.vnni_ready(host_target(allow_vnni=True))
needs_vnni = pytest.mark.skipif(not HOST_VNNI, reason="host CPU has no AVX-512 VNNI")


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
                x86.schedule_conv2d_transpose_nchw)

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


def test_vnni_operand_types_only_where_llvm_needs_them():
    from tvm.target import codegen

    assert int8_policy.needs_operand_fix() == (codegen.llvm_version_major() >= 22)


def test_build_target_policy():
    masked = "llvm -mcpu=x86-64-v4"
    assert "avx512vnni" not in _llvm_features(build_target(masked)), "an explicit mask is kept"
    assert "avx512vnni" not in _llvm_features(build_target("llvm -mcpu=x86-64-v4 -mattr=+avx512vnni", allow_vnni=False))
    assert "avx512vnni" in _llvm_features(build_target("llvm -mcpu=x86-64-v4 -mattr=+avx512vnni")), "auto keeps VNNI"
    assert "avx512vnni" not in _llvm_features(build_target("llvm -mcpu=x86-64-v3")), "no VNNI to keep"
    assert build_target("cuda").kind.name == "cuda"


def _conv_epilogue(k, channels=64, size=14, seed=0, epilogue=True):
    """uint8 x int8 conv with a requantize-like float epilogue; weights span the full int8 range."""
    rng = np.random.default_rng(seed)
    x = relay.var("x", shape=(1, channels, size, size), dtype="uint8")
    w = relay.const(rng.integers(-128, 128, (channels, channels, k, k)).astype("int8"))
    y = relay.nn.conv2d(x, w, padding=k // 2, channels=channels, kernel_size=k, out_dtype="int32")
    if not epilogue:
        return tvm.IRModule.from_expr(relay.Function([x], y))
    y = relay.add(y, relay.const(rng.integers(-1000, 1000, (channels, 1, 1)).astype("int32")))
    y = relay.cast(y, "float32") * relay.const((rng.random((channels, 1, 1)) * 1e-3).astype("float32"))
    y = relay.cast(relay.clip(relay.cast(relay.floor(y + relay.const(0.5)), "int32"), 0, 255), "uint8")
    return tvm.IRModule.from_expr(relay.Function([x], y))


def _run(lib, x):
    from tvm.contrib import graph_executor

    m = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    m.set_input("x", x)
    m.run()
    return m.get_output(0).numpy()


#: One target per int8 instruction-set class without VNNI (executed only where the host can).
NON_VNNI_TARGETS = {
    "avx2": "llvm -mcpu=x86-64-v3",
    "avx512": "llvm -mcpu=x86-64-v4",
}


def _runnable(target):
    return pytest.param(target, marks=pytest.mark.skipif(
        not runs_on_host(target), reason=f"host lacks instructions of '{target}'"))


@pytest.mark.parametrize("target", [_runnable(t) for t in NON_VNNI_TARGETS.values()], ids=list(NON_VNNI_TARGETS))
@pytest.mark.parametrize("k", [3, 1])
def test_policy_conv_schedules_are_bit_identical_without_vnni(k, target):
    """The policy's int8 conv schedules without VNNI (AVX2: ``per_tile_accumulators``; AVX-512:
    ``epilogue_per_row`` for 3x3, per tile for 1x1): same bits as TVM's own schedule with the same
    dot product (``kernels(schedule=False)``: TVM's schedules, the exact dot of
    :mod:`tvm_ext.x86.exact_int8`)."""
    mod = _conv_epilogue(k)
    x = np.random.default_rng(1).integers(0, 256, (1, 64, 14, 14)).astype("uint8")
    outs = {}
    for schedule in (False, True):
        with x86_int8.kernels(schedule=schedule), tvm.transform.PassContext(opt_level=3):
            outs[schedule] = _run(relay.build(mod, target=target), x)
    assert np.array_equal(outs[False], outs[True])


_CHILD = r"""
import sys, numpy as np, tvm
from tvm import relay
from tvm.contrib import graph_executor
sys.path.insert(0, sys.argv[1])
from test_x86_int8 import _conv_epilogue, _run
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
@pytest.mark.parametrize("k", [3, 1])
def test_vnni_builds_and_is_exact(k, tmp_path):
    """``vnni_operand_types``: VNNI builds (no abort) and equals TVM's schedule and the
    intrinsic-free build."""
    import os

    out = tmp_path / "outs.npz"
    r = subprocess.run([sys.executable, "-c", _CHILD, os.path.dirname(__file__), str(k), str(out)],
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


@pytest.mark.parametrize("target,expected", [("llvm -mcpu=x86-64-v3", "per_tile"),
                                             ("llvm -mcpu=x86-64-v4", "per_row"),
                                             ("llvm -mcpu=core2", "tvm")])
def test_conv_schedule_follows_the_isa_policy(target, expected):
    """Compiled only: kernels() changes the 3x3 conv's code exactly where policy() says per-row
    (AVX-512) or per-tile (AVX2), and keeps TVM's where it says so (SSE)."""
    mod = _conv_epilogue(3)

    def asm(**kw):
        with x86_int8.kernels(**kw), tvm.transform.PassContext(opt_level=3):
            return relay.build(mod, target=target).get_lib().get_source("asm")

    chosen = int8_policy.policy(tvm.target.Target(target)).conv_schedule
    assert chosen == expected
    assert (asm(schedule=True) != asm(schedule=False)) == (chosen != "tvm")


@pytest.mark.parametrize("target", ["llvm -mcpu=x86-64-v3", "llvm -mcpu=x86-64-v4",
                                    "llvm -mcpu=x86-64-v4 -mattr=+avx512vnni", "llvm -mcpu=core2"])
def test_1x1_conv_schedule_follows_the_isa_policy(target):
    """Compiled only: 1x1 int8 convs are computed per register tile on AVX2 and AVX-512
    (``per_tile_accumulators``).
    30 pixels wide: TVM's fallback takes a whole row (30 accumulators on AVX-512, 60 on AVX2),
    more than either budget, so the tile differs from TVM's row block on both."""
    mod = _conv_epilogue(1, size=30)

    def asm(**kw):
        with x86_int8.kernels(**kw), tvm.transform.PassContext(opt_level=3):
            return relay.build(mod, target=target).get_lib().get_source("asm")

    chosen = int8_policy.policy(tvm.target.Target(target)).conv1x1_schedule
    assert chosen == ("tvm" if "core2" in target else "per_tile")
    # on a VNNI target schedule=False still swaps in the LLVM 22 intrinsic: compare the 1x1 per-tile
    # form with TVM's 1x1 form under the same intrinsic
    with x86_int8.kernels(schedule="per_row"), tvm.transform.PassContext(opt_level=3):
        tvm_form = relay.build(mod, target=target).get_lib().get_source("asm")  # per_row: TVM's 1x1 form
    assert (asm(schedule=True) != tvm_form) == (chosen == "per_tile")


@pytest.mark.parametrize("shape,groups,wanted,expected", [
    ((56, 56), 2, (1, 4), (1, 4)),    # a tuned tile that fits is kept
    ((56, 56), 2, (2, 56), (2, 2)),   # 224 accumulators: both rows kept, 2 pixels each (3 does not divide 56)
    ((28, 28), 2, (1, 28), (1, 4)),   # TVM's fallback (< 32 pixels): 4 pixels of one row
    ((7, 7), 1, (7, 7), (7, 1)),      # AVX-512 block: as many of the rows as fit, one pixel each
    ((14, 14), 1, (1, 14), (1, 14)),  # AVX-512: 14 accumulators fit 28
])
def test_1x1_tile_shape_fits_the_registers(shape, groups, wanted, expected):
    budget = 12 if groups == 2 else 28
    got = int8_schedules.tile_shape(shape[0], shape[1], groups, wanted, accumulators=budget)
    assert got == expected
    assert got[0] * got[1] * groups <= budget


@pytest.mark.parametrize("shape,oc_chunks,groups,wanted,max_chunks,expected", [
    ((56, 56), 16, 1, (1, 28), 1, (1, 1, 28)),  # one chunk: tile_shape's tile
    ((56, 56), 16, 1, (1, 28), 4, (4, 1, 4)),   # 4 vectors x 4 pixels: 8 loads for 16 products
    ((14, 14), 16, 1, (1, 14), 4, (2, 1, 7)),   # 4 chunks fit 2 pixels (0.75 loads per product); 2 fit 7 (0.64)
    ((7, 7), 16, 1, (7, 1), 4, (2, 7, 1)),      # 7 rows x 4 chunks do not fit 28 - 3; 7 x 2 do
    ((56, 56), 6, 1, (1, 28), 4, (3, 1, 8)),    # 4 does not divide 6 output-channel chunks: 3 does
    ((56, 56), 7, 1, (1, 28), 4, (1, 1, 28)),   # 7 chunks: no divisor up to 4 but 1
    ((28, 28), 16, 2, (1, 28), 4, (1, 1, 4)),   # AVX2 (2 registers per 16 channels, 12): 2 chunks tie, 1 kept
])
def test_1x1_tile_chunks_shape_loads_least_per_product(shape, oc_chunks, groups, wanted, max_chunks, expected):
    budget = 12 if groups == 2 else 28
    got = int8_schedules.tile_chunks_shape(shape[0], shape[1], oc_chunks, groups, wanted, max_chunks, budget)
    assert got == expected
    chunks, rows, cols = got
    assert oc_chunks % chunks == 0
    assert chunks * groups * rows * cols + (chunks - 1) * groups <= budget, "accumulators and kernel vectors fit"


@pytest.mark.parametrize("width,groups,wanted,expected", [
    (14, 2, 14, 2),   # TVM's fallback takes the whole row: 28 accumulators, AVX2 has 16 registers
    (56, 2, 28, 4),
    (7, 2, 7, 7),     # 7 is prime: the whole row, 14 accumulators (one pixel would be TVM's form)
    (13, 2, 13, 1),   # 13 is prime and 26 accumulators do not fit: one pixel per tile
    (112, 2, 7, 4),   # a tuned 7 that does not fit: the largest divisor that does
    (28, 2, 2, 2),    # a tuned width that fits is kept
    (14, 1, 14, 7),   # output block 8 on AVX2: one register per pixel
    (5, 2, 0, 5),     # no wish: the largest fitting divisor
])
def test_tile_width_fits_the_registers(width, groups, wanted, expected):
    assert int8_schedules.tile_width(width, groups, wanted, accumulators=12) == expected


#: (k, channels, size, stride, epilogue, input channels): the per-tile schedule's cases
_TILE_CASES = [
    (3, 64, 14, 1, True, None),    # tile of 2 pixels
    (3, 64, 13, 1, True, None),    # prime width: tiles of one pixel
    (3, 32, 28, 2, True, None),    # stride 2
    (3, 64, 14, 1, False, None),   # no epilogue: int32 out, the conv is the kernel's last stage
    (7, 16, 30, 2, True, 4),       # ResNet's stem: 4 input channels, 7x7, stride 2
    (1, 64, 14, 1, True, 32),      # 1x1 (the 1x1 per-tile form)
    (1, 32, 28, 2, True, 64),      # 1x1, stride 2 (ResNet's downsample)
    (1, 64, 13, 1, False, 32),     # 1x1, prime width, no epilogue
]


@pytest.mark.parametrize("target", [_runnable(t) for t in NON_VNNI_TARGETS.values()], ids=list(NON_VNNI_TARGETS))
@pytest.mark.parametrize("case", _TILE_CASES, ids=["3x3", "prime-width", "stride2", "no-epilogue", "stem",
                                                    "1x1", "1x1-stride2", "1x1-prime-no-epilogue"])
def test_per_tile_schedule_is_bit_identical(case, target):
    """``per_tile_accumulators`` (forced on every class here; the policy takes it on AVX2 and for
    1x1 convs on AVX-512): same bits as TVM's schedule."""
    k, channels, size, stride, epilogue, cin = case
    cin = cin or channels
    rng = np.random.default_rng(3)
    x = relay.var("x", shape=(1, cin, size, size), dtype="uint8")
    w = relay.const(rng.integers(-128, 128, (channels, cin, k, k)).astype("int8"))
    y = relay.nn.conv2d(x, w, strides=stride, padding=k // 2, channels=channels, kernel_size=k, out_dtype="int32")
    if epilogue:
        y = _requantize(relay.add(y, relay.const(rng.integers(-900, 900, (channels, 1, 1)).astype("int32"))),
                        channels, rng)
    mod = tvm.IRModule.from_expr(relay.Function([x], y))
    xs = rng.integers(0, 256, (1, cin, size, size)).astype("uint8")
    outs = {}
    for schedule in (False, "per_tile"):
        with x86_int8.kernels(schedule=schedule), tvm.transform.PassContext(opt_level=3):
            outs[schedule] = _run(relay.build(mod, target=target), xs)
    assert np.array_equal(outs[False], outs["per_tile"])


def _requantize(y, channels, rng):
    y = relay.cast(y, "float32") * relay.const((rng.random((channels, 1, 1)) * 1e-3).astype("float32"))
    return relay.cast(relay.clip(relay.cast(relay.floor(y + relay.const(0.5)), "int32"), 0, 255), "uint8")


def _conv_depthwise_conv(channels=32, size=14, dtype="uint8", seed=0):
    """1x1 conv -> 3x3 depthwise conv -> 1x1 conv on 8-bit data (a mobile net's block), or float."""
    rng = np.random.default_rng(seed)
    x = relay.var("x", shape=(1, channels, size, size), dtype=dtype)
    wdtype, acc = ("int8", "int32") if dtype == "uint8" else ("float32", "float32")

    def weight(shape):
        return relay.const(rng.integers(-128, 128, shape).astype(wdtype))

    def settle(y):
        return _requantize(y, channels, rng) if dtype == "uint8" else relay.nn.relu(y)

    y = settle(relay.nn.conv2d(x, weight((channels, channels, 1, 1)), channels=channels, kernel_size=1,
                               out_dtype=acc))
    y = settle(relay.nn.conv2d(y, weight((channels, 1, 3, 3)), channels=channels, kernel_size=3, padding=1,
                               groups=channels, out_dtype=acc))
    y = relay.nn.conv2d(y, weight((channels, channels, 1, 1)), channels=channels, kernel_size=1, out_dtype=acc)
    return tvm.IRModule.from_expr(relay.Function([x], y))


def _kernel_names(factory):
    import json

    nodes = json.loads(factory.get_graph_json())["nodes"]
    return [n["attrs"]["func_name"] for n in nodes if n["op"] == "tvm_op"]


@pytest.mark.parametrize("target", ["llvm -mcpu=x86-64-v3", "llvm -mcpu=x86-64-v4 -mattr=+avx512vnni",
                                    "llvm -mcpu=skylake-avx512"])
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


@pytest.mark.parametrize("target,removed", [("llvm -mcpu=x86-64-v3", 1), ("llvm -mcpu=x86-64-v4 -mattr=+avx512vnni", 2),
                                            ("llvm -mcpu=x86-64-v4", 1)])
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


@pytest.mark.parametrize("target", [_runnable(t) for t in NON_VNNI_TARGETS.values()], ids=list(NON_VNNI_TARGETS))
@pytest.mark.parametrize("size", [1, 10])
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


def _narrow_blocks_graph(seed=0, size=8):
    """The 24-channel tensors of PP-OCRv4 det's neck, in 8 bits: an int8 conv 32 -> 24 (3x3; x86
    pads its output channels to 32), a float SE block (global pool, one-pixel 24 -> 8 -> 24 convs,
    sigmoid gate), an int8 conv reading the gated 24 channels, a float conv 32 -> 24 and an int8
    conv reading its 24 channels."""
    rng = np.random.default_rng(seed)
    x = relay.var("x", shape=(1, 32, size, size), dtype="uint8")

    def conv(y, cin, cout, dtype, k=1):
        w = rng.integers(-128, 128, (cout, cin, k, k)).astype(dtype)
        if dtype == "float32":
            w = w * np.float32(1e-2)
        return relay.nn.conv2d(y, relay.const(w), channels=cout, kernel_size=k, padding=k // 2,
                               out_dtype="int32" if dtype == "int8" else "float32")

    def dequantize(y):
        return relay.cast(y, "float32") * relay.const(np.float32(0.05))

    def quantize(y):
        return relay.cast(relay.clip(relay.round(y), 0, 255), "uint8")

    a = dequantize(_requantize(conv(x, 32, 24, "int8", k=3), 24, rng))
    gate = relay.nn.relu(conv(relay.nn.global_avg_pool2d(a), 24, 8, "float32"))
    gate = relay.sigmoid(conv(gate, 8, 24, "float32"))
    b = _requantize(conv(quantize(a * gate * relay.const(np.float32(20.0))), 24, 32, "int8"), 32, rng)
    c = quantize(conv(dequantize(b), 32, 24, "float32"))
    return tvm.IRModule.from_expr(relay.Function([x], conv(c, 24, 32, "int8")))


def _layout_kernels(names):
    return [n for n in names if "layout_transform" in n or "strided_slice" in n]


@pytest.mark.parametrize("target", ["llvm -mcpu=x86-64-v3", "llvm -mcpu=x86-64-v4 -mattr=+avx512vnni",
                                    "llvm -mcpu=x86-64-v4"])
def test_narrow_channel_blocks_on_avx2_and_vnni(target, monkeypatch):
    """``narrow_channel_blocks``, compiled for AVX2, AVX-512 VNNI and AVX-512. On AVX2 and VNNI the
    float conv's 24 output channels are read by the int8 conv blocked by 8, as the float conv writes
    them (TVM's int8 rule: 12, a re-blocking kernel), and the 24-channel int8 conv takes output block 8
    (neither padded to 32 nor sliced), so the SE conv reads the pool's NCHW8c output as it is:
    only the graph's input and output are re-blocked. On AVX-512 without VNNI nothing changes.
    Where the host runs the code: the same bits."""
    mod = _narrow_blocks_graph()
    blocks, out_blocks = int8_policy._NARROW_BLOCKS, int8_policy._NARROW_OUT_BLOCKS

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


# -- global_pool_channel_vector: global pools vectorized over their channel block ----------------
def _blocked_global_pool(shape, dtype="uint8", out_dtype="float32"):
    """SE-style global pool over an NCHW[x]c tensor: cast -> multiply -> global_avg_pool2d."""
    x = relay.var("x", shape=shape, dtype=dtype)
    v = relay.multiply(relay.cast(x, "float32"), relay.const(0.0173, "float32"))
    y = relay.nn.global_avg_pool2d(v, layout=f"NCHW{shape[-1]}c")
    return tvm.IRModule.from_expr(relay.Function([x], relay.cast(relay.round(y), out_dtype)))


@pytest.mark.parametrize("target", ["llvm -mcpu=x86-64-v3", "llvm -mcpu=x86-64-v4 -mattr=+avx512vnni"])
def test_global_pool_is_vectorized_over_its_channel_block(target):
    """Compile-only: the pool's kernel adds a vector of 16 channels per window position with
    ``global_pool_channel_vector`` and none with TVM's schedule (strided scalar sums)."""
    mod = _blocked_global_pool((1, 6, 20, 20, 16))

    def source(schedule):
        with x86_int8.kernels(schedule=schedule), tvm.transform.PassContext(opt_level=3):
            lib = relay.build(mod, target=target)
        return lib.get_lib().get_source("ll")

    import re

    vector_adds = lambda ll: re.findall(r"fadd (?:fast )?<16 x float>", ll)  # noqa: E731
    scalar_adds = lambda ll: re.findall(r"fadd (?:fast )?float ", ll)  # noqa: E731
    ours, tvms = source(True), source(False)
    assert vector_adds(ours) and not scalar_adds(ours)
    assert scalar_adds(tvms) and not vector_adds(tvms)


@pytest.mark.parametrize("shape", [(1, 6, 20, 20, 16), (1, 3, 10, 10, 8), (1, 128, 7, 7, 16), (1, 2, 5, 5, 4)])
def test_global_pool_vectorized_is_bit_identical(shape):
    """Host target: the same bits as TVM's pool schedule (each channel sums the same positions in
    the same order)."""
    mod = _blocked_global_pool(shape, out_dtype="int32")
    x = np.random.default_rng(3).integers(0, 256, shape).astype("uint8")
    outs = []
    for schedule in (False, True):
        with x86_int8.kernels(schedule=schedule), tvm.transform.PassContext(opt_level=3):
            outs.append(_run(relay.build(mod, target=host_target()), x))
    np.testing.assert_array_equal(outs[1], outs[0])
    # and the float pool itself, before rounding
    x2 = relay.var("x", shape=shape, dtype="uint8")
    fmod = tvm.IRModule.from_expr(relay.Function([x2], relay.nn.global_avg_pool2d(
        relay.multiply(relay.cast(x2, "float32"), relay.const(0.0173, "float32")), layout=f"NCHW{shape[-1]}c")))
    fouts = []
    for schedule in (False, True):
        with x86_int8.kernels(schedule=schedule), tvm.transform.PassContext(opt_level=3):
            fouts.append(_run(relay.build(fmod, target=host_target()), x))
    assert fouts[1].tobytes() == fouts[0].tobytes()


def _pool_group(shape=(1, 16, 7, 7, 16)):
    """x -> f(x), f = fn(p: u8) {cast(round(global_avg_pool2d(cast(p, f32) * s) / t))} Primitive=1: the
    pool group FuseWideningIntoPool makes of a quantized model's global average pool."""
    x = relay.var("x", shape=shape, dtype="uint8")
    p = relay.var("p0", shape=shape, dtype="uint8")
    v = relay.multiply(relay.cast(p, "float32"), relay.const(np.float32(0.0204243)))
    y = relay.divide(relay.nn.global_avg_pool2d(v, layout=f"NCHW{shape[-1]}c"), relay.const(np.float32(0.00408715)))
    body = relay.cast(relay.clip(relay.round(y), 0.0, 255.0), "uint8")
    fn = relay.Function([p], body).with_attr("Primitive", tvm.tir.IntImm("int32", 1))
    return tvm.IRModule.from_expr(relay.Function([x], relay.Call(fn, [x])))


@pytest.mark.parametrize("target", ["llvm -mcpu=x86-64-v3", "llvm -mcpu=x86-64-v4 -mattr=+avx512vnni"])
def test_pool_keeps_a_summed_float_product_in_its_own_stage(target):
    """pool_prologue_inline inlines a pool's producers except a float product the pool's sum reads:
    inlined, LLVM fuses the multiply into the sum's add (vfmadd, one rounding where TVM's schedule
    rounds the product first), which made int8 ResNet-50 QOperator differ from stock TVM by one
    output step on rare inputs. Compile-only: no fused multiply-add in the pool kernel, as with
    TVM's schedule; the pool still adds vectors of its channel block."""
    import re

    def asm(schedule):
        with x86_int8.kernels(schedule=schedule), tvm.transform.PassContext(opt_level=3):
            return relay.build(_pool_group(), target=target).get_lib().get_source("asm")

    ours, tvms = asm(True), asm(False)
    assert not re.findall(r"vfn?madd\w*ps", tvms)
    assert not re.findall(r"vfn?madd\w*ps", ours)
    assert re.findall(r"vaddps\s+%[yz]mm", ours)


def test_pool_group_bit_identical_to_tvms_schedule():
    """Host target: the pool group built with tvm-ext's pool schedules gives TVM's bits."""
    mod = _pool_group()
    rng = np.random.default_rng(7)
    xs = [rng.integers(0, 256, (1, 16, 7, 7, 16)).astype("uint8") for _ in range(20)]
    outs = []
    for schedule in (False, True):
        with x86_int8.kernels(schedule=schedule), tvm.transform.PassContext(opt_level=3):
            lib = relay.build(mod, target=host_target())
        outs.append(np.stack([_run(lib, x) for x in xs]))
    np.testing.assert_array_equal(outs[1], outs[0])


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


@pytest.mark.parametrize("case", _FLOAT_CASES, ids=["3x3", "7x7-stem", "1x1", "prime-width"])
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


@pytest.mark.parametrize("target,changed", [("llvm -mcpu=x86-64-v3", True),
                                            ("llvm -mcpu=x86-64-v4 -mattr=+avx512vnni", False),
                                            ("llvm -mcpu=x86-64-v4", False)])
@pytest.mark.parametrize("k", [3, 1])
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


@pytest.mark.parametrize("case", _DEPTHWISE_CASES, ids=["u8-5x5-wide", "f32-3x3", "u8-prime-width"])
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


@pytest.mark.parametrize("target,changed", [("llvm -mcpu=x86-64-v3", True), ("llvm -mcpu=alderlake", True),
                                            ("llvm -mcpu=x86-64-v4 -mattr=+avx512vnni", False),
                                            ("llvm -mcpu=skylake-avx512", False)])
def test_depthwise_register_tile_only_on_avx2(target, changed, monkeypatch):
    """Compiled only: ``fallback_register_tile`` changes a depthwise conv's code on AVX2 and leaves
    AVX-512's alone."""
    mod = _depthwise("uint8", 88, (3, 96), 5)
    asm = [_depthwise_build(mod, target, tile, monkeypatch).get_lib().get_source("asm") for tile in (False, True)]
    assert (asm[0] != asm[1]) == changed


def _int8_conv_24(k, size=10, seed=3):
    """uint8 x int8 conv 32 -> 24 channels (x86 pads 24 to 32 and slices, unless the block is 8),
    with a requantize epilogue."""
    rng = np.random.default_rng(seed)
    x = relay.var("x", shape=(1, 32, size, size), dtype="uint8")
    w = relay.const(rng.integers(-128, 128, (24, 32, k, k)).astype("int8"))
    y = relay.nn.conv2d(x, w, padding=k // 2, channels=24, kernel_size=k, out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([x], _requantize(y, 24, rng)))


@pytest.mark.parametrize("k", [3, 1])
@pytest.mark.parametrize("schedule", [True, "per_row"])
def test_vnni_int8_conv_takes_8_channel_blocks(k, schedule):
    """``narrow_channel_blocks`` on AVX-512 VNNI, compiled only: at an AVX-512 VNNI target a 24-channel int8
    conv takes output block 8 and the ymm vpdpbusd (no slice kernel, no zmm vpdpbusd), in the
    policy's schedules and in TVM's form (``schedule="per_row"`` forces TVM's for 1x1 convs);
    AVX-512 without VNNI keeps the padding."""
    import re

    mod = _int8_conv_24(k)

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
from test_x86_int8 import _int8_conv_24, _run
from tvm_ext.x86 import int8_conv as x86_int8
outs = {}
x = np.random.default_rng(4).integers(0, 256, (1, 32, 10, 10)).astype("uint8")
for k in (3, 1):
    mod = _int8_conv_24(k)
    for name, kw in (("stock", dict(schedule=False)), ("policy", dict()), ("forced", dict(schedule="per_row"))):
        with x86_int8.kernels(**kw), tvm.transform.PassContext(opt_level=3):
            outs[f"{name}{k}"] = _run(relay.build(mod, target="llvm -mcpu=x86-64-v4 -mattr=+avx512vnni"), x)
np.savez(sys.argv[2], **outs)
print("OK")
"""


@needs_vnni
def test_vnni_8_channel_blocks_are_bit_identical(tmp_path):
    """``narrow_channel_blocks`` executed (host with AVX-512 VNNI, child process): the 8-lane vpdpbusd build equals
    TVM's own (padded, 16-lane) build bit for bit, 3x3 and 1x1, policy and TVM's form."""
    import os

    out = tmp_path / "outs.npz"
    r = subprocess.run([sys.executable, "-c", _CHILD_NARROW, os.path.dirname(__file__), str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
    outs = np.load(out)
    for k in (3, 1):
        assert np.array_equal(outs[f"policy{k}"], outs[f"stock{k}"]), k
        assert np.array_equal(outs[f"forced{k}"], outs[f"stock{k}"]), k


_VNNI_TARGET = "llvm -mcpu=x86-64-v4 -mattr=+avx512vnni"


def _conv1x1(cin=64, cout=256, size=28, epilogue=True, seed=5):
    """A uint8 x int8 1x1 conv (int32 out, or requantized to uint8) and its int8 weights."""
    rng = np.random.default_rng(seed)
    x = relay.var("x", shape=(1, cin, size, size), dtype="uint8")
    w = rng.integers(-128, 128, (cout, cin, 1, 1)).astype("int8")
    y = relay.nn.conv2d(x, relay.const(w), channels=cout, kernel_size=1, out_dtype="int32")
    if epilogue:
        y = _requantize(y, cout, rng)
    return tvm.IRModule.from_expr(relay.Function([x], y)), w


def _build_chunks(mod, chunks, target=_VNNI_TARGET):
    """``mod`` built with the policy's kernels, ``tile_oc_chunks`` set to ``chunks`` on AVX-512 VNNI."""
    saved = dict(int8_policy._TILE_OC_CHUNKS)
    int8_policy._TILE_OC_CHUNKS["avx512_vnni"] = chunks
    try:
        with x86_int8.kernels(), tvm.transform.PassContext(opt_level=3):
            return relay.build(mod, target=target)
    finally:
        int8_policy._TILE_OC_CHUNKS.clear()
        int8_policy._TILE_OC_CHUNKS.update(saved)


def _loads_per_vpdpbusd(asm: str) -> float:
    """Vector loads and broadcasts from memory (as separate instructions or as vpdpbusd's memory
    operand) per vpdpbusd in ``asm``."""
    import re

    dots = len(re.findall(r"\bvpdpbusd\b", asm))
    moves = "vpbroadcastd|vmovdqu64|vmovdqu32|vmovdqa64|vmovdqa32|vmovups|vmovaps"
    loads = len(re.findall(rf"\b(?:{moves})\s+-?\w*\(", asm))
    loads += len(re.findall(r"\bvpdpbusd\s+-?\w*\(", asm))
    return loads / dots


def test_1x1_tile_of_several_channel_chunks_loads_less_per_product():
    """``tile_oc_chunks`` compiled only at an AVX-512 VNNI target: with up to 4 output-channel
    chunks per tile, the 1x1 conv's kernel loads about half a vector per vpdpbusd (4 kernel vectors
    and 4 data words per 16 products), where one chunk per tile loads about one (28 pixels, 1 vector)."""
    mod, _ = _conv1x1()
    one = _loads_per_vpdpbusd(_build_chunks(mod, 1).get_lib().get_source("asm"))
    four = _loads_per_vpdpbusd(_build_chunks(mod, 4).get_lib().get_source("asm"))
    assert one > 0.9, one
    assert four < 0.65, four


#: (output, in channels, out channels, width): ResNet's 4 x 4-pixel and 7-row tiles, and 96 channels
#: (6 chunks: 4 does not divide them) at a prime width, int32 out and requantized
_CHUNK_CASES = (("int32", 64, 256, 28), ("int32", 256, 512, 7), ("int32", 64, 96, 13), ("uint8", 64, 96, 13))

_CHILD_CHUNKS = r"""
import sys, numpy as np
sys.path.insert(0, sys.argv[1])
from test_x86_int8 import _CHUNK_CASES, _build_chunks, _conv1x1, _run
outs = {}
for name, cin, cout, size in _CHUNK_CASES:
    mod, w = _conv1x1(cin, cout, size, epilogue=name == "uint8")
    x = np.random.default_rng(size).integers(0, 256, (1, cin, size, size)).astype("uint8")
    for chunks in (1, 2, 4):
        outs[f"{name}-{cin}-{cout}-{size}-{chunks}"] = _run(_build_chunks(mod, chunks), x)
    if name == "int32":  # exact integer arithmetic, independent of TVM
        ref = np.einsum("oc,chw->ohw", w[:, :, 0, 0].astype(np.int64), x[0].astype(np.int64))[None]
        outs[f"exact-{cin}-{cout}-{size}"] = ref
np.savez(sys.argv[2], **outs)
print("OK")
"""


@needs_vnni
def test_1x1_tile_of_several_channel_chunks_is_exact(tmp_path):
    """``tile_oc_chunks`` executed (host with AVX-512 VNNI, child process): 1x1 convs with 1, 2 and 4
    output-channel chunks per tile (:data:`_CHUNK_CASES`), full-range weights: int32 outputs equal
    numpy's integer products; requantized outputs are the same bits for every chunk count."""
    import os

    out = tmp_path / "outs.npz"
    r = subprocess.run([sys.executable, "-c", _CHILD_CHUNKS, os.path.dirname(__file__), str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
    outs = np.load(out)
    for name, cin, cout, size in _CHUNK_CASES:
        for chunks in (1, 2, 4):
            got = outs[f"{name}-{cin}-{cout}-{size}-{chunks}"]
            want = outs[f"exact-{cin}-{cout}-{size}"] if name == "int32" else outs[f"{name}-{cin}-{cout}-{size}-1"]
            assert np.array_equal(got, want), (name, cin, cout, size, chunks)
