"""``weights_once``: on AVX-512 VNNI a per-tile int8 conv whose weights are at least 8 times its input reduces
over input-channel blocks outside its tiles, with the accumulators of a block of rows in a buffer, so that each
slice of weights is read once per block (and streams from memory beside the dot products) instead of once per tile.

The policy; the rules (rows per block, input blocks per pass); the accumulator buffer of the scheduled conv
with each outcome; on a host with AVX-512 VNNI, convs that take the order executed in a child process against
numpy's integer convolution (int32 out) and a plain ``llvm`` build (requantized to uint8).
"""
import pytest

from tvm_ext.x86 import int8_policy, tile_rules
from tvm_ext.x86.target import build_target

from ._int8_cases import needs_vnni, run_conv_cases


@pytest.mark.parametrize("target,expected", [("llvm -mcpu=cascadelake", 32768), ("llvm -mcpu=znver4", 32768),
                                             ("llvm -mcpu=x86-64-v3", 0), ("llvm -mcpu=x86-64-v4", 0)])
def test_policy_per_class(target, expected):
    assert int8_policy.policy(target).weights_once_bytes == expected


def test_amx_targets_take_the_vnni_order():
    assert int8_policy.policy(build_target("llvm -mcpu=sapphirerapids", allow_amx=True)).weights_once_bytes == 32768


# (data bytes, weight bytes, out height, tile rows, channel blocks, bytes of a row of accumulators, budget,
#  least parallel items) -> rows per block
@pytest.mark.parametrize("args,expected", [
    # ResNet-50's 3x3 7x7 512->512 (input padded to 9x9), tiles of 2 channel blocks: the whole map
    ((9 * 9 * 512, 3 * 3 * 512 * 512, 7, 1, 16, 2 * 7 * 64, 32768, 8), 7),
    # its 1x1 14x14 256->1024: weights 5x the input, the reduction stays in the tiles
    ((14 * 14 * 256, 256 * 1024, 14, 1, 16, 4 * 14 * 64, 32768, 8), 0),
    # 2 channel blocks: at least 8 items leaves blocks of 2 of the 14 rows (7 does not divide into 4 items)
    ((14 * 14 * 64, 3 * 3 * 64 * 512, 14, 1, 2, 14 * 64, 32768, 8), 2),
    # a row of accumulators over half the budget: blocks of one row, so none
    ((14 * 14 * 64, 3 * 3 * 64 * 512, 14, 1, 16, 20000, 32768, 8), 0),
    # tiles of 2 rows: blocks are multiples of 2 dividing the height (6 of 12; 12 would leave 4 items)
    ((12 * 12 * 64, 64 * 4096, 12, 2, 4, 12 * 64, 32768, 8), 6),
])
def test_rows_per_block(args, expected):
    assert tile_rules.weights_once_rows(*args) == expected


@pytest.mark.parametrize("blocks,steps,expected", [(64, 4, 4), (16, 12, 2), (3, 4, 3), (8, 16, 1)])
def test_input_blocks_per_pass(blocks, steps, expected):
    """The fewest input blocks (dividing them) that give a pass 16 dot-product steps, else all of them."""
    assert tile_rules.pass_blocks(blocks, steps) == expected


def _accumulator_buffer(target, cin, cout, size, k, chunks):
    """Vectors of the accumulation buffer of a ``k x k`` uint8 x int8 NCHW16c conv (input already padded)
    scheduled per tile of 7 pixels x ``chunks`` channel blocks for ``target``."""
    import tvm
    from tvm import te, topi
    from tvm.autotvm.task.space import FallbackConfigEntity, OtherOptionEntity, SplitEntity

    from tvm_ext.x86 import int8_schedules

    padded = size + 2 * (k // 2)
    data = te.placeholder((1, cin // 16, padded, padded, 16), "uint8", name="data")
    kernel = te.placeholder((cout // 16, cin // 16, k, k, 4, 16, 4), "int8", name="kernel")
    out = topi.nn.conv2d_NCHWc_int8(data, kernel, (1, 1), (0, 0), (1, 1), "NCHW16c", "NCHW16c", "int32")
    s = te.create_schedule(out.op)
    cfg = FallbackConfigEntity()
    cfg["tile_ow"] = SplitEntity([-1, 7])
    cfg["tile_oh"] = OtherOptionEntity(1)
    cfg["unroll_kw"] = OtherOptionEntity(True)
    intrin = int8_schedules.dot_u8s8_vnni(16)
    with tvm.target.Target(target):
        schedule = int8_schedules._schedule_1x1_int8_per_tile if k == 1 else int8_schedules._schedule_int8_per_tile
        schedule(s, cfg, data, out, out, 16, intrin, 28, chunks)
        func = tvm.lower(s, [data, kernel, out])["main"]
    extents = []
    tvm.tir.stmt_functor.post_order_visit(func.body, lambda n: extents.append(int(n.extents[0]))
                                          if isinstance(n, tvm.tir.Allocate) and "global" in n.buffer_var.name
                                          else None)
    return extents


@pytest.mark.parametrize("target,cin,cout,size,k,expected", [
    ("llvm -mcpu=cascadelake", 256, 256, 7, 3, [2 * 7 * 7]),    # weights 28x the input: the whole map's tiles
    ("llvm -mcpu=cascadelake", 512, 512, 7, 1, [2 * 7 * 7]),    # 1x1, weights 10x the input
    ("llvm -mcpu=cascadelake", 64, 64, 28, 3, [2 * 7]),         # weights 1.2x the input: one tile's
    ("llvm -mcpu=x86-64-v4", 256, 256, 7, 3, [2 * 7]),          # AVX-512 without VNNI: not measured
])
def test_accumulator_buffer(target, cin, cout, size, k, expected, monkeypatch):
    """With ``weights_once`` the accumulators of a block of rows (here 2 channel blocks x 7 rows x 7 pixels
    int32x16 vectors), else of one tile (2 x 7). Two runtime threads: at least 8 parallel items."""
    monkeypatch.setenv("TVM_NUM_THREADS", "2")
    assert _accumulator_buffer(target, cin, cout, size, k, 2) == expected


@pytest.mark.parametrize("threads,expected", [("4", [2 * 7 * 7]), ("8", [2 * 7]), ("32", [2 * 7])])
def test_many_threads_keep_the_tiles_order(threads, expected, monkeypatch):
    """A 3x3 7x7 conv over 256 channels has 8 parallel blocks of 2 channel blocks: with 4 threads (8 items
    wanted) the whole map per block; with more threads blocks of fewer rows would be needed, and 7 rows split
    only into single rows, so the reduction stays in each tile."""
    monkeypatch.setenv("TVM_NUM_THREADS", threads)
    assert _accumulator_buffer("llvm -mcpu=cascadelake", 256, 256, 7, 3, 2) == expected


#: (k, in, out channels, size, stride, epilogue): convs whose weights are 9-28x their input (3x3 and 1x1, one
#: strided), each once with int32 outputs and once requantized
_CASES = ((3, 256, 256, 7, 1, False), (3, 256, 256, 7, 1, True), (1, 512, 512, 7, 1, False), (1, 512, 512, 7, 1, True),
          (3, 256, 256, 14, 2, True))


@needs_vnni
def test_weights_once_is_exact(tmp_path, monkeypatch):
    """Executed on this host's AVX-512 VNNI (child process, 2 runtime threads so that every case takes the
    order): int32 outputs equal numpy's integer convolution, requantized ones a plain ``llvm`` build's."""
    monkeypatch.setenv("TVM_NUM_THREADS", "2")
    outs = run_conv_cases(_CASES, tmp_path / "outs.npz")
    assert len([k for k in outs.files if k.startswith("got-")]) == len(_CASES)
