"""Every kernel boundary gets FuseOps' reason (``_fusion_sim``'s replay, ``_analysis``): dense + bias +
relu fuses, relay.quantize's ``stop_fusion``, a residual join, ``max_depth``, a pattern-table entry, tuples,
split fields and Let-bound values. Every explanation is checked against TVM's own FuseOps (``ex.verified``)."""
from tvm import relay

from tvm_ext.core.explain import explain

from _explain_graphs import W, by_kind, conv, dense_bias_relu, mod_of, quantized_pair, residual


def test_q1_dense_bias_relu_is_one_kernel_compiled():
    ex = explain(dense_bias_relu(), compile=True)
    assert ex.verified is True
    assert ex.num_kernels == 1 and not ex.boundaries
    k = ex.kernels[0]
    assert k.ops[-2:] == ("add", "nn.relu") and "dense" in k.ops[0]
    # the graph executor's kernel name, matched op for op
    assert k.func_name.startswith("tvmgen_default_fused_") and k.func_name.endswith("add_nn_relu")
    assert ex.kernel_report.num_kernels == 1


def test_q3_stop_fusion_after_cast_and_remedy():
    ex = explain(quantized_pair())
    assert ex.verified is True
    stops = by_kind(ex, "stop_fusion")
    assert len(stops) == 1
    b = stops[0]
    assert b.dtype == "int8" and b.op == "cast" and b.remedy == "RemoveStopFusion"
    assert "annotation.stop_fusion" in b.detail and "kOpaque" in b.rule
    # the AlterOpLayout layout_transform in front of the first conv: injective, never fused into an anchor
    lt = [b for b in ex.boundaries if b.op == "layout_transform"]
    assert lt and lt[0].kind == "prologue_into_anchor" and ("layout_transform", ("AlterOpLayout",)) in lt[0].inserted_by
    # the float cast before the second conv is a prologue: FuseOps never fuses into an anchor's input
    pro = [b for b in ex.boundaries if b.op == "cast" and b.dtype == "float32"]
    assert pro and pro[0].kind == "prologue_into_anchor"
    (rr,) = ex.check_remedies(["RemoveStopFusion"])[:1]
    assert rr.measured and rr.remaining == 0 and rr.kernels_saved >= 1


def test_residual_join_two_anchors_and_reduction():
    ex = explain(residual())
    assert ex.verified is True
    (mr,) = by_kind(ex, "multiple_readers")
    join_kernel = [k for k in ex.kernels if "add" in k.ops and k.anchor][0]
    # the join is named, with the kernel that holds it, and the anchor on the path
    assert mr.join == f"add in kernel #{join_kernel.index}"
    assert "conv2d" in mr.blocker and sorted(mr.readers)[0] == "add"
    (ta,) = by_kind(ex, "two_anchors")
    assert "mean" in ta.detail and ta.remedy == "none"
    (ar,) = by_kind(ex, "after_reduction")
    assert ar.op == "mean" and "kCommReduce" in ar.rule


def test_max_depth_config_and_remedy():
    x = relay.var("x", shape=(1, 8))
    y = x
    for i in range(12):
        y = relay.sigmoid(y) if i % 2 else relay.tanh(y)
    ex = explain(mod_of(relay.nn.relu(y)), config={"relay.FuseOps.max_depth": 6})
    assert ex.verified is True  # TVM's FuseOps honours the same config
    md = by_kind(ex, "max_depth")
    assert md and all("max_depth=6" in b.detail for b in md)
    (rr,) = [r for r in ex.check_remedies(["relay.FuseOps.max_depth"]) if r.remedy == "relay.FuseOps.max_depth"]
    assert rr.remaining == 0 and rr.kernels_saved == len(md)


def test_pattern_table_entry_is_named_and_dropping_it_fuses():
    """A pattern-table group is one kernel, its entry is named, and dropping the entry lets FuseOps fuse."""
    from tvm_ext.passes import FuseByPattern
    from tvm_ext.patterns import make_table

    x = relay.var("x", shape=(1, 64))
    h = relay.nn.relu(relay.add(relay.nn.dense(x, W(64, 64)), W(64)))
    y = relay.add(relay.nn.dense(h, W(32, 64)), W(32))
    table = make_table("mlp", kinds=("dense",), activations=(), residual_opts=(False,), bias_opts=(True,))
    ex = explain(mod_of(y), passes=[FuseByPattern(table)])
    assert ex.verified is True
    fb = by_kind(ex, "function_boundary")
    assert fb and all(b.entry and b.entry.startswith("mlp.") for b in fb)
    assert all(b.remedy == "pattern entry" for b in fb)
    (rr,) = [r for r in ex.check_remedies(["pattern entry"]) if r.remedy == "pattern entry"]
    assert rr.measured and rr.remaining == 0 and rr.kernels_saved == 1  # relu fuses back into the first dense


def test_tuple_concat_and_opt_level_0():
    x = relay.var("x", shape=(1, 8, 8, 8))
    y = relay.concatenate([conv(x, 8, 8), conv(x, 8, 8)], axis=1)
    ex = explain(mod_of(y), disabled_pass=["AlterOpLayout"])
    assert ex.verified is True
    assert len(by_kind(ex, "tuple")) == 2
    assert all("tuple of concatenate" in b.detail for b in by_kind(ex, "tuple"))
    # inception-style: one value read by two branches that meet only at the concatenate's tuple
    a = relay.nn.relu(conv(x, 8, 8))
    ex = explain(mod_of(relay.concatenate([conv(a, 8, 8), conv(a, 8, 8)], axis=1)), disabled_pass=["AlterOpLayout"])
    assert ex.verified is True
    (mr,) = by_kind(ex, "multiple_readers")
    assert "join only at the tuple feeding concatenate" in mr.detail and "post-dominator is a tuple" in mr.rule
    ex0 = explain(dense_bias_relu(), opt_level=0)
    assert ex0.verified is True and ex0.num_kernels == 3
    assert {b.kind for b in ex0.boundaries} == {"fusion_disabled"}


def test_split_fields_and_let_are_resolved():
    """A tuple-valued kernel (split) read whole: each field is a crossing tensor; Let-bound values too."""
    z = relay.var("z", shape=(1, 8, 4, 4))
    parts = relay.split(relay.nn.relu(z), 2, axis=1)
    y = relay.nn.conv2d(parts[0], W(4, 4, 1, 1), kernel_size=(1, 1), channels=4) + parts[1]
    ex = explain(mod_of(y))
    assert ex.verified is True
    fields = [b for b in ex.boundaries if b.op == "split"]
    assert sorted(b.output for b in fields) == [0, 1] and all(b.kind == "multiple_readers" for b in fields)
    assert all(b.nbytes == 1 * 4 * 4 * 4 * 4 for b in fields)
    assert "the join itself is in the kernel of nn.contrib_conv2d_NCHWc" in fields[0].detail
    x, v = relay.var("x", shape=(1, 8)), relay.var("v")
    ex = explain(mod_of(relay.Let(v, relay.nn.relu(x), relay.exp(relay.add(v, v)))))
    assert ex.verified is True and ex.num_kernels == 2
    (b,) = ex.boundaries
    assert b.kind == "no_post_dominator" and "Let/If" in b.detail
