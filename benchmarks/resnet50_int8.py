#!/usr/bin/env python
"""int8 ResNet-50 benchmark (run by `make bench`): same options as `tvm-ext bench`.

Kernels, anchor kernels, tensors and MB crossing kernel boundaries by dtype, build time, latency
of stock TVM vs TVM + tvm-ext vs ONNX Runtime vs OpenVINO (interleaved, same thread count; on a host
above tvm-ext's instruction set also OpenVINO capped at it), and numerics against exact integer
arithmetic.
Writes results.json, results.md and chart.png to --out (default ./bench-results).
"""
import sys

from tvm_ext.tools.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
