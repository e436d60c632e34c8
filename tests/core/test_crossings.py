"""Why float / int32 tensors cross kernels (KernelReport.float_crossings, int_crossings).

Three small graphs, each built once, in which every reason of ``CROSSING_REASONS`` appears on a
crossing whose producer and readers are known by construction; plus the small QDQ zoo model
(slow: its stock build takes about a minute).
"""
import json

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_ext
from tvm_ext.core.report import CROSSING_REASONS, KernelReport

TARGET = tvm_ext.host_target()
C, HW = 16, 8


def _conv(x, cin, cout, dtype="float32", out_dtype="float32", seed=0):
    w = np.random.default_rng(seed).integers(-3, 4, (cout, cin, 3, 3)).astype(dtype)
    return relay.nn.conv2d(x, relay.const(w), kernel_size=(3, 3), padding=(1, 1), channels=cout,
                           out_dtype=out_dtype)


def _quantize(x, scale, dtype):
    lo, hi = (0.0, 255.0) if dtype == "uint8" else (-128.0, 127.0)
    return relay.cast(relay.clip(relay.round(relay.divide(x, relay.const(scale))), lo, hi), dtype)


def _dequantize(q, scale):
    return relay.multiply(relay.cast(q, "float32"), relay.const(scale))


def _int_conv_u8(x_u8, seed):
    """uint8 x int8 conv -> int32 accumulators."""
    return _conv(x_u8, C, C, dtype="int8", out_dtype="int32", seed=seed)


def _by_reason(rep):
    out = {}
    for c in rep.float_crossings() + rep.int_crossings():
        out.setdefault(c.reason, []).append(c)
    return out


def _kernel(rep, *ops):
    """Index of the only kernel whose ops include all of ``ops``."""
    hits = [k.index for k in rep.kernels if all(any(o in op for op in k.ops) for o in ops)]
    assert len(hits) == 1, (ops, [k.ops for k in rep.kernels])
    return hits[0]


@pytest.fixture(scope="module")
def float_graph():
    """::

        x f32 -> [K conv1] -> a f32 ---> [K conv2 + tanh] -> b f32 -> [K max_pool + quantize] -> u8 (out)
                                 `---> graph output (a)
        a: also an output of the graph -> graph_output
        b: computed in float, its only reader quantizes it first -> quantize_late
        x -> [K conv3] -> a2 f32 -> [K conv4] -> c f32 (out): a2 -> float_compute
    """
    x = relay.var("x", shape=(1, C, HW, HW))
    a = _conv(x, C, C, seed=1)
    b = relay.tanh(_conv(a, C, C, seed=2))
    q = _quantize(relay.nn.max_pool2d(b, (2, 2), (2, 2)), 0.05, "uint8")
    a2 = _conv(x, C, C, seed=3)
    c = _conv(a2, C, C, seed=4)
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.Tuple([a, q, c])))
    return tvm_ext.build(mod, TARGET, opt_level=2)


@pytest.fixture(scope="module")
def quant_graph():
    """::

        x u8 -> [K int conv + requantize + dequantize] -> d f32 (8-bit levels)
                  d -> [K max_pool + quantize] -> u8                 dq_q_round_trip
        x u8 -> [K int conv + requantize + dequantize] -> e f32 (8-bit levels)
                  e -> [K float conv] -> f32 (out)                    dequantize_early
    """
    x = relay.var("x", shape=(1, C, HW, HW), dtype="uint8")
    d = _dequantize(relay.cast(relay.clip(_int_conv_u8(x, 5), 0, 255), "uint8"), 0.1)
    rt = _quantize(relay.nn.max_pool2d(d, (2, 2), (2, 2)), 0.1, "uint8")
    e = _dequantize(relay.cast(relay.clip(_int_conv_u8(x, 6), -128, 127), "int8"), 0.1)
    f = _conv(e, C, C, seed=7)
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.Tuple([rt, f])))
    return tvm_ext.build(mod, TARGET, opt_level=2).kernel_report


@pytest.fixture(scope="module")
def int_graph():
    """::

        x u8 -> [K int conv] -> i32 -> [K max_pool + clip + cast u8] -> u8 (out)     requantize_not_fused
        x u8 -> [K int conv] -> i32 -> [K max_pool + cast f32 * s] -> f32 (out)      dequantize_not_fused
        x u8 -> [K int conv] -> i32 -> [K global_avg_pool (int32)] -> i32 (out)       int_compute
    """
    x = relay.var("x", shape=(1, C, HW, HW), dtype="uint8")
    r = relay.cast(relay.clip(relay.nn.max_pool2d(_int_conv_u8(x, 8), (2, 2), (2, 2)), 0, 255), "uint8")
    dq = _dequantize(relay.nn.max_pool2d(_int_conv_u8(x, 9), (2, 2), (2, 2)), 0.01)
    g = relay.nn.global_avg_pool2d(_int_conv_u8(x, 10))
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.Tuple([r, dq, g])))
    return tvm_ext.build(mod, TARGET, opt_level=2).kernel_report


def test_float_compute_graph_output_quantize_late(float_graph):
    rep = float_graph.kernel_report
    got = _by_reason(rep)
    assert set(got) == {"graph_output", "quantize_late", "float_compute"}, got
    assert len(got["graph_output"]) == 1 and got["graph_output"][0].on_purpose
    late = got["quantize_late"][0]
    assert late.holds == "float" and late.uses == ("quantize",) and not late.on_purpose
    assert late.producer == _kernel(rep, "tanh") and late.readers == (_kernel(rep, "max_pool2d"),)
    fc = got["float_compute"][0]
    assert fc.on_purpose and fc.uses == ("float",)
    # every float crossing byte is explained, once
    assert sum(c.nbytes for c in rep.float_crossings()) == rep.crossing.nbytes["float32"]
    assert len(rep.float_crossings()) == rep.crossing.count["float32"]


def test_round_trip_and_dequantize_early(quant_graph):
    rep = quant_graph
    got = _by_reason(rep)
    assert set(got) == {"dq_q_round_trip", "dequantize_early"}, got
    rt, early = got["dq_q_round_trip"][0], got["dequantize_early"][0]
    assert rt.holds == "q8" and rt.uses == ("quantize",) and not rt.on_purpose
    assert rt.readers == (_kernel(rep, "max_pool2d"),)
    assert early.holds == "q8" and early.uses == ("float",) and not early.on_purpose
    assert rep.avoidable_bytes() == {"float32": rt.nbytes + early.nbytes}
    assert rt.nbytes == C * HW * HW * 4


def test_int32_reasons(int_graph):
    got = _by_reason(int_graph)
    assert set(got) == {"requantize_not_fused", "dequantize_not_fused", "int_compute"}, got
    assert all(c.dtype == "int32" for cs in got.values() for c in cs)
    assert got["requantize_not_fused"][0].uses == ("narrow",)
    assert got["dequantize_not_fused"][0].uses == ("dequantize",)
    assert got["int_compute"][0].uses == ("int",)
    assert int_graph.float_crossings() == []


def test_text_and_json(quant_graph, int_graph):
    text = quant_graph.table()
    assert "dq_q_round_trip" in text and "AVOIDABLE" in text and CROSSING_REASONS["dq_q_round_trip"][1] in text
    d = json.loads(json.dumps(int_graph.to_dict()))
    reasons = {c["reason"] for c in d["int_crossings"]}
    assert reasons == {"requantize_not_fused", "dequantize_not_fused", "int_compute"}
    assert all(set(c) >= {"producer", "readers", "dtype", "nbytes", "reason", "on_purpose", "why"}
               for c in d["int_crossings"])
    assert d["float_crossings"] == []


def test_reasons_survive_with_tuned(quant_graph):
    assert _by_reason(quant_graph.with_tuned([])).keys() == _by_reason(quant_graph).keys()


def test_without_metadata_reason_is_unknown(float_graph):
    """A report read from the graph JSON alone cannot say why: 'unknown', never a guess."""
    fac = float_graph
    rep = KernelReport.from_graph_json(fac.get_graph_json(), None, param_names=set(fac.get_params()))
    assert len(rep.float_crossings()) == 3
    assert {c.reason for c in rep.float_crossings()} == {"graph_output", "unknown"}


def test_report_without_analysis_says_so(float_graph):
    """A report constructed without crossings (as Relax reports are) does not claim 'none cross'."""
    rep = float_graph.kernel_report
    bare = KernelReport(rep.kernels, rep.crossing, rep.inputs, rep.outputs)
    assert bare.float_crossings() == [] and bare.to_dict()["float_crossings"] is None
    assert "no float or wide-integer" not in bare.table() and "crossing kernels" in bare.table()


@pytest.mark.slow
def test_small_qdq_zoo_model_stock_vs_pipeline():
    """Stock TVM on the small QDQ ResNet: every float32 crossing is avoidable (8-bit values in float);
    with the int8 pipeline none is left."""
    from tvm_ext.core import pipelines
    from tvm_ext.tools import zoo
    from tvm_ext.core.frontend import from_onnx

    mod, params = from_onnx(zoo.onnx_path("resnet50_int8_qdq", small=True))
    stock = tvm_ext.build(mod, TARGET, params=params).kernel_report
    fl = stock.float_crossings()
    assert len(fl) == stock.crossing.count["float32"] > 0
    assert {c.reason for c in fl} == {"dequantize_early", "dq_q_round_trip"}
    assert all(c.holds == "q8" for c in fl)
    piped = tvm_ext.build(mod, TARGET, params=params, passes=pipelines.int8()).kernel_report
    assert piped.float_crossings() == [] and piped.int_crossings() == []


def _head_graph(parts_float: bool):
    """A detector head (YOLOv8n's, reduced): three 8-bit tensors dequantized with their own scales,
    concatenated, split, then a softmax behind a reshape/transpose and a sigmoid. FuseOps passes the
    split's tuple to the readers' kernels and ends the first kernel in the split (two outputs).
    ``parts_float``: a sigmoid before the concat (the parts are float compute, not 8-bit levels)."""
    xs, parts = [], []
    for n, scale in [(64, 0.09), (16, 0.08), (4, 0.07)]:
        x = relay.var(f"x{n}", shape=(1, 82, n), dtype="uint8")
        d = _dequantize(relay.subtract(relay.cast(x, "int32"), relay.const(141)), scale)
        xs.append(x)
        parts.append(relay.sigmoid(d) if parts_float else d)
    both = relay.split(relay.concatenate(parts, axis=2), [64], axis=1)
    dfl = relay.nn.softmax(relay.transpose(relay.reshape(both[0], (1, 4, 16, 84)), (0, 2, 1, 3)), axis=1)
    mod = tvm.IRModule.from_expr(relay.Function(xs, relay.Tuple([dfl, relay.sigmoid(both[1])])))
    return tvm_ext.build(mod, target=TARGET).kernel_report


@pytest.mark.parametrize("parts_float, reason", [(False, "dequantize_early"), (True, "float_compute")])
def test_tuple_outputs_and_tuple_params_are_analysed(parts_float, reason):
    """A kernel ending in a split (one output per part) and kernels reading a split's tuple (inputs
    flattened) are analysed like any other: no 'unknown'. A concatenate holds 8-bit levels only when
    every part does."""
    rep = _head_graph(parts_float)
    first = _kernel(rep, "concatenate", "split")
    assert rep.kernels[first].output_kinds == (("float", "float") if parts_float else ("q8", "q8"))
    assert rep.kernels[_kernel(rep, "reshape", "transpose")].output_kinds == ("param:0",)
    crossings = rep.float_crossings()
    assert len(crossings) == 3 and {c.reason for c in crossings} == {reason}, rep.table()
    split_out = [c for c in crossings if c.producer == first]
    assert [c.output for c in split_out] == [0, 1] and all(len(c.readers) == 2 for c in split_out)
    assert all(c.uses == ("float",) for c in crossings)
