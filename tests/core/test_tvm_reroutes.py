"""Tests of tvm_ext.core.tvm_reroutes: constructs TVM 0.19 cannot lower as given (a fused function holding an
8-bit conv2d, a dilated 8-bit conv2d) are built in a form it can, exactly, with a warning; near misses are left
alone."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.core import tvm_reroutes
from tvm_ext.testing import infer
from tvm_ext.x86.isa import runs_on_host


def fused_conv(out_channels, kernel=3, data="uint8", qnn=False, data_zero_point=0, fused=True):
    """x:data[1, 8, 6, 6] -> fused(conv2d(x, W:int8[out_channels, 8, kernel, kernel])) -> int32 (NCHW), the
    conv alone in a ``Primitive`` function with its weight a parameter, as FuseByPattern makes one;
    ``fused=False``: the same conv in main."""
    rng = np.random.default_rng(out_channels * 10 + kernel)
    x = relay.var("x", shape=(1, 8, 6, 6), dtype=data)
    w = relay.const(rng.integers(-128, 128, (out_channels, 8, kernel, kernel)).astype("int8"))
    p0, p1 = relay.var("p0", shape=(1, 8, 6, 6), dtype=data), relay.var("p1", shape=w.data.shape, dtype="int8")

    def conv(a, b):
        attrs = dict(kernel_size=(kernel, kernel), channels=out_channels, padding=(1, 1), out_dtype="int32")
        if qnn:
            return relay.qnn.op.conv2d(a, b, relay.const(data_zero_point), relay.const(0), relay.const(np.float32(0.5)),
                                       relay.const(np.float32(0.25)), **attrs)
        return relay.nn.conv2d(a, b, **attrs)

    if not fused:
        return infer(conv(x, w))
    fn = relay.Function([p0, p1], conv(p0, p1)).with_attr("Primitive", tvm.tir.IntImm("int32", 1))
    return infer(relay.Call(fn, [x, w]))


def exact_conv(x, w, zero_point=0):
    """NCHW conv2d, stride 1, padding 1 (the padding at the zero point), in int64."""
    xp = np.pad(x.astype(np.int64) - zero_point, ((0, 0), (0, 0), (1, 1), (1, 1)))
    k = w.shape[2]
    out_hw = xp.shape[2] - k + 1
    out = np.zeros((1, w.shape[0], out_hw, out_hw), np.int64)
    for i in range(k):
        for j in range(k):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + out_hw, j:j + out_hw], w[:, :, i, j].astype(np.int64))
    return out


def _fused_functions(mod) -> int:
    found = []

    def visit(node):
        if isinstance(node, relay.Function) and node.attrs and "Primitive" in node.attrs:
            found.append(node)

    relay.analysis.post_order_visit(mod["main"], visit)
    return len(found)


V4, V3, V2 = "llvm -mcpu=x86-64-v4", "llvm -mcpu=x86-64-v3", "llvm -mcpu=x86-64-v2"
AARCH64 = "llvm -mtriple=aarch64-linux-gnu -mattr=+neon,+dotprod"


# (conv, target, TVM's error in stock relay.build): a uint8 x int8 conv with fewer than 16 output channels,
# not a multiple of the int8 schedule's lanes (16 at AVX-512BW, 8 at AVX2, 4 at SSE4.2); an int8 x int8
# conv (a second reduction after x86 Legalize's shift); a nonzero data zero point (its weight sum)
@pytest.mark.parametrize("kwargs, target, tvm_error", [
    (dict(out_channels=8), V4, "C.shape"), (dict(out_channels=4, kernel=1), V4, "C.shape"),
    (dict(out_channels=12), V3, "split condition"), (dict(out_channels=6, kernel=1), V2, "split condition"),
    (dict(out_channels=8, qnn=True), V4, "C.shape"), (dict(out_channels=16, data="int8"), V3, "anchor_op_"),
    (dict(out_channels=16, qnn=True, data_zero_point=3), V4, "anchor_op_")],
    ids=["u8-oc8-v4", "u8-oc4-1x1-v4", "u8-oc12-v3", "u8-oc6-1x1-v2", "qnn-u8-oc8-v4", "s8-oc16-v3",
         "qnn-zp3-oc16-v4"])
def test_fused_8bit_conv_tvm_cannot_lower_is_built_unfused_and_exact(kwargs, target, tvm_error, caplog):
    """Stock relay.build fails inside its lowering (AlterOpLayout never enters a fused function, the
    legalizations do); tvm_ext.build warns, builds the conv unfused, and is exact."""
    import logging

    from tvm_ext.testing import run_module

    mod = fused_conv(**kwargs)
    with pytest.raises(tvm.TVMError, match=tvm_error):
        with tvm.transform.PassContext(opt_level=3):
            relay.build(mod, target=target)
    with caplog.at_level(logging.WARNING, logger="tvm_ext.core.tvm_reroutes"):
        fac = tvm_ext.build(mod, target)
    assert "cannot lower a fused (Primitive) function" in caplog.text and "unfused" in caplog.text
    assert _fused_functions(fac.tvm_ext_module) == 0
    data = kwargs.get("data", "uint8")
    info = np.iinfo(data)
    x = np.random.default_rng(2).integers(info.min, info.max + 1, (1, 8, 6, 6)).astype(data)
    w = mod["main"].body.args[1].data.numpy()
    if not runs_on_host(target):
        pytest.skip(f"host lacks instructions of '{target}' (built and checked, not run)")
    (out,) = run_module(fac, {"x": x})
    np.testing.assert_array_equal(out, exact_conv(x, w, kwargs.get("data_zero_point", 0)))


# the same convs where TVM lowers the fused function: 24 channels slice back to a whole 16-channel block;
# 8 are a multiple of AVX2's lanes, 12 of SSE4.2's; 16 need no padding; grouped convs are not legalized
@pytest.mark.parametrize("kwargs, target", [
    (dict(out_channels=24, kernel=1), V4), (dict(out_channels=8), V3), (dict(out_channels=12), V2),
    (dict(out_channels=16, qnn=True), V4), (dict(out_channels=16, data="int8"), "llvm"),
    (dict(out_channels=16, data="int8"), AARCH64)],
    ids=["u8-oc24-1x1-v4", "u8-oc8-v3", "u8-oc12-v2", "qnn-u8-oc16-v4", "s8-plain-llvm", "s8-aarch64"])
def test_fused_8bit_conv_tvm_lowers_stays_fused(kwargs, target):
    from tvm_ext.core.tvm_reroutes import inline_unschedulable_fused

    mod = fused_conv(**kwargs)
    out, reasons = inline_unschedulable_fused(mod, tvm.target.Target(target))
    assert out is mod and reasons == []
    if target in (V4, V3):
        fac = tvm_ext.build(mod, target)  # and TVM builds it as one kernel
        assert _fused_functions(fac.tvm_ext_module) == 1


def test_unfused_conv_and_other_targets_are_left_alone():
    from tvm_ext.core.tvm_reroutes import inline_unschedulable_fused

    plain = fused_conv(8, fused=False)
    assert inline_unschedulable_fused(plain, tvm.target.Target(V4)) == (plain, [])
    fused = fused_conv(8)
    assert inline_unschedulable_fused(fused, tvm.target.Target("cuda")) == (fused, [])


def test_unlowerable_fused_conv_reason_names_op_shapes_and_tvm_source():
    from tvm_ext.core.tvm_reroutes import inline_unschedulable_fused

    _, (why,) = inline_unschedulable_fused(fused_conv(12), tvm.target.Target(V3))
    assert "nn.conv2d of uint8[1, 8, 6, 6] data and int8[12, 8, 3, 3] weight (NCHW)" in why
    assert "12 output channels" in why and "8 lanes" in why
    assert "conv2d_alter_int8_common" in why and "schedule_conv_NCHWc_cpu_*_int8" in why
    _, (why,) = inline_unschedulable_fused(fused_conv(16, data="int8"), tvm.target.Target(V3))
    assert "nn.conv2d of int8[1, 8, 6, 6] data" in why and "(nn.conv2d, sum)" in why
    assert "te_compiler_cache.cc" in why


def test_fuse_by_pattern_at_start_with_a_narrow_uint8_conv_builds_exactly(caplog):
    """FuseByPattern("qnn") at ``start`` fuses a uint8 x int8 conv and its lowered requantize (8 channels)
    into one function: built at AVX-512 with the group unfused, equal to plain ``llvm`` (no int8 SIMD)."""
    import logging

    from tvm_ext.passes import FuseByPattern
    from tvm_ext.testing import run_module

    rng = np.random.default_rng(5)
    x = relay.var("x", shape=(1, 8, 6, 6), dtype="uint8")
    w = relay.const(rng.integers(-128, 128, (8, 8, 3, 3)).astype("int8"))
    y = relay.nn.conv2d(x, w, kernel_size=(3, 3), channels=8, padding=(1, 1), out_dtype="int32")
    y = relay.add(y, relay.const(rng.integers(-500, 500, (8, 1, 1)).astype("int32")))
    y = relay.round(relay.multiply(relay.cast(y, "float32"), relay.const(np.float32(0.02))))
    mod = infer(relay.cast(relay.clip(y, 0.0, 255.0), "uint8"))
    assert _fused_functions(FuseByPattern("qnn")(mod)) == 1
    with caplog.at_level(logging.WARNING, logger="tvm_ext.core.tvm_reroutes"):
        fac = tvm_ext.build(mod, V4, passes=[FuseByPattern("qnn")], at="start")
    assert "cannot lower a fused (Primitive) function" in caplog.text
    if not runs_on_host(V4):
        pytest.skip(f"host lacks instructions of '{V4}' (built and checked, not run)")
    xs = rng.integers(0, 256, (1, 8, 6, 6)).astype("uint8")
    with tvm.transform.PassContext(opt_level=3):
        ref = relay.build(mod, target="llvm")
    want = run_module(ref, {"x": xs})[0]
    np.testing.assert_array_equal(run_module(fac, {"x": xs})[0], want)
    assert want.min() < want.max()


# A dilated 8-bit conv2d: TVM's int8 legalizations skip it and x86's conv2d_NCHWc_int8 has no output
# block 16 divides for 8 or 12 channels; tvm_ext.build computes it in int16 (reroute_dilated_int8_convs).
def _dilated_conv(op, data_dtype, channels, kernel=3, dilation=2):
    import numpy as np
    from tvm import relay

    rng = np.random.default_rng(7)
    pad = (kernel - 1) * dilation // 2
    x = relay.var("x", shape=(1, 8, 10, 10), dtype=data_dtype)
    w = rng.integers(-128, 128, (channels, 8, kernel, kernel)).astype("int8")
    kw = dict(kernel_size=(kernel, kernel), channels=channels, padding=(pad, pad), dilation=(dilation, dilation),
              out_dtype="int32")
    if op == "nn":
        y = relay.nn.conv2d(x, relay.const(w), **kw)
    else:
        y = relay.qnn.op.conv2d(x, relay.const(w), relay.const(0), relay.const(0), relay.const(1.0),
                                relay.const(1.0), **kw)
    return tvm.IRModule.from_expr(relay.Function([x], y)), w, pad, dilation


def _dilated_reference(x, w, pad, dilation):
    import numpy as np

    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, _, h, wd = x.shape
    out = np.zeros((n, w.shape[0], h, wd), np.int64)
    for i in range(w.shape[2]):
        for j in range(w.shape[3]):
            patch = xp[:, :, i * dilation:i * dilation + h, j * dilation:j * dilation + wd]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j].astype(np.int64))
    return out


@pytest.mark.parametrize("op,data_dtype,channels,kernel", [("nn", "uint8", 8, 3), ("qnn", "int8", 12, 1),
                                                           ("qnn", "uint8", 4, 3)])
@pytest.mark.parametrize("pipeline", [True, False])
def test_dilated_int8_conv_is_computed_in_int16_and_exact(op, data_dtype, channels, kernel, pipeline):
    import numpy as np
    from tvm.contrib import graph_executor

    import tvm_ext

    mod, w, pad, dilation = _dilated_conv(op, data_dtype, channels, kernel)
    passes = tvm_ext.core.pipelines.int8() if pipeline else ()
    factory = tvm_ext.build(mod, target=V4, passes=passes)  # AVX-512BW: 16-lane int8 blocks
    convs = tvm_reroutes._calls(factory.tvm_ext_module["main"], ("nn.conv2d", "nn.contrib_conv2d_NCHWc"))
    assert [str(c.args[0].checked_type.dtype) for c in convs] == ["int16"]
    if not runs_on_host(V4):
        pytest.skip(f"host lacks instructions of '{V4}' (built and checked, not run)")
    m = graph_executor.GraphModule(factory["default"](tvm.cpu()))
    lo, hi = (0, 256) if data_dtype == "uint8" else (-128, 128)
    x = np.random.default_rng(3).integers(lo, hi, (1, 8, 10, 10)).astype(data_dtype)
    m.set_input("x", x)
    m.run()
    np.testing.assert_array_equal(m.get_output(0).numpy(), _dilated_reference(x, w, pad, dilation))


@pytest.mark.parametrize("op,data_dtype,channels,dilation", [("nn", "uint8", 16, 2), ("nn", "int8", 8, 2),
                                                             ("nn", "uint8", 8, 1), ("qnn", "uint8", 32, 2)])
def test_dilated_int8_conv_near_misses_stay_8bit(op, data_dtype, channels, dilation):
    from tvm import relay

    mod, *_ = _dilated_conv(op, data_dtype, channels, dilation=dilation)
    typed = relay.transform.InferType()(mod)
    out, reasons = tvm_reroutes.reroute_dilated_int8_convs(typed, tvm.target.Target("llvm -mcpu=x86-64-v4"))
    assert reasons == [] and out is typed


def test_dilated_int8_conv_reason_names_op_shapes_dilation_and_error():
    from tvm import relay

    mod, *_ = _dilated_conv("nn", "uint8", 8)
    _, reasons = tvm_reroutes.reroute_dilated_int8_convs(relay.transform.InferType()(mod),
                                                      tvm.target.Target("llvm -mcpu=x86-64-v4"))
    assert len(reasons) == 1
    assert "nn.conv2d of uint8[1, 8, 10, 10] data and int8[8, 8, 3, 3] weight (NCHW, dilation [2, 2])" in reasons[0]
    assert "IndexError" in reasons[0]


def test_dilated_int8_conv_aarch64_nhwc_is_rerouted():
    import numpy as np
    from tvm import relay

    x = relay.var("x", shape=(1, 10, 10, 8), dtype="uint8")
    w = relay.const(np.ones((3, 3, 8, 16), "int8"))
    y = relay.nn.conv2d(x, w, kernel_size=(3, 3), channels=16, padding=(2, 2), dilation=(2, 2), data_layout="NHWC",
                        kernel_layout="HWIO", out_dtype="int32")
    typed = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))
    target = tvm.target.Target("llvm -mtriple=aarch64-linux-gnu -mattr=+neon,+dotprod")
    _, reasons = tvm_reroutes.reroute_dilated_int8_convs(typed, target)
    assert len(reasons) == 1 and "Buffer bind data type mismatch" in reasons[0]


def test_dilated_int8_conv_with_a_dynamic_batch_is_left_to_the_shape_check():
    x = relay.var("x", shape=(relay.Any(), 8, 10, 10), dtype="uint8")
    w = relay.const(np.ones((8, 8, 3, 3), "int8"))
    y = relay.nn.conv2d(x, w, kernel_size=(3, 3), channels=8, padding=(2, 2), dilation=(2, 2), out_dtype="int32")
    typed = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))
    out, reasons = tvm_reroutes.reroute_dilated_int8_convs(typed, tvm.target.Target("llvm -mcpu=x86-64-v4"))
    assert reasons == [] and out is typed
