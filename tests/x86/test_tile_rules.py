"""tvm_ext.x86.tile_rules: the register-tile sizes of the x86 int8 conv schedules, as pure functions of the conv's
shape, the wished tile and the register budget (the schedules that use them: test_int8_schedules.py)."""
import collections

import pytest

from tvm_ext.x86 import tile_rules


@pytest.mark.parametrize("shape,groups,wanted,expected", [
    ((56, 56), 2, (1, 4), (1, 4)),    # a tuned tile that fits is kept
    ((56, 56), 2, (2, 56), (2, 2)),   # 224 accumulators: both rows kept, 2 pixels each (3 does not divide 56)
    ((28, 28), 2, (1, 28), (1, 4)),   # TVM's fallback (< 32 pixels): 4 pixels of one row
    ((7, 7), 1, (7, 7), (7, 1)),      # AVX-512 block: as many of the rows as fit, one pixel each
    ((14, 14), 1, (1, 14), (1, 14)),  # AVX-512: 14 accumulators fit 28
])
def test_1x1_tile_shape_fits_the_registers(shape, groups, wanted, expected):
    budget = 12 if groups == 2 else 28
    got = tile_rules.tile_shape(shape[0], shape[1], groups, wanted, accumulators=budget)
    assert got == expected
    assert got[0] * got[1] * groups <= budget


@pytest.mark.parametrize("shape,oc_chunks,groups,wanted,max_chunks,expected", [
    ((56, 56), 16, 1, (1, 28), 1, (1, 1, 28)),  # one chunk: tile_shape's tile
    ((56, 56), 16, 1, (1, 28), 4, (4, 1, 4)),   # 4 vectors x 4 pixels: 8 loads for 16 products
    ((14, 14), 16, 1, (1, 14), 4, (2, 1, 7)),   # 4 chunks fit 2 pixels (0.75 loads per product); 2 fit 7 (0.64)
    ((7, 7), 16, 1, (7, 1), 4, (2, 7, 1)),      # 7 rows x 4 chunks do not fit 28 - 3; 7 x 2 do
    ((56, 56), 6, 1, (1, 28), 4, (3, 1, 4)),    # 4 does not divide 6 chunks: 3 x 4 pixels (3 x 8 + 8 words > 26)
    ((56, 56), 7, 1, (1, 28), 4, (1, 1, 28)),   # 7 chunks: no divisor up to 4 but 1
    ((28, 28), 16, 2, (1, 28), 4, (1, 1, 4)),   # AVX2 (2 registers per 16 channels, 12): 2 chunks tie, 1 kept
])
def test_1x1_tile_chunks_shape_loads_least_per_product(shape, oc_chunks, groups, wanted, max_chunks, expected):
    budget = 12 if groups == 2 else 28
    got = tile_rules.tile_chunks_shape(shape[0], shape[1], oc_chunks, groups, wanted, max_chunks, budget)
    assert got == expected
    chunks, rows, cols = got
    assert oc_chunks % chunks == 0
    words = rows * cols if chunks > 1 else 0  # live across the chunks
    assert chunks * groups * rows * cols + words + (chunks - 1) * groups <= budget, "accumulators, words, kernels fit"


@pytest.mark.parametrize("wanted,store_run,expected", [
    ((2, 1), 1, (4, 1, 4)),  # a record's 2 x 1 tile, tuned with one chunk: 4 chunks x 2 pixels load 0.75 per
    #                          product, a row of 4 pixels 0.5 (wide_1x1_tiles)
    ((2, 2), 1, (4, 2, 2)),  # 2 x 2 and 1 x 4 load alike: the record's tile is kept
    ((2, 2), 4, (4, 1, 4)),  # ... unless its stores narrow four at a time (narrow_by_packs): 4 adjacent pixels
    ((1, 4), 4, (4, 1, 4)),
])
def test_1x1_tiles_of_several_chunks_may_be_wider_than_the_record(wanted, store_run, expected):
    got = tile_rules.tile_chunks_shape(56, 56, 16, 1, wanted, 4, 28, store_run)
    assert got == expected
    assert tile_rules.tile_chunks_shape(56, 56, 16, 1, wanted, 1, 28, store_run)[0] == 1  # one chunk: the record's


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
    assert tile_rules.tile_width(width, groups, wanted, accumulators=12) == expected


@pytest.mark.parametrize("width,pixels,groups,expected", [
    (7, 7, 2, True),     # AVX2, ResNet's 7-wide rows: tile_width's whole row, 14 accumulators over 12
    (5, 5, 2, False),    # 10 accumulators fit: an ordinary tile
    (13, 1, 2, False),   # one pixel per tile (26 accumulators do not fit even with two more registers)
    (7, 7, 1, False),    # an 8-channel output block: 7 accumulators fit
    (14, 2, 2, False),   # a divisor of the width
])
def test_whole_row_over_budget_only_for_the_prime_width_exception(width, pixels, groups, expected):
    assert tile_rules.tile_width(width, groups, width, accumulators=12) == pixels
    assert tile_rules.whole_row_over_budget(width, pixels, groups, accumulators=12) is expected


@pytest.mark.parametrize("shape,groups,pixels,expected", [
    ((7, 7), 2, 1, (1, 7)),      # AVX2, ResNet's 7x7 maps: one pixel of 2 groups (1.5 loads per product) -> 7 (1.14)
    ((14, 14), 2, 4, None),      # 4 pixels of 2 groups (0.75) beat 7 in turn (1.14)
    ((13, 13), 2, 1, None),      # prime and wider than the budget: one pixel either way, all groups live
    ((7, 7), 1, 7, None),        # one group per pixel: nothing to take in turn
    ((7, 7), 4, 1, (1, 7)),      # a 32-channel block on AVX2: 4 groups of one pixel (1.25) -> 7 in turn
    ((5, 5), 2, 5, None),        # 5 pixels of 2 groups (0.7) beat 5 in turn (1.2)
])
def test_1x1_groups_in_turn_only_where_they_load_less(shape, groups, pixels, expected):
    got = tile_rules.groups_in_turn(shape[0], shape[1], groups, pixels, accumulators=12)
    assert got == expected
    if got:
        assert got[0] * got[1] <= 12 and shape[0] % got[0] == 0 and shape[1] % got[1] == 0


_Workload = collections.namedtuple("_Workload", "height width padt padb padl padr kernel_h kernel_w stride_h stride_w "
                                                "dilation_h dilation_w")


@pytest.mark.parametrize("wkl,expected", [
    (_Workload(56, 56, 1, 1, 1, 1, 3, 3, 1, 1, 1, 1), (56, 56)),   # 3x3, padded
    (_Workload(56, 56, 0, 1, 0, 1, 3, 3, 2, 2, 1, 1), (28, 28)),   # stride 2, padded at the end only
    (_Workload(20, 30, 2, 2, 2, 2, 3, 3, 1, 1, 2, 2), (20, 30)),   # dilation 2: a 5x5 footprint
    (_Workload(7, 9, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1), (7, 9)),       # 1x1
])
def test_output_size_of_a_workload(wkl, expected):
    assert tile_rules.output_size(wkl) == expected
    assert tile_rules.output_pixels(wkl) == expected[0] * expected[1]
