"""Builders and readers shared by the tests of tvm_ext.x86's 8-bit dense padding and its fusion."""
import json

import numpy as np
import tvm
from tvm import relay


def _dense(units, reduced=256, batch=1, seed=0, epilogue=False, weight_var=False, weight_max=128):
    """``dense(x: u8[batch, reduced], w: i8[units, reduced])`` with weights in
    ``[-weight_max, weight_max)`` (full range by default), optionally with a bias and a float scale
    after it."""
    rng = np.random.default_rng(seed)
    x = relay.var("x", shape=(batch, reduced), dtype="uint8")
    w_np = rng.integers(-weight_max, weight_max, (units, reduced)).astype("int8")
    w = relay.var("w", shape=(units, reduced), dtype="int8") if weight_var else relay.const(w_np)
    y = relay.nn.dense(x, w, units=units, out_dtype="int32")
    if epilogue:
        y = relay.add(y, relay.const(rng.integers(-1000, 1000, (units,)).astype("int32")))
        y = relay.cast(y, "float32") * relay.const((rng.random(units) * 1e-3).astype("float32"))
    params = [x, w] if weight_var else [x]
    return tvm.IRModule.from_expr(relay.Function(params, y)), w_np


def _inputs(batch, reduced, seed=1):
    """Full-range uint8 data with the extremes 0 and 255 in it."""
    x = np.random.default_rng(seed).integers(0, 256, (batch, reduced)).astype("uint8")
    x[0, :2] = (0, 255)
    return x


def _run(factory, **inputs):
    from tvm.contrib import graph_executor

    m = graph_executor.GraphModule(factory["default"](tvm.cpu()))
    m.set_input(**inputs)
    m.run()
    return m.get_output(0).numpy()


def _kernels(factory):
    """``(func_name, output shape)`` of every kernel, in order."""
    graph = json.loads(factory.get_graph_json())
    shapes = graph["attrs"]["shape"][1]
    return [(n["attrs"]["func_name"], tuple(shapes[i])) for i, n in enumerate(graph["nodes"]) if n["op"] == "tvm_op"]


def _dense_weight_shapes(factory):
    """Shapes of the packed constant weights (4-D) the build's dense kernels read."""
    params = factory.get_params()
    graph = json.loads(factory.get_graph_json())
    nodes = graph["nodes"]
    out = []
    for n in nodes:
        if n["op"] == "tvm_op" and "dense" in n["attrs"]["func_name"]:
            out += [params[nodes[s]["name"]].shape for s, *_ in n["inputs"] if nodes[s]["name"] in params]
    return [shape for shape in out if len(shape) == 4]
