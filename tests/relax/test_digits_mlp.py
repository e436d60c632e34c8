"""An MLP on scikit-learn's digits, end to end on Relax: rewrite, fusion by a pattern table, build, run.

The flow of the MLC course's "Computational Graph Optimization" chapter: an MLP IRModule in
TVMScript; a pattern rewrite ``multiply + add -> ewise_fma``; ``dense + add`` grouped into fused
functions (here by a tvm-ext pattern table instead of a hand-written ``DenseAddFusor``); stock
``FuseOps``, ``FuseTIR``; ``relax.build``; run on the VM.
Data: scikit-learn's digits set (ships with scikit-learn), an MLP trained in numpy from a fixed
seed; the built module must classify the held-out split exactly as numpy does.
"""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard
from tvm.script import relax as R

import tvm_ext.relax as tr
from tvm_ext.patterns import make_table

N_TEST = 450


def digits_split(seed=0):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype("float32")
    idx = np.random.default_rng(seed).permutation(len(x))
    tr_i, te_i = idx[:-N_TEST], idx[-N_TEST:]
    return x[tr_i], d.target[tr_i], x[te_i], d.target[te_i]


def train_mlp(x, y, hidden=64, epochs=300, lr=0.5, seed=0):
    """Full-batch gradient descent on softmax cross-entropy; returns w0, b0, w1, b1 (dense layout)."""
    rng = np.random.default_rng(seed)
    w0 = (rng.standard_normal((hidden, x.shape[1])) * 0.1).astype("float32")
    w1 = (rng.standard_normal((10, hidden)) * 0.1).astype("float32")
    b0, b1 = np.zeros(hidden, "float32"), np.zeros(10, "float32")
    for _ in range(epochs):
        h = np.maximum(x @ w0.T + b0, 0)
        z = h @ w1.T + b1
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        g = p
        g[np.arange(len(y)), y] -= 1
        g /= len(y)
        gh = g @ w1
        gh[h <= 0] = 0
        for a, ga in ((w0, gh.T @ x), (b0, gh.sum(0)), (w1, g.T @ h), (b1, g.sum(0))):
            a -= lr * ga
    return w0, b0, w1, b1


def numpy_mlp(x, w0, b0, w1, b1):
    return np.maximum(x @ w0.T + b0, 0) @ w1.T + b1


# The chapter's MLP, in today's TVMScript: relax.op.dense(x, w) is matmul(x, permute_dims(w)).
@tvm.script.ir_module
class MLPModule:
    @R.function
    def main(x: R.Tensor((N_TEST, 64), "float32"), w0: R.Tensor((64, 64), "float32"), b0: R.Tensor((64,), "float32"),
             w1: R.Tensor((10, 64), "float32"), b1: R.Tensor((10,), "float32")):
        with R.dataflow():
            lv0 = R.matmul(x, R.permute_dims(w0))
            lv1 = R.add(lv0, b0)
            lv2 = R.nn.relu(lv1)
            lv3 = R.matmul(lv2, R.permute_dims(w1))
            lv4 = R.add(lv3, b1)
            R.output(lv4)
        return lv4


# The chapter's first example.
@tvm.script.ir_module
class MyModule:
    @R.function
    def main(x: R.Tensor((3, 4), "float32"), y: R.Tensor((3, 4), "float32")):
        with R.dataflow():
            lv0 = R.multiply(x, y)
            gv0 = R.add(lv0, y)
            R.output(gv0)
        return gv0


def ewise_fma(func):
    """# add(multiply(a, b), c) -> ewise_fma(a, b, c)   (TVM's pattern language, no mutator)"""
    a, b, c = wildcard(), wildcard(), wildcard()
    pat = is_op("relax.add")(is_op("relax.multiply")(a, b), c)
    return rewrite_call(pat, lambda _, m: R.ewise_fma(m[a], m[b], m[c]), func)


DENSE_ADD = make_table("mlp", kinds=("dense",), activations=(), residual_opts=(False,), bias_opts=(True,))


@pytest.fixture(scope="module")
def digits_mlp():
    xtr, ytr, xte, yte = digits_split()
    params = train_mlp(xtr, ytr)
    return params, xte, yte


def test_ewise_fma_rewrite_builds_and_runs():
    fn = ewise_fma(MyModule["main"])
    ops = []
    relax.analysis.post_order_visit(fn, lambda e: ops.append(e.op.name) if isinstance(e, relax.Call) else None)
    assert ops == ["relax.ewise_fma"]  # multiply gone (rewrite_call drops the dead binding)
    mod = tvm.IRModule({"main": fn})
    x, y = np.random.default_rng(1).standard_normal((2, 3, 4)).astype("float32")
    ex = tr.build(mod)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.nd.array(x), tvm.nd.array(y)).numpy()
    np.testing.assert_allclose(out, x * y + y, rtol=1e-6, atol=1e-6)
    assert ex.kernel_report.num_kernels == 1


def test_ewise_fma_no_match_unchanged():
    fn = ewise_fma(MLPModule["main"])
    tvm.ir.assert_structural_equal(fn, MLPModule["main"])


def test_digits_mlp_fused_by_table_classifies_as_numpy(digits_mlp):
    (w0, b0, w1, b1), xte, yte = digits_mlp
    ref = numpy_mlp(xte, w0, b0, w1, b1)
    acc_np = float((ref.argmax(1) == yte).mean())
    assert acc_np > 0.9  # the numpy MLP really learned the digits

    mod = relax.transform.BindParams("main", {"w0": w0, "b0": b0, "w1": w1, "b1": b1})(MLPModule)
    fuse = tr.FuseByPattern(DENSE_ADD)
    ex = tr.build(mod, passes=[fuse])  # FoldConstant, table, LegalizeOps, FuseOps, FuseTIR, relax.build
    assert fuse.last_counts == {"mlp.dense_bias": 2}
    kernels = [k.ops for k in ex.kernel_report.kernels]
    assert kernels == [("matmul", "add"), ("relu",), ("matmul", "add")]  # the table decides, as the chapter's fusor

    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.nd.array(xte)).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    acc_tvm = float((out.argmax(1) == yte).mean())
    assert acc_tvm == acc_np
    assert (out.argmax(1) == ref.argmax(1)).all()


def test_digits_mlp_stock_fuseops_fuses_relu_into_dense(digits_mlp):
    """Without the table, stock FuseOps fuses relu into the first dense: 2 kernels, same outputs."""
    (w0, b0, w1, b1), xte, _ = digits_mlp
    mod = relax.transform.BindParams("main", {"w0": w0, "b0": b0, "w1": w1, "b1": b1})(MLPModule)
    ex = tr.build(mod)
    assert [k.ops for k in ex.kernel_report.kernels] == [("matmul", "add", "relu"), ("matmul", "add")]
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.nd.array(xte)).numpy()
    np.testing.assert_allclose(out, numpy_mlp(xte, w0, b0, w1, b1), rtol=1e-4, atol=1e-4)
