"""Tools on top of the core: the CLI, the benchmark, the model zoo, deployment and tuning search.

``cli`` (the ``tvm-ext`` command), ``bench`` (tvm-ext against stock TVM, ONNX Runtime and
OpenVINO), ``zoo`` and ``zoo_real`` (generated and pinned third-party models), ``ort_isa`` (ONNX
Runtime restricted to AVX2), ``deploy`` (compile to a shared library and run it), ``rpc`` (run
it on a remote TVM RPC server), ``tune`` (searches the records the x86 back end applies,
on this CPU), ``tune_remote`` (the same for a board's convolutions, timed over RPC) and ``mca``
(the int8 hot loops' share of the dot-product peak per CPU model, from llvm-mca).
"""
import importlib

_MODULES = ("cli", "bench", "zoo", "zoo_real", "ort_isa", "deploy", "rpc", "tune", "tune_remote", "mca")


def __getattr__(name):
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
