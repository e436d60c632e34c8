"""A real third-party model built by tvm-ext's int8 pipeline at each ARM class and run under qemu (slow).

PP-OCR's text-direction classifier, statically quantized to QOperator (uint8 x int8) from the pinned
rapidocr-onnxruntime wheel (tvm_ext.tools.zoo_real). Stock TVM 0.19 does not build it for
Neoverse-N1 (docs/arm.md). The oracle is the x86 ``llvm`` build of the stock graph (no -mcpu: no int8
SIMD, one rounding per requantize): its integer layers are exact. The classifier ends in a float
softmax, so the outputs are compared within float tolerance, far below one step of the last
quantized layer; the top class must agree.
"""
import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.contrib import graph_executor

from tvm_ext.testing.aarch64 import TARGETS, run_on_session

pytestmark = pytest.mark.slow

MODEL = "ppocr_cls_v2_int8_qoperator"


@pytest.fixture(scope="module")
def model_and_reference():
    from tvm_ext.tools import zoo, zoo_real

    try:
        m = zoo.load(MODEL)
    except zoo_real.ModelUnavailable as err:
        pytest.skip(f"real model unavailable: {err}")
    x = zoo_real.images("ppocr_cls_v2", 1, seed=3)[0]
    with tvm.transform.PassContext(opt_level=3):
        x86 = relay.build(m.mod, target="llvm", params=m.params)
    gm = graph_executor.GraphModule(x86["default"](tvm.cpu()))
    gm.set_input(m.input_name, x)
    gm.run()
    return m, x, gm.get_output(0).numpy()


@pytest.mark.parametrize("cpu", list(TARGETS))
def test_tvm_ext_int8_pipeline_real_classifier_matches_x86_llvm(cpu, model_and_reference, arm_server, tmp_path,
                                                               record_property):
    import tvm_ext
    from tvm_ext.core import pipelines

    m, x, ref = model_and_reference
    factory = tvm_ext.build(m.mod, TARGETS[cpu], m.params, passes=pipelines.int8())
    record_property("kernels", factory.kernel_report.num_kernels)
    session = arm_server.connect(session_timeout=600)  # after the build: a session ends at its timeout
    (out,) = run_on_session(session, factory, {m.input_name: x}, tmp_path, f"ppocr_cls_{cpu}")
    record_property("max_abs_diff", float(np.abs(out - ref).max()))
    assert out.argmax() == ref.argmax()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6, err_msg=f"{MODEL} at {TARGETS[cpu]} vs x86 llvm")
