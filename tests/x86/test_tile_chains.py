"""``tile_chains``: on AVX-512 VNNI a 3x3/7x7 int8 conv whose row tile has fewer independent accumulators
than ``vpdpbusd``'s latency x throughput (:attr:`KernelPolicy.dot_chains`) is computed per tile of several
output-channel blocks.

The choice per shape; the compiled loop's accumulators and llvm-mca's share at Cascade Lake (compiled
only); on a host with AVX-512 VNNI, executed in a child process against numpy's integer convolution
(int32 out) and a plain ``llvm`` build (requantized to uint8).
"""
import pytest

from tvm_ext.x86 import int8_policy, tile_rules

from ._int8_cases import needs_vnni, run_conv_cases


@pytest.mark.parametrize("pixels,groups,oc_chunks,expected", [
    (7, 1, 32, 2),    # a 7-pixel row tile: 14 accumulators with 2 blocks
    (14, 1, 16, 1),   # 14 already
    (7, 1, 3, 3),     # 2 does not divide 3 blocks: 3 (21 accumulators)
    (5, 1, 8, 2),     # 10 with 2
    (3, 1, 8, 4),     # 12 with 4 (3 x 4 + 3 kernel vectors <= 28)
    (7, 1, 1, 1),     # one block: nothing to add
    (7, 1, 7, 1),     # 7 blocks: no divisor up to 4 but 1
    (1, 1, 16, 4),    # one pixel: as many as fit the policy's 4, still under 10
])
def test_tile_chains_choice(pixels, groups, oc_chunks, expected):
    got = tile_rules.tile_chains(pixels, groups, oc_chunks, chains=10, max_chunks=4, accumulators=28)
    assert got == expected
    assert oc_chunks % got == 0
    assert pixels * groups * got + (got - 1) * groups <= 28


def test_only_vnni_asks_for_chains():
    assert int8_policy.policy("llvm -mcpu=cascadelake").dot_chains == 10
    assert int8_policy.policy("llvm -mcpu=znver4").dot_chains == 10
    assert int8_policy.policy("llvm -mcpu=x86-64-v3").dot_chains == 0
    assert int8_policy.policy("llvm -mcpu=x86-64-v4").dot_chains == 0


@pytest.mark.parametrize("cin,cout,size,stride", [(128, 128, 28, 1), (512, 512, 7, 1), (256, 256, 28, 2)],
                         ids=["28x28", "7x7", "stride2"])
def test_chained_tile_at_cascadelake(cin, cout, size, stride):
    """Compiled for Cascade Lake (not run), as ``benchmarks/kernel_mca.py`` builds them (with the shipped
    records): ResNet-50's 3x3 convs whose tuned row tile is 7 pixels have >= 10 accumulators in their
    hot loop and >= 85% of llvm-mca's vpdpbusd peak (7 accumulators and 70% with one block per tile)."""
    from tvm_ext.tools import mca

    try:
        mca.llvm_mca_path()
    except mca.McaError as err:
        pytest.skip(str(err))
    (kernel,) = mca.analyze(mca.single_conv(mca.ConvShape(cin, cout, size, 3, stride)), cpu="cascadelake").kernels
    assert kernel.hot.accumulators >= 10, kernel.hot.text
    assert kernel.share >= 0.85, (kernel.share, kernel.mca.bound)


#: (k, in, out channels, size, stride, epilogue): 7-wide rows (2 blocks; 3 blocks for 48 channels), a
#: stride-2 7-wide output, 5-pixel rows of a 5x5 kernel, and a 13-wide row that needs none
_CASES = ((3, 64, 64, 7, 1, False), (3, 32, 48, 7, 1, True), (3, 32, 64, 14, 2, False), (5, 16, 32, 5, 1, True),
          (3, 64, 32, 13, 1, False))


@needs_vnni
def test_chained_tiles_are_exact(tmp_path):
    """Executed on this host's AVX-512 VNNI (child process): int32 outputs equal numpy's integer
    convolution, requantized ones a plain ``llvm`` build's; every case's loop holds >= 10 accumulators
    (the 13-wide one without extra blocks)."""
    outs = run_conv_cases(_CASES, tmp_path / "outs.npz")
    for i, case in enumerate(_CASES):
        assert int(outs[f"acc-{i}"]) >= 10, (case, int(outs[f"acc-{i}"]))
