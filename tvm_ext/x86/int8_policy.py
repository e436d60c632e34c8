"""tvm-ext's x86 int8 kernel policy: per instruction-set class, the conv schedule, channel blocks
and register budgets :mod:`tvm_ext.x86.int8_conv` applies, each with the measurement behind it.

The tables are keyed by :func:`tvm_ext.x86.isa.isa_class`; a class without an entry keeps TVM's
choice. :func:`policy` reads them for one target. The changes they drive, and their measurements
in full, are in docs/x86-kernels.md.
"""
from __future__ import annotations

from dataclasses import dataclass

from .isa import isa_class

__all__ = ["policy", "KernelPolicy", "vnni_ready", "needs_operand_fix", "INT8_CONV_BLOCK", "FALLBACK_TILE_ACCUMULATORS",
           "WEIGHTS_ONCE_ITEMS"]


#: LLVM major version from which vpdpbusd takes <64 x i8> byte operands (llvm-project #155194).
LLVM_VNNI_I8_OPERANDS = 22
#: Channel block AlterOpLayout gives an untuned int8 conv on every x86 CPU (TVM's ``int32_lanes=16``).
INT8_CONV_BLOCK = 16


@dataclass(frozen=True)
class KernelPolicy:
    """How tvm-ext compiles x86 int8 convolutions for one instruction-set class.

    Attributes
    ----------
    isa : str
        The class (:func:`tvm_ext.x86.isa.isa_class`).
    vector_bits : int
        Register width the int8 dot product uses (512 zmm, 256 ymm, 128 xmm; 0 for non-x86).
    dot : str
        The instruction of the int8 dot product: ``vpdpbusd`` (VNNI) or ``vpmaddubsw``
        (+ ``vpmaddwd``; saturates int16 pair sums).
    per_row : bool
        Compute 3x3/7x7 int8 convs per output row (``epilogue_per_row``) instead of TVM's
        per-pixel form.
    evidence : str
        The measurement behind ``per_row`` and ``tile_accumulators``
        (``benchmarks/lab/int8_conv_schedules.py``).
    channel_blocks : tuple of int
        The channel blocks of 8-bit tensors in order of preference (:func:`tvm_ext.x86.int8_conv.int8_block` takes the
        first that divides the channels): TVM's int8 rule (16, 12, 8, 4), or on AVX2 and AVX-512
        VNNI 8 before 12 (``narrow_channel_blocks``: a full 8-lane register, not one and a half).
    int8_out_blocks : tuple of int
        The output blocks an int8 conv may take, largest first; output channels no block divides
        are padded to :data:`INT8_CONV_BLOCK` (TVM's legalization). TVM's is (16,); AVX2 (16, 8)
        (``narrow_channel_blocks``: 24 output channels are not padded to 32 and sliced); AVX-512
        VNNI (16, 24, 8), where 24 (``vnni_24_lanes``: a zmm and a ymm ``vpdpbusd`` per pixel) is
        taken only where :func:`tvm_ext.x86.tile_rules.wide_out_block` admits the conv.
    tile_accumulators : int
        Compute 1x1 int8 convs, and 3x3/7x7 ones when not ``per_row``, per *tile* of output
        pixels whose accumulators fit this many vector registers (``per_tile_accumulators``),
        instead of TVM's forms; 0 keeps TVM's.
    tile_accumulators_1x1 : int
        Accumulator registers the tile of a 1x1 int8 conv over at most :data:`SHORT_REDUCTION` input
        channels may fill (``tile_budget_1x1``), 0 for ``tile_accumulators``: LLVM unrolls such a
        reduction whole, so the tile loop also holds the requantize and activation epilogue with its
        constants and byte tables.
    tile_oc_chunks : int
        Output-channel blocks per register tile of the per-tile 1x1 int8 conv
        (``per_tile_accumulators``): a tile of R pixels x C blocks loads C kernel vectors and R data
        words for R x C dot products, where one block loads 1 and R for R (oneDNN's brgemm tile
        is 4 vectors x 6 pixels). 1 keeps one block per tile. On classes with ``dot_chains`` it is
        also the most output-channel blocks a 3x3/7x7 tile may take.
    dot_chains : int
        Independent accumulators a 3x3/7x7 int8 conv's tile needs to keep the dot instruction
        busy: its latency times how many issue per cycle (``vpdpbusd``: 5 cycles x 2 per cycle on
        Cascade Lake and Ice Lake). A row tile with fewer takes up to ``tile_oc_chunks`` output-channel
        blocks (``tile_chains``, computed per tile rather than per row). 0: no such minimum.
    strided_chain_tiles : bool
        An untuned strided 3x3/5x5/7x7 int8 conv takes a row tile of half ``dot_chains`` pixels, so
        that ``tile_chains`` computes it with two output-channel blocks sharing each broadcast data
        word (``fallback_strided_chains``, :func:`tvm_ext.x86.tile_rules.strided_chain_width`).
    rows_first : bool
        The per-tile schedules split their parallel loop over output rows before output-channel blocks
        when the conv's input is at least as large as its weights (``parallel_rows_first``,
        :func:`tvm_ext.x86.tile_rules.rows_first`), so that each thread reads the input rows that
        the producing kernel, split the same way, wrote on the same core; False: output-channel
        blocks first (TVM's order).
    weights_once_bytes : int
        A per-tile int8 conv whose weights are many times larger than its input and whose tiles'
        accumulators for a block of rows fit this many bytes reduces over input-channel blocks outside
        the tiles, so each weight slice is read once per block and streams from memory beside the dot
        products
        (``weights_once``, :func:`tvm_ext.x86.tile_rules.weights_once_rows`); 0 keeps the reduction
        inside each tile.
    kw_reuse_registers : int
        Vector registers an untuned stride-1 3x3/5x5/7x7 int8 conv's row tile may fill with
        accumulators, broadcast data words and kernel vectors when ``kw`` is unrolled so that
        neighbouring kernel columns share the words (``fallback_kw_reuse``,
        :func:`tvm_ext.x86.tile_rules.kw_reuse_width`); 0 keeps TVM's fallback tile (``tile_ow`` the
        largest divisor of the width up to 31, ``kw`` rolled: one broadcast per dot product).
    depthwise_taps : bool
        8-bit depthwise convs multiply 4 adjacent taps per 32-bit lane with ``vpdpbusd``
        (:mod:`tvm_ext.x86.depthwise_taps`) instead of TVM's one widened tap per lane.
    """

    isa: str
    vector_bits: int
    dot: str
    per_row: bool
    evidence: str
    channel_blocks: tuple = (16, 12, 8, 4)
    int8_out_blocks: tuple = (16,)
    tile_accumulators: int = 0
    tile_accumulators_1x1: int = 0
    tile_oc_chunks: int = 1
    dot_chains: int = 0
    depthwise_taps: bool = False
    kw_reuse_registers: int = 0
    strided_chain_tiles: bool = False
    rows_first: bool = False
    weights_once_bytes: int = 0

    @property
    def conv_schedule(self) -> str:
        """``"per_row"``, ``"per_tile"`` or ``"tvm"``: how 3x3/7x7 int8 convs are computed."""
        return "per_row" if self.per_row else ("per_tile" if self.tile_accumulators else "tvm")

    @property
    def conv1x1_schedule(self) -> str:
        """``"per_tile"`` or ``"tvm"``: how 1x1 int8 convs are computed."""
        return "per_tile" if self.tile_accumulators else "tvm"


# Per-ISA choices (vector bits, dot instruction, epilogue_per_row, evidence); ResNet-50's 3x3/7x7
# int8 convs with a requantize epilogue, one thread, Zen 4 (AVX2 measured by building for
# -mcpu=znver3), benchmarks/lab/int8_conv_schedules.py.
_POLICY = {
    "avx512_vnni": (512, "vpdpbusd", True, "epilogue_per_row: 0.19-0.49x TVM's time per conv (Zen 4, "
                    "-mcpu=znver4)"),
    "avx512": (512, "vpmaddubsw", True, "epilogue_per_row: 0.82-0.99x TVM's time per conv, 0.90x summed (Zen 4, "
               "VNNI masked)"),
    "avx2": (256, "vpmaddubsw", False, "epilogue_per_row: 0.86-1.65x TVM's time per conv, 1.16-1.32x summed; "
             "per_tile_accumulators: 0.86-1.02x, 0.94-0.96x summed (Zen 4 running -mcpu=znver3 code)"),
    "sse": (128, "pmaddubsw", False, "not measured: TVM's schedule kept"),
    "other": (0, "", False, "not x86: TVM's schedule"),
}


#: Channel blocks of 8-bit tensors per class where they differ from TVM's int8 rule
#: (``narrow_channel_blocks``).
_NARROW_BLOCKS = {"avx2": (16, 8, 12, 4), "avx512_vnni": (16, 8, 12, 4)}


#: Int8 conv output blocks per class where they differ from TVM's (``narrow_channel_blocks``; on
#: AVX-512 VNNI through the 8-lane ymm ``vpdpbusd``, and 24 lanes as a zmm and a ymm one, ``vnni_24_lanes``:
#: PP-OCRv4 det QDQ 0.95x end to end on a Granite Rapids-class Xeon, bit-identical; docs/x86-kernels.md).
_NARROW_OUT_BLOCKS = {"avx2": (16, 8), "avx512_vnni": (16, 24, 8)}


#: Accumulator registers of the per-tile schedules per class (``per_tile_accumulators``): AVX2 has
#: 16 ymm registers, AVX-512 32 zmm; the kernel vector, the broadcast data word and the constant of ``vpmaddwd``
#: take three, and one is left spare.
_TILE_ACCUMULATORS = {"avx2": 12, "avx512": 28, "avx512_vnni": 28}


#: Input channels up to which a 1x1 conv's reduction counts as short (``tile_budget_1x1``): 4 or fewer
#: ``vpdpbusd`` per output vector, which LLVM unrolls whole into the tile loop beside the epilogue.
SHORT_REDUCTION = 16

#: Accumulator registers of a short-reduction 1x1 conv's tile per class (``tile_budget_1x1``): half of
#: AVX-512's 32 zmm, the other half for the epilogue's constants and byte tables. With 28, PP-OCR cls
#: v2's 1x1 convs over 8 and 16 input channels spilled 28-98 values an iteration of their hot loop
#: (``benchmarks/kernel_mca.py --kernels`` at znver4 and cascadelake).
_TILE_ACCUMULATORS_1X1: dict = {"avx512_vnni": 16}


#: Output-channel blocks per 1x1 conv tile per class where it is not 1 (``tile_oc_chunks``; the
#: most a tile may take: :func:`tvm_ext.x86.tile_rules.tile_chunks_shape` picks up to this many).
#: AVX-512 VNNI, QDQ ResNet-50 on an Intel Xeon of the Cascade Lake class (two 512-bit VNNI pipes),
#: 2 threads, with the shipped records: its 1x1 convs 0.72-0.89x the time of one block per tile
#: (debug executor), all convs 0.85x, end to end 0.91x, bit-identical. Zen 4 not measured with it.
_TILE_OC_CHUNKS: dict = {"avx512_vnni": 4}


#: Independent accumulators a 3x3/7x7 tile needs per class where the dot instruction carries the
#: accumulator's dependency chain (``tile_chains``; ``vpdpbusd`` adds into its destination: latency 5,
#: two per cycle in llvm-mca's Cascade Lake and Ice Lake models, so 10 chains; a 7-pixel row tile of
#: one block has 7 and runs at 70% of that peak there). The vpmaddwd classes add with ``vpaddd``
#: (latency 1) and need none.
_DOT_CHAINS: dict = {"avx512_vnni": 10}


#: Vector registers of an untuned stride-1 int8 conv's row tile with ``kw`` unrolled, per class
#: (``fallback_kw_reuse``; AVX-512: 32 zmm). YOLOv8n QDQ's 3x3 convs (64->64 at 40x40): TVM's
#: fallback tile of 20 pixels does 80 ``vpdpbusd zmm`` with 80 ``vpbroadcastd`` and 4 kernel loads,
#: 72% of llvm-mca's Cascade Lake and Ice Lake peak (its models give each load a port-0/1/5
#: micro-op); 10 pixels with ``kw`` unrolled do 120 with 36 broadcasts, 100%. On Zen 4 (2 threads)
#: the conv 0.99x TVM's tile's time, 80x80 32->32 0.98x, YOLOv8n and PP-OCRv4 det end to end
#: 0.99-1.00x; bit-identical (docs/x86-kernels.md).
_KW_REUSE_REGISTERS: dict = {"avx512_vnni": 32}


#: Classes whose untuned strided int8 convs take tiles of half ``dot_chains`` pixels and two output-channel
#: blocks (``fallback_strided_chains``). YOLOv8n QDQ's 3x3/2 convs: TVM's fallback tile (10-20 pixels, one
#: block) broadcasts a data word per ``vpdpbusd``, 70-72% of llvm-mca's Cascade Lake peak; 5 pixels x 2
#: blocks, 95%.
_STRIDED_CHAIN_TILES = frozenset({"avx512_vnni"})


#: Classes whose per-tile schedules split their parallel loop over rows first where the input is at
#: least as large as the weights (``parallel_rows_first``). QDQ ResNet-50 on a Granite Rapids-class Xeon,
#: 2 threads, bit-identical, timed in alternation: 0.96-0.97x end to end (0.97-0.98x with the rule by a weight
#: size limit instead, 1.01x with every conv split over rows: the last stage's 2.3 MB of 3x3 weights then
#: stream from L3 once per row); YOLOv8n 1.00x, PP-OCRv4 det 1.01x and 0.95x. AVX2 code (-mcpu=x86-64-v3, the exact
#: int16-pair path) on the same host, ResNet-50, 2 threads: 0.97x (docs/x86-kernels.md).
_ROWS_FIRST = frozenset({"avx512_vnni", "avx2"})


#: Accumulator buffer bytes of a weight-heavy per-tile conv's block of rows per class (``weights_once``):
#: the first-level data cache of every CPU of the class (32 KiB on Zen 4-5, 32-48 KiB on Intel's). QDQ ResNet-50
#: on a Granite Rapids-class Xeon, bit-identical, timed in alternation: 0.967-0.981x end to end at 1 thread (two
#: runs), 0.984-1.003x at 2 threads (three runs; 0.974x with 64 KiB); its last two stages' 3x3 convs 45-70 us
#: faster each in a whole run at 1 thread (TVM's profiler). YOLOv8n 1.00x (one conv takes it). A Zen 4 is slower with it
#: (docs/x86-kernels.md): kept for the class, whose CPUs differ by their memory hierarchy, which the target
#: does not name.
_WEIGHTS_ONCE_BYTES: dict = {"avx512_vnni": 32 * 1024}
#: Parallel items (channel blocks x row blocks) a ``weights_once`` conv keeps at least, so that its blocks of
#: rows do not leave the threads idle: this many, and two per thread of the runtime (``TVM_NUM_THREADS``, else
#: the compiling process's CPUs), so that on many cores the blocks shrink or the conv keeps its tiles' order.
WEIGHTS_ONCE_ITEMS = 8
#: Classes whose 8-bit depthwise convs take 4 taps per 32-bit lane (``depthwise_taps``): PP-OCR cls v2's
#: depthwise convs alone, Zen 5, 2 threads: 0.56x TVM's time summed (docs/x86-kernels.md).
_DEPTHWISE_TAPS = frozenset({"avx512_vnni"})


#: The same for the tiles of TVM's *fallback* (untuned) configs of float convs and of depthwise
#: convs, 8-bit and float (``fallback_register_tile``). TVM's fallback takes up to 31 pixels of one
#: register each, which fits AVX-512's 32 zmm but spills AVX2's 16 ymm; only AVX2 has an entry
#: (AVX-512 is not measured).
FALLBACK_TILE_ACCUMULATORS = {"avx2": 12}


#: Classes whose convs take another class's choices in every table above: an AMX target's convs
#: run on AVX-512 VNNI (its tiles compute dense and batch_matmul only, :mod:`tvm_ext.x86.amx`).
_CONVS_AS = {"amx": "avx512_vnni"}


def policy(target) -> KernelPolicy:
    """The int8 conv kernel choices tvm-ext makes for ``target`` (see :class:`KernelPolicy`)."""
    cls = isa_class(target)
    key = _CONVS_AS.get(cls, cls)
    bits, dot, per_row, evidence = _POLICY[key]
    return KernelPolicy(cls, bits, dot, per_row, evidence, _NARROW_BLOCKS.get(key, KernelPolicy.channel_blocks),
                        _NARROW_OUT_BLOCKS.get(key, KernelPolicy.int8_out_blocks),
                        _TILE_ACCUMULATORS.get(key, 0), _TILE_ACCUMULATORS_1X1.get(key, 0),
                        _TILE_OC_CHUNKS.get(key, 1), _DOT_CHAINS.get(key, 0),
                        key in _DEPTHWISE_TAPS, _KW_REUSE_REGISTERS.get(key, 0),
                        key in _STRIDED_CHAIN_TILES, key in _ROWS_FIRST, _WEIGHTS_ONCE_BYTES.get(key, 0))


def needs_operand_fix() -> bool:
    """True when this LLVM's ``vpdpbusd.512`` takes ``<64 x i8>`` (TVM 0.19's call aborts)."""
    from tvm.target import codegen

    return codegen.llvm_version_major() >= LLVM_VNNI_I8_OPERANDS


def vnni_ready(target) -> bool:
    """True when ``target`` has AVX-512 VNNI and :func:`tvm_ext.x86.int8_conv.kernels` can build for it
    safely."""
    cls = isa_class(target)
    return _CONVS_AS.get(cls, cls) == "avx512_vnni"
