"""The GPU back end, compile-only (no device needed): the int8 pipeline narrowed for GPUs, kernel counts
at ``opencl`` against stock TVM, targets this TVM cannot build refused up front (never an abort), bad
options rejected."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext import families as select
from tvm_ext.core import pipelines
from tvm_ext.errors import UnsupportedByTVM
from tvm_ext.gpu.backend import GPU, unsupported

CPU_ONLY_STEPS = {"PadChannelsAtProducer", "EpilogueBeforeChannelSlice"}
#: Steps of ``int8()`` that run at GPU targets only (FuseOps postpones fusions into joins there).
GPU_ONLY_STEPS = {"AnchoredArgumentFirst"}


def _small_float():
    x = relay.var("x", shape=(1, 4, 8, 8), dtype="float32")
    w = relay.const(np.ones((8, 4, 3, 3), "float32"))
    y = relay.nn.relu(relay.nn.conv2d(x, w, padding=(1, 1), channels=8, kernel_size=(3, 3)))
    return tvm.IRModule.from_expr(relay.Function([x], relay.nn.global_avg_pool2d(y)))


def test_gpu_targets_belong_to_the_gpu_family():
    for kind in ("opencl", "cuda", "nvptx", "vulkan", "rocm", "metal"):
        assert select.family(kind) == "gpu"
    assert select.family("llvm") != "gpu"


def test_int8_pipeline_narrowed_for_gpu_drops_the_cpu_kernel_steps():
    full = pipelines.int8().pass_names()
    gpu = pipelines.int8().for_family("gpu").pass_names()
    names_full = set(full["start"]) | set(full["before_fuse"])
    names_gpu = set(gpu["start"]) | set(gpu["before_fuse"])
    assert CPU_ONLY_STEPS <= names_full and GPU_ONLY_STEPS <= names_full
    assert not CPU_ONLY_STEPS & names_gpu
    assert names_gpu == names_full - CPU_ONLY_STEPS
    assert "QDQToInteger" in names_gpu and "RemoveStopFusion" in names_gpu
    # x86 keeps every step but the GPU-only ones
    x86 = pipelines.int8().for_family("x86").pass_names()
    assert set(x86["start"]) | set(x86["before_fuse"]) == names_full - GPU_ONLY_STEPS


def test_opencl_build_gets_the_host_cpu_as_host():
    tgt = select.build_target("opencl")
    assert tgt.kind.name == "opencl" and tgt.host is not None and tgt.host.kind.name == "llvm"


def test_bad_gpu_options_raise_type_error():
    with pytest.raises(TypeError, match="not options of the gpu back end"):
        select.build_target("opencl", amx=True)
    with pytest.raises(TypeError, match="not options of the gpu back end"):
        tvm_ext.build(_small_float(), target="opencl", allow_vnni=True)


@pytest.mark.skipif(tvm.get_global_func("target.build.cuda", allow_missing=True) is not None,
                    reason="this TVM has a CUDA code generator")
def test_cuda_refused_when_tvm_has_no_cuda_code_generator():
    with pytest.raises(UnsupportedByTVM, match="cuda"):
        tvm_ext.build(_small_float(), target="cuda")


def test_nvptx_refused_without_aborting_the_process():
    # in a child process: if the refusal ever stopped working, LLVM's abort must not end the test session
    code = textwrap.dedent("""
        import numpy as np, tvm, tvm_ext
        from tvm import relay
        from tvm_ext.errors import UnsupportedByTVM
        x = relay.var("x", shape=(1, 4, 8, 8))
        mod = tvm.IRModule.from_expr(relay.Function([x], relay.nn.global_avg_pool2d(x)))
        try:
            tvm_ext.build(mod, target="nvptx -mcpu=sm_80")
        except UnsupportedByTVM as err:
            print("REFUSED", err)
        else:
            print("BUILT")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "REFUSED" in proc.stdout or "BUILT" in proc.stdout
    if "REFUSED" in proc.stdout:
        assert "nvptx" in proc.stdout


def test_unsupported_names_the_cause_and_opencl_is_supported():
    assert unsupported(tvm.target.Target("opencl")) == ""
    why = unsupported(tvm.target.Target("nvptx"))
    if why:  # this wheel: LLVM 22 aborts, or no CUDA runtime
        assert "nvptx" in why or "cuda" in why
    with pytest.raises(UnsupportedByTVM):
        if not why:
            pytest.skip("this TVM builds nvptx")
        GPU().target("nvptx")


def _launched(name, passes):
    """Kernels the graph executor launches (a reshape-only ``__nop`` aliases its input: no launch), the
    bytes crossing between kernels, and their dtypes."""
    from tvm_ext.tools import zoo

    m = zoo.load(name, small=True)
    report = tvm_ext.build(m.mod, target="opencl", params=m.params, passes=passes).kernel_report
    return report.num_launched_kernels, sum(report.crossing.nbytes.values()), set(report.crossing.nbytes)


# each a small zoo ResNet built twice at opencl (about a minute); tests/gpu/test_opencl.py builds the int8
# pipeline at opencl and compares its outputs by default
@pytest.mark.parametrize("name, eight_bit", [
    pytest.param("resnet50_int8_qdq", True, marks=pytest.mark.slow),
    pytest.param("resnet50_int8_qoperator", True, marks=pytest.mark.slow),
    pytest.param("resnet50_int8_relay", False, marks=pytest.mark.slow),
    pytest.param("resnet50_fp32", False, marks=pytest.mark.slow),
])
def test_int8_pipeline_at_opencl_builds_with_at_most_stock_kernels_and_bytes(name, eight_bit):
    """At most stock's launched kernels and crossing bytes; only 8-bit tensors cross the ONNX int8 models."""
    stock_kernels, stock_bytes, _ = _launched(name, ())
    kernels, nbytes, dtypes = _launched(name, pipelines.int8())
    assert kernels <= stock_kernels, f"{name} at opencl: tvm-ext launches {kernels} kernels, stock {stock_kernels}"
    assert nbytes <= stock_bytes, f"{name} at opencl: tvm-ext moves {nbytes} bytes between kernels, stock {stock_bytes}"
    if eight_bit:
        assert dtypes <= {"uint8", "int8"}, f"{name} at opencl: {sorted(dtypes)} tensors cross kernels"
