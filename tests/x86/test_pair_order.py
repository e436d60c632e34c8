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


def _two_convs(w1, w2, bias, requant_scale, kernel_scale, size=8, reader_dtype="uint8", stop=False):
    """qnn.conv2d (per-channel kernel scale) -> bias_add -> per-channel requantize -> max pool ->
    qnn.conv2d: one channel group, written by the first conv and read by the second."""
    c = w1.shape[0]
    x = relay.var("x", shape=(1, w1.shape[1], size, size), dtype="uint8")
    y = relay.qnn.op.conv2d(x, relay.const(w1), relay.const(128), relay.const(0), relay.const(1.0),
                            relay.const(kernel_scale), kernel_size=w1.shape[2:], channels=c, padding=(1, 1),
                            out_dtype="int32")
    y = relay.nn.bias_add(y, relay.const(bias))
    y = relay.qnn.op.requantize(y, relay.const(requant_scale), relay.const(0), relay.const(1.0),
                                relay.const(0 if reader_dtype == "uint8" else -128), axis=1, out_dtype=reader_dtype)
    y = relay.annotation.stop_fusion(y) if stop else y
    y = relay.nn.max_pool2d(y, pool_size=(3, 3), padding=(1, 1))
    y = relay.qnn.op.conv2d(y, relay.const(w2), relay.const(0 if reader_dtype == "uint8" else -128), relay.const(0),
                            relay.const(1.0), relay.const(1.0), kernel_size=w2.shape[2:], channels=w2.shape[0],
                            padding=(0, 0), out_dtype="int32")
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


def _run(lib, x):
    m = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    m.set_input(x=x)
    m.run()
    return m.get_output(0).numpy()


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
