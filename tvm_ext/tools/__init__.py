"""Tools on top of the core: the CLI, the benchmark, the model zoo, deployment and tuning search.

``cli`` (the ``tvm-ext`` command), ``bench`` (tvm-ext against stock TVM, ONNX Runtime and
OpenVINO), ``zoo`` and ``zoo_real`` (generated and pinned third-party models), ``ort_isa`` (ONNX
Runtime restricted to AVX2), ``deploy`` (compile to a shared library and run it), ``rpc`` (run
it on a remote TVM RPC server), ``tune`` (searches the records :mod:`tvm_ext.x86.tuning` applies,
on this CPU) and ``tune_remote`` (the same for a board's convolutions, timed over RPC).
"""
import importlib

_MODULES = ("cli", "bench", "zoo", "zoo_real", "ort_isa", "deploy", "rpc", "tune", "tune_remote")


def __getattr__(name):
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
