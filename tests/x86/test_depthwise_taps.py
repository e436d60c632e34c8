"""tvm_ext.x86.depthwise_taps: 8-bit depthwise convs as one vpdpbusd per 4 taps on AVX-512 VNNI, the taps
permuted in registers (AVX-512 VBMI) or the input regrouped once (without it).

Structure is read from the assembly at any host; results are executed only where the host runs the
target's code and compared with numpy's int64 arithmetic."""
import re

import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_ext.x86 import int8_conv as x86_int8
from tvm_ext.x86 import int8_policy

from ._int8_cases import _kernel_names, _run

VNNI = "llvm -mcpu=x86-64-v4 -mattr=+avx512vnni"
VNNI_VBMI = "llvm -mcpu=icelake-server"
#: the two forms at CPUs that have them: in registers (VBMI), regrouped (Cascade Lake: VNNI, no VBMI)
FORMS = {"registers": VNNI_VBMI, "regrouped": "llvm -mcpu=cascadelake"}


def _depthwise(channels, size, k, strides, padding, dtype="uint8", kdtype="int8", seed=0):
    """A depthwise conv (``k`` = (kh, kw), ``size`` = (h, w)) with the int8 extremes in its data and
    weights; returns the module, the input and the weights."""
    rng = np.random.default_rng(seed)
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    x = rng.integers(lo, hi, (1, channels) + size).astype(dtype)
    x.flat[:3] = hi - 1
    w = rng.integers(-128, 128, (channels, 1) + k).astype(kdtype)
    w.flat[:2] = -128 if kdtype == "int8" else 255
    var = relay.var("x", shape=x.shape, dtype=dtype)
    y = relay.nn.conv2d(var, relay.const(w), kernel_size=k, channels=channels, groups=channels, strides=strides,
                        padding=padding, out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([var], y)), x, w


def _numpy(x, w, strides, padding):
    top, left, down, right = padding
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (top, down), (left, right)))
    (kh, kw), (sh, sw) = w.shape[-2:], strides
    oh, ow = (xp.shape[2] - kh) // sh + 1, (xp.shape[3] - kw) // sw + 1
    out = np.zeros((1, x.shape[1], oh, ow), np.int64)
    for a in range(kh):
        for b in range(kw):
            out += xp[:, :, a:a + sh * (oh - 1) + 1:sh, b:b + sw * (ow - 1) + 1:sw] * w[None, :, 0, a, b, None, None]
    return out


def _build(mod, target, **kw):
    with x86_int8.kernels(**kw), tvm.transform.PassContext(opt_level=3):
        return relay.build(mod, target=target)


def _products(lib) -> set:
    """The module's multiply and byte-permute instructions with their widest register (its only
    products are the depthwise conv's: the other kernels re-block)."""
    asm = lib.get_lib().get_source("asm")
    # AVX-VNNI hosts may print the 256-bit dot with its VEX prefix: "{vex} vpdpbusd"
    return {(m, r) for m, r in re.findall(r"\n\s+(?:\{vex\}\s+)?(vpdp\w+|vpmadd\w+|vpermb)\s+[^\n]*%([xyz]mm)\d+\n",
                                          asm)}


#: (channels, (h, w), (kh, kw), strides, padding top/left/bottom/right): blocks of 16 and 8, 3x3 and
#: 5x5 and a 3x5, strides 1, 2 and (2, 1), asymmetric and no padding, odd widths; in the last two a
#: stride leaves the input's last row, or its last column, unread
CASES = [(32, (7, 9), (3, 3), (1, 1), (1, 1, 1, 1)), (48, (6, 20), (5, 5), (2, 1), (2, 2, 2, 2)),
         (24, (5, 11), (3, 3), (2, 2), (0, 1, 1, 0)), (16, (4, 13), (3, 5), (1, 2), (1, 2, 0, 1)),
         (16, (21, 10), (2, 3), (2, 1), (0, 1, 0, 0)), (40, (7, 23), (1, 4), (2, 2), (0, 0, 0, 0))]


@pytest.mark.parametrize("target", [VNNI, VNNI_VBMI])
def test_vnni_depthwise_takes_four_taps_per_lane(target):
    """Structure: the depthwise kernel's products are vpdpbusd (4 bytes per lane), with the bytes
    permuted in registers (``vpermb`` where the target has AVX-512 VBMI); TVM's one widened tap per
    lane (``vpdpwssd``) is gone. Blocks of 16 channels take the zmm form, of 8 the ymm form."""
    for channels, form in ((32, "zmm"), (24, "ymm")):
        mod, _, _ = _depthwise(channels, (6, 10), (3, 3), (1, 1), (1, 1, 1, 1))
        ours = {m for m, _ in _products(_build(mod, target))}
        assert ("vpdpbusd", form) in _products(_build(mod, target))
        assert ours <= {"vpdpbusd", "vpermb"}, ours
        assert ("vpermb" in ours) == ("icelake" in target)
        stock = {m for m, _ in _products(_build(mod, target, schedule=False))}
        assert "vpdpbusd" not in stock and stock & {"vpmaddwd", "vpdpwssd"}, stock


@pytest.mark.parametrize("target,mod_args", [
    ("llvm -mcpu=x86-64-v3", {}),  # AVX2: the class keeps TVM's depthwise conv
    ("llvm -mcpu=x86-64-v4", {}),  # AVX-512 without VNNI
    (VNNI, {"dtype": "int8"}),  # int8 data: vpdpbusd multiplies unsigned bytes
    (VNNI, {"kdtype": "uint8"}),
])
def test_other_depthwise_convs_keep_tvms_kernels(target, mod_args):
    """Unchanged where the form does not apply: the same kernels and assembly as with the form
    switched off by policy."""
    mod, _, _ = _depthwise(32, (6, 10), (3, 3), (1, 1), (1, 1, 1, 1), **mod_args)
    lib = _build(mod, target)
    assert not {m for m, _ in _products(lib)} & {"vpdpbusd", "vpermb"}
    assert not int8_policy.policy(tvm.target.Target(target)).depthwise_taps or mod_args


def test_only_avx512_vnni_classes_take_the_form():
    takes = {t: int8_policy.policy(tvm.target.Target(t)).depthwise_taps
             for t in ("llvm -mcpu=x86-64-v3", "llvm -mcpu=x86-64-v4", VNNI, "llvm -mcpu=sapphirerapids")}
    assert takes == {"llvm -mcpu=x86-64-v3": False, "llvm -mcpu=x86-64-v4": False, VNNI: True,
                     "llvm -mcpu=sapphirerapids": True}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}ch-{c[2][0]}x{c[2][1]}-s{c[3][0]}{c[3][1]}" for c in CASES])
def test_vnni_depthwise_equals_numpy(case, form):
    """Every case takes the form at its target; where the host runs the target's code the build runs and
    equals numpy's int64 sums bit for bit (elsewhere it is compiled only)."""
    from tvm_ext.x86.isa import runs_on_host

    channels, size, k, strides, padding = case
    mod, x, w = _depthwise(channels, size, k, strides, padding)
    target = FORMS[form]
    lib = _build(mod, target)
    assert "vpdpbusd" in {m for m, _ in _products(lib)}
    if runs_on_host(target):
        assert np.array_equal(_run(lib, x).astype(np.int64), _numpy(x, w, strides, padding))


def _hot_loop(lib):
    """The depthwise kernel's hot loop (``tvm_ext.tools.mca``'s reading of the assembly): its mnemonics."""
    from tvm_ext.tools.mca import _asm

    funcs = _asm.parse(lib.get_lib().get_source("asm"))
    (name,) = [n for n in _asm.kernels(funcs) if "depthwise" in n]
    hot = _asm.hot_loop(name, funcs, _asm.kernels(funcs)[name], "depthwise")
    return {line.split()[0] for line in hot.text.splitlines() if line.strip()}


@pytest.mark.parametrize("k", [(3, 3), (5, 5)])
def test_without_vbmi_the_loop_has_no_permutes(k):
    """Without VBMI the input is regrouped in the padded copy: the conv's hot loop is loads and ``vpdpbusd``,
    with no ``vpermd``/``vpshufb``; with VBMI each 4 taps are permuted in the loop (``vpermb``)."""
    mod, _, _ = _depthwise(32, (6, 40), k, (1, 1), (k[0] // 2,) * 4)
    regrouped, registers = _hot_loop(_build(mod, FORMS["regrouped"])), _hot_loop(_build(mod, FORMS["registers"]))
    assert "vpdpbusd" in regrouped and not regrouped & {"vpermb", "vpermd", "vpshufb", "vpermq"}, regrouped
    assert {"vpdpbusd", "vpermb"} <= registers, registers


@pytest.mark.parametrize("kw,sw,out_w,regrouped,registers", [
    (3, 1, 40, 2, 1), (5, 1, 40, 2, 2), (7, 1, 40, 3, 2), (4, 1, 40, 2, 1),
    (3, 2, 40, 2, 1),   # phases 0 and 2: the second group only at phase 2
    (4, 4, 10, 1, 1),   # one phase: every output starts a group
    (3, 1, 1, 1, 1),    # one output: phase 0 only
])
def test_dots_per_kernel_row(kw, sw, out_w, regrouped, registers):
    """The most groups of 4 pixels an output's kernel row meets over its phases (regrouped), or
    ``ceil(kw / 4)`` groups of taps (in registers)."""
    from tvm_ext.x86 import depthwise_taps

    assert depthwise_taps.dots_per_kernel_row(kw, sw, out_w, tvm.target.Target(FORMS["regrouped"])) == regrouped
    assert depthwise_taps.dots_per_kernel_row(kw, sw, out_w, tvm.target.Target(FORMS["registers"])) == registers


def test_depthwise_in_a_model_keeps_its_kernel_count():
    """A conv -> depthwise -> conv chain at AVX-512 VNNI: the same kernels with the form as TVM's
    (the padded input is written inside the depthwise kernel)."""
    from ._int8_cases import _conv_depthwise_conv

    mod = _conv_depthwise_conv()
    assert len(_kernel_names(_build(mod, VNNI))) == len(_kernel_names(_build(mod, VNNI, schedule=False)))
