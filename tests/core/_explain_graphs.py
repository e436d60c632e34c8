"""Graphs the explain tests share: dense + bias + relu (one kernel), relay.quantize's conv -> cast ->
stop_fusion -> conv, and a residual block; ``by_kind`` picks an explanation's boundaries of one reason."""
import numpy as np
import tvm
from tvm import relay

W = lambda *shape: relay.const(np.random.default_rng(0).standard_normal(shape).astype("float32"))  # noqa: E731


def conv(x, cin, cout, k=3):
    return relay.nn.conv2d(x, W(cout, cin, k, k), padding=(k // 2, k // 2), kernel_size=(k, k), channels=cout)


def mod_of(y):
    return tvm.IRModule.from_expr(relay.Function(relay.analysis.free_vars(y), y))


def dense_bias_relu():
    """dense -> add(bias) -> relu: one kernel."""
    x = relay.var("x", shape=(1, 64))
    return mod_of(relay.nn.relu(relay.add(relay.nn.dense(x, W(32, 64)), W(32))))


def quantized_pair():
    """conv -> relu -> cast(int8) -> stop_fusion -> cast -> conv (relay.quantize's form)."""
    x = relay.var("x", shape=(1, 16, 8, 8))
    y = relay.nn.relu(conv(x, 16, 16))
    y = relay.annotation.stop_fusion(relay.cast(relay.clip(relay.round(y), -127, 127), "int8"))
    return mod_of(conv(relay.cast(y, "float32"), 16, 16))


def residual():
    """x -> conv -> relu = a;  a -> conv -> add(a) -> relu -> mean -> sqrt."""
    x = relay.var("x", shape=(1, 16, 8, 8))
    a = relay.nn.relu(conv(x, 16, 16))
    y = relay.nn.relu(relay.add(a, conv(a, 16, 16)))
    return mod_of(relay.sqrt(relay.mean(y, axis=[2, 3])))


def by_kind(ex, kind):
    return [b for b in ex.boundaries if b.kind == kind]
