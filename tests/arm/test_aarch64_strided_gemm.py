"""tvm_ext.arm.strided_gemm: NHWC 1x1 convs with a stride on aarch64, computed from their strided pixels.

TVM 0.19's GEMM conv reshapes a 1x1 conv's input without striding it; tvm_ext.build strides it first.
The form is checked on TOPI arguments here; the builds run under qemu (``arm_session``) against numpy.
"""
import numpy as np
import pytest
import tvm
from tvm import relay, te

import tvm_ext
from tvm_ext.arm import strided_gemm
from tvm_ext.testing.aarch64 import TARGETS, run_on_session


def _recording():
    """A stand-in for TVM's compute that records the data, strides and padding it is given."""
    seen = {}

    def original(cfg, data, b, strides, padding, *rest, **kw):
        seen.update(data=data, strides=strides, padding=padding)
        return data

    return strided_gemm._wrap(original), seen


@pytest.mark.parametrize("kernel, strides, padding, shape", [
    ((1, 1), (2, 2), (1, 1, 1, 1), (1, 5, 6, 8)),  # (7 + 2 - 1) // 2 + 1 = 5 rows, (9 + 2 - 1) // 2 + 1 = 6 columns
    ((1, 1), (2, 1), (0, 0, 0, 0), (1, 4, 9, 8)),
    ((1, 1), 3, (0, 0, 0, 0), (1, 3, 3, 8)),
])
def test_a_strided_one_by_one_conv_reads_its_strided_pixels(kernel, strides, padding, shape):
    wrapped, seen = _recording()
    data = te.placeholder((1, 7, 9, 8), "int8", name="data")
    wrapped(None, data, None, strides, padding, (1, 1), "int32", kernel, 16, False)
    assert tuple(int(d) for d in seen["data"].shape) == shape and seen["data"].op.name == "data_strided"
    assert seen["strides"] == (1, 1) and seen["padding"] == 0


@pytest.mark.parametrize("kernel, strides", [((1, 1), (1, 1)), ((3, 3), (2, 2)), ((1, 1), 1)])
def test_other_convs_keep_tvms_arguments(kernel, strides):
    wrapped, seen = _recording()
    data = te.placeholder((1, 7, 9, 8), "int8", name="data")
    wrapped(None, data, None, strides, (1, 1, 1, 1), (1, 1), "int32", kernel, 16, False)
    assert seen["data"] is data and seen["strides"] == strides and seen["padding"] == (1, 1, 1, 1)


def test_tvms_compute_is_back_after_the_outermost_exit():
    import tvm.topi.arm_cpu.conv2d as arm_conv2d

    tvms = arm_conv2d.compute_conv2d_gemm_without_weight_transform
    with strided_gemm.strided_one_by_one():
        with strided_gemm.strided_one_by_one():
            inside = arm_conv2d.compute_conv2d_gemm_without_weight_transform
        assert arm_conv2d.compute_conv2d_gemm_without_weight_transform is inside
    assert inside._tvm_ext_change == "strided_one_by_one" and inside.__wrapped__ is tvms
    assert arm_conv2d.compute_conv2d_gemm_without_weight_transform is tvms


def _conv(dtype, strides, padding, seed=0):
    """An NHWC 1x1 conv 8 -> 16 channels on a 7x9 input with the int8 extremes: module, input, numpy result."""
    rng = np.random.default_rng(seed)
    if dtype == "int8":
        x = rng.integers(-128, 128, (1, 7, 9, 8)).astype("int8")
        w = rng.integers(-128, 128, (1, 1, 8, 16)).astype("int8")
        x.flat[:2], w.flat[:2] = -128, -128
    else:
        x, w = rng.standard_normal((1, 7, 9, 8)).astype(dtype), rng.standard_normal((1, 1, 8, 16)).astype(dtype)
    var = relay.var("x", shape=x.shape, dtype=dtype)
    y = relay.nn.conv2d(var, relay.const(w), strides=strides, padding=padding, channels=16, kernel_size=(1, 1),
                        data_layout="NHWC", kernel_layout="HWIO", out_dtype="int32" if dtype == "int8" else dtype)
    top, left, down, right = padding
    xp = np.pad(x.astype(np.float64), ((0, 0), (top, down), (left, right), (0, 0)))
    want = np.einsum("nhwc,co->nhwo", xp[:, ::strides[0], ::strides[1], :], w[0, 0].astype(np.float64))
    return tvm.IRModule.from_expr(relay.Function([var], y)), x, want


@pytest.mark.parametrize("cpu, dtype, strides, padding", [
    ("cortex-a72", "int8", (2, 2), (1, 1, 1, 1)),
    ("neoverse-n1", "int8", (2, 1), (0, 1, 0, 0)),
    ("neoverse-v1", "int8", (2, 2), (0, 0, 0, 0)),
    ("cortex-a72", "float32", (2, 2), (0, 0, 0, 0)),
])
def test_tvm_ext_build_computes_strided_one_by_one_convs(cpu, dtype, strides, padding, arm_session, tmp_path):
    """Under qemu: tvm_ext.build's conv equals numpy's (int8 bit for bit, float32 within rounding)."""
    mod, x, want = _conv(dtype, strides, padding)
    (out,) = run_on_session(arm_session, tvm_ext.build(mod, target=TARGETS[cpu]), {"x": x}, tmp_path, f"sg_{cpu}")
    if dtype == "int8":
        np.testing.assert_array_equal(out.astype(np.int64), want.astype(np.int64))
    else:
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_stock_tvm_reads_the_wrong_pixels(arm_session, tmp_path):
    """What the form works around: stock relay.build's strided 1x1 conv differs from the definition."""
    mod, x, want = _conv("int8", (2, 2), (0, 0, 0, 0))
    with tvm.transform.PassContext(opt_level=3):
        stock = relay.build(mod, target=TARGETS["cortex-a72"])
    (out,) = run_on_session(arm_session, stock, {"x": x}, tmp_path, "sg_stock")
    assert not np.array_equal(out.astype(np.int64), want.astype(np.int64))
