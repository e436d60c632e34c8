"""tvm_ext.tools.mca: hot-loop extraction, MAC counts, llvm-mca parsing and a single conv at three CPU models.

Compile only: the builds are cross-compiled for CPU models the host may not have, and llvm-mca only
reads their assembly.
"""
import re

import pytest

from tvm_ext.tools import mca
from tvm_ext.tools.mca import _asm, _llvm_mca, _peak

from _mca_marks import needs_mca


def _body(text: str) -> list:
    return [i for i in _asm.parse(".type f,@function\n" + text)["f"] if i.mnemonic]


@pytest.mark.parametrize("line, macs", [
    ("vpdpbusd %zmm1, %zmm2, %zmm3", 64),          # 16 int32 lanes x 4 byte products
    ("vpdpbusd 64(%rax){1to16}, %zmm2, %zmm3", 64),
    ("vpdpbusd %ymm1, %ymm2, %ymm3", 32),
    ("{vex}\tvpdpbusd %ymm14, %ymm13, %ymm0", 32),  # the AVX-VNNI encoding LLVM picks for ymm0-15
    ("vpmaddwd %ymm1, %ymm2, %ymm3", 16),          # 8 int32 lanes x 2 int16 products
    ("vpmaddwd (%rdi), %zmm2, %zmm3", 32),
    ("sdot v0.4s, v1.16b, v2.16b", 16),
    ("udot v0.4s, v1.16b, v2.4b[3]", 16),
    ("sdot v0.2s, v1.8b, v2.8b", 8),
    ("smmla v0.4s, v1.16b, v2.16b", 32),           # 2x8 by 8x2
    ("smull v0.8h, v1.8b, v2.8b", 8),
    ("smlal2 v0.4s, v1.8h, v2.8h", 4),
    ("smlal v0.2d, v1.2s, v2.2s", 0),              # int32 x int32: requantize arithmetic, not int8 work
    ("smull x1, w2, w3", 0),
    ("vpaddd %zmm1, %zmm2, %zmm3", 0),
])
def test_dot_macs_hand_count(line, macs):
    assert _asm.dot_macs(_body(line))[1] == macs


def test_vpmaddwd_next_to_vpmaddubsw_adds_no_products():
    body = _body("vpmaddubsw %ymm1, %ymm2, %ymm3\nvpmaddwd %ymm4, %ymm3, %ymm3\nvpaddd %ymm3, %ymm5, %ymm5")
    count, macs = _asm.dot_macs(body)
    assert (dict(count), macs) == ({"vpmaddubsw ymm": 1}, 32)


_NESTED = """\
\t.type\ttvmgen_default_fused_nn_conv2d_compute_,@function
tvmgen_default_fused_nn_conv2d_compute_:
\tretq
\t.type\t.L__tvm_parallel_lambda.7,@function
.L__tvm_parallel_lambda.7:
.LBB1_1:                                # outer
\txorl\t%eax, %eax
.LBB1_2:                                # inner: 2 dots
\tvpdpbusd\t(%rsi), %zmm0, %zmm1
\tvpdpbusd\t64(%rsi), %zmm0, %zmm2
\taddq\t$1, %rax
\tjne\t.LBB1_2
\tvpdpbusd\t%zmm3, %zmm0, %zmm4
\tvpdpbusd\t%zmm3, %zmm0, %zmm5
\tvpdpbusd\t%zmm3, %zmm0, %zmm6
\tjne\t.LBB1_1
.LBB1_3:                                # a second innermost loop: 1 dot
\tvpdpbusd\t%ymm3, %ymm0, %ymm4
\tjne\t.LBB1_3
\tretq
\t.type\ttvmgen_default_fused_layout_transform,@function
tvmgen_default_fused_layout_transform:
\tretq
"""


def test_hot_loop_is_the_innermost_loop_with_the_most_macs():
    funcs = _asm.parse(_NESTED)
    kernels = _asm.kernels(funcs)
    assert kernels["tvmgen_default_fused_nn_conv2d"] == ["tvmgen_default_fused_nn_conv2d_compute_",
                                                         ".L__tvm_parallel_lambda.7"]
    hot = _asm.hot_loop("tvmgen_default_fused_nn_conv2d", funcs, kernels["tvmgen_default_fused_nn_conv2d"])
    # the outer loop has 5 dots but holds the inner one; the inner has more MACs than the ymm loop
    assert hot.dots == {"vpdpbusd zmm": 2} and hot.macs == 128 and hot.accumulators == 2
    assert hot.body[0].startswith("vpdpbusd") and hot.body[-1].startswith("jne")
    assert _asm.hot_loop("tvmgen_default_fused_layout_transform", funcs,
                         kernels["tvmgen_default_fused_layout_transform"]) is None


def test_aarch64_immediates_are_not_comments():
    (ins,) = _body("add x0, x0, #1 // counter")
    assert ins.operands == "x0, x0, #1"


_MCA_REPORT = """\
Iterations:        200
Instructions:      2800
Total Cycles:      4807
Total uOps:        2800

Dispatch Width:    6
uOps Per Cycle:    0.58
IPC:               0.58
Block RThroughput: 24.0


Cycles with backend pressure increase [ 99.48% ]
Throughput Bottlenecks:
  Resource Pressure       [ 99.48% ]
  - Zn4FP0  [ 99.48% ]
  - Zn4FP1  [ 99.48% ]
  Data Dependencies:      [ 0.21% ]
  - Register Dependencies [ 0.21% ]
  - Memory Dependencies   [ 0.00% ]
"""


def test_llvm_mca_report_parsing():
    r = _llvm_mca.parse(_MCA_REPORT)
    assert (r.iterations, r.total_cycles, r.instructions) == (200, 4807, 14)
    assert r.cycles_per_iteration == pytest.approx(24.035)
    assert r.bottlenecks["Resource Pressure"] == pytest.approx(0.9948)
    assert r.bound == "ports Zn4FP0/Zn4FP1"


def test_llvm_mca_report_without_summary_is_an_error():
    with pytest.raises(mca.McaError, match="Total Cycles"):
        _llvm_mca.parse("Iterations: 100\n")


def test_unknown_cpu_model_names_the_known_ones():
    with pytest.raises(ValueError, match="znver4.*neoverse-n1"):
        mca.cpu_model("pentium4")


def test_peak_loop_text_is_twelve_independent_dots():
    body = _body(_peak.loop_text("sdot"))
    dots = [i for i in body if i.mnemonic == "sdot"]
    assert len(dots) == _peak.COPIES * _peak.UNROLL and _peak.COPIES == 12
    assert len({i.operands.split(",")[0] for i in dots}) == 12  # twelve accumulators
    assert _asm.dot_macs(body)[1] == len(dots) * 16
    assert body[-1].branch_target == ".Lpeak"


@needs_mca
@pytest.mark.parametrize("cpu, per_cycle", [("cascadelake", 128), ("neoverse-n1", 32), ("x86-64-v3", 16),
                                            ("znver3", 32)])
def test_peak_within_the_issue_width(cpu, per_cycle):
    # cascadelake: two 512-bit vpdpbusd per cycle; neoverse-n1: two sdot; haswell: one vpmaddwd ymm; Zen 3: two
    p = mca.peak(cpu)
    assert 0.95 * per_cycle <= p.macs_per_cycle <= per_cycle


#: (cpu, dot mnemonic, MACs per instruction of the form the kernel uses)
_CONV_CASES = [("znver5", r"vpdpbusd\s.*zmm\d+$", 64), ("x86-64-v3", r"vpmaddwd\s.*ymm\d+$", 16),
               ("neoverse-n1", r"sdot\s+v\d+\.4s", 16)]


@needs_mca
@pytest.mark.parametrize("cpu, pattern, per_instruction", _CONV_CASES, ids=[c[0] for c in _CONV_CASES])
def test_single_conv_hot_loop(cpu, pattern, per_instruction):
    shape = mca.ConvShape(64, 64, 14, 3)
    a = mca.analyze(mca.single_conv(shape), cpu=cpu)
    (k,) = a.kernels
    assert k.macs == 64 * 14 * 14 * 64 * 9 == shape.macs
    assert k.hot is not None, f"no hot loop at {cpu}"
    hand = sum(per_instruction for line in k.hot.body if re.match(pattern, line))
    assert hand > 0 and k.hot.macs == hand
    assert re.match(r"(j\w+|b\.\w+|cbn?z|tbn?z)\s", k.hot.body[-1]), "a loop ends with its backward branch"
    assert 0 < k.share <= 1.02
    assert a.share == pytest.approx(k.share)


@pytest.mark.parametrize("line, kind, macs", [
    ("vpdpwssd %ymm1, %ymm2, %ymm3", "", 16),           # int16 pairs: two products per 32-bit lane
    ("vpdpwssd %ymm1, %ymm2, %ymm3", "depthwise", 8),   # one widened tap per lane, a zero partner
    ("vpmaddwd (%rdi), %zmm2, %zmm3", "depthwise", 16),
    ("vpdpbusd %zmm1, %zmm2, %zmm3", "depthwise", 64),  # bytes stay bytes
    ("vfmadd231ps %zmm1, %zmm2, %zmm3", "", 0),          # float work counts only in a float conv
    ("vfmadd231ps %zmm1, %zmm2, %zmm3", "float", 16),
    ("vfmadd213ps (%rax){1to8}, %ymm2, %ymm3", "float", 8),
    ("fmla v0.4s, v1.4s, v2.s[1]", "float", 4),
])
def test_dot_macs_by_kind(line, kind, macs):
    assert _asm.dot_macs(_body(line), kind)[1] == macs


def test_unknown_kind_is_an_error():
    with pytest.raises(ValueError, match="kind"):
        _asm.dot_macs(_body("vpdpbusd %zmm1, %zmm2, %zmm3"), "grouped")


def _conv(dtype, channels, groups):
    from tvm import relay

    data = relay.var("x", shape=(1, channels, 8, 8), dtype=dtype)
    wdtype = "int8" if dtype == "uint8" else dtype
    weight = relay.var("w", shape=(channels, channels // groups, 3, 3), dtype=wdtype)
    out = relay.nn.conv2d(data, weight, padding=(1, 1), groups=groups, kernel_size=(3, 3),
                          out_dtype="int32" if dtype == "uint8" else dtype)
    return relay.transform.InferType()(__import__("tvm").IRModule.from_expr(out))["main"]


@pytest.mark.parametrize("dtype, groups, kind, macs", [
    ("uint8", 1, "", 16 * 64 * 16 * 9),
    ("uint8", 16, "depthwise", 16 * 64 * 9),
    ("uint8", 4, "", 16 * 64 * 4 * 9),            # grouped, 4 channels per group: not depthwise
    ("float32", 1, "float", 16 * 64 * 16 * 9),
])
def test_conv_kind_and_macs(dtype, groups, kind, macs):
    from tvm_ext.tools.mca import _macs

    func = _conv(dtype, 16, groups)
    assert _macs.kind(func) == kind
    assert _macs.macs(func) == macs


@needs_mca
@pytest.mark.parametrize("cpu", ["znver5", "cascadelake", "x86-64-v3"])
def test_peak_is_the_best_of_register_and_memory_forms(cpu):
    forms = mca.cpu_model(cpu).peak_forms
    assert any(f.endswith(" mem") for f in forms)
    best = mca.peak(cpu)
    assert all(best.macs_per_cycle >= _peak.form_peak(cpu, f).macs_per_cycle for f in forms)


@needs_mca
def test_memory_form_loop_within_the_znver5_peak():
    # LLVM 22's Zen 4 model rates vpdpbusd's memory form twice its register form: a loop of memory-form
    # dots must not score above the peak
    m = mca.cpu_model("znver5")
    text = ".Lx:\n" + "\n".join(f"vpdpbusd {8 * i}(%rsi){{1to16}}, %zmm31, %zmm{i}" for i in range(12))
    text += "\naddq $1, %rax\ncmpq %rdx, %rax\njne .Lx\n"
    res = _llvm_mca.run(text, m.triple, m.mcpu, m.mattr)
    assert 12 * 64 / res.cycles_per_iteration <= 1.02 * mca.peak("znver5").macs_per_cycle


def _estimate(cpu: str, loop: str) -> mca.KernelEstimate:
    """The estimate of a kernel whose only loop is ``loop`` (assembly with a ``.Lpeak`` label)."""
    m = mca.cpu_model(cpu)
    funcs = _asm.parse(".type f,@function\nf:\n" + loop + "retq\n")
    hot = _asm.hot_loop("f", funcs, ["f"])
    res = _llvm_mca.run(hot.text, m.triple, m.mcpu, m.mattr)
    return mca.KernelEstimate("f", hot.macs, 1, hot, res, mca.peak(cpu), cpu=cpu)


def test_hot_loop_counts_the_dots_with_a_memory_source():
    hot = _asm.hot_loop("f", _asm.parse(".type f,@function\nf:\n.Lx:\nvpdpbusd %zmm1, %zmm2, %zmm3\n"
                                        "vpdpbusd 64(%rsi){1to16}, %zmm2, %zmm4\nvpdpbusd (%rdi), %zmm2, %zmm5\n"
                                        "jne .Lx\nretq\n"), ["f"])
    assert hot.dots == {"vpdpbusd zmm": 3} and hot.memory_dots == {"vpdpbusd zmm": 2}


@needs_mca
@pytest.mark.parametrize("cpu", ["znver4", "cascadelake"])
def test_form_share_rates_a_loop_at_its_own_dot_forms(cpu):
    """The peak loop of each dot form is at 100% of its own form's rate. LLVM 22's Zen 4 model gives the
    register form half the memory form's rate, so there the register-form loop's share of the model's
    peak is about half; Cascade Lake's model rates the forms alike."""
    for form in ("vpdpbusd zmm", "vpdpbusd zmm mem"):
        k = _estimate(cpu, _peak.loop_text(form))
        assert k.form_share == pytest.approx(1.0, rel=0.02), (form, k.form_share)
    register = _estimate(cpu, _peak.loop_text("vpdpbusd zmm"))
    half = _peak.form_peak(cpu, "vpdpbusd zmm").macs_per_cycle < 0.75 * mca.peak(cpu).macs_per_cycle
    assert half == (cpu == "znver4")
    assert register.share == pytest.approx(0.5 if half else 1.0, rel=0.05), register.share


@needs_mca
def test_form_share_falls_back_to_the_share_without_a_peak_loop_of_the_form():
    # no peak loop of a memory-form ymm vpdpbusd: the share of the model's peak stands
    assert "vpdpbusd ymm mem" not in _peak.FORMS
    k = _estimate("znver4", ".Lpeak:\n" + "\n".join(f"vpdpbusd (%rsi), %ymm15, %ymm{i}" for i in range(12))
                  + "\naddq $1, %rax\ncmpq %rdx, %rax\njne .Lpeak\n")
    assert k.hot.memory_dots == {"vpdpbusd ymm": 12} and k.form_share == k.share > 0


_EPILOGUE_NESTED = """\
\t.type\ttvmgen_default_fused_nn_conv2d_hardswish_compute_,@function
tvmgen_default_fused_nn_conv2d_hardswish_compute_:
.LBB2_1:                                # tile loop: the conv's reduction unrolled
\tvpdpbusd\t(%rsi), %ymm0, %ymm1
\tvpdpbusd\t32(%rsi), %ymm0, %ymm2
\tvpdpbusd\t64(%rsi), %ymm0, %ymm3
.LBB2_2:                                # epilogue loop: hard-swish's int16 multiply
\tvpmaddwd\t%ymm7, %ymm8, %ymm7
\tvpdpwssd\t%ymm7, %ymm8, %ymm9
\tjne\t.LBB2_2
\tjne\t.LBB2_1
\tretq
"""


def test_pair_multiplies_of_a_vnni_kernel_are_epilogue():
    funcs = _asm.parse(_EPILOGUE_NESTED)
    name = "tvmgen_default_fused_nn_conv2d_hardswish"
    hot = _asm.hot_loop(name, funcs, _asm.kernels(funcs)[name])
    assert hot.dots == {"vpdpbusd ymm": 3} and hot.macs == 96 and hot.accumulators == 3


def test_conv_described_in_words():
    from tvm_ext.tools.mca import _macs

    assert _macs.describe(_conv("uint8", 16, 16)) == "3x3 dw 16 8x8"
    assert _macs.describe(_conv("uint8", 16, 1)) == "3x3 16->16 8x8"
    assert _macs.describe(_conv("uint8", 16, 4)) == "3x3 16->16 g4 8x8"


def test_tile_loop_over_a_nested_epilogue_loop():
    # x86-64-v3: the conv's vpmaddwd (reduction unrolled) in the tile loop, a hard-swish's vpmaddwd in the
    # epilogue loop nested in it
    text = (".type tvmgen_default_fused_nn_conv2d_hs_compute_,@function\ntvmgen_default_fused_nn_conv2d_hs_compute_:\n"
            ".LBB3_1:\n" + "".join(f"vpmaddwd {32 * i}(%rsi), %ymm14, %ymm13\nvpaddd %ymm13, %ymm{i}, %ymm{i}\n"
                                   for i in range(12))
            + ".LBB3_2:\nvpmaddwd %ymm7, %ymm8, %ymm7\njne .LBB3_2\njne .LBB3_1\nretq\n")
    funcs = _asm.parse(text)
    name = "tvmgen_default_fused_nn_conv2d_hs"
    hot = _asm.hot_loop(name, funcs, _asm.kernels(funcs)[name])
    assert hot.dots == {"vpmaddwd ymm": 12} and hot.macs == 12 * 16


@pytest.mark.parametrize("kw,dots,macs", [(3, 0, (3 * 64 + 32) * 3 // 4), (5, 0, (3 * 64 + 32) * 5 // 8),
                                           (4, 0, 3 * 64 + 32), (3, 2, (3 * 64 + 32) * 3 // 8),
                                           (5, 2, (3 * 64 + 32) * 5 // 8), (7, 3, round((3 * 64 + 32) * 7 / 12))])
def test_x86_depthwise_tap_dots_count_the_taps_with_a_weight(kw, dots, macs):
    """A depthwise kernel's vpdpbusd multiplies 4 taps per lane; of an output's ``dots`` per kernel row
    (``ceil(kw / 4)`` when 0) ``kw`` taps of ``4 x dots`` carry a weight: a zmm dot (16 lanes x 4) counts 48
    products for a 3x3 in one dot, 24 in two, 40 for a 5x5 in two, all 64 for kw = 4 in one; a ymm dot
    (8 lanes) half as many."""
    hot = _asm.HotLoop("k", "f", (), {"vpdpbusd zmm": 3, "vpdpbusd ymm": 1}, 3 * 64 + 32)
    assert _asm.depthwise_taps(hot, kw, dots).macs == macs


@needs_mca
def test_form_share_of_an_aarch64_loop_is_its_share():
    k = _estimate("cortex-a72", _peak.loop_text("smlal .4s"))
    assert k.hot.memory_dots == {} and k.form_share == k.share


@needs_mca
def test_whole_model_form_share_weighs_kernels_by_macs():
    # register-form and memory-form peak loops, each at its own form's rate: the whole is at 100% too
    ks = [_estimate("znver4", _peak.loop_text(f)) for f in ("vpdpbusd zmm", "vpdpbusd zmm mem")]
    whole = mca.Analysis("znver4", mca.peak("znver4"), ks)
    assert whole.form_share == pytest.approx(1.0, rel=0.02) and whole.share < 0.8
