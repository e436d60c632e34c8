"""Kernel reports of Relax builds: kernels = call_tir launches, anchors, crossing bytes by dtype."""
from __future__ import annotations

import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

import tvm_ext.relax as tr
from tvm_ext.core.report import KernelReport


@tvm.script.ir_module
class Net:
    # conv -> relu -> maxpool -> reshape (a view) -> matmul ; the relu output crosses into the pool
    @R.function
    def main(x: R.Tensor((1, 2, 8, 8), "float32"), w: R.Tensor((4, 2, 3, 3), "float32"),
             v: R.Tensor((64, 3), "float32")):
        with R.dataflow():
            c = R.nn.relu(R.nn.conv2d(x, w, padding=[1, 1, 1, 1]))
            p = R.nn.max_pool2d(c, pool_size=[2, 2], strides=[2, 2])
            f = R.reshape(p, [1, 64])
            y = R.matmul(f, v)
            R.output(y)
        return y


def test_report_counts_launches_and_crossings():
    ex = tr.build(Net)
    rep = ex.kernel_report
    assert isinstance(rep, KernelReport)
    lowered = ex.tvm_ext_module
    launches = []
    relax.analysis.post_order_visit(
        lowered["main"],
        lambda e: launches.append(e) if isinstance(e, relax.Call) and getattr(e.op, "name", "") == "relax.call_tir"
        else None)
    assert rep.num_kernels == len(launches) == 3
    assert [k.anchor for k in rep.kernels] == ["conv2d", "max_pool2d", "matmul"]
    assert rep.kernels[0].ops == ("conv2d", "relu")
    # conv output 1x4x8x8 and pool output 1x4x4x4 (read through the reshape view) cross, in float32
    assert rep.crossing.count == {"float32": 2}
    assert rep.crossing.nbytes == {"float32": (256 + 64) * 4}
    assert rep.inputs.total_count == 3 and rep.outputs.nbytes == {"float32": 12}
    assert rep.to_dict()["num_kernels"] == 3 and "3 kernels" in rep.table()


def test_report_rejects_non_relax():
    from tvm import relay

    x = relay.var("x", shape=(2,))
    with pytest.raises(ValueError, match="no Relax function"):
        tr.build(tvm.IRModule.from_expr(relay.Function([x], x)))
