"""FuseByPattern: table matches become Primitive functions (kernels); FuseOps fuses the rest."""
import logging

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext import testing
from tvm_ext.passes.fuse_by_pattern import FuseByPattern, fused_counts
from tvm_ext.patterns import GENERIC, QNN, Entry, PatternTable, make_table
from tvm_ext.core.registry import get_pass
from tvm_ext.testing import check, infer

logging.getLogger("te_compiler").setLevel(logging.WARNING)
rng = np.random.default_rng(0)


def const(*shape, dtype="float32"):
    return relay.const(rng.standard_normal(shape).astype(dtype))


def _primitive(params, body, pattern_name, entry):
    fn = relay.Function(params, body)
    fn = fn.with_attr("PartitionedFromPattern", pattern_name)
    fn = fn.with_attr("Primitive", tvm.tir.IntImm("int32", 1))
    return fn.with_attr("tvm_ext.pattern", entry)


def test_structural_dense_bias_relu():
    """relu(dense(x, w) + b) -> Primitive(x, w, b){relu(dense + b)}; softmax stays for FuseOps"""
    x, w, b = relay.var("x", shape=(2, 4)), relay.var("w", shape=(3, 4)), relay.var("b", shape=(3,))

    def before():
        return relay.Function([x, w, b], relay.nn.softmax(relay.nn.relu(relay.add(relay.nn.dense(x, w), b))))

    def expected():
        px, pw, pb = relay.var("px", shape=(2, 4)), relay.var("pw", shape=(3, 4)), relay.var("pb", shape=(3,))
        fn = _primitive([px, pw, pb], relay.nn.relu(relay.add(relay.nn.dense(px, pw), pb)),
                        "nn.dense_add_nn.relu_", "generic.dense_bias_relu")
        return relay.Function([x, w, b], relay.nn.softmax(relay.Call(fn, [x, w, b])))

    check(FuseByPattern(GENERIC), before(), expected())


def test_structural_lifts_tensor_constants_keeps_scalars():
    """clip(dense(x, W) + B) with constant W, B: W and B become parameters, as FuseOps does."""
    x = relay.var("x", shape=(2, 4))
    W, B = const(3, 4), const(3)

    def before():
        return relay.Function([x], relay.clip(relay.add(relay.nn.dense(x, W), B), 0.0, 6.0))

    def expected():
        px, pw, pb = relay.var("px", shape=(2, 4)), relay.var("pw", shape=(3, 4)), relay.var("pb", shape=(3,))
        fn = _primitive([px, pw, pb], relay.clip(relay.add(relay.nn.dense(px, pw), pb), 0.0, 6.0),
                        "nn.dense_add_clip_", "generic.dense_bias_clip")
        return relay.Function([x], relay.Call(fn, [x, W, B]))

    check(FuseByPattern(GENERIC), before(), expected())


def test_no_match_unchanged_and_idempotent():
    x = relay.var("x", shape=(2, 4))
    testing.assert_unchanged(FuseByPattern(GENERIC), relay.nn.softmax(relay.exp(x)))
    mod = _cnn()
    once = FuseByPattern(GENERIC)(mod)
    twice = FuseByPattern(GENERIC)(once)
    tvm.ir.assert_structural_equal(once, twice)
    assert fused_counts(once) == fused_counts(twice) != {}


def test_registered_and_bad_arguments():
    assert get_pass("FuseByPattern").factory is FuseByPattern
    assert FuseByPattern("generic").info.name == "FuseByPattern"
    with pytest.raises(ValueError, match="PatternTable"):
        FuseByPattern([("a", None)])
    with pytest.raises(KeyError, match="unknown pattern table"):
        FuseByPattern("nope")


def test_untyped_input_not_mutated_and_ill_typed_rejected():
    x, w = relay.var("x", shape=(2, 4)), relay.var("w", shape=(3, 4))
    mod = tvm.IRModule.from_expr(relay.Function([x, w], relay.nn.relu(relay.nn.dense(x, w))))
    text = mod.astext()
    out = FuseByPattern(GENERIC)(mod)
    assert mod.astext() == text
    assert fused_counts(out) == {"generic.dense_relu": 1}
    bad = tvm.IRModule.from_expr(relay.Function([x, w], relay.add(x, w)))  # (2,4) + (3,4)
    with pytest.raises(ValueError, match="does not type-check"):
        FuseByPattern(GENERIC)(bad)


def test_dynamic_shapes_skipped(caplog):
    x = relay.var("x", shape=(relay.Any(), 4))
    w = relay.var("w", shape=(3, 4))
    mod = infer(relay.Function([x, w], relay.nn.relu(relay.nn.dense(x, w))))
    with caplog.at_level("DEBUG", logger="tvm_ext.patterns"):
        testing.assert_unchanged(FuseByPattern(GENERIC), mod)
    assert "generic.dense_relu: rejected (nn.dense has a dynamic" in caplog.text


def test_let_if_and_tuples_are_safe():
    x, w = relay.var("x", shape=(2, 4)), relay.var("w", shape=(3, 4))
    v = relay.var("v")
    let = relay.Let(v, relay.nn.dense(x, w), relay.nn.relu(v))  # the Let hides dense from relu
    out = FuseByPattern(GENERIC)(infer(relay.Function([x, w], let)))
    assert fused_counts(out) == {"generic.dense": 1}  # relu is not pulled across the Let
    cond = relay.var("c", shape=(), dtype="bool")
    body = relay.If(cond, relay.nn.relu(relay.nn.dense(x, w)), relay.nn.dense(x, w))
    out = FuseByPattern(GENERIC)(infer(relay.Function([cond, x, w], body)))
    assert fused_counts(out) == {"generic.dense": 1, "generic.dense_relu": 1}
    tup = relay.Tuple([relay.nn.relu(relay.nn.dense(x, w)), x])
    out = FuseByPattern(GENERIC)(infer(relay.Function([x, w], relay.TupleGetItem(tup, 0))))
    assert fused_counts(out) == {"generic.dense_relu": 1}


def test_checks_reject_groups_tvm_cannot_compile(caplog):
    """A table fusing dense -> dense, or dense -> reshape, is refused with the reason."""
    from tvm.relay.dataflow_pattern import is_op, wildcard

    two = Entry("bad.dense_dense", is_op("nn.dense")(is_op("nn.dense")(wildcard(), wildcard()), wildcard()),
                equation="dense(dense(x, w1), w2)", doc="two anchors")
    inj = Entry("bad.dense_reshape", is_op("reshape")(is_op("nn.dense")(wildcard(), wildcard())),
                equation="reshape(dense(x, w))", doc="anchor + injective")
    table = PatternTable("bad", [two, inj])
    x, w1, w2 = relay.var("x", shape=(2, 4)), relay.var("w1", shape=(4, 4)), relay.var("w2", shape=(3, 4))
    f = relay.Function([x, w1, w2], relay.reshape(relay.nn.dense(relay.nn.dense(x, w1), w2), (3, 2)))
    with caplog.at_level("DEBUG", logger="tvm_ext.patterns"):
        testing.assert_unchanged(FuseByPattern(table), f)
    assert "bad.dense_dense: rejected (two anchor ops in one kernel: nn.dense and nn.dense)" in caplog.text
    assert "bad.dense_reshape: rejected (reshape (injective) cannot join the nn.dense kernel" in caplog.text


# --------------------------------------------------------------------------- numerics via tvm_ext.build
def _cnn():
    """x -> conv+bias+relu (y) -> conv+bias (+y) -> relu -> gap -> flatten -> dense + b"""
    x = relay.var("x", shape=(1, 8, 16, 16))
    y = relay.nn.relu(relay.nn.bias_add(
        relay.nn.conv2d(x, const(16, 8, 3, 3), padding=(1, 1), channels=16, kernel_size=(3, 3)), const(16)))
    z = relay.nn.conv2d(y, const(16, 16, 3, 3), padding=(1, 1), channels=16, kernel_size=(3, 3))
    z = relay.nn.relu(relay.add(relay.nn.bias_add(z, const(16)), y))
    z = relay.nn.batch_flatten(relay.nn.global_avg_pool2d(z))
    return infer(relay.add(relay.nn.dense(z, const(10, 16)), const(10)))


def _ops(factory):
    return sorted(k.ops for k in factory.kernel_report.kernels)


def test_build_steering_small_cnn():
    """Generic table: at most stock's kernels; conv kept apart from its epilogue: more kernels."""
    mod = _cnn()
    inputs = testing.random_inputs(mod)
    stock = tvm_ext.build(mod)
    fused = tvm_ext.build(mod, passes=[FuseByPattern(GENERIC)], at="before_fuse")
    assert fused_counts(fused.tvm_ext_module) == {
        "generic.conv2d_bias_add_relu": 1, "generic.conv2d_bias_relu": 1, "generic.dense_bias": 1}
    conv = "nn.contrib_conv2d_NCHWc"
    assert (conv, "add", "add", "nn.relu") in _ops(fused) and ("nn.contrib_dense_pack", "add") in _ops(fused)
    assert _ops(fused) == _ops(stock)  # this table's groups are what FuseOps makes here
    apart = tvm_ext.build(mod, passes=[FuseByPattern(GENERIC.select(["generic.conv2d"], name="generic"))])
    assert fused.kernel_report.num_kernels <= stock.kernel_report.num_kernels < apart.kernel_report.num_kernels
    assert (conv,) in _ops(apart) and ("add", "add", "nn.relu") in _ops(apart)
    testing.assert_same_outputs(stock, fused, inputs)
    testing.assert_same_outputs(stock, apart, inputs)


def test_build_int8_graph_bit_exact():
    """qnn.conv2d + bias + requantize with a uint8 output: bit-exact with stock TVM."""
    # 16 channels: x86 legalization pads int8 convs to 16 channels otherwise (then slices)
    x = relay.var("x", shape=(1, 16, 8, 8), dtype="uint8")
    w = relay.const(rng.integers(-20, 20, (16, 16, 3, 3)).astype("int8"))
    y = relay.qnn.op.conv2d(x, w, relay.const(3), relay.const(0), relay.const(0.05), relay.const(0.02),
                            kernel_size=(3, 3), channels=16, padding=(1, 1))
    y = relay.nn.bias_add(y, relay.const(rng.integers(-100, 100, 16).astype("int32")))
    y = relay.qnn.op.requantize(y, relay.const(0.001), relay.const(0), relay.const(0.05), relay.const(5),
                                out_dtype="uint8")
    mod = infer(relay.Function([x], y))
    stock = tvm_ext.build(mod)
    fused = tvm_ext.build(mod, passes=[FuseByPattern(QNN)])
    assert fused_counts(fused.tvm_ext_module) == {"qnn.conv2d_bias_requantize": 1}
    assert _ops(fused) == _ops(stock)
    testing.assert_same_outputs(stock, fused, testing.random_inputs(mod))  # integer output: exact


def test_dense_bias_table_keeps_relu_out_of_the_mlp_kernels():
    """An MLP (dense -> add -> relu -> dense -> add) with a dense+bias table: each dense fuses with its
    bias add and nothing else (the relu gets a kernel of its own), with the stock build's outputs."""
    x = relay.var("x", shape=(1, 784))
    h = relay.nn.relu(relay.add(relay.nn.dense(x, const(128, 784)), const(128)))
    mod = infer(relay.add(relay.nn.dense(h, const(10, 128)), const(10)))
    table = make_table("mlp", kinds=("dense",), activations=(), residual_opts=(False,), bias_opts=(True,))
    assert table.names() == ["mlp.dense_bias"]
    built = tvm_ext.build(mod, passes=[FuseByPattern(table)])
    names = [k.func_name for k in built.kernel_report.kernels]
    assert [k.ops for k in built.kernel_report.kernels] == [
        ("nn.contrib_dense_pack", "add"), ("nn.relu",), ("nn.contrib_dense_pack", "add")]
    assert all("fused_nn_contrib_dense_pack_add" in n for n in (names[0], names[2]))
    testing.assert_same_outputs(tvm_ext.build(mod), built, testing.random_inputs(mod), rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- zoo (int8 ResNet-50)
@pytest.fixture(scope="module")
def zoo():
    return pytest.importorskip("tvm_ext.tools.zoo")


def _zoo_check(zoo, name, table, small=True, same_kernels=True, small_zoo_build=None):
    """``small_zoo_build``: where the stock build (relay.build) of a small model comes from, shared with
    other tests; without it the stock build is tvm_ext.build without passes (the same build)."""
    if small_zoo_build is not None:
        m, stock = small_zoo_build(name, "stock")
    else:
        m = zoo.load(name, small=small)
        stock = tvm_ext.build(m.mod, params=m.params)
    stock_report = tvm_ext.KernelReport.from_factory(stock)
    inputs = {m.input_name: zoo.sample_input(m)}
    fused = tvm_ext.build(m.mod, params=m.params, passes=[FuseByPattern(table)], at="before_fuse")
    counts = fused_counts(fused.tvm_ext_module)
    if same_kernels:
        assert _ops(fused) == sorted(k.ops for k in stock_report.kernels)
    else:
        assert fused.kernel_report.num_kernels >= stock_report.num_kernels
    if "qdq" in name:
        # a float graph (dequantize -> float conv -> quantize): regrouped float code may round
        # differently (FMA contraction), which moves a few outputs by one quantization step
        a, b = testing.run_module(stock, inputs)[0], testing.run_module(fused, inputs)[0]
        assert a.argmax() == b.argmax() and np.abs(a - b).max() <= 0.2
    else:
        # integer graph, only grouped differently: the outputs agree bit for bit
        testing.assert_same_outputs(stock, fused, inputs, rtol=0, atol=0)
    return counts, stock_report.num_kernels, fused.kernel_report.num_kernels


@pytest.mark.slow  # the small zoo ResNet fused by the QNN table; test_build_int8_graph_bit_exact runs in CI
@pytest.mark.xdist_group("small_zoo:resnet50_int8_qoperator")
def test_zoo_small_qoperator_qnn(zoo, small_zoo_build):
    counts, n_stock, n_fused = _zoo_check(zoo, "resnet50_int8_qoperator", QNN, small_zoo_build=small_zoo_build)
    assert counts == {"qnn.conv2d_bias_requantize": 13, "qnn.conv2d_bias_requantize_add": 4,
                      "qnn.dense_bias_requantize": 1}
    assert n_fused == n_stock == 26


@pytest.mark.slow
def test_zoo_small_qdq_qnn(zoo):
    counts, _, _ = _zoo_check(zoo, "resnet50_int8_qdq", QNN)
    assert counts == {"qnn.dq_conv2d_bias_q": 13, "qnn.dq_conv2d_bias_q_add": 4, "qnn.dq_dense_bias_q": 1}


@pytest.mark.slow
def test_zoo_small_qoperator_generic(zoo):
    counts, n_stock, n_fused = _zoo_check(zoo, "resnet50_int8_qoperator", GENERIC, same_kernels=False)
    assert counts == {"generic.conv2d": 1, "generic.conv2d_bias": 16, "generic.dense_bias": 1}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50_int8_qoperator", "resnet50_int8_qdq"])
def test_zoo_full_qnn(zoo, name):
    counts, n_stock, n_fused = _zoo_check(zoo, name, QNN, small=False)
    assert sum(counts.values()) == 54  # 53 convs + the classifier


def _conv_add_chain(extra_user=False):
    """x -> conv -> add(., multiply(cast(y), 2)) : the chain is private unless ``extra_user``."""
    x = relay.var("x", shape=(1, 16, 8, 8))
    y = relay.var("y", shape=(1, 16, 8, 8), dtype="int32")
    w = relay.const(np.random.default_rng(0).standard_normal((16, 16, 1, 1)).astype("float32"))
    chain = relay.multiply(relay.cast(y, "float32"), relay.const(2.0))
    out = relay.add(relay.nn.conv2d(x, w, channels=16, kernel_size=1), chain)
    if extra_user:
        out = relay.Tuple([out, relay.nn.relu(chain)])
    return tvm.IRModule.from_expr(relay.Function([x, y], out))


def test_private_elementwise_producer_joins_the_group():
    """FuseOps fuses the dequantize-like chain into the conv+add kernel; so must a pattern group."""
    table = make_table("t", kinds=("conv2d",), activations=(), residual_opts=(True,), bias_opts=(False,))
    mod = _conv_add_chain()
    # opt_level 2: no AlterOpLayout, so no layout_transform sits between the chain and the add
    stock = tvm_ext.build(mod, opt_level=2)
    assert stock.kernel_report.num_kernels == 1  # FuseOps fuses cast, multiply into conv + add
    fused = tvm_ext.build(mod, passes=[FuseByPattern(table)], opt_level=2)
    assert fused_counts(fused.tvm_ext_module) == {"t.conv2d_add": 1}
    assert fused.kernel_report.num_kernels == stock.kernel_report.num_kernels
    group_ops = [k.ops for k in fused.kernel_report.kernels if any("conv2d" in op for op in k.ops)][0]
    assert "cast" in group_ops and "multiply" in group_ops
    inputs = testing.random_inputs(mod)
    testing.assert_same_outputs(stock, fused, inputs)


def test_shared_producer_stays_outside():
    table = make_table("t", kinds=("conv2d",), activations=(), residual_opts=(True,), bias_opts=(False,))
    fused = tvm_ext.build(_conv_add_chain(extra_user=True), passes=[FuseByPattern(table)], opt_level=2)
    group_ops = [k.ops for k in fused.kernel_report.kernels if any("conv2d" in op for op in k.ops)][0]
    assert "cast" not in group_ops


def test_unlowered_qnn_ops_are_not_grouped(caplog):
    """FuseByPattern(qnn) at stage start does not group qnn.conv2d -> bias_add -> qnn.requantize: in a
    Primitive function their scales would be parameters, and relay.build's QNN canonicalization
    fails on them ("Expr must be a constant expr"). Rejected with the reason."""
    import numpy as np
    from tvm import relay

    from tvm_ext.testing import assert_unchanged, infer

    x = relay.var("x", shape=(1, 2, 2, 2), dtype="int8")
    zp, s = relay.const(0, "int32"), relay.const(np.float32(0.05))
    y = relay.qnn.op.conv2d(x, relay.const(np.ones((8, 1, 1, 1), "int8")), zp, zp, s, s, kernel_size=(1, 1),
                            channels=8, groups=2, out_dtype="int32")
    y = relay.nn.bias_add(y, relay.const(np.arange(8, dtype="int32")))
    y = relay.qnn.op.requantize(y, relay.const(np.full(8, 0.01, "float32")), zp, relay.const(np.float32(0.5)), zp,
                                axis=1, out_dtype="uint8")
    with caplog.at_level(logging.DEBUG):
        assert_unchanged(FuseByPattern("qnn"), infer(y))
    assert "is not lowered yet" in caplog.text


def test_int8_int8_conv_not_grouped_before_legalization(caplog):
    """FuseByPattern(qnn) at stage start does not group an int8 x int8 conv2d with its requantize: x86
    Legalize would put conv + sum (two anchors) into that Primitive function, and relay.build fails
    on it ("Cannot apply TOPI schedule ... two complicated ops")."""
    import numpy as np
    from tvm import relay

    from tvm_ext.testing import assert_unchanged, infer

    x = relay.var("x", shape=(1, 8, 4, 3), dtype="int8")
    y = relay.nn.conv2d(x, relay.const(np.ones((8, 8, 1, 1), "int8")), kernel_size=(1, 1), channels=8,
                        out_dtype="int32")
    y = relay.right_shift(relay.add(relay.nn.relu(y), relay.const(4)), relay.const(3))
    y = relay.cast(relay.clip(y, -127, 127), "int8")
    with caplog.at_level(logging.DEBUG):
        assert_unchanged(FuseByPattern("qnn"), infer(y))
    assert "legalized into two anchors" in caplog.text
