"""The core of tvm-ext: ``tvm_ext.build`` and what it hands back.

``build`` (relay.build with insertion points), ``pipelines`` (the int8 pipeline as ordered data),
``report`` (kernel reports from the built graph), ``explain`` (why FuseOps left each boundary),
``registry`` (passes by name), ``frontend`` (ONNX to Relay) and ``tvm_bugs`` (TVM 0.19 bugs refused
or built around). The x86 kernel policy (:mod:`tvm_ext.x86`) sits below it; the tools
(:mod:`tvm_ext.tools`) sit on top.
"""
import importlib

_MODULES = ("build", "pipelines", "report", "explain", "registry", "frontend", "tvm_bugs")


def __getattr__(name):
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
