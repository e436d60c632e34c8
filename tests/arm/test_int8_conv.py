"""tvm_ext.arm.int8_conv: every int8 conv and dense at an aarch64 target multiplies 8-bit operands.

Compiled only (aarch64 code does not run here); tests/arm/test_aarch64_int8_policy.py runs the same
builds under qemu against exact integer arithmetic. The kernel report says what crosses between
kernels and which layouts the convs took; the assembly says which instructions they use.
"""
import collections
import re

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.target import codegen

import tvm_ext
from tvm_ext.arm import int8_conv, mmla_conv
from tvm_ext.testing.aarch64 import TARGETS

pytestmark = pytest.mark.skipif("aarch64" not in list(codegen.llvm_get_targets()),
                                reason="this TVM's LLVM has no AArch64 back end")

DOT = {"sdot", "udot", "usdot"}
MATRIX = {"smmla", "ummla", "usmmla"}


def _conv_requantize(channels, size=14):
    """uint8 x int8 3x3 conv (input zero point 77), bias, requantize to uint8: a quantized network's layer."""
    rng = np.random.default_rng(channels)
    x = relay.var("x", shape=(1, channels, size, size), dtype="uint8")
    w = relay.const(rng.integers(-127, 128, (32, channels, 3, 3)).astype("int8"))
    y = relay.qnn.op.conv2d(x, w, relay.const(77), relay.const(0), relay.const(0.02), relay.const(0.01),
                            kernel_size=(3, 3), channels=32, padding=(1, 1), out_dtype="int32")
    y = relay.nn.bias_add(y, relay.const(rng.integers(-1000, 1000, 32).astype("int32")))
    y = relay.qnn.op.requantize(y, relay.const(0.0002), relay.const(0), relay.const(0.05), relay.const(3),
                                out_dtype="uint8")
    return tvm.IRModule.from_expr(relay.Function([x], y))


def _dense_requantize(rows=2):
    rng = np.random.default_rng(5)
    x = relay.var("x", shape=(rows, 64), dtype="uint8")
    y = relay.qnn.op.dense(x, relay.const(rng.integers(-127, 128, (16, 64)).astype("int8")), relay.const(77),
                           relay.const(0), relay.const(0.02), relay.const(0.01), units=16, out_dtype="int32")
    y = relay.qnn.op.requantize(y, relay.const(0.0002), relay.const(0), relay.const(0.05), relay.const(3),
                                out_dtype="uint8")
    return tvm.IRModule.from_expr(relay.Function([x], y))


def _stock(mod, target):
    return tvm_ext.build(mod, target=target, kernels=False)


def _policy(mod, target):
    return tvm_ext.build(mod, target=target, kernels=True)


def _conv_mnemonics(factory, kernel="conv2d") -> collections.Counter:
    ops, inside = collections.Counter(), False
    for line in factory.get_lib().get_source("asm").splitlines():
        label = re.match(r"^([A-Za-z_][\w.$]*):", line)
        if label:
            inside = kernel in label.group(1)
            continue
        op = re.match(r"^\s+([a-z][a-z0-9.]*)\s", line)
        if op and inside:
            ops[op.group(1)] += 1
    return ops


def _kernel_names(factory) -> list:
    return [k.name for k in factory.kernel_report.kernels]


def _wide_inputs(factory) -> set:
    """dtypes wider than 8 bits that a conv or dense kernel reads from another kernel."""
    return {d for d in factory.kernel_report.crossing.count if d not in ("int8", "uint8")}


@pytest.mark.parametrize("make", [lambda: _conv_requantize(64), _dense_requantize], ids=["conv", "dense"])
def test_neon_only_keeps_8bit_operands(make):
    mod = make()
    stock, ours = _stock(mod, TARGETS["cortex-a72"]), _policy(mod, TARGETS["cortex-a72"])
    assert "int16" in _wide_inputs(stock), "TVM widens the operands to int16 without a dot product"
    assert not _wide_inputs(ours), f"8-bit operands cross: {ours.kernel_report.crossing.count}"


def test_neon_only_conv_multiplies_int8_with_widening_instructions():
    ops = _conv_mnemonics(_policy(_conv_requantize(64), TARGETS["cortex-a72"]))
    assert ops["smull"] or ops["smull2"], f"no int8 x int8 -> int16 multiply in the conv: {dict(ops)}"
    assert ops["saddlp"] or ops["sadalp"], f"no pairwise widening add in the conv: {dict(ops)}"
    assert not DOT & set(ops), "the library must run on a CPU without FEAT_DotProd"


@pytest.mark.parametrize("cpu, instructions", [
    ("neoverse-n1", DOT),
    # the 8-channel conv's smmla at +i8mm; [neoverse-n1] checks the few-channel NCHWc kernel, and
    # test_channel_counts_of_every_kind_build[neoverse-v1-20] a few-channel NCHWc conv at +i8mm, in the default tier
    pytest.param("neoverse-v1", MATRIX, marks=pytest.mark.slow)])
def test_few_channels_take_an_nchwc_int8_kernel(cpu, instructions):
    mod = _conv_requantize(8)  # below TVM's 64: the NCHW spatial pack and layout transforms otherwise
    stock, ours = _stock(mod, TARGETS[cpu]), _policy(mod, TARGETS[cpu])
    assert not any("NCHWc" in n for n in _kernel_names(stock)), _kernel_names(stock)
    assert any("conv2d_NCHWc" in n for n in _kernel_names(ours)), _kernel_names(ours)
    assert instructions & set(_conv_mnemonics(ours)), f"none of {instructions} in the 8-channel conv at {cpu}"


# The default tier: each channel count once and each class at least once; the slow tier every count at every class
@pytest.mark.parametrize("cpu, channels", [
    pytest.param(cpu, channels, id=f"{cpu}-{channels}", marks=() if (cpu, channels) in {
        ("cortex-a72", 3), ("neoverse-n1", 12), ("neoverse-v1", 20), ("cortex-a72", 68)} else pytest.mark.slow)
    for cpu in ("cortex-a72", "neoverse-n1", "neoverse-v1") for channels in (3, 12, 20, 68)])
def test_channel_counts_of_every_kind_build(cpu, channels):
    """Up to 4 input channels pad to 4; other counts to multiples of 8 (the kernel's channel blocks):
    12, 20 and 68 are multiples of 4 that no block of 8 divides."""
    names = _kernel_names(_policy(_conv_requantize(channels, size=8), TARGETS[cpu]))
    assert any("conv2d_NCHWc" in n for n in names), names


def test_tvms_rules_are_back_after_the_build_and_after_an_error():
    mod = _conv_requantize(8)
    names = _kernel_names(_stock(mod, TARGETS["neoverse-n1"]))
    with pytest.raises(RuntimeError):
        with int8_conv.kernels():
            with int8_conv.kernels():
                pass
            assert any("NCHWc" in n for n in _kernel_names(_stock(mod, TARGETS["neoverse-n1"])))
            raise RuntimeError("boom")
    assert _kernel_names(_stock(mod, TARGETS["neoverse-n1"])) == names


def test_x86_targets_untouched():
    mod = _conv_requantize(8)
    target = "llvm -mcpu=x86-64-v3"
    with int8_conv.kernels():
        inside = _kernel_names(_stock(mod, target))
    assert inside == _kernel_names(_stock(mod, target))


def _float_stem_then_int8():
    """relay.quantize's first layer kept in float (3 channels), quantized, max-pooled, then an int8 conv."""
    rng = np.random.default_rng(3)
    x = relay.var("x", shape=(1, 3, 32, 32), dtype="float32")
    y = relay.nn.conv2d(x, relay.const(rng.standard_normal((64, 3, 3, 3)).astype("float32")), padding=(1, 1),
                        channels=64, kernel_size=(3, 3))
    q = relay.cast(relay.clip(relay.round(relay.multiply(relay.nn.relu(y), relay.const(8.0))), 0, 127), "int8")
    q = relay.nn.max_pool2d(q, pool_size=(2, 2), strides=(2, 2))
    w = relay.const(rng.integers(-127, 128, (64, 64, 3, 3)).astype("int8"))
    z = relay.nn.conv2d(q, w, padding=(1, 1), channels=64, kernel_size=(3, 3), out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([x], z))


@pytest.mark.parametrize("cpu", [
    "neoverse-n1",
    # the float stem's NCHW8c at +i8mm; [neoverse-n1] checks the blocking in the default tier, and
    # test_aarch64_int8_policy.py::test_float_first_layer_within_tolerance_under_qemu[neoverse-v1] builds it at +i8mm
    pytest.param("neoverse-v1", marks=pytest.mark.slow)])
def test_float_first_layer_is_blocked_like_the_int8_convs_after_it(cpu):
    mod = _float_stem_then_int8()
    stock, ours = _stock(mod, TARGETS[cpu]), _policy(mod, TARGETS[cpu])
    def after_pool(names):
        return names[next(i for i, n in enumerate(names) if "max_pool2d" in n) + 1]

    assert after_pool(_kernel_names(stock)).endswith("fused_layout_transform"), _kernel_names(stock)
    assert "conv2d_NCHWc" in after_pool(_kernel_names(ours)), _kernel_names(ours)


def _busiest_block(factory, mnemonic, operands=False):
    """The basic block of the conv kernel with the most ``mnemonic``: Counter of its mnemonics (with
    ``operands``, loads also counted by register width: ``ldr q``, ``ldp d``, ...)."""
    blocks, current = collections.defaultdict(collections.Counter), None
    for line in factory.get_lib().get_source("asm").splitlines():
        label = re.match(r"^([A-Za-z_.][\w.$]*):", line)
        if label:
            current = label.group(1)
            continue
        op = re.match(r"^\s+([a-z][a-z0-9.]*)\s+([a-z]?)", line)
        if op and current:
            blocks[current][op.group(1)] += 1
            if operands and op.group(1) in ("ldr", "ldp"):
                blocks[current][f"{op.group(1)} {op.group(2)}"] += 1
    return max(blocks.values(), key=lambda ops: ops[mnemonic])


def test_i8mm_convs_multiply_8bit_matrices_and_tvm_does_not():
    mod = _conv_requantize(64)
    stock, ours = _stock(mod, TARGETS["neoverse-v1"]), _policy(mod, TARGETS["neoverse-v1"])
    assert not MATRIX & set(_conv_mnemonics(stock)), "TVM 0.19 uses i8mm only in its NHWC schedule"
    ops = _conv_mnemonics(ours)
    assert ops["smmla"] and not DOT & set(ops), f"int8 x int8 operands take smmla alone: {dict(ops)}"
    assert any("conv2d_NCHWc" in n for n in _kernel_names(ours)), _kernel_names(ours)


def test_i8mm_register_tile_reuses_its_loads():
    """4 pixel pairs x 4 channel pairs: 16 accumulators, 8 16-byte operand loads per 8 input channels (0.5
    per smmla). The block may also hold the tile's epilogue, which regroups the accumulators through
    64-bit stack halves (``ldr d``/``ldp d``, not counted here)."""
    block = _busiest_block(_policy(_conv_requantize(64, size=16), TARGETS["neoverse-v1"]), "smmla", operands=True)
    loads = block["ldr q"] + 2 * block["ldp q"] + block["ld1"]
    assert block["smmla"] >= 16, dict(block)
    assert loads <= 0.55 * block["smmla"], f"{loads} 16-byte loads for {block['smmla']} smmla: {dict(block)}"


def test_i8mm_stem_keeps_the_dot_product_kernel():
    """3 input channels pad to 4, fewer than one 8-channel row of the matrix instruction."""
    ops = _conv_mnemonics(_policy(_conv_requantize(3, size=8), TARGETS["neoverse-v1"]))
    assert DOT & set(ops) and not MATRIX & set(ops), dict(ops)


@pytest.mark.parametrize("size, instructions", [(1, DOT), (2, MATRIX)])
def test_i8mm_one_pixel_rows_keep_the_dot_product(size, instructions):
    """A one-pixel-wide output (a squeeze-excite conv on a pooled 1x1 map) builds at +i8mm and keeps
    the dot product: the matrix instruction pairs two pixels of a row, and takes rows of two or more."""
    ops = _conv_mnemonics(_policy(_conv_requantize(64, size=size), TARGETS["neoverse-v1"]))
    assert instructions & set(ops) and not ((DOT | MATRIX) - instructions) & set(ops), dict(ops)


@pytest.mark.parametrize("pairs, tile", [(28, 4), (14, 5), (4, 4), (7, 4), (1, 1), (2, 2), (3, 3), (9, 3),
                                         (12, 6)])
def test_register_tile_per_row(pairs, tile):
    """The cheapest tile per dispatch slot that fits the registers; on a near tie, the least padding."""
    assert mmla_conv.pixel_pairs(pairs) == tile


@pytest.mark.parametrize("chunks, kernel, unroll", [(16, 1, 4), (256, 1, 4), (8, 1, 1), (12, 1, 1), (32, 3, 1)])
def test_reduction_unroll(chunks, kernel, unroll):
    """1x1 convs with 16 or more input blocks (a multiple of 4) step by 4 blocks per loop iteration."""
    assert mmla_conv.reduction_unroll(chunks, kernel, kernel) == unroll


def test_wide_reduction_steps_by_four_blocks():
    """A 1x1 conv of 128 input channels at +i8mm, rows 28 wide (14 pixel pairs: 5-pair tiles): the
    hot loop holds 4 input blocks of 20 ``smmla``, where one block per iteration would leave 20."""
    from tvm_ext.tools.mca import ConvShape, _asm, single_conv

    factory = _policy(single_conv(ConvShape(128, 32, 28, 1)), TARGETS["neoverse-v1"])
    funcs = _asm.parse(factory.get_lib().get_source("asm"))
    hot = [_asm.hot_loop(k, funcs, names) for k, names in _asm.kernels(funcs).items() if "conv2d" in k]
    assert [h.dots for h in hot if h] == [{"smmla .4s": 80}], hot


@pytest.mark.parametrize("cpu, rows, instruction", [
    ("cortex-a72", 2, "smull"), ("neoverse-n1", 2, "sdot"), ("neoverse-v1", 2, "smmla"),
    # one data row at +i8mm takes the dot product: test_aarch64_int8_dense.py::test_uint8_weights_exact_under_qemu
    # [1-udot] checks that choice in the default tier
    pytest.param("neoverse-v1", 1, "sdot", marks=pytest.mark.slow)])
def test_int8_dense_instruction_per_class(cpu, rows, instruction):
    """TVM gives every class widening multiplies; the policy the 8-bit dot product or matrix multiply
    where the target has them (one data row: the dot product, a matrix product would be half padding)."""
    mod = _dense_requantize(rows)
    stock = _conv_mnemonics(_stock(mod, TARGETS[cpu]), "dense")
    ours = _conv_mnemonics(_policy(mod, TARGETS[cpu]), "dense")
    assert not (DOT | MATRIX) & set(stock), dict(stock)
    assert ours[instruction], f"no {instruction} in the dense at {cpu}: {dict(ours)}"
    assert not (DOT | MATRIX) - {instruction} & set(ours), dict(ours)


def _stem_pool_two_convs():
    """A 3-channel int8 stem and a max pool read by two 1x1 16-channel int8 convs (a residual block's branch
    and shortcut), summed: a dot-product conv, then matrix ones at V1."""
    rng = np.random.default_rng(7)

    def conv(y, cin, cout, k):
        w = relay.const(rng.integers(-127, 128, (cout, cin, k, k)).astype("int8"))
        y = relay.qnn.op.conv2d(y, w, relay.const(77), relay.const(0), relay.const(0.02), relay.const(0.01),
                                kernel_size=(k, k), channels=cout, padding=(k // 2, k // 2), out_dtype="int32")
        return relay.qnn.op.requantize(y, relay.const(0.0002), relay.const(0), relay.const(0.05), relay.const(77),
                                       out_dtype="uint8")

    x = relay.var("x", shape=(1, 3, 32, 32), dtype="uint8")
    pool = relay.nn.max_pool2d(conv(x, 3, 16, 3), pool_size=(2, 2), strides=(2, 2))
    y = relay.add(relay.cast(conv(pool, 16, 16, 1), "int32"), relay.cast(conv(pool, 16, 16, 1), "int32"))
    return tvm.IRModule.from_expr(relay.Function([x], y))


def test_i8mm_stem_writes_the_matrix_kernels_layout():
    """The stem's dot-product conv writes NCHW8c at +i8mm: no layout_transform kernel before the next conv,
    as many kernels and bytes as at +dotprod."""
    mod = _stem_pool_two_convs()
    v1, n1 = _policy(mod, TARGETS["neoverse-v1"]), _policy(mod, TARGETS["neoverse-n1"])
    inner = _kernel_names(v1)[:-1]  # the last kernel writes the graph's NCHW output
    assert not any(re.search(r"fused_layout_transform(_\d+)?$", n) for n in inner), _kernel_names(v1)
    assert len(_kernel_names(v1)) == len(_kernel_names(n1))
    assert v1.kernel_report.crossing.to_dict()["total_bytes"] <= n1.kernel_report.crossing.to_dict()["total_bytes"]
    assert MATRIX & set(_conv_mnemonics(v1)) and DOT & set(_conv_mnemonics(v1))


def _float_network():
    """Float convs with 3 and 16 input channels, and no 8-bit tensor anywhere."""
    rng = np.random.default_rng(4)
    x = relay.var("x", shape=(1, 3, 16, 16), dtype="float32")
    y = relay.nn.conv2d(x, relay.const(rng.standard_normal((16, 3, 3, 3)).astype("float32")), padding=(1, 1),
                        channels=16, kernel_size=(3, 3))
    y = relay.nn.conv2d(relay.nn.relu(y), relay.const(rng.standard_normal((16, 16, 3, 3)).astype("float32")),
                        padding=(1, 1), channels=16, kernel_size=(3, 3))
    return tvm.IRModule.from_expr(relay.Function([x], y))


@pytest.mark.parametrize("cpu", [
    "neoverse-n1",
    # the same rule at the +i8mm record; [neoverse-n1] checks it in the default tier
    pytest.param("neoverse-v1", marks=pytest.mark.slow)])
def test_float_network_keeps_tvms_convs(cpu):
    """Only an 8-bit graph's float first layer is blocked: a float network compiles as TVM compiles it."""
    mod = _float_network()
    assert _kernel_names(_policy(mod, TARGETS[cpu])) == _kernel_names(_stock(mod, TARGETS[cpu]))


def _qnn_conv_requantize(x, channels, out_channels, kernel, groups, seed):
    rng = np.random.default_rng(seed)
    w = relay.const(rng.integers(-127, 128, (out_channels, channels // groups, kernel, kernel)).astype("int8"))
    y = relay.qnn.op.conv2d(x, w, relay.const(3), relay.const(0), relay.const(0.02), relay.const(0.01),
                            kernel_size=(kernel, kernel), channels=out_channels, groups=groups,
                            padding=(kernel // 2, kernel // 2), out_dtype="int32")
    y = relay.nn.bias_add(y, relay.const(rng.integers(-1000, 1000, out_channels).astype("int32")))
    return relay.qnn.op.requantize(y, relay.const(0.0002), relay.const(0), relay.const(0.05), relay.const(3),
                                   out_dtype="uint8")


def _pointwise_depthwise_pointwise(channels=16, expanded=32, size=14):
    """A MobileNet block: 1x1 conv up, 3x3 depthwise conv, 1x1 conv down, each requantized to uint8."""
    x = relay.var("x", shape=(1, channels, size, size), dtype="uint8")
    y = _qnn_conv_requantize(x, channels, expanded, 1, 1, 1)
    y = _qnn_conv_requantize(y, expanded, expanded, 3, expanded, 2)
    y = _qnn_conv_requantize(y, expanded, channels, 1, 1, 3)
    return tvm.IRModule.from_expr(relay.Function([x], y))


@pytest.mark.parametrize("cpu", [
    # the block at NEON only and at +i8mm (NCHW8c); [neoverse-n1] checks the three convs and the count against stock
    # in the default tier, test_depthwise_block_follows_its_producer[neoverse-v1-32-8] the +i8mm block and
    # test_aarch64_int8_policy.py::test_qnn_depthwise_conv2d_exact_under_qemu[cortex-a72-16-strides0] the NEON-only one
    pytest.param("cortex-a72", marks=pytest.mark.slow), "neoverse-n1",
    pytest.param("neoverse-v1", marks=pytest.mark.slow)])
def test_depthwise_conv_is_blocked_like_its_pointwise_neighbours(cpu):
    """No layout_transform kernel between the three convs; at +dotprod and +i8mm no more kernels than stock
    (at NEON only stock's int16 convs stay NCHW, so the block's output needs one layout change more)."""
    from tvm_ext.core import pipelines

    mod = _pointwise_depthwise_pointwise()
    ours = _kernel_names(tvm_ext.build(mod, target=TARGETS[cpu], passes=pipelines.int8(), kernels=True))
    convs = [i for i, n in enumerate(ours) if "conv2d" in n]
    assert len(convs) == 3 and "depthwise_conv2d_NCHWc" in ours[convs[1]], ours
    between = ours[convs[0]:convs[-1] + 1]
    assert not [n for n in between if "layout_transform" in n], ours
    if cpu != "cortex-a72":
        stock = _kernel_names(_stock(mod, TARGETS[cpu]))
        assert len(ours) <= len(stock), (ours, stock)


def _altered(mod, cpu):
    """The policy build's graph as FuseOps receives it (layouts altered), as text."""
    seen = []

    @tvm.instrument.pass_instrument
    class BeforeFuse:
        def run_before_pass(self, mod_, info):
            if info.name == "FuseOps" and not seen:
                seen.append(mod_["main"].astext())

    _policy_instrumented = tvm_ext.build(mod, target=TARGETS[cpu], kernels=True, instruments=[BeforeFuse()])
    assert _policy_instrumented is not None and seen
    return seen[0]


@pytest.mark.parametrize("cpu, channels, block", [
    # 32 channels (whole blocks) at +dotprod; [neoverse-n1-12-4] checks NCHW4c at +dotprod in the default tier
    pytest.param("neoverse-n1", 32, 4, marks=pytest.mark.slow),
    ("neoverse-n1", 12, 4), ("neoverse-v1", 32, 8)])
def test_depthwise_block_follows_its_producer(cpu, channels, block):
    """The 1x1 conv's block: NCHW4c from the dot-product conv (12 channels: padded to 16, 3 of 4 blocks
    sliced), NCHW8c from the matrix-multiply conv."""
    x = relay.var("x", shape=(1, channels, 8, 8), dtype="uint8")
    y = _qnn_conv_requantize(x, channels, channels, 1, 1, 4)
    text = _altered(tvm.IRModule.from_expr(relay.Function([x], _qnn_conv_requantize(y, channels, channels, 3,
                                                                                     channels, 5))), cpu)
    assert f'data_layout="NCHW{block}c", kernel_layout="OIHW1i{block}o"' in text, text


@pytest.mark.parametrize("cpu", [
    # the same rule at the NEON-only and +i8mm records; [neoverse-n1] checks it in the default tier
    pytest.param("cortex-a72", marks=pytest.mark.slow), "neoverse-n1",
    pytest.param("neoverse-v1", marks=pytest.mark.slow)])
def test_depthwise_after_an_nchw_producer_keeps_tvms_layout(cpu):
    """Read from the graph's NCHW input (or a float conv), the depthwise conv stays NCHW: blocking it
    would only add a layout_transform kernel."""
    x = relay.var("x", shape=(1, 32, 8, 8), dtype="uint8")
    text = _altered(tvm.IRModule.from_expr(relay.Function([x], _qnn_conv_requantize(x, 32, 32, 3, 32, 4))), cpu)
    assert "contrib_depthwise_conv2d_NCHWc" not in text and "groups=32" in text, text


def _quantized_hard_swish(x):
    """x * clip(x + 3, 0, 6) / 6 on uint8 as PP-OCR's QDQ detector has it after QDQToInteger: each step
    dequantized, computed in float and quantized, the product as qnn.mul (23 elementwise ops on the
    data's path once canonicalized)."""
    s, z = relay.const(0.05), relay.const(3)

    def step(v, f):
        return relay.qnn.op.quantize(f(relay.qnn.op.dequantize(v, s, z)), s, z, out_dtype="uint8")

    plus3 = step(x, lambda d: relay.clip(relay.add(d, relay.const(3.0)), 0.0, 6.0))
    prod = relay.qnn.op.mul(x, plus3, s, z, s, z, s, z)
    return step(prod, lambda d: relay.divide(d, relay.const(6.0)))


def test_depthwise_follows_its_producer_through_a_long_quantized_epilogue():
    """Two quantized hard-swishes between the 1x1 conv and the depthwise conv: some 45 elementwise ops
    (PP-OCR's QDQ detector has some 50 between them)."""
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="uint8")
    y = _quantized_hard_swish(_quantized_hard_swish(_qnn_conv_requantize(x, 16, 32, 1, 1, 4)))
    text = _altered(tvm.IRModule.from_expr(relay.Function([x], _qnn_conv_requantize(y, 32, 32, 3, 32, 5))),
                    "neoverse-n1")
    assert 'data_layout="NCHW4c", kernel_layout="OIHW1i4o"' in text, text


def _squeeze_excite(mid, channels=16, size=8):
    """uint8 x -> 1x1 conv -> global average pool (int32) -> 1x1 conv to ``mid`` channels -> 1x1 conv back,
    each conv requantized to uint8: a squeeze-excite block's convs. At +i8mm the first conv takes the matrix
    multiply (NCHW8c), the two on the pooled one-pixel map the dot product; ``mid`` 2 and 12 are padded to 8
    and 16 output channels and sliced back (2 is re-padded to 4 input channels at the other classes)."""
    x = relay.var("x", shape=(1, channels, size, size), dtype="uint8")
    y = _qnn_conv_requantize(x, channels, channels, 1, 1, 11)
    y = relay.cast(relay.nn.global_avg_pool2d(relay.cast(y, "int32")), "uint8")
    y = _qnn_conv_requantize(y, channels, mid, 1, 1, 12)
    return tvm.IRModule.from_expr(relay.Function([x], _qnn_conv_requantize(y, mid, channels, 1, 1, 13)))


# Slow: adds the kernel count against +dotprod. In the default tier,
# test_aarch64_fold_channel_repad.py::test_squeeze_excite_block_exact_under_qemu[neoverse-v1-2-False] checks that a
# squeeze-excite block's convs share one block at +i8mm (no layout, slice or re-pad kernel between them), and
# test_i8mm_dot_product_conv_reads_its_producers_nchw8c this graph's reads
@pytest.mark.slow
@pytest.mark.parametrize("mid", [2, 12])
def test_i8mm_squeeze_excite_convs_share_one_channel_block(mid):
    """At +i8mm the dot-product convs after the pool read the NCHW8c that the matrix-multiply conv and the
    padded conv write: no layout_transform kernel and no slice/re-pad kernel between the convs, and no more
    kernels than at +dotprod (one block, NCHW4c, everywhere)."""
    from tvm_ext.core import pipelines

    mod = _squeeze_excite(mid)
    v1, n1 = (tvm_ext.build(mod, target=TARGETS[cpu], passes=pipelines.int8()).kernel_report.kernels
              for cpu in ("neoverse-v1", "neoverse-n1"))
    convs = [i for i, k in enumerate(v1) if any("conv2d" in op for op in k.ops)]
    assert len(convs) == 3, [k.ops for k in v1]
    between = [k.ops for k in v1[convs[0]:convs[-1] + 1]
               if {"layout_transform", "strided_slice", "nn.pad"} & set(k.ops)]
    assert not between, [k.ops for k in v1]
    assert len(v1) <= len(n1), ([k.ops for k in v1], [k.ops for k in n1])


def test_i8mm_dot_product_conv_reads_its_producers_nchw8c():
    """The conv after the pool reads NCHW8c with ``OIHW2i8o4i`` int8 weights (two groups of 4 input channels
    per dot product of an 8-channel block); after the padded conv, its 2 input channels are padded to 8."""
    text = _altered(_squeeze_excite(2), "neoverse-v1")
    reads = re.findall(r'contrib_conv2d_NCHWc\([^;]*?data_layout="(NCHW\d+c)", kernel_layout="(\w+)"', text)
    assert reads[1:] == [("NCHW8c", "OIHW2i8o4i")] * 2, text
