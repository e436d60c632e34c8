"""Integer layers and their exact results (numpy, int64) for the aarch64 tier's tests."""
import numpy as np
import tvm
from tvm import relay

X_ZP = 77  # not 0 and not 128: a kernel that drops or mis-shifts it differs


def qnn_conv(rng, channels=64, size=8):
    """uint8 x int8 -> int32 3x3 conv, padding 1 (qnn pads with the input zero point).
    TVM 0.19's arm_cpu int8 conv strategies need at least 64 input channels (tvm_ext.arm.int8_conv lifts it)."""
    x = rng.integers(0, 256, (1, channels, size, size)).astype("uint8")
    w = rng.integers(-127, 128, (channels, channels, 3, 3)).astype("int8")
    w[0, 0] = 127
    w[1, 0] = -127  # both ends of the range present
    var = relay.var("x", shape=x.shape, dtype="uint8")
    y = relay.qnn.op.conv2d(var, relay.const(w), relay.const(X_ZP), relay.const(0), relay.const(0.02),
                            relay.const(0.01), kernel_size=(3, 3), channels=channels, padding=(1, 1),
                            out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([var], y)), x, w


def conv_reference(x, w):
    xs = np.pad(x.astype(np.int64) - X_ZP, ((0, 0), (0, 0), (1, 1), (1, 1)))  # padded zero point -> 0
    n, c, h, wd = x.shape
    out = np.zeros((n, w.shape[0], h, wd), np.int64)
    for ky in range(3):
        for kx in range(3):
            out += np.einsum("nchw,oc->nohw", xs[:, :, ky:ky + h, kx:kx + wd], w[:, :, ky, kx].astype(np.int64))
    return out.astype(np.int32)


def qnn_dense(rng, m=4, k=64, n=32):
    x = rng.integers(0, 256, (m, k)).astype("uint8")
    w = rng.integers(-127, 128, (n, k)).astype("int8")
    w[0, :2] = (127, -127)
    var = relay.var("x", shape=x.shape, dtype="uint8")
    y = relay.qnn.op.dense(var, relay.const(w), relay.const(X_ZP), relay.const(0), relay.const(0.02),
                           relay.const(0.01), units=n, out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([var], y)), x, w


def dense_reference(x, w):
    return ((x.astype(np.int64) - X_ZP) @ w.astype(np.int64).T).astype(np.int32)


def conv_nchw_exact(x, w, x_zero_point=0, strides=(1, 1), padding=(0, 0)):
    """Exact int64 NCHW conv of ``x - x_zero_point`` with OIHW ``w`` (padding with the zero point: 0 after)."""
    (sh, sw), (ph, pw) = strides, padding
    xs = np.pad(x.astype(np.int64) - x_zero_point, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    kh, kw = w.shape[2:]
    oh, ow = (xs.shape[2] - kh) // sh + 1, (xs.shape[3] - kw) // sw + 1
    out = np.zeros((x.shape[0], w.shape[0], oh, ow), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            window = xs[:, :, ky:ky + (oh - 1) * sh + 1:sh, kx:kx + (ow - 1) * sw + 1:sw]
            out += np.einsum("nchw,oc->nohw", window, w[:, :, ky, kx].astype(np.int64))
    return out


PW_ZP = 61  # the pointwise conv's output zero point, the depthwise conv's input zero point


def qnn_pointwise_depthwise(rng, channels=16, size=9, strides=(1, 1)):
    """uint8 x -> 1x1 conv (uint8 x int8) -> requantize at equal scales (acc + PW_ZP, clipped to uint8)
    -> 3x3 depthwise conv (groups = channels, padding 1 with PW_ZP) -> int32: a MobileNet block's first
    two layers, whose integer result numpy computes exactly. The depthwise conv reads the 1x1 conv's
    NCHWc output. Returns (module, x, 1x1 weights, depthwise weights)."""
    x = rng.integers(0, 256, (1, channels, size, size)).astype("uint8")
    w1 = rng.integers(-127, 128, (channels, channels, 1, 1)).astype("int8")
    w2 = rng.integers(-127, 128, (channels, 1, 3, 3)).astype("int8")
    w2[0, 0, 0] = (127, -127, 127)  # both ends of the range present
    var = relay.var("x", shape=x.shape, dtype="uint8")
    y = relay.qnn.op.conv2d(var, relay.const(w1), relay.const(X_ZP), relay.const(0), relay.const(0.02),
                            relay.const(0.01), kernel_size=(1, 1), channels=channels, out_dtype="int32")
    y = relay.qnn.op.requantize(y, relay.const(0.0002), relay.const(0), relay.const(0.0002), relay.const(PW_ZP),
                                out_dtype="uint8")
    y = relay.qnn.op.conv2d(y, relay.const(w2), relay.const(PW_ZP), relay.const(0), relay.const(0.0002),
                            relay.const(0.01), kernel_size=(3, 3), channels=channels, groups=channels,
                            strides=strides, padding=(1, 1), out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([var], y)), x, w1, w2


def pointwise_depthwise_reference(x, w1, w2, strides=(1, 1)):
    """Exact int64 result of :func:`qnn_pointwise_depthwise`, as int32."""
    acc = np.einsum("nchw,oc->nohw", x.astype(np.int64) - X_ZP, w1[:, :, 0, 0].astype(np.int64))
    y = np.clip(acc + PW_ZP, 0, 255)
    (sh, sw), c = strides, y.shape[1]
    ys = np.pad(y - PW_ZP, ((0, 0), (0, 0), (1, 1), (1, 1)))  # padded with the zero point: 0 after
    oh, ow = (ys.shape[2] - 3) // sh + 1, (ys.shape[3] - 3) // sw + 1
    out = np.zeros((y.shape[0], c, oh, ow), np.int64)
    for ky in range(3):
        for kx in range(3):
            window = ys[:, :, ky:ky + (oh - 1) * sh + 1:sh, kx:kx + (ow - 1) * sw + 1:sw]
            out += window * w2[:, 0, ky, kx].astype(np.int64)[None, :, None, None]
    return out.astype(np.int32)


def qlinearconv_onnx(path, rng, channels=16, size=8):
    """A tiny QOperator ONNX model: two uint8 x int8 ``QLinearConv`` (3x3 with bias, then 1x1) with
    non-zero zero points; an integer graph, so every build is compared with exact integer arithmetic."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    c = channels
    consts = {"xs": np.array(0.02, np.float32), "ws": np.array(0.01, np.float32), "ys": np.array(0.5, np.float32),
              "zs": np.array(0.4, np.float32), "xz": np.array(X_ZP, np.uint8), "wz": np.array(0, np.int8),
              "yz": np.array(60, np.uint8), "zz": np.array(100, np.uint8),
              "w1": rng.integers(-127, 128, (c, c, 3, 3)).astype(np.int8),
              "w2": rng.integers(-127, 128, (c, c, 1, 1)).astype(np.int8),
              "b1": rng.integers(-2000, 2000, (c,)).astype(np.int32)}
    nodes = [helper.make_node("QLinearConv", ["x", "xs", "xz", "w1", "ws", "wz", "ys", "yz", "b1"], ["y"],
                              pads=[1, 1, 1, 1]),
             helper.make_node("QLinearConv", ["y", "ys", "yz", "w2", "ws", "wz", "zs", "zz"], ["z"])]
    graph = helper.make_graph(nodes, "tiny_qlinearconv",
                              [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, c, size, size])],
                              [helper.make_tensor_value_info("z", TensorProto.UINT8, [1, c, size, size])],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def plain_llvm_output(mod, params, x, input_name="x"):
    """The model's first output on ``x`` from a plain ``llvm`` build run here: no -mcpu, so no int8
    SIMD, exact integer arithmetic (the oracle of the remote runs)."""
    from tvm.contrib import graph_executor

    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target="llvm", params=params)
    gm = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    gm.set_input(input_name, x)
    gm.run()
    return gm.get_output(0).numpy()
