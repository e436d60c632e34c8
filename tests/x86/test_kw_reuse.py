"""``fallback_kw_reuse``: on AVX-512 VNNI an untuned stride-1 int8 conv with ``kw`` > 1 unrolls ``kw`` and takes
the widest row tile whose accumulators, data words and kernel vectors fit the 32 registers, so that
neighbouring kernel columns share each broadcast data word (TVM's fallback: up to 31 pixels, one
broadcast per dot product).

The rule per width; the policy per class; the fallback config it writes; the compiled loop's broadcasts
and llvm-mca's share at Cascade Lake (compiled only); on a host with AVX-512 VNNI, executed in a child
process against numpy's integer convolution (int32 out) and a plain ``llvm`` build (requantized to uint8).
"""
import collections

import pytest

from tvm_ext.x86 import int8_policy, tile_rules

from ._int8_cases import fallback_config, needs_vnni, run_conv_cases


@pytest.mark.parametrize("width,kernel_w,fallback,expected", [
    (40, 3, 20, 10),    # YOLOv8n's 40x40 maps: 10 + 12 words + 1 kernel vector
    (80, 3, 20, 10),
    (56, 3, 28, 14),    # 14 + 16 + 1 = 31
    (64, 3, 16, 8),     # 16 does not fit (16 + 18 + 1)
    (13, 3, 13, 13),    # a prime width that fits whole
    (7, 3, 7, 7),       # narrower than 8, but TVM's tile is no wider
    (19, 3, 19, None),  # a prime width that does not fit: only 1 would
    (15, 3, 15, None),  # 5 pixels fit, under 8 and under TVM's 15
    (40, 5, 20, 10),    # 5x5: 10 + 14 + 1
    (20, 7, 20, 10),    # 7x7: 10 + 16 + 1
])
def test_kw_reuse_width(width, kernel_w, fallback, expected):
    got = tile_rules.kw_reuse_width(width, 1, kernel_w, 32, fallback)
    assert got == expected
    if got is not None:
        assert width % got == 0 and got + (got + kernel_w - 1) + 1 <= 32


def test_two_groups_per_pixel_take_half_the_pixels():
    assert tile_rules.kw_reuse_width(40, 2, 3, 32, 20) == 8  # 16 accumulators + 10 words + 2 kernel vectors


def test_only_vnni_reuses_words():
    for target, registers in (("llvm -mcpu=cascadelake", 32), ("llvm -mcpu=znver4", 32),
                              ("llvm -mcpu=sapphirerapids", 32), ("llvm -mcpu=x86-64-v3", 0),
                              ("llvm -mcpu=x86-64-v4", 0), ("llvm -mtriple=aarch64-linux-gnu", 0)):
        assert int8_policy.policy(target).kw_reuse_registers == registers, target


_Workload = collections.namedtuple("_Workload", "width padl padr kernel_w stride_w dilation_w out_filter",
                                   defaults=(64,))


def _fallback_config(target, wkl):
    from tvm_ext.x86 import int8_conv

    return fallback_config(int8_conv._int8_conv_kw_reuse, target, wkl)  # pylint: disable=protected-access


def test_fallback_config():
    stride1 = _Workload(40, 1, 1, 3, 1, 1)
    assert _fallback_config("llvm -mcpu=cascadelake", stride1) == (10, True)
    assert _fallback_config("llvm -mcpu=x86-64-v3", stride1) == (20, False)
    assert _fallback_config("llvm -mcpu=cascadelake", _Workload(80, 1, 1, 3, 2, 1)) == (20, False)  # stride 2
    assert _fallback_config("llvm -mcpu=cascadelake", _Workload(80, 2, 2, 3, 1, 2)) == (20, False)  # dilated
    assert _fallback_config("llvm -mcpu=cascadelake", _Workload(40, 0, 0, 1, 1, 1)) == (20, False)  # 1x1
    assert _fallback_config("llvm -mcpu=cascadelake", _Workload(19, 1, 1, 3, 1, 1)) == (19, False)


def _broadcasts_per_dot(hot) -> float:
    return sum(line.startswith("vpbroadcastd") for line in hot.body) / sum(hot.dots.values())


@pytest.mark.parametrize("cin,cout,size", [(64, 64, 40), (32, 32, 80)], ids=["40x40", "80x80"])
def test_untuned_conv_at_cascadelake(cin, cout, size):
    """Compiled for Cascade Lake (not run), as ``benchmarks/kernel_mca.py`` builds it: an untuned 3x3 conv of
    YOLOv8n's shapes broadcasts under one data word per 2 dot products and reaches >= 85% of llvm-mca's
    vpdpbusd peak (TVM's fallback tile: one broadcast per dot product, 72%)."""
    from tvm_ext.tools import mca

    try:
        mca.llvm_mca_path()
    except mca.McaError as err:
        pytest.skip(str(err))
    (kernel,) = mca.analyze(mca.single_conv(mca.ConvShape(cin, cout, size, 3, 1)), cpu="cascadelake").kernels
    assert _broadcasts_per_dot(kernel.hot) < 0.5, kernel.hot.text
    assert kernel.share >= 0.85, (kernel.share, kernel.mca.bound)


#: (k, in, out channels, size, stride, epilogue): 10-pixel tiles of 40-wide rows, 8-channel output blocks
#: (24 channels), a 5x5 kernel, a whole 13-wide row, 8-pixel tiles of 16-wide rows (with tile_chains' second
#: block), and a stride-2 conv of one output block that keeps TVM's tile
_CASES = ((3, 64, 64, 40, 1, False), (3, 96, 24, 20, 1, True), (5, 32, 32, 20, 1, True), (3, 32, 64, 13, 1, False),
          (3, 64, 64, 16, 1, True), (3, 32, 16, 20, 2, False))


@needs_vnni
def test_unrolled_tiles_are_exact(tmp_path):
    """Executed on this host's AVX-512 VNNI (child process): int32 outputs equal numpy's integer convolution,
    requantized ones a plain ``llvm`` build's; the stride-1 loops broadcast under one word per 2 dot
    products, the stride-2 one a word per dot product (TVM's tile)."""
    outs = run_conv_cases(_CASES, tmp_path / "outs.npz")
    for i, case in enumerate(_CASES):
        broadcasts = float(outs[f"bcast-{i}"])
        assert (broadcasts < 0.5) if case[4] == 1 else (broadcasts >= 0.9), (case, broadcasts)
