"""``tvm_ext.x86.fuse_sliced_dense``: a padded 8-bit dense, its slice and its epilogue in one kernel.

Built by ``tvm_ext.build`` with tvm-ext's kernels for an AVX-512 VNNI CPU, the kernels read back: from
17 outputs on one kernel with no int32 tensor between kernels, below 16 the slice in a kernel of its
own; a sliced dense with two readers executed where the host has VNNI, against numpy's int64
arithmetic. The pass alone: a module without a padded dense comes back as given, and the region it
makes is one ``Primitive`` function that FuseOps keeps.
"""
import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_ext.core.build import build
from tvm_ext.x86.fuse_sliced_dense import FuseSlicedInt8Dense
from tvm_ext.x86.target import host_target

from ._dense_cases import _dense, _dense_weight_shapes, _inputs, _kernels, _run
from ._int8_cases import needs_vnni

VNNI_CPU = "llvm -mcpu=cascadelake"


@pytest.mark.parametrize("units, kernels", [(1000, 1), (17, 1), (10, 2)])
def test_slice_in_the_dense_kernel_from_one_block_on(units, kernels):
    """From 17 outputs the slice and the epilogue are in the dense's kernel; below 16 outputs the
    slice starts the next kernel (TVM's bounds would give the dot product fewer than 16 lanes)."""
    factory = build(_dense(units, 256, epilogue=True)[0], target=VNNI_CPU, kernels=True)
    assert _dense_weight_shapes(factory) == [(-(-units // 16), 64, 16, 4)]
    assert len(_kernels(factory)) == kernels, _kernels(factory)
    assert (factory.kernel_report.int_crossings() == []) == (kernels == 1)


@needs_vnni
def test_sliced_dense_with_two_readers_stays_exact():
    """The sliced dense read by two calls: its kernel ends at the slice, the readers fuse as FuseOps
    decides."""
    mod, w = _dense(1000, 256)
    y = mod["main"].body
    c = relay.const(np.arange(1000, dtype="int32"))
    mod = tvm.IRModule.from_expr(relay.Function(mod["main"].params, relay.Tuple([y + c, y * c])))
    x = _inputs(1, 256)
    factory = build(mod, target=host_target(allow_vnni=True), kernels=True)
    assert [s for n, s in _kernels(factory) if "dense" in n] == [(1, 1000)]
    from tvm.contrib import graph_executor

    m = graph_executor.GraphModule(factory["default"](tvm.cpu()))
    m.set_input(x=x)
    m.run()
    expected = x.astype(np.int64) @ w.astype(np.int64).T
    np.testing.assert_array_equal(m.get_output(0).numpy(), expected + np.arange(1000))
    np.testing.assert_array_equal(m.get_output(1).numpy(), expected * np.arange(1000))


@needs_vnni
@pytest.mark.parametrize("batch", [1, 5])
def test_fused_epilogue_against_plain_llvm(batch):
    mod, _ = _dense(1001, 128, batch, epilogue=True)
    x = _inputs(batch, 128)
    with tvm.transform.PassContext(opt_level=3):
        plain = relay.build(mod, target="llvm")
    factory = build(mod, target=host_target(allow_vnni=True), kernels=True)
    assert len(_kernels(factory)) == 1
    np.testing.assert_array_equal(_run(factory, x=x), _run(plain, x=x))


def _padded_module():
    """``strided_slice(contrib_dense_pack(x, w: NC16n4c, 1008 outputs), :1000)`` then ``+ b`` and
    ``* 2``: what the padded dense looks like before FuseOps."""
    rng = np.random.default_rng(0)
    x = relay.var("x", shape=(1, 64), dtype="uint8")
    w = relay.const(rng.integers(-128, 128, (63, 16, 16, 4)).astype("int8"))
    y = relay.nn.contrib_dense_pack(x, w, "NC16n4c", out_dtype="int32")
    y = relay.strided_slice(y, begin=[0], end=[1000], axes=[1])
    y = relay.multiply(relay.add(y, relay.const(rng.integers(-9, 9, (1000,)).astype("int32"))), relay.const(2))
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))


def test_region_is_one_primitive_function():
    out = FuseSlicedInt8Dense()(_padded_module())
    call = out["main"].body
    assert isinstance(call.op, relay.Function) and int(call.op.attrs["Primitive"]) == 1
    ops = []
    relay.analysis.post_order_visit(call.op.body, lambda e: isinstance(e, relay.Call) and ops.append(e.op.name))
    assert ops == ["nn.contrib_dense_pack", "strided_slice", "add", "multiply"]
    assert len(call.args) == 3  # x, the weight, the bias (the scalar stays inline)
    assert tvm.ir.structural_equal(FuseSlicedInt8Dense()(out), out)  # idempotent


def test_pass_without_padded_dense_returns_the_module():
    mod = relay.transform.InferType()(_dense(1024, 64, epilogue=True)[0])
    assert FuseSlicedInt8Dense()(mod).same_as(mod)


@needs_vnni
def test_epilogue_branches_that_join_are_in_the_kernel():
    """``y = slice(dense)``, ``z = y - c``, ``y + z``: y has two readers, both in the epilogue."""
    mod, w = _dense(1000, 256)
    y = mod["main"].body
    c = relay.const(np.arange(1000, dtype="int32"))
    mod = tvm.IRModule.from_expr(relay.Function(mod["main"].params, y + (y - c)))
    x = _inputs(1, 256)
    factory = build(mod, target=host_target(allow_vnni=True), kernels=True)
    assert len(_kernels(factory)) == 1, _kernels(factory)
    expected = x.astype(np.int64) @ w.astype(np.int64).T
    np.testing.assert_array_equal(_run(factory, x=x), 2 * expected - np.arange(1000))


def test_constant_producers_are_computed_in_the_kernel():
    """``slice + zeros()``: the ``zeros`` call (no tensor input) goes into the kernel, as FuseOps would
    put it, instead of a kernel of its own."""
    mod = _padded_module()
    body = relay.add(mod["main"].body, relay.zeros((1, 1000), "int32"))
    out = FuseSlicedInt8Dense()(relay.transform.InferType()(tvm.IRModule.from_expr(
        relay.Function(mod["main"].params, body))))
    call = out["main"].body
    ops = []
    relay.analysis.post_order_visit(call.op.body, lambda e: isinstance(e, relay.Call) and ops.append(e.op.name))
    assert ops == ["nn.contrib_dense_pack", "strided_slice", "add", "multiply", "zeros", "add"]
