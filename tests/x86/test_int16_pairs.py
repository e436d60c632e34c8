"""Convs packed in int16 pairs (``PairPackInt8Convs`` + :func:`tvm_ext.x86.exact_dot.dot_int16_pairs`): the
kernel widened at compile time, the data widened once before the conv's loops, so the dot loop loads int16
pairs and widens nothing.

Exactness against numpy integer arithmetic and against a plain ``llvm`` build (TVM's generic int8
kernels, no SIMD dot product), at the instruction sets the path serves (SSE, AVX2, AVX-512 without
VNNI), executed only where the host runs them; the loop's instructions read from the assembly;
llvm-mca's share of the x86-64-v3 peak for one conv of each kind.
"""
import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.core import pipelines
from tvm_ext.x86 import exact_dot, exact_int8
from tvm_ext.x86 import int8_conv as x86_int8
from tvm_ext.x86.isa import runs_on_host

from .test_exact_int8 import _conv, _conv_exact, _forms, _nchwc_conv, _run

TARGETS = {"sse": "llvm -mcpu=x86-64-v2", "avx2": "llvm -mcpu=x86-64-v3", "avx512": "llvm -mcpu=x86-64-v4"}
#: What a dot loop that widens int8 in place runs (sign/zero extension, a GPR moved into a vector).
WIDENING = ("vpmovsxbw", "vpmovzxbw", "pmovsxbw", "pmovzxbw", "vmovd")


def _target(name):
    target = TARGETS[name]
    return pytest.param(target, id=name, marks=pytest.mark.skipif(
        not runs_on_host(target), reason=f"host lacks instructions of '{target}'"))


def _worst_case(shape, seed):
    """Full-range int8 weights with runs of -128 and 127, so every extreme product appears."""
    w = np.random.default_rng(seed).integers(-128, 128, shape).astype("int8")
    w.reshape(-1)[:: 7] = -128
    w.reshape(-1)[3:: 11] = 127
    return w


def _data(shape, seed):
    x = np.random.default_rng(seed).integers(0, 256, shape).astype("uint8")
    x.reshape(-1)[:: 5] = 255
    return x


#: (out channels, in channels, kernel, size, stride, pad): channels that are not a multiple of the
#: 16-channel block (8-channel blocks, 4-channel blocks), stride 2, padding, 5x5, 1x1 stride 2, odd sizes,
#: a 1x1 conv on a 7x7 map (AVX2's tile of accumulator groups in turn, with the int8 pipeline), 7-wide rows
#: at stride 1 (AVX2's whole-row tile with kw unrolled).
SHAPES = [
    (32, 32, 3, 12, 1, 1),
    (40, 24, 3, 11, 1, 1),
    (24, 12, 3, 9, 2, 1),
    (48, 16, 1, 9, 2, 0),
    (16, 36, 1, 7, 1, 0),
    (16, 16, 5, 10, 1, 2),
    (32, 64, 3, 7, 2, 1),
    (32, 48, 3, 7, 1, 1),
]


#: The case of each shape in the default tier, a diagonal: each shape once, each of AVX2 without and with the int8
#: pipeline, SSE and AVX-512 at least once. The slow tier runs every case of :func:`_cases` (the same shapes through
#: the same pair kernel at the other classes and pipelines).
DEFAULT_TIER = {
    (32, 32, 3, 12, 1, 1): "avx2-plain",
    (40, 24, 3, 11, 1, 1): "avx512-int8",
    (24, 12, 3, 9, 2, 1): "sse-int8",
    (48, 16, 1, 9, 2, 0): "avx2-int8",
    (16, 36, 1, 7, 1, 0): "avx2-int8",
    (16, 16, 5, 10, 1, 2): "avx2-int8",
    (32, 64, 3, 7, 2, 1): "avx2-plain",
    (32, 48, 3, 7, 1, 1): "avx2-int8",
}


def _cases():
    """Every shape at AVX2 with and without the int8 pipeline; SSE and AVX-512 with it, on a subset."""

    def case(name, pipeline, shape):
        form = f"{name}-{'int8' if pipeline else 'plain'}"
        slow = () if DEFAULT_TIER[shape] == form else (pytest.mark.slow,)
        return pytest.param(TARGETS[name], pipeline, *shape, marks=(*_target(name).marks, *slow), id=f"{form}-{shape}")

    for shape in SHAPES:
        for pipeline in (False, True):
            yield case("avx2", pipeline, shape)
    for name in ("sse", "avx512"):
        for shape in SHAPES[1:5]:
            yield case(name, True, shape)


@pytest.mark.parametrize("target,pipeline,oc,ic,k,size,stride,pad", list(_cases()))
def test_int16_pairs_are_exact(target, pipeline, oc, ic, k, size, stride, pad):
    """Against numpy's integer convolution: full-range weights (-128 and 127 included), data up to 255,
    zero point 128 (so data - zero point spans [-128, 127])."""
    w = _worst_case((oc, ic, k, k), seed=oc + ic + k)
    x = _data((1, ic, size, size), seed=size)
    lib = tvm_ext.build(_conv(w, size=size, stride=stride, pad=pad), target=target,
                        passes=pipelines.int8() if pipeline else ())
    assert _forms(lib) == {"pairs"}
    assert "int16" in lib.tvm_ext_module.astext(), "the kernel is packed in int16 pairs"
    np.testing.assert_array_equal(_run(lib, x=x), _conv_exact(x, w, stride, pad))


# The default tier runs a diagonal, each value once and each class at least once ([255-avx2], [128-avx512],
# [0-avx512]); the slow tier each value at the other class
@pytest.mark.parametrize("value, target", [
    pytest.param(value, TARGETS[name], id=f"{value}-{name}", marks=(*_target(name).marks, *(
        () if (value, name) in {(255, "avx2"), (128, "avx512"), (0, "avx512")} else (pytest.mark.slow,))))
    for value in (255, 128, 0) for name in ("avx2", "avx512")])
def test_extreme_pairs_are_exact(target, value):
    """Every pair at its extreme (127 * 255 twice, -128 * 255 twice), zero point 0."""
    w = np.full((32, 16, 1, 1), 127, "int8")
    w[16:] = -128
    x = np.full((1, 16, 5, 5), value, "uint8")
    lib = tvm_ext.build(_conv(w, size=5, pad=0, zero_point=0), target=target, passes=pipelines.int8())
    assert _forms(lib) == {"pairs"}
    np.testing.assert_array_equal(_run(lib, x=x), _conv_exact(x, w, pad=0, zero_point=0))


def _requantized_conv(w, size, stride, pad, seed=0):
    """qnn.conv2d (data zero point 3) + bias + requantize to uint8: a ResNet layer."""
    rng = np.random.default_rng(seed)
    oc, ic, k, _ = w.shape
    x = relay.var("x", shape=(1, ic, size, size), dtype="uint8")
    y = relay.qnn.op.conv2d(x, relay.const(w), relay.const(3), relay.const(0), relay.const(0.02),
                            relay.const(0.01), kernel_size=(k, k), channels=oc, padding=(pad, pad),
                            strides=(stride, stride), out_dtype="int32")
    y = relay.nn.bias_add(y, relay.const(rng.integers(-1000, 1000, (oc,)).astype("int32")))
    y = relay.qnn.op.requantize(y, relay.const(0.0002), relay.const(0), relay.const(0.05), relay.const(5),
                                out_dtype="uint8")
    return tvm.IRModule.from_expr(relay.Function([x], y))


# The default tier runs a diagonal: the 1x1 layer at AVX2, the 3x3 one at AVX-512; the slow tier each layer at the
# other class
@pytest.mark.parametrize("oc,ic,k,size,stride,pad,target", [
    pytest.param(*shape, TARGETS[name], id=f"{'-'.join(map(str, shape))}-{name}", marks=(*_target(name).marks, *(
        () if (shape[2], name) in {(1, "avx2"), (3, "avx512")} else (pytest.mark.slow,))))
    for shape in ((64, 64, 1, 14, 1, 0), (48, 40, 3, 9, 2, 1)) for name in ("avx2", "avx512")])
def test_requantized_conv_matches_plain_llvm(target, oc, ic, k, size, stride, pad):
    """The whole layer (requantize epilogue fused into the conv's kernel) against the same graph built
    at plain ``llvm``, whose int8 code has no SIMD dot product."""
    w = _worst_case((oc, ic, k, k), seed=5)
    mod = _requantized_conv(w, size, stride, pad)
    x = _data((1, ic, size, size), seed=6)
    lib = tvm_ext.build(mod, target=target, passes=pipelines.int8())
    assert _forms(lib) == {"pairs"}
    with tvm.transform.PassContext(opt_level=3):
        reference = relay.build(mod, target="llvm")
    np.testing.assert_array_equal(_run(lib, x=x), _run(reference, x=x))


@pytest.mark.parametrize("target", [_target("avx2")])
def test_int8_pair_kernel_keeps_its_form(target):
    """A conv written with an int8 kernel already packed in pairs (``o2i``, int8) keeps the form that
    widens it in the loop (:func:`exact_dot.dot_u8s8_int16_pairs`): exact too."""
    w = _worst_case((16, 16, 3, 3), seed=13)
    before, _ = _nchwc_conv(w)
    f = before["main"]
    call = f.body
    int8_pairs = relay.nn.contrib_conv2d_nchwc(
        f.params[0], relay.const(exact_dot.pair_kernel(call.args[1].data.numpy())), channels=16,
        kernel_size=(3, 3), padding=(1, 1), data_layout="NCHW8c", kernel_layout="OIHW4i8o2i",
        out_layout="NCHW8c", out_dtype="int32")
    xv = np.random.default_rng(14).integers(0, 256, (1, 2, 6, 6, 8)).astype("uint8")
    with x86_int8.kernels(schedule=False), tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(relay.Function(list(f.params), int8_pairs)), target=target)
    x_nchw = xv.transpose(0, 1, 4, 2, 3).reshape(1, 16, 6, 6)
    want = _conv_exact(x_nchw, w, zero_point=0).reshape(1, 2, 8, 6, 6).transpose(0, 1, 3, 4, 2)
    np.testing.assert_array_equal(_run(lib, x=xv), want)


def test_is_int16_pair_conv():
    assert exact_int8.is_int16_pair_conv("uint8", (2, 2, 3, 3, 4, 8, 2), "int16")
    assert not exact_int8.is_int16_pair_conv("uint8", (2, 2, 3, 3, 4, 8, 2), "int8")
    assert not exact_int8.is_int16_pair_conv("int8", (2, 2, 3, 3, 4, 8, 2), "int16")
    assert not exact_int8.is_int16_pair_conv("uint8", (2, 2, 3, 3, 2, 8, 4), "int16")
    assert not exact_int8.is_int16_pair_conv("uint8", (16, 16, 3, 3), "int16")


# --- what the loop runs: compiled for x86-64-v3 (any host), read, and scored with llvm-mca ----------

def _analysis(mod):
    from tvm_ext.tools import mca

    try:
        mca.llvm_mca_path()
    except mca.McaError as err:
        pytest.skip(str(err))
    return mca.analyze(mod, cpu="x86-64-v3")


@pytest.mark.parametrize("k,channels,size", [(1, 64, 28), (3, 64, 14)], ids=["1x1", "3x3"])
def test_dot_loop_loads_int16_pairs(k, channels, size):
    """The hot loop of a 1x1 and a 3x3 conv holds vpmaddwd, no widening of int8 (the loop's operands
    are int16 in memory), and llvm-mca's Haswell model puts it at >= 85% of the vpmaddwd peak (before
    the kernel was widened at compile time: 57%, port 5 bound)."""
    from tvm_ext.tools.mca import single_conv
    from tvm_ext.tools.mca._graphs import ConvShape

    an = _analysis(single_conv(ConvShape(channels, channels, size, k)))
    (kernel,) = an.kernels
    assert kernel.hot is not None and "vpmaddwd ymm" in kernel.hot.dots
    assert not [i for i in kernel.hot.body if i.split()[0] in WIDENING], kernel.hot.text
    assert kernel.share >= 0.85, (kernel.share, kernel.mca.bound, kernel.hot.text)
