"""Checks the pass tests share: bad input (untyped, If/Let), and real models against ONNX Runtime.

Imported by the test modules of this folder as ``_helpers`` (pytest puts the folder on ``sys.path``).
A test that makes one of the shared checks is named after it: ``assert_untyped_module_raises`` in
``test_untyped_module_raises``, ``assert_if_and_let_skipped`` in ``test_if_and_let_skipped`` (``test_if_skipped``
or ``test_let_skipped`` for one of them), ``assert_not_mutated_and_disabled_by_name`` in
``test_not_mutated_and_disabled_by_name``; a dynamic-shape skip is ``test_dynamic_shapes_skipped``.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_ext.passes._util import UntypedModuleError
from tvm_ext.testing import assert_unchanged, exact_ort_session, infer


def assert_untyped_module_raises(pass_, mod, pass_name: str) -> None:
    """``pass_`` on the untyped ``mod`` raises an error naming ``pass_name`` and leaves ``mod`` as it was."""
    text = mod.astext()
    with pytest.raises(Exception, match=f"{pass_name}: the module is not type-inferred") as info:
        pass_(mod)
    assert isinstance(info.value, (UntypedModuleError, tvm.TVMError))
    assert mod.astext() == text


def assert_unchanged_with_reason(pass_, mod, reason: str, logger: str, caplog) -> None:
    """``pass_`` leaves ``mod`` unchanged and says why: ``reason`` is logged (DEBUG or above) on ``logger``."""
    with caplog.at_level(logging.DEBUG, logger=logger):
        assert_unchanged(pass_, mod)
    assert reason in caplog.text


def assert_if_and_let_skipped(pass_, body, logger: str, caplog) -> None:
    """``body`` under an ``If`` and under a ``Let``: ``pass_`` leaves both alone and logs both reasons."""
    cond = relay.var("c", shape=(), dtype="bool")
    with caplog.at_level(logging.DEBUG, logger=logger):
        assert_unchanged(pass_, infer(relay.If(cond, body, body)))
        v = relay.var("v")
        assert_unchanged(pass_, infer(relay.Let(v, body, relay.nn.relu(v))))
    assert "If" in caplog.text and "Let" in caplog.text


# --- real models (slow: a build takes minutes, so it runs in a child process) ----------------------
_REAL_CHILD = r"""
import sys, numpy as np, tvm, tvm_ext
from tvm.contrib import graph_executor
from tvm_ext.core import pipelines
from tvm_ext.tools import zoo, zoo_real
name, pipeline, out = sys.argv[1], sys.argv[2], sys.argv[3]
m = zoo.load(name)
passes = pipelines.int8(numerics="onnxruntime") if pipeline == "int8" else pipelines.onnxruntime_numerics()
lib = tvm_ext.build(m.mod, params=m.params, passes=passes)
gm = graph_executor.GraphModule(lib["default"](tvm.cpu()))
ys = []
for x in zoo_real.images(name, 8, seed=1000):
    gm.set_input(m.input_name, x); gm.run(); ys.append(gm.get_output(0).numpy())
np.save(out, np.stack(ys))
"""


def real_model_vs_onnxruntime(tmp_path, name: str, pipeline: str = "int8", timeout: int = 3600):
    """Outputs of the real model ``name`` on 8 images: tvm-ext's, ONNX Runtime's, and the output step.

    ``pipeline``: ``"int8"`` (``pipelines.int8(numerics="onnxruntime")``) or ``"onnxruntime_numerics"``.
    ONNX Runtime's outputs are those of its exact int8 path (:func:`onnxruntime_reference`).
    The tvm-ext build runs in a child process; the test is skipped when the model is unavailable.
    """
    import subprocess
    import sys

    from tvm_ext.tools import bench, zoo, zoo_real

    try:
        path = zoo.onnx_path(name)
    except zoo_real.ModelUnavailable as err:
        pytest.skip(f"{name}: {err}")
    out = tmp_path / "tvm.npy"
    proc = subprocess.run([sys.executable, "-c", _REAL_CHILD, name, pipeline, str(out)], capture_output=True,
                          text=True, check=False, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = np.load(out)
    ref = onnxruntime_reference(path, zoo_real.images(name, 8, seed=1000))
    step = bench._output_step(path)["output_step"]  # pylint: disable=protected-access
    return got, ref, step


def onnxruntime_reference(path, inputs) -> np.ndarray:
    """ONNX Runtime's first output of the ONNX model at ``path`` for each of ``inputs``, stacked, from its
    exact int8 path (:func:`tvm_ext.testing.exact_ort_session`). The numerics claims are made against
    exact accumulation: on CPUs without VNNI, ONNX Runtime's default uint8 x int8 kernels saturate
    int16 pair sums (PP-OCR cls: 29-30 output steps from its own exact path, top-1 7/8), and tvm-ext's
    int8 convs do not."""
    sess = exact_ort_session(str(path))
    input_name = sess.get_inputs()[0].name
    return np.stack([sess.run(None, {input_name: x})[0] for x in inputs])


def pass_names_seen(run) -> list:
    """Names of the passes an instrument sees while ``run()`` runs (under opt_level 2)."""
    seen = []

    @tvm.instrument.pass_instrument
    class Names:  # pylint: disable=too-few-public-methods
        def run_before_pass(self, mod, info):  # pylint: disable=unused-argument
            seen.append(info.name)

    with tvm.transform.PassContext(opt_level=2, instruments=[Names()]):
        run()
    return seen


def assert_not_mutated_and_disabled_by_name(pass_, mod, pass_name: str, rewritten: str) -> None:
    """``pass_`` in a Sequential rewrites ``mod`` (``rewritten`` leaves its text) without mutating it,
    and ``disabled_pass=[pass_name]`` turns it off."""
    text = mod.astext()
    seq = tvm.transform.Sequential([pass_, relay.transform.InferType()])
    with tvm.transform.PassContext(opt_level=3):
        out = seq(mod)
    assert mod.astext() == text and rewritten not in out.astext()
    with tvm.transform.PassContext(opt_level=3, disabled_pass=[pass_name]):
        tvm.ir.assert_structural_equal(seq(mod)["main"], mod["main"])


def require_real_model(name: str):
    """The ONNX file of the real model ``name``; the test is skipped when it cannot be had."""
    from tvm_ext.tools import zoo, zoo_real

    try:
        return zoo.onnx_path(name)
    except zoo_real.ModelUnavailable as err:
        pytest.skip(f"real model unavailable: {err}")


def child_json(script: str, *args: str, timeout: int = 3600):
    """Run the Python source ``script`` in a child process with ``args``: its last output line, as JSON."""
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"child exited with {proc.returncode}: {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
