"""FuseByPattern on Relax: the table's matches become fused functions FuseOps/FuseTIR compile."""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard
from tvm.script import relax as R

import tvm_ext.relax as tr
from tvm_ext.patterns import GENERIC, make_table

from .conftest import check_relax

DENSE_ADD = make_table("mlp", kinds=("dense",), activations=(), residual_opts=(False,), bias_opts=(True,))


@tvm.script.ir_module
class MLP:
    # relu(x @ w0^T + b0) @ w1^T + b1
    @R.function
    def main(x: R.Tensor((2, 16), "float32"), w0: R.Tensor((8, 16), "float32"), b0: R.Tensor((8,), "float32"),
             w1: R.Tensor((4, 8), "float32"), b1: R.Tensor((4,), "float32")):
        with R.dataflow():
            lv0 = R.matmul(x, R.permute_dims(w0))
            lv1 = R.add(lv0, b0)
            lv2 = R.nn.relu(lv1)
            lv3 = R.matmul(lv2, R.permute_dims(w1))
            lv4 = R.add(lv3, b1)
            R.output(lv4)
        return lv4


def expected():
    """What a hand-written dense + add fusing mutator gives: FuseOpsByPattern with its own pattern."""
    pat = is_op("relax.add")(is_op("relax.matmul")(wildcard(), is_op("relax.permute_dims")(wildcard())), wildcard())
    return relax.transform.FuseOpsByPattern([("mlp.dense_bias", pat)], bind_constants=False)(MLP)


def test_structure_equals_hand_written_fusor():
    after = check_relax(tr.FuseByPattern(DENSE_ADD), MLP, expected())
    assert tr.composite_counts(after) == {"mlp.dense_bias": 2}


def test_numerics_and_kernels():
    rng = np.random.default_rng(0)
    args = [rng.standard_normal([int(d) for d in p.struct_info.shape]).astype("float32") for p in MLP["main"].params]
    x, w0, b0, w1, b1 = args
    ref = np.maximum(x @ w0.T + b0, 0) @ w1.T + b1
    outs = {}
    for name, passes in (("stock", []), ("table", [tr.FuseByPattern(DENSE_ADD)])):
        ex = tr.build(MLP, passes=passes)
        outs[name] = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.nd.array(a) for a in args]).numpy()
        outs[name + "_kernels"] = [k.ops for k in ex.kernel_report.kernels]
    np.testing.assert_allclose(outs["table"], ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs["stock"], ref, rtol=1e-5, atol=1e-5)
    # the table's dense is matmul(x, permute_dims(w)): the transpose of the parameter joins the group;
    # relu stays out (the table decides); stock FuseOps fuses relu instead and transposes apart
    assert outs["table_kernels"] == [("transpose", "matmul", "add"), ("relu",), ("transpose", "matmul", "add")]
    assert ("matmul", "add", "relu") in outs["stock_kernels"] and ("transpose",) in outs["stock_kernels"]


def test_idempotent():
    once = tr.FuseByPattern(DENSE_ADD)(MLP)
    check_relax(tr.FuseByPattern(DENSE_ADD), once, once)


def test_no_match_unchanged():
    @tvm.script.ir_module
    class NoDense:
        @R.function
        def main(x: R.Tensor((2, 16), "float32")):
            with R.dataflow():
                y = R.nn.relu(R.add(x, x))
                R.output(y)
            return y

    check_relax(tr.FuseByPattern(GENERIC), NoDense, NoDense)


def test_generic_table_on_conv_block():
    # relu(conv2d(x, w) + b + r) -> generic.conv2d_bias_add_relu, one kernel
    @tvm.script.ir_module
    class Block:
        @R.function
        def main(x: R.Tensor((1, 4, 8, 8), "float32"), w: R.Tensor((4, 4, 3, 3), "float32"),
                 b: R.Tensor((1, 4, 1, 1), "float32")):
            with R.dataflow():
                c = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
                y = R.nn.relu(R.add(R.add(c, b), x))
                R.output(y)
            return y

    fuse = tr.FuseByPattern(GENERIC)
    ex = tr.build(Block, passes=[fuse])
    assert fuse.last_counts == {"generic.conv2d_bias_add_relu": 1}
    assert [k.ops for k in ex.kernel_report.kernels] == [("conv2d", "add", "add", "relu")]


def test_disabled_by_name_and_non_relax_module():
    with tvm.transform.PassContext(disabled_pass=["FuseByPattern"]):
        out = tvm.transform.Sequential([tr.FuseByPattern(DENSE_ADD)])(MLP)
    tvm.ir.assert_structural_equal(out, MLP)
    from tvm import relay

    x = relay.var("x", shape=(2, 2))
    relay_mod = tvm.IRModule.from_expr(relay.Function([x], relay.nn.relu(x)))
    tvm.ir.assert_structural_equal(tr.FuseByPattern(DENSE_ADD)(relay_mod), relay_mod)
