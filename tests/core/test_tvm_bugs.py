"""Tests of tvm_ext.core.tvm_bugs: a known TVM 0.19 bug is refused with a clear error naming the cause,
or, where tvm-ext can route around it, the build is retried without the pass at fault."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.testing import infer
from tvm_ext.core.tvm_bugs import UnsupportedByTVM, check_module


def dense(units, k=8, dtype="int8", qnn=False):
    """x:int8[1, k] -> dense(W:int8[units, k]) (units=8 fails inside relay.build for AVX-512)"""
    x = relay.var("x", shape=(1, k), dtype=dtype)
    w = relay.const(np.ones((units, k), "int8"))
    if qnn:
        zp, s = relay.const(0, "int32"), relay.const(np.float32(0.1))
        return infer(relay.qnn.op.dense(x, w, zp, zp, s, s, units=units, out_dtype="int32"))
    return infer(relay.nn.dense(x, w, units=units, out_dtype="int32"))


AVX512 = tvm.target.Target("llvm -mcpu=skylake-avx512")
AVX2 = tvm.target.Target("llvm -mcpu=haswell")


def test_int8_dense_units_not_multiple_of_16_refused_on_avx512():
    with pytest.raises(UnsupportedByTVM,
                       match=r"nn.dense with int8 data and int8 weight \[8, 8\].*units divisible by 16"):
        check_module(dense(8), AVX512)


def test_int8_qnn_dense_is_not_refused_and_builds_exactly():
    """qnn.Legalize shifts int8 data to uint8 before the buggy dense legalization sees it (ORT's S8S8
    models are made of such denses): accepted, and the host build is exact."""
    mod = dense(100, k=66, qnn=True)
    check_module(mod, AVX512)
    fac = tvm_ext.build(mod)
    x = np.random.RandomState(0).randint(-128, 128, (1, 66)).astype("int8")
    from tvm_ext.testing import run_module

    (out,) = run_module(fac, {"x": x})
    np.testing.assert_array_equal(out, x.astype(np.int64) @ np.ones((100, 66), np.int64).T)


@pytest.mark.parametrize("mod", [dense(16), dense(8, dtype="uint8"), dense(32, k=4)],
                         ids=["units16", "uint8", "units32"])
def test_buildable_dense_accepted(mod):
    check_module(mod, AVX512)


def test_avx2_target_not_affected():
    check_module(dense(8), AVX2)  # the legalization only pads on AVX-512BW / AMX targets


def test_build_raises_clear_error_instead_of_tvm_diagnostic():
    host = tvm_ext.build_target()
    mod = dense(8)
    if not check_avx512(host):
        pytest.skip("host has no AVX-512BW: TVM builds this dense")
    with pytest.raises(UnsupportedByTVM, match="TVM 0.19 cannot build it"):
        tvm_ext.build(mod)


def check_avx512(target) -> bool:
    from tvm_ext.core.tvm_bugs import _x86_int8_gemm

    return _x86_int8_gemm(target)


def test_llvm_debug_info_error_is_retried_without_tir_cse(monkeypatch, caplog):
    """TVM 0.19 + LLVM 22 reject debug info for vector let variables made by TIR CSE (PP-OCR cls on
    znver4): tvm_ext.build builds again with tir.disable_cse_tir (the relay.build failure is faked
    here; the real model needs a download)."""
    import logging

    from tvm_ext.core.tvm_bugs import NO_TIR_CSE, is_llvm_debug_info_error

    real_build = relay.build
    seen = []

    def flaky_build(*args, **kwargs):
        cse_off = bool(tvm.transform.PassContext.current().config.get(NO_TIR_CSE, False))
        seen.append(cse_off)
        if not cse_off:
            raise tvm.TVMError("LLVM module verification failed with the following errors: \n"
                               "location of #dbg_declare must be a pointer or int")
        return real_build(*args, **kwargs)

    monkeypatch.setattr(relay, "build", flaky_build)
    mod = dense(16, dtype="uint8")
    with caplog.at_level(logging.WARNING, logger="tvm_ext.core.build"):
        fac = tvm_ext.build(mod)
    assert seen == [False, True]
    assert "tir.disable_cse_tir" in caplog.text
    assert fac.kernel_report.num_kernels >= 1
    assert is_llvm_debug_info_error(RuntimeError("x: location of #dbg_declare must be a pointer or int"))
    assert not is_llvm_debug_info_error(RuntimeError("another LLVM verification error"))


def test_other_build_errors_are_not_retried(monkeypatch):
    calls = []

    def failing_build(*args, **kwargs):
        calls.append(1)
        raise tvm.TVMError("something else entirely")

    monkeypatch.setattr(relay, "build", failing_build)
    with pytest.raises(tvm.TVMError, match="something else"):
        tvm_ext.build(dense(16, dtype="uint8"))
    assert calls == [1]


def inline_function_read_twice():
    """x:int8 -> f(x) = fn(p) {avg_pool(cast(p, i32))} Primitive=1, read by a pool and by
    add(cast(f(x), i16), cast(f(x), i16)), which SimplifyExpr rewrites to multiply(cast(...), 2)
    (what FuseWideningIntoPool at stage ``start`` makes of ``tvm_ext.testing.fuzz``'s graph for seed
    2211); and the same graph without ``fn``."""
    def graph(inline: bool):
        x = relay.var("x", shape=(1, 2, 4, 4), dtype="int8")
        if inline:
            p = relay.var("p0", shape=(1, 2, 4, 4), dtype="int8")
            f = relay.Function([p], relay.nn.avg_pool2d(relay.cast(p, "int32"), (2, 2), (2, 2), padding=(1, 1)))
            f = f.with_attr("Primitive", tvm.tir.IntImm("int32", 1))
            y = relay.Call(f, [x])
        else:
            y = relay.nn.avg_pool2d(relay.cast(x, "int32"), (2, 2), (2, 2), padding=(1, 1))
        out = relay.Tuple([relay.nn.avg_pool2d(y, (2, 2), (2, 2), padding=(1, 1)),
                           relay.add(relay.cast(y, "int16"), relay.cast(y, "int16"))])
        return infer(relay.Function([x], out))
    return graph(True), graph(False)


@pytest.mark.parametrize("at", ["start", "before_fuse"])
def test_simplify_expr_copying_an_inline_function_is_built_without_it(at, caplog):
    """relay.build fails on it (TVM's SimplifyExpr copies the function with its parameter Vars);
    tvm_ext.build runs the prefix again without SimplifyExpr, and the outputs are exact."""
    import logging

    from tvm_ext.testing import run_module

    mod, plain = inline_function_read_twice()
    with pytest.raises(tvm.TVMError, match="WellFormed"):
        with tvm.transform.PassContext(opt_level=3):
            relay.build(mod, target="llvm")
    with caplog.at_level(logging.WARNING, logger="tvm_ext.core.build"):
        fac = tvm_ext.build(mod, at=at)
    assert "SimplifyExpr copied an inline function" in caplog.text
    x = np.random.default_rng(0).integers(-128, 128, (1, 2, 4, 4)).astype("int8")
    got, want = run_module(fac, {"x": x}), run_module(tvm_ext.build(plain), {"x": x})
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_inline_function_copy_error_needs_an_inline_function():
    from tvm_ext.core.tvm_bugs import is_inline_function_copy_error

    err = tvm.TVMError("Check failed: (WellFormed(e)) is false: fn (%p0-malformed-ir) {...}")
    mod, plain = inline_function_read_twice()
    assert is_inline_function_copy_error(err, mod)
    assert not is_inline_function_copy_error(err, plain)  # nothing to copy: a different bug, not retried
    assert not is_inline_function_copy_error(tvm.TVMError("something else"), mod)


def conv_times_int_scale(groups=4, qnn=False, per_channel=True):
    """x:uint8[1, 4, 3, 3] -> conv2d(W:int8, groups) -> int32 -> multiply by an int32 constant per channel
    (the shape of fuzz seed 2783: TVM 0.19's FoldScaleAxis folds the scale into the int8 weight), or by
    a scalar int32 constant (``per_channel=False``: BackwardFoldScaleAxis folds it the same way)."""
    rng = np.random.default_rng(0)
    x = relay.var("x", shape=(1, 4, 3, 3), dtype="uint8")
    w = relay.const(rng.integers(-100, 100, (4, 4 // groups, 3, 3)).astype("int8"))
    if qnn:
        y = relay.qnn.op.conv2d(x, w, relay.const(128), relay.const(0), relay.const(np.float32(0.05)),
                                relay.const(np.full((4,), 0.02, "float32")), padding=[1, 1, 1, 1], groups=groups,
                                channels=4, kernel_size=[3, 3], out_dtype="int32")
    else:
        y = relay.nn.conv2d(x, w, padding=[1, 1, 1, 1], groups=groups, channels=4, kernel_size=[3, 3],
                            out_dtype="int32")
    scale = relay.const(np.array([50, 100, 3, 7], "int32").reshape(4, 1, 1) if per_channel else np.int32(3))
    return infer(relay.nn.bias_add(relay.multiply(y, scale), relay.const(np.arange(4).astype("int32"))))


@pytest.mark.parametrize("qnn, at, groups, per_channel, target", [
    (False, "start", 4, True, "llvm -mcpu=x86-64-v3"), (False, "before_fuse", 4, True, "llvm -mcpu=x86-64-v3"),
    (True, "start", 4, True, "llvm -mcpu=x86-64-v3"), (True, "before_fuse", 4, True, "llvm -mcpu=x86-64-v3"),
    (False, "before_fuse", 1, False, "llvm")])
def test_integer_scale_folded_into_int8_weight_is_built_without_fold_scale_axis(qnn, at, groups, per_channel,
                                                                                 target, caplog):
    """relay.build fails type checking inside its prefix (FoldScaleAxis writes multiply(int8 weight,
    int32 scale)); tvm_ext.build warns and builds it without FoldScaleAxis, equal to relay.build with
    FoldScaleAxis disabled (integer graph: bit for bit)."""
    import logging

    from tvm_ext.testing import run_module

    mod = conv_times_int_scale(groups=groups, qnn=qnn, per_channel=per_channel)
    with pytest.raises(tvm.TVMError, match="DiagnosticError"):
        with tvm.transform.PassContext(opt_level=3):
            relay.build(mod, target=target)
    with caplog.at_level(logging.WARNING, logger="tvm_ext.core.build"):
        fac = tvm_ext.build(mod, target, at=at)
    assert "FoldScaleAxis folded an int32 scale" in caplog.text
    with tvm.transform.PassContext(opt_level=3, disabled_pass=["FoldScaleAxis"]):
        ref = relay.build(mod, target=target)
    x = np.random.default_rng(1).integers(0, 256, (1, 4, 3, 3)).astype("uint8")
    got, want = run_module(fac, {"x": x})[0], run_module(ref, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
    assert np.abs(want).max() > 0


def test_integer_scale_fold_error_needs_the_construct():
    from tvm_ext.core.tvm_bugs import is_integer_scale_fold_error

    err = tvm.error.DiagnosticError("one or more error diagnostics were emitted, please check diagnostic render")
    assert is_integer_scale_fold_error(err, conv_times_int_scale())
    x = relay.var("x", shape=(1, 4), dtype="float32")
    float_scale = infer(relay.multiply(x, relay.const(np.ones((1, 4), "float32"))))
    assert not is_integer_scale_fold_error(err, float_scale)  # no 8-bit conv weight, no integer scale
    assert not is_integer_scale_fold_error(tvm.TVMError("something else"), conv_times_int_scale())


def _let_bound_closure():
    """fn (%a) { let %f = fn () { exp(%a) }; %f() }: relay.vm runs it, the graph executor cannot."""
    a = relay.var("a", shape=(4,))
    f = relay.var("f")
    body = relay.Let(f, relay.Function([], relay.exp(a)), relay.Call(f, []))
    return infer(tvm.IRModule.from_expr(relay.Function([a], body)))


def test_a_closure_call_is_refused_naming_the_construct():
    with pytest.raises(UnsupportedByTVM, match="call of a closure"):
        tvm_ext.build(_let_bound_closure(), target="llvm")


def test_a_directly_called_function_literal_is_not_a_closure_call():
    a = relay.var("a", shape=(4,))
    b = relay.var("b", shape=(4,))
    mod = infer(tvm.IRModule.from_expr(relay.Function([a], relay.Call(relay.Function([b], relay.exp(b)), [a]))))
    check_module(mod, tvm.target.Target("llvm"), True)  # no error


def _clip(dtype, lo, hi):
    return infer(relay.clip(relay.var("x", shape=(4,), dtype=dtype), lo, hi))


@pytest.mark.parametrize("dtype,lo,hi,name", [("uint8", -20, 100, "a_min=-20"), ("uint16", -1, 5, "a_min=-1"),
                                              ("int8", -200, 100, "a_min=-200"), ("int8", 0, 200, "a_max=200")])
def test_integer_clip_with_a_bound_its_dtype_cannot_hold_is_refused(dtype, lo, hi, name):
    """relay.build fails deep in topi.clip on these (checked here too); tvm_ext.build names the clip,
    its dtype and the bound instead, for every target."""
    with pytest.raises(tvm.TVMError), tvm.transform.PassContext(opt_level=3):
        relay.build(_clip(dtype, lo, hi), target="llvm")
    for target in (AVX2, "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1"):
        with pytest.raises(UnsupportedByTVM, match=f"clip of {dtype} data with {name}: TVM 0.19 cannot build it"):
            check_module(_clip(dtype, lo, hi), tvm.target.Target(target))
    with pytest.raises(UnsupportedByTVM, match=f"clip of {dtype} data"):
        tvm_ext.build(_clip(dtype, lo, hi), target="llvm")


@pytest.mark.parametrize("dtype,lo,hi", [("uint8", 0, 300), ("int8", -128, 127), ("float32", -1e9, 1e9),
                                         ("int32", -5, 5)])
def test_clip_bounds_relay_build_takes_are_accepted(dtype, lo, hi):
    check_module(_clip(dtype, lo, hi), AVX2)
    tvm_ext.build(_clip(dtype, lo, hi), target="llvm")


def test_simplifier_folds_a_shifted_bound_to_its_first_term():
    """docs/tvm-bugs.md: TVM 0.19 simplifies ``4d + j - p < 4`` (``0 <= j, p < 4``) to ``d < 1``, which is
    false at ``d = 1, j = 0, p = 1`` where the bound holds; the bounds next to it stay as written."""
    from tvm import te

    d, j, p = te.var("d"), te.var("j"), te.var("p")
    analyzer = tvm.arith.Analyzer()
    for var, extent in ((d, 2), (j, 4), (p, 4)):
        analyzer.bind(var, tvm.ir.Range(0, extent))

    def at(expr, values):
        return bool(analyzer.simplify(tvm.tir.stmt_functor.substitute(expr, values)))

    folded = analyzer.simplify(d * 4 + j - p < 4)
    assert str(folded) == "d < 1"
    assert at(d * 4 + j - p < 4, {d: 1, j: 0, p: 1}) and not at(folded, {d: 1, j: 0, p: 1})
    assert str(analyzer.simplify(d * 4 + j - p < 3)) == "d * 4 + j - p < 3"
