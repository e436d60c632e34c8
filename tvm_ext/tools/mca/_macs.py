"""Multiply-accumulates of a fused Relay function's convolutions and dense layers, from its types.

A conv's MACs = output elements x (input channels / groups) x kernel height x kernel width, the
channels read off the data layout (``C`` times ``c`` for blocked layouts such as ``NCHW16c``); a dense
or batch matmul's = output elements x the reduced dimension (the data's last axis). :func:`kind` says
whether a function's conv is depthwise or float, which changes how its loops' instructions count.
"""
from __future__ import annotations

import math
import re

__all__ = ["macs", "kind", "describe", "kernel_row"]


def _shape(expr) -> list:
    return [int(d) for d in expr.checked_type.shape]


def _channels(shape, layout: str) -> int:
    n = 1
    for dim, letter in zip(shape, layout):
        if letter in "Cc":
            n *= dim
    return n


def _call_macs(call) -> int:
    name = call.op.name
    if "conv2d" in name and "transpose" not in name:
        out = _shape(call)
        data = _shape(call.args[0])
        layout = re.sub(r"\d", "", str(call.attrs.data_layout) or "NCHW")  # NCHW16c -> NCHWc
        if len(layout) != len(data):
            return 0
        kh, kw = (int(k) for k in call.attrs.kernel_size) if call.attrs.kernel_size else _shape(call.args[1])[2:4]
        return math.prod(out) * _channels(data, layout) // int(call.attrs.groups) * kh * kw
    if "dense" in name or "matmul" in name:
        return math.prod(_shape(call)) * _shape(call.args[0])[-1]
    return 0


def macs(func) -> int:
    """Sum of the MACs of the convolutions and dense layers called in Relay function ``func``."""
    import tvm
    from tvm import relay

    total = 0

    def visit(node):
        nonlocal total
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op):
            try:
                total += _call_macs(node)
            except (AttributeError, ValueError, TypeError):  # an untyped or shape-polymorphic call
                pass

    relay.analysis.post_order_visit(func, visit)
    return total


def kind(func) -> str:
    """``"float"`` when a conv or dense of ``func`` reads float data, ``"depthwise"`` when a conv has one
    input channel per group (groups > 1), else ``""``."""
    import tvm
    from tvm import relay

    kinds = set()

    def visit(node):
        if not (isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op)):
            return
        name = node.op.name
        if not (("conv2d" in name and "transpose" not in name) or "dense" in name or "matmul" in name):
            return
        try:
            if str(node.args[0].checked_type.dtype).startswith("float"):
                kinds.add("float")
            elif "conv2d" in name and int(node.attrs.groups) > 1:
                layout = re.sub(r"\d", "", str(node.attrs.data_layout) or "NCHW")
                if _channels(_shape(node.args[0]), layout) == int(node.attrs.groups):
                    kinds.add("depthwise")
        except (AttributeError, ValueError, TypeError):  # an untyped call
            pass

    relay.analysis.post_order_visit(func, visit)
    return "float" if "float" in kinds else ("depthwise" if "depthwise" in kinds else "")


def kernel_row(func) -> tuple:
    """``(kernel width, stride width, output width)`` of the first conv of ``func`` (zeros without one)."""
    import tvm
    from tvm import relay

    found = []

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op) and "conv2d" in node.op.name:
            try:
                layout = re.sub(r"\d", "", str(node.attrs.out_layout or node.attrs.data_layout) or "NCHW")
                found.append((int(node.attrs.kernel_size[1]), int(node.attrs.strides[1]),
                              int(_shape(node)[layout.index("W")])))
            except (AttributeError, IndexError, TypeError, ValueError):  # no static kernel size or shape
                pass

    relay.analysis.post_order_visit(func, visit)
    return found[0] if found else (0, 0, 0)


def describe(func) -> str:
    """The first conv or dense of ``func`` in words: ``"5x5/2x1 dw 104 6x96"`` (kernel, strides when not
    1, ``dw`` for depthwise, input -> output channels or the depthwise channels, output height x width),
    ``"dense 1x200->2"``; ``""`` when it has none."""
    import tvm
    from tvm import relay

    found = []

    def visit(node):
        if found or not (isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op)):
            return
        name = node.op.name
        try:
            if "conv2d" in name and "transpose" not in name:
                layout = re.sub(r"\d", "", str(node.attrs.data_layout) or "NCHW")
                out_layout = re.sub(r"\d", "", str(node.attrs.out_layout or node.attrs.data_layout) or "NCHW")
                ci = _channels(_shape(node.args[0]), layout)
                out = _shape(node)
                co = _channels(out, out_layout)
                oh, ow = out[out_layout.index("H")], out[out_layout.index("W")]
                kh, kw = (int(k) for k in node.attrs.kernel_size)
                sh, sw = (int(v) for v in node.attrs.strides)
                stride = "" if (sh, sw) == (1, 1) else (f"/{sh}" if sh == sw else f"/{sh}x{sw}")
                groups = int(node.attrs.groups)
                chans = f"{ci}->{co}" + (f" g{groups}" if groups > 1 else "")
                chans = f"dw {co}" if groups > 1 and groups == ci else chans
                found.append(f"{kh}x{kw}{stride} {chans} {oh}x{ow}")
            elif "dense" in name or "matmul" in name:
                data, out = _shape(node.args[0]), _shape(node)
                found.append(f"dense {'x'.join(map(str, data))}->{out[-1]}")
        except (AttributeError, ValueError, TypeError):  # an untyped call
            pass

    relay.analysis.post_order_visit(func, visit)
    return found[0] if found else ""
