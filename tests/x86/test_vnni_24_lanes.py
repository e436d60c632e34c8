"""24-channel output blocks of int8 convs on AVX-512 VNNI (``vnni_24_lanes``): a zmm and a ymm ``vpdpbusd``
per pixel (tvm_ext.x86.int8_schedules.dot_u8s8_vnni(24)) where the reduction is long and there are pixels to
tile (tvm_ext.x86.tile_rules.wide_out_block), 8-channel blocks elsewhere; compiled everywhere, executed on
hosts with AVX-512 VNNI against numpy's integer convolution and a plain ``llvm`` build."""
import re

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.x86 import int8_policy, int8_schedules
from tvm_ext.x86.tile_rules import wide_out_block

from ._int8_cases import _kernel_names, conv_case, needs_vnni, run_conv_cases

VNNI = "llvm -mcpu=x86-64-v4 -mattr=+avx512vnni"


def test_dot_intrinsic_lanes():
    assert int8_schedules.dot_u8s8_vnni(24) is not None
    with pytest.raises(ValueError, match="lanes must be 8, 16 or 24"):
        int8_schedules.dot_u8s8_vnni(12)


@pytest.mark.parametrize("channels,pixels,expected", [
    (96, 80 * 80, True),   # PP-OCRv4 det's 3x3 96->24: 864 products per output
    (17, 4, True),
    (16, 160 * 160, False),  # a short reduction: the requantize bounds the tile, not the dots
    (96, 1, False),          # an SE conv on a pooled 1x1 map: no pixels to tile
])
def test_wide_out_block_rule(channels, pixels, expected):
    assert wide_out_block(channels, pixels, int8_policy.SHORT_REDUCTION) is expected


def test_only_vnni_has_the_block():
    assert 24 in int8_policy.policy(VNNI).int8_out_blocks
    for target in ("llvm -mcpu=x86-64-v3", "llvm -mcpu=x86-64-v4", "llvm"):
        assert 24 not in int8_policy.policy(target).int8_out_blocks, target
    # the input side keeps 8-channel blocks: a 24-channel tensor is read as 3 blocks of 8
    assert int8_policy.policy(VNNI).channel_blocks[:2] == (16, 8)


def _dots(asm):
    zmm = len(re.findall(r"vpdpbusd\s+[^\n]*%zmm", asm))
    ymm = len(re.findall(r"vpdpbusd\s+[^\n]*%ymm", asm))
    return zmm, ymm


def _conv_block(factory):
    """The channel block of the int8 conv's output (the last dim of the conv kernel's output shape)."""
    import json

    g = json.loads(factory.get_graph_json())
    shapes = g["attrs"]["shape"][1]
    blocks = {shapes[i][-1] for i, n in enumerate(g["nodes"]) if n["op"] == "tvm_op" and "conv2d" in
              n["attrs"]["func_name"]}
    assert len(blocks) == 1, blocks
    return blocks.pop()


# (k, in channels, out channels, size, stride) -> output block, zmm dots expected
@pytest.mark.parametrize("case,block,zmm", [
    ((3, 96, 24, 12, 1), 24, True),
    ((3, 96, 72, 10, 2), 24, True),
    ((1, 40, 24, 8, 1), 24, True),
    ((1, 16, 24, 8, 1), 8, False),   # short reduction
    ((1, 96, 24, 1, 1), 8, False),   # one output pixel
    ((3, 32, 48, 8, 1), 16, True),   # 16 divides: TVM's block
])
def test_block_and_instructions_compiled(case, block, zmm):
    """Compiled only (any host): which output block the int8 conv takes, and its dot instructions: the
    24-lane block computes each pixel with one zmm and one ymm ``vpdpbusd``; no channel is padded or
    sliced off."""
    k, cin, cout, size, stride = case
    mod, _ = conv_case(k, cin, cout, size, stride, epilogue=True)
    lib = tvm_ext.build(mod, target=VNNI, passes=pipelines.int8())
    assert _conv_block(lib) == block
    z, y = _dots(lib.get_lib().get_source("asm"))
    assert (z > 0) is zmm, (z, y)
    if block == 24:
        assert y > 0 and z == y, (z, y)
    assert not any("strided_slice" in n for n in _kernel_names(lib)), _kernel_names(lib)


def test_without_vnni_nothing_changes():
    mod, _ = conv_case(3, 96, 24, 12, 1, epilogue=True)
    lib = tvm_ext.build(mod, target="llvm -mcpu=x86-64-v4", passes=pipelines.int8())
    assert 24 not in {_conv_block(lib)}


_CASES = [
    (3, 96, 24, 12, 1, False), (3, 96, 24, 12, 1, True), (3, 96, 72, 10, 2, False),
    (3, 96, 72, 10, 2, True), (1, 40, 24, 9, 1, False), (1, 40, 24, 9, 1, True),
]


@needs_vnni
def test_exact_on_vnni(tmp_path):
    """Executed (host with AVX-512 VNNI, child process): int32 outputs equal numpy's integer convolution, and
    requantized ones a plain ``llvm`` build (no int8 SIMD). These shapes take the 24-lane block
    (test_block_and_instructions_compiled)."""
    outs = run_conv_cases(_CASES, tmp_path / "outs.npz")
    assert len([k for k in outs.files if k.startswith("got-")]) == len(_CASES)


def test_reader_of_the_block_is_exact_at_every_class():
    """A 24-channel block read by an elementwise op, a global pool and an 8-channel-block conv: the graph
    builds at the VNNI class with the block (compile only) and, at the host's class, equals a plain ``llvm``
    build."""
    from tvm.contrib import graph_executor

    from tvm_ext.x86.target import host_target

    rng = np.random.default_rng(7)
    x = relay.var("x", shape=(1, 96, 10, 10), dtype="uint8")

    def qconv(y, w, cin, cout, k):
        y = relay.qnn.op.conv2d(y, relay.const(w), relay.const(0), relay.const(0), relay.const(0.02),
                                relay.const(0.01), kernel_size=(k, k), channels=cout, padding=(k // 2, k // 2),
                                out_dtype="int32")
        return relay.qnn.op.requantize(y, relay.const(0.0002), relay.const(0), relay.const(0.05),
                                       relay.const(3), out_dtype="uint8")

    y = qconv(x, rng.integers(-128, 128, (24, 96, 3, 3)).astype("int8"), 96, 24, 3)
    pooled = relay.nn.global_avg_pool2d(relay.cast(y, "int32"))
    z = qconv(y, rng.integers(-128, 128, (16, 24, 1, 1)).astype("int8"), 24, 16, 1)
    out = relay.Tuple([relay.cast(z, "int32") + relay.const(1), pooled])
    mod = tvm.IRModule.from_expr(relay.Function([x], out))
    xv = rng.integers(0, 256, (1, 96, 10, 10)).astype("uint8")

    import json

    g = json.loads(tvm_ext.build(mod, target=VNNI, passes=pipelines.int8()).get_graph_json())
    assert [1, 1, 10, 10, 24] in g["attrs"]["shape"][1], "the 96->24 conv writes one 24-channel block"

    def run(factory):
        m = graph_executor.GraphModule(factory["default"](tvm.cpu()))
        m.set_input("x", xv)
        m.run()
        return [m.get_output(i).numpy() for i in range(2)]

    with tvm.transform.PassContext(opt_level=3):
        want = run(relay.build(mod, target="llvm"))
    got = run(tvm_ext.build(mod, target=host_target(allow_vnni=True), passes=pipelines.int8()))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
