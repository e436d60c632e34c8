"""The int8 pipeline's steps for CPU kernels, applied by hand (``passes=[...]``) at ``opencl``: each builds,
and runs on PoCL with the outputs of a plain ``llvm`` build of the graph without the pass (integer
graphs: bit for bit).

``FuseWideningIntoPool`` puts a widening chain in front of a pool or softmax in one kernel; TVM's GPU
schedules of those ops leave such a stage unscheduled, and the GPU back end's schedules inline it
(:mod:`tvm_ext.gpu.schedules`). ``NarrowKernelBoundaries`` cuts the join's later argument there, and
``AnchoredArgumentFirst`` makes a widening chain the later argument.
``DequantizeInConvTranspose`` groups a dequantize with the transposed conv reading it, which the GPU
back end's transposed-conv schedule inlines. ``PadChannelsAtProducer`` skips GPU targets (logged);
``EpilogueBeforeChannelSlice`` finds nothing to move (no channel slice at GPU targets) and builds.
Compiling needs no device; running skips with the reason when the OpenCL set-up is missing."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.gpu import exact_float, opencl
from _opencl_cases import device_or_skip, run_graph
from tvm_ext.passes import (AnchoredArgumentFirst, EpilogueBeforeChannelSlice, FuseWideningIntoPool,
                            NarrowKernelBoundaries, PadChannelsAtProducer)

RNG = np.random.default_rng(7)


@pytest.fixture(autouse=True, scope="module")
def _opencl_runtime():
    """Loaded before the builds when present, so that they hand back runnable modules (compile-only without)."""
    opencl.load_runtime()


def _check_against_llvm(mod, built, inputs, exact=True):
    """``built`` (an opencl build) runs on PoCL with the outputs of a plain ``llvm`` build of ``mod``."""
    dev = device_or_skip()
    ref = run_graph(tvm_ext.build(mod, target="llvm"), tvm.cpu(), inputs)
    got = run_graph(built, dev, inputs)
    for r, g in zip(ref, got):
        assert g.dtype == r.dtype and g.shape == r.shape
        if exact:
            np.testing.assert_array_equal(g, r)
        else:
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)


def _pool_group(kind):
    """int32 x -> clip to [0, 255] -> cast u8 (the 8-bit point) -> cast i32 -> subtract zp -> multiply
    -> pool or softmax -> add: ``FuseWideningIntoPool`` takes everything after the 8-bit point."""
    shape = (8, 36) if kind.endswith("_2d") else (1, 8, 6, 6)
    x = relay.var("x", shape=shape, dtype="int32")
    n = relay.cast(relay.clip(relay.add(x, relay.const(3)), 0, 255), "uint8")
    w = relay.multiply(relay.subtract(relay.cast(n, "int32"), relay.const(7)), relay.const(3))
    pools = {
        "global_avg_pool2d": lambda v: relay.nn.global_avg_pool2d(v),
        "avg_pool2d": lambda v: relay.nn.avg_pool2d(v, (3, 3), padding=(1, 1)),
        "adaptive_avg_pool2d": lambda v: relay.nn.adaptive_avg_pool2d(v, (2, 2)),
        "global_max_pool2d": lambda v: relay.nn.global_max_pool2d(v),
        "softmax": lambda v: relay.nn.softmax(relay.cast(v, "float32"), axis=1),
        "softmax_2d": lambda v: relay.nn.softmax(relay.cast(v, "float32"), axis=1),
        "log_softmax_2d": lambda v: relay.nn.log_softmax(relay.cast(v, "float32"), axis=1),
    }
    y = pools[kind](w)
    one = relay.const(1, "float32" if "softmax" in kind else "int32")
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.add(y, one)))
    return mod, {"x": RNG.integers(-50, 300, shape).astype("int32")}


POOL_KINDS = ["global_avg_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "global_max_pool2d", "softmax",
              "softmax_2d", "log_softmax_2d"]


@pytest.mark.parametrize("kind", POOL_KINDS)
def test_fuse_widening_into_pool_by_hand_builds_and_runs_at_opencl(kind):
    mod, inputs = _pool_group(kind)
    built = tvm_ext.build(mod, target="opencl", passes=[FuseWideningIntoPool()])
    kernels = built.kernel_report.kernels
    assert len(kernels) == 2
    op = kind.removesuffix("_2d") if kind.endswith("softmax_2d") else kind
    pool_kernel = next(k for k in kernels if f"nn.{op}" in k.ops)
    assert pool_kernel.inputs[0][1] == "uint8", "the pool's kernel reads the 8-bit value"
    _check_against_llvm(mod, built, inputs, exact="softmax" not in kind)


def test_gpu_schedules_leave_stock_kernels_alone():
    """Kernels FuseOps makes by itself (no stage in front of the pool or softmax) get TVM's schedules:
    tvm_ext.build's OpenCL source equals relay.build's, and TVM's schedules are back afterwards."""
    import tvm.topi.cuda as cuda

    before = (cuda.schedule_pool, cuda.schedule_adaptive_pool)
    x = relay.var("x", shape=(1, 8, 6, 6), dtype="float32")
    y = relay.nn.relu(relay.add(x, relay.const(1.0)))
    out = relay.Tuple([relay.nn.global_avg_pool2d(y), relay.nn.avg_pool2d(y, (3, 3), padding=(1, 1)),
                       relay.nn.softmax(relay.reshape(y, (8, 36)))])
    mod = tvm.IRModule.from_expr(relay.Function([x], out))

    def source(lib):
        """{kernel name: its definition} (TVM writes the functions and their declarations in any order)."""
        text = next(m.get_source() for m in opencl._walk(lib.lib) if m.type_key == "opencl")
        blocks = (b.split("\n", 1) for b in text.split("// Function: ")[1:])
        declaration = lambda ln: ln.startswith("__kernel") and ln.endswith(");")  # noqa: E731
        return {name: [ln for ln in body.splitlines() if not declaration(ln)] for name, body in blocks}

    ours = tvm_ext.build(mod, target="opencl")
    # stock with the back end's float exactness (exact constants, the pragma), which every kernel gets
    with exact_float.fp_contract_off(), tvm.transform.PassContext(opt_level=3, config=exact_float.lower_config()):
        stock = relay.build(mod, target=tvm.target.Target("opencl", host="llvm"))
    assert source(ours) == source(stock)
    assert (cuda.schedule_pool, cuda.schedule_adaptive_pool) == before


def _int8_conv(x, cin, cout, seed):
    rng = np.random.default_rng(seed)
    w = relay.const(rng.integers(-3, 4, (cout, cin, 3, 3)).astype("int8"))
    c = relay.qnn.op.conv2d(x, w, relay.const(3), relay.const(0), relay.const(0.1),
                            relay.const(rng.uniform(0.01, 0.05, cout).astype("float32")), kernel_size=(3, 3),
                            channels=cout, padding=(1, 1), out_dtype="int32")
    return relay.qnn.op.requantize(c, relay.const(0.002), relay.const(0), relay.const(0.1), relay.const(3), axis=1,
                                   out_dtype="uint8")


def _qnn_chain():
    """uint8 x -> qconv (12 output channels, which x86 would pad to 16 and slice) -> requantize -> qconv."""
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="uint8")
    mod = tvm.IRModule.from_expr(relay.Function([x], _int8_conv(_int8_conv(x, 16, 12, 1), 12, 12, 2)))
    return mod, {"x": RNG.integers(0, 256, (1, 16, 8, 8)).astype("uint8")}


def _residual():
    """uint8 x -> two 1x1 convs, each requantized to an 8-bit point, meeting at an add (a residual join)."""
    x = relay.var("x", shape=(1, 8, 6, 6), dtype="uint8")

    def branch(seed, scale):
        w = relay.const(np.random.default_rng(seed).integers(-3, 4, (8, 8, 1, 1)).astype("int8"))
        c = relay.nn.conv2d(x, w, kernel_size=(1, 1), channels=8, out_dtype="int32")
        v = relay.cast(relay.floor(relay.multiply(relay.cast(c, "float32"), relay.const(scale))), "int32")
        return relay.clip(v, 0.0, 255.0)

    lhs = relay.cast(relay.floor(relay.multiply(relay.cast(branch(1, 0.01), "float32"), relay.const(1.5))), "int32")
    out = relay.cast(relay.clip(relay.add(lhs, branch(2, 0.02)), 0.0, 255.0), "uint8")
    mod = tvm.IRModule.from_expr(relay.Function([x], out))
    return mod, {"x": RNG.integers(0, 256, (1, 8, 6, 6)).astype("uint8")}


def _float_producer_int8_conv():
    """float conv -> relu -> quantize (6 channels, which x86 pads to 8) -> int8 conv: PadChannelsAtProducer's
    match on x86."""
    rng = np.random.default_rng(3)
    x = relay.var("x", shape=(1, 16, 7, 7), dtype="float32")
    y = relay.nn.relu(relay.nn.conv2d(x, relay.const(rng.standard_normal((6, 16, 1, 1)).astype("float32")),
                                      channels=6, kernel_size=(1, 1)))
    q = relay.qnn.op.quantize(y, relay.const(np.float32(0.05)), relay.const(3), out_dtype="uint8")
    v = relay.const(rng.integers(-127, 128, (8, 6, 3, 3)).astype("int8"))
    out = relay.qnn.op.conv2d(q, v, relay.const(3), relay.const(0), relay.const(np.float32(0.05)),
                              relay.const(np.float32(0.01)), kernel_size=(3, 3), channels=8, padding=(1, 1),
                              out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([x], out))


def test_epilogue_before_channel_slice_by_hand_builds_and_runs_at_opencl():
    mod, inputs = _qnn_chain()
    built = tvm_ext.build(mod, target="opencl", passes=[EpilogueBeforeChannelSlice()])
    _check_against_llvm(mod, built, inputs)


def test_narrow_kernel_boundaries_by_hand_builds_and_runs_at_opencl():
    """At opencl FuseOps fuses the widening chain into the join only from the join's later argument:
    the pass cuts that one, so the build keeps stock's kernels and only uint8 crosses."""
    mod, inputs = _residual()
    built = tvm_ext.build(mod, target="opencl", passes=[NarrowKernelBoundaries()])
    stock = tvm_ext.build(mod, target="opencl").kernel_report
    report = built.kernel_report
    assert report.num_launched_kernels == stock.num_launched_kernels == 2
    assert set(stock.crossing.nbytes) == {"int32"} and set(report.crossing.nbytes) == {"uint8"}
    _check_against_llvm(mod, built, inputs)


@pytest.mark.parametrize("step, make, stage, reason", [
    (PadChannelsAtProducer, _float_producer_int8_conv, "start", "is not x86"),
])
def test_cpu_kernel_steps_skip_opencl_and_build_as_stock(step, make, stage, reason, caplog):
    mod = make()
    name = step().info.name
    with caplog.at_level(logging.DEBUG, logger=f"tvm_ext.passes.{name}"):
        built = tvm_ext.build(mod, target="opencl", passes={stage: [step()]})
    assert reason in caplog.text, f"{name} did not say why it skipped opencl"
    stock = tvm_ext.build(mod, target="opencl")
    assert [k.ops for k in built.kernel_report.kernels] == [k.ops for k in stock.kernel_report.kernels]


def _shortcut_join():
    """A residual join as QDQ graphs make it: n = conv1's 8-bit output, read by conv2 and by the
    join's earlier argument, a widening chain; the later argument is conv2's chain."""
    x = relay.var("x", shape=(1, 8, 6, 6), dtype="uint8")

    def conv(v, seed):
        w = relay.const(np.random.default_rng(seed).integers(-3, 4, (8, 8, 1, 1)).astype("int8"))
        c = relay.nn.conv2d(v, w, kernel_size=(1, 1), channels=8, out_dtype="int32")
        return relay.cast(relay.floor(relay.multiply(relay.cast(c, "float32"), relay.const(0.01))), "int32")

    n = relay.cast(relay.clip(conv(x, 1), 0.0, 255.0), "uint8")
    widened = relay.multiply(relay.subtract(relay.cast(n, "int32"), relay.const(5)), relay.const(2))
    out = relay.cast(relay.clip(relay.add(widened, relay.clip(conv(n, 2), 0.0, 255.0)), 0.0, 255.0), "uint8")
    mod = tvm.IRModule.from_expr(relay.Function([x], out))
    return mod, {"x": RNG.integers(0, 256, (1, 8, 6, 6)).astype("uint8")}


def test_anchored_argument_first_puts_the_widening_chain_last_at_opencl(caplog):
    """Stock FuseOps at opencl leaves the earlier argument's widening chain as a kernel of its own;
    with the join's arguments swapped it fuses into conv2's kernel, and only uint8 crosses."""
    mod, inputs = _shortcut_join()
    stock = tvm_ext.build(mod, target="opencl").kernel_report
    with caplog.at_level(logging.INFO, logger="tvm_ext.passes.AnchoredArgumentFirst"):
        built = tvm_ext.build(mod, target="opencl", passes=[NarrowKernelBoundaries(), AnchoredArgumentFirst()])
    assert "arguments swapped" in caplog.text
    report = built.kernel_report
    assert stock.num_launched_kernels == 3 and report.num_launched_kernels == 2
    assert set(report.crossing.nbytes) == {"uint8"}
    _check_against_llvm(mod, built, inputs)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tvm_ext.passes.AnchoredArgumentFirst"):
        tvm_ext.build(mod, target="llvm", passes=[AnchoredArgumentFirst()])
    assert "arguments swapped" not in caplog.text  # CPU targets: FuseOps fuses either argument's chain
