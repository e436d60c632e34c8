"""``tile_budget_1x1``: on AVX-512 VNNI the tile of a 1x1 int8 conv over at most
:data:`tvm_ext.x86.int8_policy.SHORT_REDUCTION` input channels fills at most :attr:`KernelPolicy.tile_accumulators_1x1`
accumulators, so that the epilogue LLVM unrolls into its loop fits the other registers; and a tile of
several output-channel blocks counts the data words it keeps live (``tile_oc_chunks``).

The policy; the tile rule; the compiled hot loop at Cascade Lake (compiled only, read with
llvm-mca): no spills in the short-reduction 1x1 convs that spilled with the 3x3 tiles' budget; on a
host with AVX-512 VNNI, executed in a child process against numpy's integer convolution (int32 out)
and a plain ``llvm`` build (requantized to uint8).
"""
import pytest

from tvm_ext.x86 import int8_policy, tile_rules
from tvm_ext.x86.target import build_target

from ._int8_cases import conv_case, needs_vnni, run_conv_cases


@pytest.mark.parametrize("target,budget", [("llvm -mcpu=cascadelake", 16), ("llvm -mcpu=znver4", 16),
                                           ("llvm -mcpu=x86-64-v3", 0), ("llvm -mcpu=x86-64-v4", 0)])
def test_policy_budget_per_class(target, budget):
    assert int8_policy.policy(target).tile_accumulators_1x1 == budget


def test_amx_targets_take_the_vnni_budget():
    spr = "llvm -mcpu=sapphirerapids"
    assert int8_policy.policy(build_target(spr, allow_amx=True)).tile_accumulators_1x1 == 16


@pytest.mark.parametrize("out_h,out_w,oc_chunks,groups,wanted,expected", [
    (2, 96, 2, 1, (1, 12), (2, 1, 8)),    # 2 blocks of 8 pixels: 16 accumulators + 8 words + 1 kernel <= 28
    (56, 56, 16, 1, (1, 28), (4, 1, 4)),  # ResNet-50's 56x56 tiles: 4 blocks x 4 pixels, as without the words
    (14, 14, 64, 1, (1, 14), (2, 1, 7)),  # and its 14x14 ones: 2 x 7
])
def test_tiles_of_several_blocks_count_their_data_words(out_h, out_w, oc_chunks, groups, wanted, expected):
    got = tile_rules.tile_chunks_shape(out_h, out_w, oc_chunks, groups, wanted, 4, 28)
    assert got == expected
    c, rows, cols = got
    assert rows * cols * (c * groups + (c > 1)) + (c - 1) * groups <= 28


@pytest.mark.parametrize("cin,cout,size,epilogue", [(16, 32, 12, False), (8, 24, 24, True), (16, 88, 24, True)],
                         ids=["16->32", "8->24-requantize", "16->88-requantize"])
def test_short_reduction_tiles_do_not_spill_at_cascadelake(cin, cout, size, epilogue):
    """Compiled for Cascade Lake (not run): with 28 accumulators these tiles' hot loops loaded and stored
    57, 56 and 38 values through the stack an iteration (the 16->32 loop at 27% of llvm-mca's peak);
    with the 1x1 budget none, and the 16->32 loop (no epilogue) reaches 75%."""
    from tvm_ext.core import pipelines
    from tvm_ext.tools import mca

    import tvm_ext

    try:
        mca.llvm_mca_path()
    except mca.McaError as err:
        pytest.skip(str(err))
    mod, _ = conv_case(1, cin, cout, size, 1, epilogue)
    factory = tvm_ext.build(mod, target=mca.cpu_model("cascadelake").target, passes=pipelines.int8())
    (kernel,) = mca.analyze_factory(factory, "cascadelake").kernels
    assert kernel.hot.stack_accesses == 0, kernel.hot.text
    assert kernel.hot.accumulators <= 16
    if not epilogue:
        assert kernel.share >= 0.75, (kernel.share, kernel.limit)


#: (k, in, out channels, size, stride, epilogue): 1x1 convs over 8-32 input channels (the reduction
#: unrolled whole, the epilogue in the tile loop), a 200->32 conv of two-block tiles, with and without
#: a requantize
_CASES = ((1, 8, 24, 24, 1, True), (1, 16, 88, 12, 1, True), (1, 16, 32, 12, 1, False), (1, 32, 64, 14, 1, True),
          (1, 200, 32, 14, 1, True), (1, 200, 32, 7, 1, False))


@needs_vnni
def test_budgeted_tiles_are_exact(tmp_path):
    """Executed on this host's AVX-512 VNNI (child process): int32 outputs equal numpy's integer
    convolution, requantized ones a plain ``llvm`` build's; no short reduction's hot loop holds more than
    16 accumulators."""
    outs = run_conv_cases(_CASES, tmp_path / "outs.npz")
    for i, case in enumerate(_CASES):
        if case[1] <= int8_policy.SHORT_REDUCTION:
            assert int(outs[f"acc-{i}"]) <= 16, (case, int(outs[f"acc-{i}"]))
