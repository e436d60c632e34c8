"""benchmarks/lab/kernel_profile.py: which sampled instructions count as dot-product work, and how a
kernel's time is split and summed per conv geometry (no perf run)."""
import pytest
from _scripts import load_script


def _module():
    return load_script("benchmarks/lab/kernel_profile.py")


@pytest.mark.parametrize("text,previous,dot", [
    ("vpdpbusd %zmm30,%zmm27,%zmm11", "", True),
    ("vpbroadcastd -0x8c(%r12,%rbp,1),%zmm27", "", True),      # a data word broadcast for the dots
    ("vmovdqa64 -0x4ac0(%r15),%zmm28", "", True),               # a kernel vector loaded for the dots
    ("add $0x40,%r12", "vpdpbusd %zmm30,%zmm27,%zmm11", True),  # sampled just after a dot
    ("vmovdqa64 %zmm27,0x1040(%rsp)", "", False),                # a store: epilogue or spill
    ("vpmuldq %zmm3,%zmm21,%zmm21", "vpsrlq $0x20,%zmm21,%zmm22", False),  # requantize
    ("vdivps %zmm1,%zmm22,%zmm21", "", False),
])
def test_dot_instructions(text, previous, dot):
    assert _module().is_dot(text, previous) is dot


def test_table_splits_each_kernel_by_its_samples():
    kp = _module()
    conv = {"out": [1, 4, 56, 56, 16], "ins": [[1, 4, 58, 58, 16], [4, 4, 3, 3, 4, 16, 4]]}
    rows = [dict(conv, name="fused_conv2d_a", ms=2.0), dict(conv, name="fused_conv2d_b", ms=1.0),
            {"name": "fused_add", "ms": 0.5, "out": [1, 4, 56, 56, 16], "ins": []}]
    out = kp.table(rows, {"fused_conv2d_a": [3.0, 1.0], "fused_conv2d_b": [1.0, 1.0]}, peak=100.0)
    row = next(line for line in out.splitlines() if line.startswith("| (64, 3, 3, 56, 56)"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # 2 layers of 64x64x9x56x56 MACs; 3 ms; dot 2 x 0.75 + 1 x 0.5 = 2.0 ms, rest 1.0 ms
    assert cells[1:] == ["2", "0.231", "3.000", "77", "77%", "2.000", "1.000"], row
    assert "other kernels: 0.500 ms" in out


def test_table_adds_each_kernel_in_sequence_from_its_share_of_the_samples():
    kp = _module()
    conv = {"out": [1, 4, 56, 56, 16], "ins": [[1, 4, 58, 58, 16], [4, 4, 3, 3, 4, 16, 4]]}
    rows = [dict(conv, name="fused_conv2d_a", ms=2.0), {"name": "fused_add", "ms": 0.5, "out": [1], "ins": []}]
    # the conv holds 6 of the library's 8 samples: 3/4 of a 4 ms run
    out = kp.table(rows, {"fused_conv2d_a": [5.0, 1.0], "fused_add": [0.0, 2.0]}, run_ms=4.0)
    row = next(line for line in out.splitlines() if line.startswith("| (64, 3, 3, 56, 56)"))
    assert row.rstrip(" |").endswith("3.000"), row
    assert "other kernels: 0.500 ms (1.000 in sequence)" in out
