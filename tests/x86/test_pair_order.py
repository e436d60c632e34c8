"""OrderChannelsInSafePairs: structure, exactness against plain llvm, idempotence, what it leaves alone.

Built code runs only where the host has its instructions (:func:`tvm_ext.x86.isa.runs_on_host`).
"""
import logging

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.contrib import graph_executor

import tvm_ext
from tvm_ext.x86 import exact_record
from tvm_ext.x86._pairing import compatible, fits_in_order
from tvm_ext.x86.isa import runs_on_host
from tvm_ext.x86.pair_order import OrderChannelsInSafePairs, orders_pairs

AVX2 = "llvm -mcpu=x86-64-v3"
LOGGER = "tvm_ext.x86.pair_order"


def _writer(w1, bias, requant_scale, kernel_scale, size, out_scale=1.0, out_dtype="uint8"):
    """The input and qnn.conv2d (per-channel kernel scale) -> bias_add -> per-channel requantize."""
    x = relay.var("x", shape=(1, w1.shape[1], size, size), dtype="uint8")
    y = relay.qnn.op.conv2d(x, relay.const(w1), relay.const(128), relay.const(0), relay.const(1.0),
                            relay.const(kernel_scale), kernel_size=w1.shape[2:], channels=w1.shape[0],
                            padding=(1, 1), out_dtype="int32")
    y = relay.nn.bias_add(y, relay.const(bias))
    return x, relay.qnn.op.requantize(y, relay.const(requant_scale), relay.const(0), relay.const(out_scale),
                                      relay.const(0 if out_dtype == "uint8" else -128), axis=1, out_dtype=out_dtype)


def _two_convs(w1, w2, bias, requant_scale, kernel_scale, size=8, reader_dtype="uint8", stop=False):
    """qnn.conv2d (per-channel kernel scale) -> bias_add -> per-channel requantize -> max pool ->
    qnn.conv2d: one channel group, written by the first conv and read by the second."""
    x, y = _writer(w1, bias, requant_scale, kernel_scale, size, out_dtype=reader_dtype)
    y = relay.annotation.stop_fusion(y) if stop else y
    y = relay.nn.max_pool2d(y, pool_size=(3, 3), padding=(1, 1))
    y = relay.qnn.op.conv2d(y, relay.const(w2), relay.const(0 if reader_dtype == "uint8" else -128), relay.const(0),
                            relay.const(1.0), relay.const(1.0), kernel_size=w2.shape[2:], channels=w2.shape[0],
                            padding=(0, 0), out_dtype="int32")
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))


def _conv_pool_dense(w1, wd, bias, requant_scale, kernel_scale, w2=None, size=6, pooled=1):
    """qnn.conv2d -> bias_add -> per-channel requantize -> dequantize -> global_avg_pool2d -> quantize
    -> batch_flatten -> qnn.dense: a classifier's tail, the channels read as the dense's input columns
    (``pooled`` > 1: an average pool to a ``pooled`` x ``pooled`` map instead of the global pool);
    with ``w2`` a 1x1 qnn.conv2d reads the requantized tensor too (as a residual stage's next block)."""
    x, stream = _writer(w1, bias, requant_scale, kernel_scale, size, out_scale=0.05)
    y = stream
    y = relay.qnn.op.dequantize(y, relay.const(0.05), relay.const(0))
    step = size // pooled
    y = relay.nn.global_avg_pool2d(y) if pooled == 1 else relay.nn.avg_pool2d(y, (step, step), (step, step))
    y = relay.nn.batch_flatten(relay.qnn.op.quantize(y, relay.const(0.05), relay.const(0), out_dtype="uint8"))
    y = relay.qnn.op.dense(y, relay.const(wd), relay.const(0), relay.const(0), relay.const(0.05), relay.const(1.0),
                           units=wd.shape[0], out_dtype="int32")
    if w2 is not None:
        y = relay.Tuple([y, relay.qnn.op.conv2d(stream, relay.const(w2), relay.const(0), relay.const(0),
                                                relay.const(0.05), relay.const(1.0), kernel_size=(1, 1),
                                                channels=w2.shape[0], out_dtype="int32")])
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))


def _unique_pairing_case():
    """Four channels whose reader allows only the pairs (0, 2) and (1, 3): (0, 1) and (0, 3) sum
    above the limit in one row each, (2, 3) and (1, 2) too."""
    rng = np.random.default_rng(0)
    w1 = rng.integers(-128, 128, (4, 4, 3, 3)).astype("int8")
    w2 = rng.integers(-8, 9, (4, 4, 1, 1)).astype("int8")
    w2[0, [0, 1], 0, 0] = 100
    w2[1, [0, 3], 0, 0] = -100
    w2[2, [2, 3], 0, 0] = 90
    w2[3, [1, 2], 0, 0] = -90
    params = dict(bias=np.arange(4, dtype="int32") * 7, requant_scale=np.array([.01, .02, .03, .04], "float32"),
                  kernel_scale=np.array([.5, .25, .125, 1.0], "float32"))
    return w1, w2, params


@pytest.mark.parametrize("stop", [False, True])
def test_reorders_writer_constants_and_reader(stop):
    r"""conv2(pool([stop_fusion](requantize(bias_add(conv1(x, W1, s), b), r))), W2)
    -> conv2(pool([stop_fusion](requantize(bias_add(conv1(x, W1[P], s[P]), b[P]), r[P]))), W2[:, P]),
    P = [0, 2, 1, 3]"""
    w1, w2, p = _unique_pairing_case()
    order = [0, 2, 1, 3]
    before = _two_convs(w1, w2, **p, stop=stop)
    expected = _two_convs(w1[order], w2[:, order], bias=p["bias"][order], requant_scale=p["requant_scale"][order],
                          kernel_scale=p["kernel_scale"][order], stop=stop)
    assert not fits_in_order(compatible(w2)) and fits_in_order(compatible(w2[:, order]))
    tvm.ir.assert_structural_equal(OrderChannelsInSafePairs()(before), expected, map_free_vars=True)


def test_a_dense_of_the_flattened_channels_follows():
    r"""(dense(flatten(q(pool(dq(t))))), V), conv2(t, W2)), t = requantize(bias_add(conv(x, W, s), b), r)
    -> (dense(..., V[:, P]), conv2(t', W2[:, P])), t' = requantize(bias_add(conv(x, W[P], s[P]), b[P]), r[P]),
    P = [0, 2, 1, 3] (conv2's only safe pairs): the dense's columns are the channels of the 1x1 map it
    flattens, and it follows the order whatever its own pairs (here (0, 1) unsafe in either order)."""
    w1, w2, p = _unique_pairing_case()
    wd, order = np.full((3, 4), 100, "int8"), [0, 2, 1, 3]
    wd[1] = np.arange(4)
    before = _conv_pool_dense(w1, wd, **p, w2=w2)
    expected = _conv_pool_dense(w1[order], wd[:, order], bias=p["bias"][order], w2=w2[:, order],
                                requant_scale=p["requant_scale"][order], kernel_scale=p["kernel_scale"][order])
    once = OrderChannelsInSafePairs()(before)
    tvm.ir.assert_structural_equal(once, expected, map_free_vars=True)
    tvm.ir.assert_structural_equal(OrderChannelsInSafePairs()(once), once)


def _run_all(lib, x):
    m = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    m.set_input(x=x)
    m.run()
    return [m.get_output(i).numpy() for i in range(m.get_num_outputs())]


def _run(lib, x):
    return _run_all(lib, x)[0]


def _wide_case(seed=1):
    """32 channels, full-range int8 reader weights: many pairs saturate in the natural order."""
    rng = np.random.default_rng(seed)
    w1 = rng.integers(-128, 128, (32, 8, 3, 3)).astype("int8")
    w2 = (rng.integers(-128, 128, (16, 32, 1, 1)) // rng.integers(1, 4, (16, 32, 1, 1))).astype("int8")
    params = dict(bias=rng.integers(-5000, 5000, 32).astype("int32"),
                  requant_scale=rng.uniform(0.002, 0.01, 32).astype("float32"),
                  kernel_scale=rng.uniform(0.01, 0.1, 32).astype("float32"))
    return _two_convs(w1, w2, **params), w2


def test_build_is_bit_exact_and_keeps_vpmaddubsw():
    """tvm_ext.build at AVX2 (the pass runs in the x86 back end) equals relay.build at plain llvm (no
    int8 SIMD, no tvm-ext) bit for bit, on data whose natural-order pair sums saturate; the reader
    conv keeps the saturating instruction, the one reading the function input takes the int16 pairs."""
    if not runs_on_host(AVX2):
        pytest.skip(f"host lacks instructions of '{AVX2}'")
    mod, w2 = _wide_case()
    assert not fits_in_order(compatible(w2))
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (1, 8, 8, 8)).astype("uint8")
    x[..., :3] = 255
    with tvm.transform.PassContext(opt_level=3):
        want = _run(relay.build(mod, target="llvm"), x)
    got_lib = tvm_ext.build(mod, target=AVX2)
    np.testing.assert_array_equal(_run(got_lib, x), want)
    asm = got_lib.get_lib().get_source("asm")
    assert "vpmaddubsw" in asm and "vpmaddwd" in asm
    module_text = got_lib.tvm_ext_module.astext()
    assert module_text.count("o2i") >= 1 and module_text.count("o4i") >= 1, "one conv in pairs, one in quads"
    with exact_record.saturating():  # the same graph in TVM's form, natural order: wrong on this data
        assert not np.array_equal(_run(tvm_ext.build(mod, target=AVX2), x), want)


def test_dense_reader_build_is_bit_exact():
    """The classifier's tail and a conv reading the same tensor at AVX2 against plain llvm (no int8
    SIMD), bit for bit: the conv's pairs are unsafe in the natural order, the dense's (full-range
    columns) in any; the dense's columns are the writer's output channels, 1x1 after the pool."""
    if not runs_on_host(AVX2):
        pytest.skip(f"host lacks instructions of '{AVX2}'")
    rng = np.random.default_rng(1)
    w1 = rng.integers(-128, 128, (32, 8, 3, 3)).astype("int8")
    w2 = (rng.integers(-128, 128, (16, 32, 1, 1)) // rng.integers(1, 4, (16, 32, 1, 1))).astype("int8")
    wd = rng.integers(-128, 128, (10, 32)).astype("int8")
    mod = _conv_pool_dense(w1, wd, bias=rng.integers(-5000, 5000, 32).astype("int32"), w2=w2,
                           requant_scale=rng.uniform(0.002, 0.01, 32).astype("float32"),
                           kernel_scale=rng.uniform(0.01, 0.1, 32).astype("float32"))
    assert not fits_in_order(compatible(w2)) and not tvm.ir.structural_equal(OrderChannelsInSafePairs()(mod), mod)
    x = rng.integers(0, 256, (1, 8, 6, 6)).astype("uint8")
    with tvm.transform.PassContext(opt_level=3):
        want = _run_all(relay.build(mod, target="llvm"), x)
    assert np.unique(want[0]).size == want[0].size
    for got, expected in zip(_run_all(tvm_ext.build(mod, target=AVX2), x), want):
        np.testing.assert_array_equal(got, expected)


def test_idempotent_and_pure():
    mod, _ = _wide_case()
    text = mod.astext()
    once = OrderChannelsInSafePairs()(mod)
    assert not tvm.ir.structural_equal(once, mod)
    tvm.ir.assert_structural_equal(OrderChannelsInSafePairs()(once), once)
    assert mod.astext() == text, "the caller's module is not mutated"


def _safe_case():
    w1, w2, p = _unique_pairing_case()
    return _two_convs(w1, np.clip(w2, -60, 60).astype("int8"), **p)


def _input_read_case():
    w = _unique_pairing_case()[1]
    x = relay.var("x", shape=(1, 4, 6, 6), dtype="uint8")
    y = relay.qnn.op.conv2d(x, relay.const(w), relay.const(0), relay.const(0), relay.const(1.0), relay.const(1.0),
                            kernel_size=(1, 1), channels=4, out_dtype="int32")
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))


def _no_order_case():
    w1, w2, p = _unique_pairing_case()
    w2[0, [0, 2], 0, 0] = 100  # now (0, 2) clashes too: channel 0 has no partner
    return _two_convs(w1, w2, **p)


def _odd_case():
    w1, w2, p = _unique_pairing_case()
    keep = [0, 1, 3]
    return _two_convs(w1[keep], w2[:, keep], **{k: v[keep] for k, v in p.items()})


def _flatten_case():
    """The group is also read by a reshape: its order is the function's business."""
    mod = _two_convs(*_unique_pairing_case()[:2], **_unique_pairing_case()[2])
    body = mod["main"].body
    pooled = body.args[0]
    out = relay.Tuple([body, relay.reshape(pooled, (1, -1))])
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(mod["main"].params, out)))


def _dense_of_input_case():
    """A dense reads a function input: nothing writes its columns."""
    x = relay.var("x", shape=(1, 4), dtype="uint8")
    y = relay.qnn.op.dense(x, relay.const(_unique_pairing_case()[1][:, :, 0, 0]), relay.const(0), relay.const(0),
                           relay.const(1.0), relay.const(1.0), units=4, out_dtype="int32")
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))


def _dense_of_dense_case():
    """A dense reads another dense's output: only input columns are renumbered, never a dense's outputs."""
    w = _unique_pairing_case()[1][:, :, 0, 0]
    x = relay.var("x", shape=(1, 4), dtype="uint8")
    y = relay.qnn.op.dense(x, relay.const(w), relay.const(0), relay.const(0), relay.const(1.0), relay.const(1.0),
                           units=4, out_dtype="int32")
    y = relay.nn.dense(y, relay.const(w), out_dtype="int32")
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))


def _constant_read_case():
    """A conv reads a constant tensor: the constant would need the order too."""
    data = relay.const(np.random.default_rng(0).integers(0, 256, (1, 4, 6, 6)).astype("uint8"))
    x = relay.var("x", shape=(1, 4, 6, 6), dtype="int32")
    y = relay.qnn.op.conv2d(data, relay.const(_unique_pairing_case()[1]), relay.const(0), relay.const(0),
                            relay.const(1.0), relay.const(1.0), kernel_size=(1, 1), channels=4, out_dtype="int32")
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.add(y, x))))


def _spatial_flatten_case():
    """The dense reads a flattened 2x2 map: its columns are channel x pixel, not channels."""
    w1, w2, p = _unique_pairing_case()
    return _conv_pool_dense(w1, np.repeat(w2[:, :, 0, 0], 4, axis=1), **p, pooled=2)


def _dense_only_case():
    """Only a dense reads the channels: its pairs do not choose orders."""
    w1, w2, p = _unique_pairing_case()
    return _conv_pool_dense(w1, w2[:, :, 0, 0], **p)


def _if_case():
    mod = _two_convs(*_unique_pairing_case()[:2], **_unique_pairing_case()[2])
    f = mod["main"]
    cond = relay.var("c", shape=(), dtype="bool")
    body = relay.If(cond, f.body, relay.zeros_like(f.body))
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([*f.params, cond], body)))


@pytest.mark.parametrize("case, why", [
    (_safe_case, "every pair is safe in the present order"),
    (_input_read_case, "x is a function input"),
    (_no_order_case, "no order makes every pair safe"),
    (_odd_case, "3 channels (odd)"),
    (_flatten_case, "reshape reads it"),
    (_dense_of_input_case, "x is a function input"),
    (_dense_of_dense_case, "a dense writes it"),
    (_constant_read_case, "it is a constant"),
    (_spatial_flatten_case, "nn.batch_flatten writes it"),
    (_dense_only_case, "no int8 conv reads it"),
    (_if_case, "holds a If"),
])
def test_unchanged_when_nothing_to_do_or_unsafe_to_do(case, why, caplog):
    mod = case()
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        got = OrderChannelsInSafePairs()(mod)
    tvm.ir.assert_structural_equal(got, mod)
    assert why in caplog.text


def test_types_an_untyped_module_first():
    mod, _ = _wide_case()
    untyped = tvm.IRModule.from_expr(mod["main"])
    tvm.ir.assert_structural_equal(OrderChannelsInSafePairs()(untyped), OrderChannelsInSafePairs()(mod))


@pytest.mark.parametrize("target, runs", [("llvm -mcpu=x86-64-v3", True), ("llvm -mcpu=x86-64-v2", True),
                                          ("llvm -mcpu=skylake-avx512", True), ("llvm -mcpu=cascadelake", False),
                                          ("llvm", False)])
def test_runs_where_int8_convs_saturate(target, runs):
    """At AVX-512 VNNI vpdpbusd does not saturate; at plain llvm TVM has no int8 kernel (SSE4.2)."""
    assert orders_pairs(tvm.target.Target(target)) is runs
