"""``fallback_strided_chains``: on AVX-512 VNNI an untuned strided int8 conv takes a row tile of half the dot
chains' pixels (5), so that ``tile_chains`` computes it with two output-channel blocks sharing each broadcast
data word (TVM's fallback: up to 31 pixels of one block, one broadcast per dot product).

The rule per shape; the policy per class; the fallback config it writes; the compiled loop's broadcasts and
llvm-mca's share at Cascade Lake (compiled only); on a host with AVX-512 VNNI, executed in a child process
against numpy's integer convolution (int32 out) and a plain ``llvm`` build (requantized to uint8).
"""
import collections

import pytest

from tvm_ext.x86 import int8_policy, tile_rules

from ._int8_cases import fallback_config, needs_vnni, run_conv_cases


@pytest.mark.parametrize("width,groups,oc_chunks,fallback,expected", [
    (40, 1, 4, 20, 5),     # YOLOv8n's 3x3/2 convs: 5 pixels x 2 blocks = 10 chains
    (10, 1, 16, 10, 5),
    (20, 1, 3, 20, None),  # an odd number of blocks: 2 do not divide them
    (40, 1, 1, 20, None),  # one block: a 5-pixel tile would have 5 chains
    (7, 1, 32, 7, None),   # 5 does not divide the width
    (5, 1, 4, 5, None),    # TVM's tile is already 5 pixels
    (40, 2, 4, 20, None),  # two registers per pixel: 10 / 4 is not whole
])
def test_strided_chain_width(width, groups, oc_chunks, fallback, expected):
    assert tile_rules.strided_chain_width(width, groups, oc_chunks, 10, fallback) == expected


def test_only_vnni_takes_strided_chains():
    for target, expected in (("llvm -mcpu=cascadelake", True), ("llvm -mcpu=znver4", True),
                             ("llvm -mcpu=x86-64-v3", False), ("llvm -mcpu=x86-64-v4", False)):
        assert int8_policy.policy(target).strided_chain_tiles is expected, target


_Workload = collections.namedtuple("_Workload", "width padl padr kernel_w stride_w dilation_w out_filter")


def _fallback_config(target, wkl):
    from tvm_ext.x86 import int8_conv

    return fallback_config(int8_conv._int8_conv_strided_chains, target, wkl)  # pylint: disable=protected-access


def test_fallback_config():
    strided = _Workload(80, 1, 1, 3, 2, 1, 64)  # 40 output pixels, 4 blocks
    assert _fallback_config("llvm -mcpu=cascadelake", strided) == (5, False)
    assert _fallback_config("llvm -mcpu=x86-64-v3", strided) == (20, False)
    assert _fallback_config("llvm -mcpu=cascadelake", _Workload(40, 1, 1, 3, 1, 1, 64)) == (20, False)  # stride 1
    assert _fallback_config("llvm -mcpu=cascadelake", _Workload(80, 1, 1, 3, 2, 1, 16)) == (20, False)  # 1 block


@pytest.mark.parametrize("cin,cout,size", [(64, 64, 80), (128, 256, 20)], ids=["80x80", "20x20"])
def test_untuned_strided_conv_at_cascadelake(cin, cout, size):
    """Compiled for Cascade Lake (not run): an untuned 3x3/2 conv of YOLOv8n's shapes has 10 accumulators,
    broadcasts under 0.6 data words per dot product and reaches >= 85% of llvm-mca's vpdpbusd peak (TVM's
    fallback tile: one broadcast per dot product, 70-72%)."""
    from tvm_ext.tools import mca

    try:
        mca.llvm_mca_path()
    except mca.McaError as err:
        pytest.skip(str(err))
    (kernel,) = mca.analyze(mca.single_conv(mca.ConvShape(cin, cout, size, 3, 2)), cpu="cascadelake").kernels
    broadcasts = sum(line.startswith("vpbroadcastd") for line in kernel.hot.body) / sum(kernel.hot.dots.values())
    assert kernel.hot.accumulators >= 10 and broadcasts < 0.6, kernel.hot.text
    assert kernel.share >= 0.85, (kernel.share, kernel.mca.bound)


#: (k, in, out channels, size, stride, epilogue): YOLOv8n-like 3x3/2 convs of 2, 4 and 8 blocks, with and without
#: a requantize, a 5x5/2, and a 3x3/2 whose odd block count keeps TVM's tile
_CASES = ((3, 32, 64, 40, 2, False), (3, 64, 32, 20, 2, True), (3, 128, 128, 20, 2, True), (5, 32, 64, 20, 2, False),
          (3, 32, 48, 20, 2, False))


@needs_vnni
def test_strided_chain_tiles_are_exact(tmp_path):
    """Executed on this host's AVX-512 VNNI (child process): int32 outputs equal numpy's integer convolution,
    requantized ones a plain ``llvm`` build's; the tiles of two blocks hold 10 accumulators and broadcast under
    0.6 words per dot product, the odd one (3 blocks) broadcasts a word per dot product."""
    outs = run_conv_cases(_CASES, tmp_path / "outs.npz")
    for i, case in enumerate(_CASES):
        broadcasts = float(outs[f"bcast-{i}"])
        if case[2] // 16 % 2:
            assert broadcasts >= 0.9, (case, broadcasts)
        else:
            assert int(outs[f"acc-{i}"]) >= 10 and broadcasts < 0.6, (case, broadcasts, int(outs[f"acc-{i}"]))
