"""tvm_ext.core.explain's entry point: ``tvm_ext.explain`` is the function, its tables are ordered data,
bad input is refused naming the cause, the input module is never changed, and the int8 pipeline
leaves fewer boundaries than a plain build."""
import pytest

import tvm_ext
from tvm_ext.core.explain import REASONS, REMEDIES, explain

from _explain_graphs import by_kind, residual


def test_tables_are_ordered_data():
    kinds = [k for k, _ in REASONS]
    assert len(kinds) == len(set(kinds))
    assert REMEDIES[-1].kind == "none"  # the catch-all comes last


def test_tvm_ext_explain_is_the_function():
    """``tvm_ext.explain`` is the plain function of :mod:`tvm_ext.core.explain`; that module stays a module."""
    import types

    import tvm_ext.core.explain as module

    assert tvm_ext.explain is explain and isinstance(explain, types.FunctionType)
    assert type(module) is types.ModuleType and not callable(module)


def test_bad_input_and_no_mutation():
    mod = residual()
    text = mod.astext()
    explain(mod)
    assert mod.astext() == text
    with pytest.raises(ValueError, match="tvm_ext.build"):
        explain(mod, at="nowhere")
    with pytest.raises(TypeError, match="tvm_ext.build"):
        explain(mod, passes=[object()])
    with pytest.raises(TypeError):
        explain("not a module")


@pytest.mark.slow
def test_pipeline_int8_leaves_fewer_boundaries():
    m = tvm_ext.tools.zoo.load("resnet50_int8_relay", small=True)
    stock = explain(m.mod, params=m.params)
    ours = explain(m.mod, params=m.params, passes=tvm_ext.core.pipelines.int8())
    assert ours.verified is True
    assert ours.num_kernels < stock.num_kernels and ours.crossing_bytes < stock.crossing_bytes
    assert not by_kind(ours, "stop_fusion") or len(by_kind(ours, "stop_fusion")) < len(by_kind(stock, "stop_fusion"))
