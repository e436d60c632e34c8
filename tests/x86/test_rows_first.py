"""``parallel_rows_first``: on AVX-512 VNNI and AVX2 the per-tile int8 conv schedules split their parallel loop over
output rows before output-channel blocks when the conv's input is at least as large as its weights, so that
each thread reads the input rows its own core wrote in the kernel before.

The policy; the rule; the loop order of the scheduled conv (and of its padded input) with each outcome
of the rule; on a host with AVX-512 VNNI, convs that take each order executed in a child process against
numpy's integer convolution (int32 out) and a plain ``llvm`` build (requantized to uint8).
"""
import pytest

from tvm_ext.x86 import int8_policy, tile_rules
from tvm_ext.x86.target import build_target

from ._int8_cases import needs_vnni, run_conv_cases


@pytest.mark.parametrize("target,expected", [("llvm -mcpu=cascadelake", True), ("llvm -mcpu=znver4", True),
                                             ("llvm -mcpu=x86-64-v3", True), ("llvm -mcpu=x86-64-v4", False)])
def test_policy_per_class(target, expected):
    assert int8_policy.policy(target).rows_first is expected


def test_amx_targets_take_the_vnni_order():
    assert int8_policy.policy(build_target("llvm -mcpu=sapphirerapids", allow_amx=True)).rows_first


@pytest.mark.parametrize("data,weights,expected", [
    (56 * 56 * 64, 256 * 64, True),        # ResNet-50's 56x56 64->256: 200 KB of input, 16 KB of weights
    (14 * 14 * 256, 3 * 3 * 256 * 256, False),  # its 14x14 3x3 256->256: 49 KB of input, 576 KB of weights
    (4096, 4096, True),                    # a tie splits over rows
])
def test_rule(data, weights, expected):
    assert tile_rules.rows_first(data, weights) is expected


def _parallel_loops(target, cin, cout, size, k):
    """The parallel loops' variables of a ``k x k`` uint8 x int8 NCHW16c conv scheduled with the per-tile
    stages for ``target``."""
    import tvm
    from tvm import te, topi

    from tvm_ext.x86 import int8_schedules

    data = te.placeholder((1, cin // 16, size, size, 16), "uint8", name="data")
    kernel = te.placeholder((cout // 16, cin // 16, k, k, 4, 16, 4), "int8", name="kernel")
    out = topi.nn.conv2d_NCHWc_int8(data, kernel, (1, 1), (k // 2, k // 2), (1, 1), "NCHW16c", "NCHW16c", "int32")
    s = te.create_schedule(out.op)
    with tvm.target.Target(target):
        int8_schedules._tile_stages(s, out.op.input_tensors[0], out, out, 1, 4)
    loops = []
    tvm.tir.stmt_functor.post_order_visit(
        tvm.lower(s, [data, kernel, out])["main"].body,
        lambda n: loops.append(n.loop_var.name) if isinstance(n, tvm.tir.For)
        and n.kind == tvm.tir.ForKind.PARALLEL else None)
    return loops


@pytest.mark.parametrize("target,cin,cout,size,k,expected", [
    ("llvm -mcpu=cascadelake", 64, 256, 56, 1, ["n.oh.outer.fused.oc_chunk.fused"]),
    ("llvm -mcpu=cascadelake", 64, 64, 56, 3, ["i0.i2.fused.i1.fused", "n.oh.outer.fused.oc_chunk.fused"]),
    ("llvm -mcpu=cascadelake", 1024, 2048, 7, 1, ["n.oc_chunk.fused.oh.outer.fused"]),  # weights larger
    ("llvm -mcpu=x86-64-v3", 64, 256, 56, 1, ["n.oh.outer.fused.oc_chunk.fused"]),
    ("llvm -mcpu=x86-64-v4", 64, 256, 56, 1, ["n.oc_chunk.fused.oh.outer.fused"]),  # AVX-512 without VNNI: not measured
])
def test_parallel_loop_order(target, cin, cout, size, k, expected):
    """Rows first: the fused parallel variable starts with the row blocks (and the padded copy of a 3x3
    conv's input with its rows, ``i2``); else with the output-channel chunks, TVM's order."""
    assert _parallel_loops(target, cin, cout, size, k) == expected


#: (k, in, out channels, size, stride, epilogue): convs split over rows first (input larger than weights),
#: strided and tiled over several output-channel blocks among them, and one split over channel blocks
_CASES = ((1, 64, 256, 28, 1, True), (3, 32, 32, 28, 1, True), (3, 32, 64, 28, 2, False), (1, 64, 64, 14, 1, False),
          (3, 256, 256, 7, 1, True))


@needs_vnni
def test_both_orders_are_exact(tmp_path):
    """Executed on this host's AVX-512 VNNI (child process): int32 outputs equal numpy's integer
    convolution, requantized ones a plain ``llvm`` build's, in either loop order."""
    outs = run_conv_cases(_CASES, tmp_path / "outs.npz")
    assert len([k for k in outs.files if k.startswith("got-")]) == len(_CASES)
