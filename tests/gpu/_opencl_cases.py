"""What the OpenCL tests share: OpenCL device 0 or a skip with the reason, running a graph executor
factory on a device, and tiny_onnx's model in numpy (the exact reference of its int8 builds)."""
import numpy as np
import pytest
import tvm
from tvm.contrib import graph_executor

from tvm_ext.gpu import opencl


def device_or_skip():
    """OpenCL device 0, or a skip naming what is missing (``make gpu-env`` sets it up)."""
    why = opencl.missing()
    if why:
        pytest.skip(f"no OpenCL device: {why}")
    return tvm.opencl(0)


def run_graph(factory, dev, inputs):
    """Every output of ``factory`` run on ``dev`` with ``inputs`` (name -> array)."""
    gm = graph_executor.GraphModule(factory["default"](dev))
    for name, value in inputs.items():
        gm.set_input(name, value)
    gm.run()
    return [gm.get_output(i).numpy() for i in range(gm.get_num_outputs())]


def numpy_tiny(x):
    """tiny_onnx's model in numpy: each output channel is the 3x3 box sum over all input channels, relu."""
    p = np.pad(x[0].sum(axis=0), 1)
    box = sum(p[i:i + 8, j:j + 8] for i in range(3) for j in range(3))
    return np.maximum(np.broadcast_to(box, (1, 4, 8, 8)), 0)
