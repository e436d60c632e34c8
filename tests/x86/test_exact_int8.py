"""tvm_ext.x86.exact_int8: int8 convs and dense without VNNI against exact integer arithmetic (numpy).

Code is executed only where the host has every instruction it was compiled for
(:func:`tvm_ext.x86.isa.runs_on_host`); AVX-512 targets are compiled and their assembly read.
"""
import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.contrib import graph_executor

import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.x86 import exact_dot, exact_record, pair_pack
from tvm_ext.x86 import int8_conv as x86_int8
from tvm_ext.x86.isa import runs_on_host

#: One target per instruction-set class whose int8 dot product is vpmaddubsw.
TARGETS = {
    "sse": "llvm -mcpu=x86-64-v2",
    "avx2": "llvm -mcpu=x86-64-v3",
    "avx512": "llvm -mcpu=x86-64-v4",
    "avx512-vnni-masked": "llvm -mcpu=znver4 -mattr=-avx512vnni",
}
#: The byte-split form's masks of the data bytes (0x7f7f7f7f, 0x80808080) as LLVM prints them.
SPLIT_MASKS = ("2139062143", "0x7f7f7f7f")


def _forms(lib) -> set:
    """The int8 dot products in a build: ``"pairs"`` (a conv packed in pairs, int16 vpmaddwd),
    ``"split"`` (vpmaddubsw on the byte halves), ``"saturating"`` (TVM's vpmaddubsw)."""
    asm = lib.get_lib().get_source("asm")
    module = getattr(lib, "tvm_ext_module", None)
    forms = set()
    if module is not None and "o2i" in module.astext() and "pmaddwd" in asm:
        forms.add("pairs")
    if any(m in asm for m in SPLIT_MASKS):
        forms.add("split")
    if "pmaddubsw" in asm and "split" not in forms:
        forms.add("saturating")
    return forms


def _uses_exact_form(lib) -> bool:
    forms = _forms(lib)
    assert forms, "expected an int8 vpmaddubsw or vpmaddwd kernel"
    return "saturating" not in forms


def _run(lib, **inputs):
    m = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    m.set_input(**inputs)
    m.run()
    return m.get_output(0).numpy()


def _conv(weights, size=12, stride=1, pad=1, zero_point=128):
    """qnn.conv2d: uint8 data with ``zero_point``, the given int8 OIHW weights, int32 output."""
    oc, ic, k, _ = weights.shape
    x = relay.var("x", shape=(1, ic, size, size), dtype="uint8")
    y = relay.qnn.op.conv2d(x, relay.const(weights), relay.const(zero_point), relay.const(0), relay.const(1.0),
                            relay.const(1.0), kernel_size=(k, k), channels=oc, strides=(stride, stride),
                            padding=(pad, pad), out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([x], y))


def _conv_exact(x, w, stride=1, pad=1, zero_point=128):
    """The integer convolution of ``x - zero_point`` (padded with zeros after the shift) and ``w``."""
    xs = np.pad(x.astype(np.int64) - zero_point, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oc, _, k, _ = w.shape
    out_size = (xs.shape[2] - k) // stride + 1
    out = np.zeros((1, oc, out_size, out_size), np.int64)
    span = stride * (out_size - 1) + 1
    for kh in range(k):
        for kw in range(k):
            window = xs[0, :, kh:kh + span:stride, kw:kw + span:stride]
            out[0] += np.einsum("oi,ihw->ohw", w[:, :, kh, kw].astype(np.int64), window)
    return out


def _full_range(shape, seed=0):
    return np.random.default_rng(seed).integers(-128, 128, shape).astype("int8")


def _target_param(name):
    return pytest.param(TARGETS[name], id=name)


# --- the weight check ----------------------------------------------------------------------------

@pytest.mark.parametrize("pair,fits", [
    ((64, 64), True), ((65, 64), False), ((127, 1), True), ((127, 2), False),
    ((-64, -64), True), ((-65, -64), False), ((-128, 0), True), ((-128, -1), False),
    ((127, -128), True),  # opposite signs never add up
])
def test_pairs_fit_int16_at_the_limit(pair, fits):
    w = np.array([[*pair, 0, 0], [0, 0, 0, 0]], "int8")
    assert exact_dot.pairs_fit_int16(w) is fits
    assert exact_dot.pairs_fit_int16(w[:, [2, 3, 0, 1]]) is fits, "both pairs of the group are checked"


def test_pairs_are_adjacent_bytes_only():
    """Bytes (0, 1) and (2, 3) are pairs: one large weight in each fits (255 * 127 per pair), two
    in one pair do not."""
    assert exact_dot.pairs_fit_int16(np.array([[127, 0, 127, 0]], "int8"))
    assert exact_dot.pairs_fit_int16(np.array([[0, 127, 127, 0]], "int8"))
    assert not exact_dot.pairs_fit_int16(np.array([[127, 127, 0, 0]], "int8"))


def test_pairs_fit_int16_rejects_what_it_cannot_check():
    with pytest.raises(TypeError, match="int8"):
        exact_dot.pairs_fit_int16(np.zeros((4, 4), "int16"))
    with pytest.raises(ValueError, match="whole pairs"):
        exact_dot.pairs_fit_int16(np.zeros((4, 3), "int8"))


def test_the_limit_is_the_int16_bound():
    assert 255 * exact_dot.PAIR_LIMIT <= 32767 < 255 * (exact_dot.PAIR_LIMIT + 1)


# --- executed: exact against numpy ----------------------------------------------------------------

# The default tier runs a diagonal, each kernel and stride once, each pipeline and each class at least once
# ([3-1-int8-pipeline-avx2], [1-1-plain-avx2], [3-2-plain-sse]); the slow tier every combination
@pytest.mark.parametrize("k,stride,pipeline,target", [
    pytest.param(k, stride, pipeline, TARGETS[name], id=f"{k}-{stride}-{form}-{name}",
                 marks=() if (k, stride, pipeline, name) in {(3, 1, True, "avx2"), (1, 1, False, "avx2"),
                                                             (3, 2, False, "sse")} else pytest.mark.slow)
    for k, stride in ((3, 1), (1, 1), (3, 2)) for pipeline, form in ((False, "plain"), (True, "int8-pipeline"))
    for name in ("sse", "avx2")])
def test_full_range_conv_is_exact(target, pipeline, k, stride):
    """Full-range weights (including -128) against uniform uint8 data: every accumulator is the
    integer result, with tvm_ext.build alone and with the int8 pipeline's kernels."""
    if not runs_on_host(target):
        pytest.skip(f"host lacks instructions of '{target}'")
    w = _full_range((32, 32, k, k))
    x = np.random.default_rng(1).integers(0, 256, (1, 32, 12, 12)).astype("uint8")
    mod = _conv(w, stride=stride, pad=k // 2)
    lib = tvm_ext.build(mod, target=target, passes=pipelines.int8() if pipeline else ())
    assert _forms(lib) == {"pairs"}
    np.testing.assert_array_equal(_run(lib, x=x), _conv_exact(x, w, stride, k // 2))


@pytest.mark.parametrize("target", [
    # the extreme sums at SSE; [avx2] runs them in the default tier, and test_full_range_conv_is_exact[3-2-plain-sse]
    # and test_pair_packed_conv_is_exact[sse] the pair form at SSE
    pytest.param(TARGETS["sse"], id="sse", marks=pytest.mark.slow), _target_param("avx2")])
def test_worst_case_pairs_are_exact(target):
    """Every pair at its extreme: data 255 against weights 127 and -128, and data 0 (the shifted
    zero point), the sums stock TVM saturates most."""
    if not runs_on_host(target):
        pytest.skip(f"host lacks instructions of '{target}'")
    w = np.full((16, 16, 1, 1), 127, "int8")
    w[8:] = -128
    mod = _conv(w, size=4, pad=0, zero_point=0)
    for value in (255, 128, 127, 0):
        x = np.full((1, 16, 4, 4), value, "uint8")
        got = tvm_ext.build(mod, target=target)
        np.testing.assert_array_equal(_run(got, x=x), _conv_exact(x, w, pad=0, zero_point=0))


@pytest.mark.parametrize("target", [_target_param("avx2")])
def test_stock_saturates_where_tvm_ext_is_exact(target):
    """The test data above is data that saturates: stock TVM, and tvm-ext forced into TVM's form
    (:func:`exact_record.saturating`), miss the integer result on it."""
    if not runs_on_host(target):
        pytest.skip(f"host lacks instructions of '{target}'")
    w = _full_range((32, 32, 3, 3))
    x = np.random.default_rng(1).integers(0, 256, (1, 32, 12, 12)).astype("uint8")
    mod, want = _conv(w), _conv_exact(x, w)
    with tvm.transform.PassContext(opt_level=3):
        stock = _run(relay.build(mod, target=target), x=x)
    with exact_record.saturating():
        forced = tvm_ext.build(mod, target=target)
    assert _forms(forced) == {"saturating"}
    assert (stock != want).sum() > want.size // 2
    np.testing.assert_array_equal(_run(forced, x=x), stock)


@pytest.mark.parametrize("target", [
    # the split form at SSE; [avx2] checks it in the default tier
    pytest.param(TARGETS["sse"], id="sse", marks=pytest.mark.slow), _target_param("avx2")])
def test_relay_build_inside_kernels_is_exact(target):
    """A plain relay.build inside kernels() records no weights: every workload takes the exact form."""
    if not runs_on_host(target):
        pytest.skip(f"host lacks instructions of '{target}'")
    w = np.full((16, 16, 3, 3), 3, "int8")  # fits int16, but nobody checked
    x = np.random.default_rng(2).integers(0, 256, (1, 16, 12, 12)).astype("uint8")
    with x86_int8.kernels(schedule=False), tvm.transform.PassContext(opt_level=3):
        lib = relay.build(_conv(w), target=target)
    assert _forms(lib) == {"split"}
    np.testing.assert_array_equal(_run(lib, x=x), _conv_exact(x, w))


def _dense(w):
    x = relay.var("x", shape=(8, w.shape[1]), dtype="uint8")
    y = relay.qnn.op.dense(x, relay.const(w), relay.const(0), relay.const(0), relay.const(1.0), relay.const(1.0),
                           units=w.shape[0], out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([x], y))


@pytest.mark.parametrize("target", [_target_param("sse"), _target_param("avx2")])
def test_full_range_dense_is_exact(target):
    """(TVM 0.19 packs int8 dense for vpmaddubsw only on AVX-512; below it computes in int32.)"""
    if not runs_on_host(target):
        pytest.skip(f"host lacks instructions of '{target}'")
    w = _full_range((64, 128), seed=5)
    xv = np.random.default_rng(4).integers(0, 256, (8, 128)).astype("uint8")
    lib = tvm_ext.build(_dense(w), target=target)
    np.testing.assert_array_equal(_run(lib, x=xv), xv.astype(np.int64) @ w.astype(np.int64).T)


@pytest.mark.parametrize("target", [_target_param("avx512"), _target_param("avx512-vnni-masked")])
def test_dense_on_avx512_takes_the_exact_form_unless_its_weights_fit(target):
    """Compiled only (this class may not run here); executed where the host has it."""
    w = _full_range((64, 128), seed=5)
    fit = (w // 4).astype("int8")
    xv = np.random.default_rng(4).integers(0, 256, (8, 128)).astype("uint8")
    for weights, form in ((w, "split"), (fit, "saturating")):
        lib = tvm_ext.build(_dense(weights), target=target)
        assert _forms(lib) == {form}
        if runs_on_host(target):
            np.testing.assert_array_equal(_run(lib, x=xv), xv.astype(np.int64) @ weights.astype(np.int64).T)


# --- per workload: the saturating form only where every weight pair fits --------------------------

# [sse] and [avx512-vnni-masked] are slow: the same per-workload choice at SSE and at Zen 4 with VNNI masked (the
# avx512 class: test_isa.py::test_isa_class); [avx2] and [avx512] check it in the default tier
@pytest.mark.parametrize("target", [
    pytest.param(target, id=name, marks=pytest.mark.slow if name in ("sse", "avx512-vnni-masked") else ())
    for name, target in TARGETS.items()])
def test_weights_that_fit_keep_vpmaddubsw(target):
    """Compiled for every non-VNNI class: weights in [-64, 64] keep TVM's form, full-range ones
    take the exact form; executed (against numpy) where the host can."""
    fit = np.random.default_rng(6).integers(-64, 65, (32, 32, 3, 3)).astype("int8")
    for w, form in ((fit, "saturating"), (_full_range((32, 32, 3, 3)), "pairs")):
        lib = tvm_ext.build(_conv(w), target=target, passes=pipelines.int8())
        assert _forms(lib) == {form}
        if runs_on_host(target):
            x = np.random.default_rng(7).integers(0, 256, (1, 32, 12, 12)).astype("uint8")
            np.testing.assert_array_equal(_run(lib, x=x), _conv_exact(x, w))


@pytest.mark.parametrize("target", [_target_param("avx2")])
def test_layers_of_one_shape_each_get_their_own_form(target):
    """Two convs of one shape, one with weights that fit and one without: the second is packed in
    pairs (another kernel shape, so another compiled kernel), the first keeps vpmaddubsw; both
    exact."""
    fit = np.random.default_rng(8).integers(-64, 65, (16, 16, 3, 3)).astype("int8")
    wide = _full_range((16, 16, 3, 3), seed=9)
    x = relay.var("x", shape=(1, 16, 10, 10), dtype="uint8")

    def conv(data, w):
        return relay.qnn.op.conv2d(data, relay.const(w), relay.const(0), relay.const(0), relay.const(1.0),
                                   relay.const(1.0), kernel_size=(3, 3), channels=16, padding=(1, 1),
                                   out_dtype="int32")

    y = relay.concatenate([conv(x, fit), conv(x, wide)], axis=1)
    lib = tvm_ext.build(tvm.IRModule.from_expr(relay.Function([x], y)), target=target)
    assert _forms(lib) == {"pairs", "saturating"}
    assert lib.tvm_ext_module.astext().count("o2i") == 1
    if runs_on_host(target):
        xv = np.random.default_rng(10).integers(0, 256, (1, 16, 10, 10)).astype("uint8")
        want = np.concatenate([_conv_exact(xv, fit, zero_point=0), _conv_exact(xv, wide, zero_point=0)], axis=1)
        np.testing.assert_array_equal(_run(lib, x=xv), want)


def test_weights_that_are_not_constants_take_the_exact_form():
    target = TARGETS["avx2"]
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="uint8")
    w = relay.var("w", shape=(16, 16, 3, 3), dtype="int8")
    y = relay.nn.conv2d(x, w, padding=1, channels=16, kernel_size=3, out_dtype="int32")
    lib = tvm_ext.build(tvm.IRModule.from_expr(relay.Function([x, w], y)), target=target)
    if runs_on_host(target):
        assert _uses_exact_form(lib) or "pmaddubsw" not in lib.get_lib().get_source("asm")
        wv = _full_range((16, 16, 3, 3), seed=11)
        xv = np.random.default_rng(12).integers(0, 256, (1, 16, 8, 8)).astype("uint8")
        np.testing.assert_array_equal(_run(lib, x=xv, w=wv), _conv_exact(xv, wv, zero_point=0))


def test_vnni_is_left_to_vpdpbusd():
    """Compiled only: VNNI accumulates exactly, so its code has no byte split."""
    target = "llvm -mcpu=znver4"
    import subprocess
    import sys
    # built in a child process: an LLVM abort must not take the test session with it
    code = (
        "import numpy as np, tvm_ext\n"
        "from tvm import relay\nimport tvm\n"
        "w = np.random.default_rng(0).integers(-128, 128, (32, 32, 3, 3)).astype('int8')\n"
        "x = relay.var('x', shape=(1, 32, 12, 12), dtype='uint8')\n"
        "y = relay.nn.conv2d(x, relay.const(w), padding=1, channels=32, kernel_size=3, out_dtype='int32')\n"
        f"lib = tvm_ext.build(tvm.IRModule.from_expr(relay.Function([x], y)), target='{target}')\n"
        "asm = lib.get_lib().get_source('asm')\n"
        "print('vpdpbusd' in asm, any(m in asm for m in ('2139062143', '0x7f7f7f7f')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["True", "False"]


# --- the zoo's int8 ResNet-50s (slow: full-size builds) --------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50_int8_qoperator", "resnet50_int8_relay", "resnet50_int8_qdq"])
@pytest.mark.parametrize("small", [True, False], ids=["small", "full"])
def test_zoo_resnet_is_exact_at_the_host_target(name, small):
    """The int8 pipeline at the host's instruction set against the same integer graph built at
    plain ``llvm`` (TVM's generic int8 kernels: no SIMD dot product, exact integer arithmetic), bit
    for bit, on two inputs. The QDQ model is compared after the pipeline's start stage, which makes
    its convolutions integer (the imported graph computes them in float). relay.quantize keeps its
    first conv and its head in float, which a generic build rounds without fused multiply-adds:
    within 1e-5 there (a saturated pair moves a logit by about 0.1)."""
    from tvm_ext.tools import zoo
    from tvm_ext.x86.target import host_target

    m = zoo.load(name, small=small)
    pipeline = pipelines.int8()
    lib = tvm_ext.build(m.mod, target=host_target(), params=m.params, passes=pipeline)
    graph, params = m.mod, m.params
    if name.endswith("qdq"):  # the integer graph the start stage makes (params bound into it)
        bound = tvm.IRModule.from_expr(relay.build_module.bind_params_by_name(m.mod["main"], m.params))
        with host_target(), tvm.transform.PassContext(opt_level=3):
            graph = pipeline.start(relay.transform.InferType()(bound))
        params = None
    with tvm.transform.PassContext(opt_level=3):
        reference = relay.build(graph, target="llvm", params=params)
    for seed in (0, 1):
        x = zoo.sample_input(m, seed=seed)
        got, want = _run(lib, **{m.input_name: x}), _run(reference, **{m.input_name: x})
        if name == "resnet50_int8_relay":
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
        else:
            np.testing.assert_array_equal(got, want)


# --- PairPackInt8Convs: structure, numerics, idempotence, no match ---------------------------------

def _nchwc_conv(weight_oihw, ic_bn=8, oc_bn=8, data_dtype="uint8", groups=1):
    """An AlterOpLayout-style int8 conv: NCHW{ic_bn}c data, the kernel packed OIHW{ic/4}i{oc}o4i."""
    oc, ic, k, _ = weight_oihw.shape
    w7 = weight_oihw.reshape(oc // oc_bn, oc_bn, ic // ic_bn, ic_bn // 4, 4, k, k).transpose(0, 2, 5, 6, 3, 1, 4)
    x = relay.var("x", shape=(1, ic // ic_bn, 6, 6, ic_bn), dtype=data_dtype)

    def conv(kernel, layout):
        return relay.nn.contrib_conv2d_nchwc(x, relay.const(np.ascontiguousarray(kernel)), channels=oc,
                                             kernel_size=(k, k), padding=(k // 2, k // 2), groups=groups,
                                             data_layout=f"NCHW{ic_bn}c", kernel_layout=layout,
                                             out_layout=f"NCHW{oc_bn}c", out_dtype="int32")

    before = tvm.IRModule.from_expr(relay.Function([x], conv(w7, f"OIHW{ic_bn // 4}i{oc_bn}o4i")))
    expected = tvm.IRModule.from_expr(relay.Function(
        [x], conv(exact_dot.pair_kernel(w7).astype("int16"), f"OIHW{ic_bn // 2}i{oc_bn}o2i")))
    return before, expected


def test_pair_kernel_keeps_every_weight():
    w = np.arange(2 * 3 * 2 * 8 * 4).reshape(2, 3, 1, 1, 2, 8, 4)
    p = exact_dot.pair_kernel(w)
    assert p.shape == (2, 3, 1, 1, 4, 8, 2)
    for f in range(2):
        for j in range(4):
            np.testing.assert_array_equal(p[..., 2 * f + j // 2, :, j % 2], w[..., f, :, j])
    with pytest.raises(ValueError, match="ic/4"):
        exact_dot.pair_kernel(np.zeros((2, 2, 1, 1, 2, 8, 2), "int8"))


def test_pair_pack_structure():
    r"""conv(x: u8, w: i8[2, 2, 3, 3, 2, 8, 4]) -> conv(x, int16(pair_kernel(w)): i16[2, 2, 3, 3, 4, 8, 2])"""
    before, expected = _nchwc_conv(_full_range((16, 16, 3, 3)))
    got = pair_pack.PairPackInt8Convs()(before)
    tvm.ir.assert_structural_equal(got, relay.transform.InferType()(expected), map_free_vars=True)


def test_pair_pack_is_idempotent_and_pure():
    before, _ = _nchwc_conv(_full_range((16, 16, 3, 3)))
    text = before.astext()
    once = pair_pack.PairPackInt8Convs()(before)
    tvm.ir.assert_structural_equal(pair_pack.PairPackInt8Convs()(once), once)
    assert before.astext() == text, "the caller's module is not mutated"


@pytest.mark.parametrize("case", ["fits", "int8 data"])
def test_pair_pack_leaves_what_it_must_not_pack(case, caplog):
    import logging

    rng = np.random.default_rng(3)
    w = rng.integers(-64, 65, (16, 16, 3, 3)).astype("int8") if case == "fits" else _full_range((16, 16, 3, 3))
    before, _ = _nchwc_conv(w, data_dtype="int8" if case == "int8 data" else "uint8")
    with caplog.at_level(logging.DEBUG, logger="tvm_ext.x86.pair_pack"):
        got = pair_pack.PairPackInt8Convs()(before)
    tvm.ir.assert_structural_equal(got, relay.transform.InferType()(before))
    assert {"fits": "fits int16", "int8 data": "not uint8 x int8"}[case] in caplog.text


def test_pair_pack_types_an_untyped_module_first():
    before, expected = _nchwc_conv(_full_range((16, 16, 3, 3)))
    untyped = tvm.IRModule.from_expr(before["main"])  # from_expr does not infer types
    text = untyped.astext()
    got = pair_pack.PairPackInt8Convs()(untyped)
    tvm.ir.assert_structural_equal(got, relay.transform.InferType()(expected), map_free_vars=True)
    assert untyped.astext() == text


@pytest.mark.parametrize("wrap", ["If", "Let"])
def test_pair_pack_rewrites_convs_under_if_and_let(wrap):
    """Packing changes a constant kernel and its layout only: the conv computes the same under any
    control flow, so a conv in an ``If`` branch or a ``Let`` binding is packed like any other."""
    before, expected = _nchwc_conv(_full_range((16, 16, 3, 3)))

    def wrapped(mod):
        f = mod["main"]
        if wrap == "If":
            cond = relay.var("c", shape=(), dtype="bool")
            body = relay.If(cond, f.body, relay.zeros_like(f.body))
            return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([*f.params, cond], body)))
        v = relay.var("v")
        body = relay.Let(v, f.body, relay.add(v, v))
        return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(list(f.params), body)))

    got = pair_pack.PairPackInt8Convs()(wrapped(before))
    tvm.ir.assert_structural_equal(got, wrapped(expected), map_free_vars=True)


@pytest.mark.parametrize("target", [_target_param("sse"), _target_param("avx2")])
def test_pair_packed_conv_is_exact(target):
    """The packed conv, built alone, against numpy (through the module's own unpacking of the
    NCHWc layouts)."""
    if not runs_on_host(target):
        pytest.skip(f"host lacks instructions of '{target}'")
    w = _full_range((16, 16, 3, 3), seed=13)
    _, packed = _nchwc_conv(w)
    xv = np.random.default_rng(14).integers(0, 256, (1, 2, 6, 6, 8)).astype("uint8")
    with x86_int8.kernels(schedule=False), tvm.transform.PassContext(opt_level=3):
        lib = relay.build(packed, target=target)
    x_nchw = xv.transpose(0, 1, 4, 2, 3).reshape(1, 16, 6, 6)
    want = _conv_exact(x_nchw, w, zero_point=0).reshape(1, 2, 8, 6, 6).transpose(0, 1, 3, 4, 2)
    np.testing.assert_array_equal(_run(lib, x=xv), want)


def test_pairs_only_for_instruction_sets_that_saturate():
    assert pair_pack.packs_pairs(tvm.target.Target(TARGETS["avx2"]))
    assert pair_pack.packs_pairs(tvm.target.Target(TARGETS["avx512"]))
    assert not pair_pack.packs_pairs(tvm.target.Target("llvm -mcpu=znver4"))
    assert not pair_pack.packs_pairs(tvm.target.Target("llvm -mtriple=aarch64-linux-gnu"))
    with exact_record.saturating():
        assert not pair_pack.packs_pairs(tvm.target.Target(TARGETS["avx2"]))
