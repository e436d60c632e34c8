"""Single-conv Relay graphs: a uint8 x int8 ``qnn.conv2d`` with bias and requantize to uint8, at the
distinct convolution shapes of ResNet-50 v1.5 (the zoo's layout: stride on the 3x3 conv)."""
from __future__ import annotations

import collections
from dataclasses import dataclass

__all__ = ["ConvShape", "single_conv", "resnet50_convs"]


@dataclass(frozen=True)
class ConvShape:
    """One conv: input channels, output channels, input height = width, kernel, stride."""

    ci: int
    co: int
    hw: int
    k: int
    stride: int = 1

    @property
    def out_hw(self) -> int:
        return (self.hw + 2 * (self.k // 2) - self.k) // self.stride + 1

    @property
    def macs(self) -> int:
        return self.co * self.out_hw ** 2 * self.ci * self.k * self.k

    @property
    def geometry(self) -> tuple:
        """(out channels, kh, kw, out h, out w): how benchmarks/layers_vs_peers.py keys a conv."""
        return (self.co, self.k, self.k, self.out_hw, self.out_hw)

    def __str__(self) -> str:
        s = f"/{self.stride}" if self.stride > 1 else ""
        return f"{self.k}x{self.k}{s} {self.hw}x{self.hw} {self.ci}->{self.co}"


def single_conv(shape: ConvShape, seed: int = 0):
    """IRModule of ``requantize(qnn.conv2d(x_u8, w_i8) + bias) -> uint8`` at ``shape`` (padding k // 2)."""
    import numpy as np
    import tvm
    from tvm import relay

    rng = np.random.default_rng(seed)
    k, p = shape.k, shape.k // 2
    x = relay.var("x", shape=(1, shape.ci, shape.hw, shape.hw), dtype="uint8")
    w = relay.const(rng.integers(-127, 128, (shape.co, shape.ci, k, k)).astype("int8"))
    y = relay.qnn.op.conv2d(x, w, relay.const(3), relay.const(0), relay.const(0.02), relay.const(0.01),
                            kernel_size=(k, k), channels=shape.co, padding=(p, p),
                            strides=(shape.stride, shape.stride), out_dtype="int32")
    y = relay.nn.bias_add(y, relay.const(rng.integers(-1000, 1000, (shape.co,)).astype("int32")))
    y = relay.qnn.op.requantize(y, relay.const(0.0002), relay.const(0), relay.const(0.05), relay.const(5),
                                out_dtype="uint8")
    return tvm.IRModule.from_expr(relay.Function([x], y))


def resnet50_convs(blocks=(3, 4, 6, 3), base_width: int = 64, image_size: int = 224) -> dict:
    """``{ConvShape: how many times ResNet-50 has it}`` for every conv after the stem, in network order."""
    count: dict = collections.Counter()
    hw, cin = image_size // 4, base_width
    for si, n in enumerate(blocks):
        width = base_width * 2 ** si
        for bi in range(n):
            stride = 2 if (bi == 0 and si > 0) else 1
            count[ConvShape(cin, width, hw, 1)] += 1
            count[ConvShape(width, width, hw, 3, stride)] += 1
            out_hw = hw // stride
            count[ConvShape(width, width * 4, out_hw, 1)] += 1
            if bi == 0:
                count[ConvShape(cin, width * 4, hw, 1, stride)] += 1
            cin, hw = width * 4, out_hw
    return dict(count)
