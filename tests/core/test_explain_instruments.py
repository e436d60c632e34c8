"""The pass instruments (``_instruments``): ``FuseOpsInput`` captures the module FuseOps sees inside a
plain relay.build, which ``explain_prefused`` explains without re-running anything."""
import tvm
from tvm import relay

import tvm_ext

from _explain_graphs import by_kind, quantized_pair


def test_fuse_ops_input_of_plain_relay_build():
    """The module FuseOps sees inside a plain relay.build, explained without re-running anything."""
    from tvm_ext.core.explain import FuseOpsInput, explain_prefused

    mod = quantized_pair()
    cap = FuseOpsInput()
    with tvm.transform.PassContext(opt_level=3, instruments=[cap.make()]):
        fac = relay.build(mod, target="llvm")
    ex = explain_prefused(cap.module, "llvm")
    assert ex.verified is True
    assert ex.num_kernels == tvm_ext.KernelReport.from_factory(fac).num_kernels
    assert [b.kind for b in by_kind(ex, "stop_fusion")] == ["stop_fusion"]


def test_fuse_ops_input_ignores_nested_builds():
    """QNN legalization of qnn.sigmoid builds its lookup table with a nested VM executor (its own
    FuseOps); the instrument captures relay.build's FuseOps input, not the table's."""
    from tvm import relay as _relay

    from tvm_ext.core.explain import FuseOpsInput

    x = _relay.var("x", shape=(1, 4, 8, 8), dtype="uint8")
    y = _relay.qnn.op.sigmoid(x, _relay.const(0.1), _relay.const(3, "int32"), _relay.const(1 / 255.0),
                              _relay.const(0, "int32"))
    cap = FuseOpsInput()
    with tvm.transform.PassContext(opt_level=3, instruments=[cap.make()]):
        _relay.build(tvm.IRModule.from_expr(_relay.Function([x], y)), target="llvm")
    main = cap.module["main"]
    assert [p.name_hint for p in main.params] == ["x"] and "take" in main.astext()
