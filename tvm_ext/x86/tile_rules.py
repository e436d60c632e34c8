"""Register-tile sizes of tvm-ext's x86 int8 conv schedules (:mod:`tvm_ext.x86.int8_schedules`): how many
output pixels, rows, output-channel chunks and accumulator groups a tile takes so that its accumulators fit
the vector registers and it loads few values per product. Pure functions of the conv's shape, the
configured wish and the register budget (:mod:`tvm_ext.x86.int8_policy`); docs/x86-kernels.md has the
measurements behind each rule; :func:`rows_first` orders the tiles' parallel loop and :func:`weights_once_rows`
their reduction.
"""
from __future__ import annotations

__all__ = ["tile_width", "tile_shape", "tile_chunks_shape", "tile_chains", "whole_row_over_budget", "groups_in_turn",
           "kw_reuse_width", "strided_chain_width", "rows_first", "weights_once_rows",
           "pass_blocks", "wide_out_block", "output_width", "output_size",
           "output_pixels"]


def tile_chains(pixels: int, groups: int, oc_chunks: int, chains: int, max_chunks: int, accumulators: int) -> int:
    """Output-channel blocks per 3x3/7x7 tile of ``pixels`` x ``groups`` accumulators (``tile_chains``):
    1 when the tile already has ``chains`` independent accumulators, else the fewest blocks (dividing
    ``oc_chunks``, up to ``max_chunks``) that give it that many and still fit ``accumulators`` (each
    block beyond the first holds its kernel vectors: ``groups`` registers), else the most that fit::

        # pixels * groups * C >= chains  and  pixels * groups * C + (C - 1) * groups <= accumulators
    """
    if pixels * groups >= chains:
        return 1
    best = 1
    for c in range(2, max(1, max_chunks) + 1):
        if oc_chunks % c:
            continue
        if pixels * groups * c + (c - 1) * groups > accumulators:
            break
        best = c
        if pixels * groups * c >= chains:
            break
    return best


def kw_reuse_width(out_width: int, groups: int, kernel_w: int, registers: int, fallback_width: int,
                   least: int = 8):
    """Output pixels per row tile of an untuned stride-1 conv computed with ``kw`` unrolled
    (``fallback_kw_reuse``), or None where TVM's fallback tile of ``fallback_width`` pixels stays.

    Unrolled over ``kw``, the tile's ``kernel_w`` kernel columns read the data words of pixels
    ``x .. x + kernel_w - 1``: one broadcast word per pixel serves ``kernel_w`` dot products once the
    tile's ``pixels + kernel_w - 1`` words stay in registers beside its accumulators and the kernel
    vectors of one column. The widest tile (a divisor of the width) that fits ``registers``::

        # pixels * groups + (pixels + kernel_w - 1) + groups <= registers

    A tile narrower than ``least`` pixels and than TVM's own (a width whose divisors that fit are
    all small, e.g. a prime) keeps TVM's tile without the unroll.
    """
    most = (registers - kernel_w + 1 - groups) // (groups + 1)
    if most < 1:
        return None
    pixels = _largest_divisor(out_width, most)
    return pixels if pixels >= min(least, fallback_width) else None


def strided_chain_width(out_width: int, groups: int, oc_chunks: int, chains: int, fallback_width: int):
    """Output pixels per row tile of an untuned strided conv (``fallback_strided_chains``), or None where
    TVM's fallback tile of ``fallback_width`` pixels stays.

    A strided tile cannot share data words across kernel columns (its ``kw`` columns read every other
    word), but :func:`tile_chains` shares each word across output-channel blocks: a tile of half the
    dot chains' pixels takes two blocks, ``chains`` accumulators, and loads a word per 2 dot products
    where TVM's tile loads one per product::

        # P * groups * 2 == chains,  P divides out_width,  2 divides oc_chunks,  P < TVM's tile
    """
    pixels, rest = divmod(chains, 2 * groups)
    if rest or not pixels or out_width % pixels or oc_chunks % 2 or pixels >= fallback_width:
        return None
    return pixels


def _largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of ``n`` not above ``at_most`` (at least 1)."""
    return next(d for d in range(max(1, min(at_most, n)), 0, -1) if n % d == 0)


def tile_width(out_width: int, groups: int, wanted: int, accumulators: int) -> int:
    """Output pixels per tile of the per-tile schedule (``per_tile_accumulators``).

    ``groups`` accumulator registers per pixel (output block / int32 lanes); ``wanted`` is the
    config's ``tile_ow`` (tuned or TVM's fallback, which takes the largest divisor of the width up
    to 31: 28 pixels x 2 registers on AVX2, far more than its 16 registers). Returns ``wanted``
    when its accumulators fit, else the largest divisor of ``out_width`` whose accumulators fit;
    when that is one pixel (a prime width such as ResNet's 7), the whole row if its accumulators
    fit two more registers (on AVX2 all 16 but the kernel vector and the data word: measured
    0.84-0.91x TVM's time for ResNet-50's 7x7-output convs, where one pixel per tile is TVM's form).
    """
    fit = max(1, accumulators // max(1, groups))
    if 1 <= wanted <= fit and out_width % wanted == 0:
        return wanted
    best = _largest_divisor(out_width, fit)
    if best == 1 and out_width * groups <= accumulators + 2:
        return out_width
    return best


def whole_row_over_budget(out_width: int, pixels: int, groups: int, accumulators: int) -> bool:
    """The tile is :func:`tile_width`'s whole row of a prime width whose accumulators exceed the budget
    (ResNet's 7-wide rows on AVX2: 14 of 16 registers). At stride 1 such a tile gets kw unrolled, so the
    three kw positions share data words: 0.81-0.87x the time of the rolled form for 3x3 7-wide convs
    of 64-512 channels in int16 pairs, 0.99x with vpmaddubsw (docs/x86-kernels.md)::

        # pixels == out_width and out_width * groups > accumulators  ->  unroll_kw (stride 1)
    """
    return pixels == out_width and out_width * groups > accumulators


def tile_shape(out_height: int, out_width: int, groups: int, wanted: tuple, accumulators: int) -> tuple:
    """``(rows, pixels per row)`` of a 1x1 conv's tile (``per_tile_accumulators``): the config's ``(tile_oh, tile_ow)``
    when its accumulators fit, else as many of its rows as fit (dividing the height) and the
    widest divisor of the width that fits beside them."""
    rows, cols = wanted
    if rows * cols * groups <= accumulators and out_height % rows == 0 and out_width % cols == 0:
        return rows, cols
    fit = max(1, accumulators // max(1, groups))
    rows = _largest_divisor(out_height, min(rows, fit))
    cols = _largest_divisor(out_width, fit // rows)
    return rows, cols


def groups_in_turn(out_height: int, out_width: int, groups: int, pixels: int, accumulators: int):
    """``(rows, pixels per row)`` of a 1x1 conv tile that computes its ``groups`` accumulator registers per
    pixel one group at a time, when that loads fewer values per product than a tile of ``pixels`` pixels
    with every group live (:func:`tile_chunks_shape`); else None.

    A tile of R pixels with all G groups live loads G kernel vectors and R data words for G x R
    products; taking the groups in turn, a tile of R' pixels loads 1 and R' for R' (its data words
    again for each group), and R' may use every accumulator. It wins where the width leaves few
    pixels per tile: ResNet's 7x7 maps on AVX2 (16 channels, 2 registers per pixel) go from one
    pixel (1.5 loads per product) to a row of 7 (1.14)::

        # (1 + R') / R'  <  (G + R) / (G * R)   ->   groups in turn, R' = rows x cols
    """
    if groups < 2:
        return None
    tiles = [(r, c) for r in range(1, out_height + 1) if out_height % r == 0
             for c in range(1, out_width + 1) if out_width % c == 0 and r * c <= accumulators]
    rows, cols = max(tiles, key=lambda t: (t[0] * t[1], -t[0]))
    turn, live = rows * cols, pixels
    if (1 + turn) / turn < (groups + live) / (groups * live) - 1e-9:
        return rows, cols
    return None


def tile_chunks_shape(out_height: int, out_width: int, oc_chunks: int, groups: int, wanted: tuple,
                      max_chunks: int, accumulators: int, store_run: int = 1) -> tuple:
    """``(chunks, rows, pixels per row)`` of a 1x1 conv's tile (``per_tile_accumulators`` with
    ``tile_oc_chunks``): of the output-channel chunk counts up to ``max_chunks`` that divide the
    conv's ``oc_chunks``, the one whose tile (:func:`tile_shape`) loads the fewest values per dot
    product (C kernel vectors and R data words for R x C products).

    The kernel vectors of every chunk stay in registers through a reduction step, so each chunk
    beyond the first takes ``groups`` registers from ``accumulators``; with more than one chunk LLVM
    also keeps each pixel's broadcast data word live until every chunk has used it, so a pixel takes
    one register more. ``max_chunks`` 1 gives :func:`tile_shape`'s tile.

    ``wanted`` (a tuned record's tile) was measured with one chunk: a tile of several chunks may also be
    the widest one-row tile that fits (``wide_1x1_tiles``). Ties go to a width that ``store_run``
    divides (adjacent 8-bit stores that :mod:`tvm_ext.x86.narrow_by_packs` narrows together), then to
    fewer chunks, then to ``wanted``::

        # R * (C * groups + [C > 1]) + (C - 1) * groups  <=  accumulators
        # tile = least (loads per product, width % store_run != 0, C) over C and {wanted, (1, width) if C > 1}
    """
    best = None
    for c in range(1, min(max_chunks, oc_chunks) + 1):
        budget = accumulators - (c - 1) * groups
        if oc_chunks % c or budget < c * groups + (c > 1):
            continue
        for want in (wanted, (1, out_width)) if c > 1 else (wanted,):
            rows, cols = tile_shape(out_height, out_width, c * groups + (c > 1), want, budget)
            loads_per_dot = (c * groups + rows * cols) / (c * groups * rows * cols)
            key = (round(loads_per_dot, 9), cols % store_run != 0, c)
            if best is None or key < best[0]:
                best = (key, c, rows, cols)
    return best[1:]


def rows_first(data_bytes: int, weight_bytes: int) -> bool:
    """Whether a conv's per-tile schedule splits its parallel loop over output rows before output-channel
    blocks (``parallel_rows_first``).

    Split over output-channel blocks, each of T threads reads the whole input, (T - 1) / T of which the
    producing kernel wrote on other cores, and 1 / T of the weights; split over rows, a thread reads its
    own rows of the input (and the rows beside them, for a kernel taller than 1), which the producer,
    split the same way, wrote on the same core, and all of the weights, which stay in its cache from
    one row to the next when they are the smaller::

        # input bytes >= weight bytes  ->  rows first
    """
    return data_bytes >= weight_bytes



#: How many times larger than its input a conv's weights are at least for ``weights_once``: QDQ ResNet-50's
#: convs of 10-94x gained, its 1x1 convs of 1.3x and 5x lost (the accumulators' extra loads and stores
#: cost more than the weights' first reading from memory).
WEIGHTS_ONCE_RATIO = 8


def weights_once_rows(data_bytes: int, weight_bytes: int, out_height: int, tile_rows: int, blocks: int,
                      row_bytes: int, budget: int, least_items: int) -> int:
    """Output rows per block of a conv whose weights are read once per block (``weights_once``), or 0 to keep
    the reduction inside each tile.

    With the reduction inside each tile, a thread reads a block of output channels' weights for its first
    tile while the dot products wait, from memory, and again from its cache for every later tile.
    Reduced over input-channel blocks outside the tiles, every slice of weights serves the whole block of
    rows as soon as it arrives, so the weights stream beside the products; the tiles' accumulators then
    live in a buffer of ``rows x row_bytes`` bytes that must stay in the first-level cache, loaded and
    stored once per pass over input blocks. So only for weights :data:`WEIGHTS_ONCE_RATIO` times the
    input's bytes or more. The block is the most rows (a multiple of ``tile_rows`` dividing the height, at
    least 2 rows) whose buffer fits ``budget`` and that leave at least ``least_items`` parallel items
    (``blocks`` channel blocks x row blocks)::

        # weight_bytes >= 8 * data_bytes,  rows * row_bytes <= budget,
        # blocks * (out_height / rows) >= least_items,  rows >= 2
    """
    if weight_bytes < WEIGHTS_ONCE_RATIO * data_bytes:
        return 0
    best = 0
    for rows in range(tile_rows, out_height + 1, tile_rows):
        if out_height % rows or rows * row_bytes > budget or blocks * (out_height // rows) < least_items:
            continue
        best = rows
    return best if best >= 2 else 0


def pass_blocks(ic_blocks: int, steps_per_block: int, least_steps: int = 16) -> int:
    """Input-channel blocks per pass of a ``weights_once`` tile over its accumulator buffer: each pass loads
    and stores the tile's accumulators once, so it takes the fewest blocks (dividing ``ic_blocks``) that
    give it ``least_steps`` dot-product steps, at most one memory operation per 8 dot products::

        # blocks * steps_per_block >= least_steps  (or every block)
    """
    for blocks in range(1, ic_blocks + 1):
        if ic_blocks % blocks == 0 and blocks * steps_per_block >= least_steps:
            return blocks
    return ic_blocks


def wide_out_block(channels_per_group: int, out_pixels: int, short_reduction: int) -> bool:
    """Whether an int8 conv may take an output block wider than one vector (24 channels: a zmm and a ymm
    ``vpdpbusd`` per pixel) instead of 8-channel blocks: only where the dot products outweigh the epilogue
    (more than ``short_reduction`` input channels per group; a short reduction's tile is bound by its
    requantize, the same per channel in either block) and there are pixels to tile (more than one).
    The block's readers take 8-channel blocks (a re-blocking kernel), as every other 24-channel tensor."""
    return channels_per_group > short_reduction and out_pixels > 1


def output_width(wkl) -> int:
    """Output width of a conv workload (TOPI's ``Workload``: padded input, dilated kernel)."""
    return (wkl.width + wkl.padl + wkl.padr - ((wkl.kernel_w - 1) * wkl.dilation_w + 1)) // wkl.stride_w + 1


def output_size(wkl) -> tuple:
    """``(out_h, out_w)`` of a conv workload (:func:`output_width`, and the same for the height)."""
    out_h = (wkl.height + wkl.padt + wkl.padb - ((wkl.kernel_h - 1) * wkl.dilation_h + 1)) // wkl.stride_h + 1
    return out_h, output_width(wkl)


def output_pixels(wkl) -> int:
    """Output pixels per channel of a conv workload (:func:`output_size`)."""
    out_h, out_w = output_size(wkl)
    return out_h * out_w
