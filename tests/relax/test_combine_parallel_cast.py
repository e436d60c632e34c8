"""CombineParallelCast on Relax (R.astype): structure, numerics, idempotence, no-match, bad input."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm.script import relax as R

import tvm_ext.relax as tr

from .conftest import check_relax, run_relax


def before():
    #  x -> relu -> astype(f16) -> add <- astype(f16)   (both casts of one relu)
    @tvm.script.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4, 16), "float32"), w: R.Tensor((16, 8), "float32")):
            with R.dataflow():
                a = R.nn.relu(x)
                c1 = R.astype(a, "float16")
                c2 = R.astype(a, "float16")
                d = R.matmul(c1, R.astype(w, "float16"))
                e = R.add(d, R.mean(c2, axis=[1], keepdims=True))
                R.output(e)
            return e

    return Before


def expected():
    @tvm.script.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((4, 16), "float32"), w: R.Tensor((16, 8), "float32")):
            with R.dataflow():
                a = R.nn.relu(x)
                c1 = R.astype(a, "float16")
                d = R.matmul(c1, R.astype(w, "float16"))
                e = R.add(d, R.mean(c1, axis=[1], keepdims=True))
                R.output(e)
            return e

    return Expected


def test_structure():
    check_relax(tr.CombineParallelCast(), before(), expected())


def test_numerics_and_kernels():
    x = np.random.default_rng(0).standard_normal((4, 16)).astype("float32")
    w = np.random.default_rng(1).standard_normal((16, 8)).astype("float32")
    mod = before()
    ref, ex0 = run_relax(mod, x, w)
    out, ex1 = run_relax(tr.CombineParallelCast()(mod), x, w)
    np.testing.assert_array_equal(out, ref)  # same float16 casts of the same values: bit-exact
    # the merged cast fuses into relu's kernel, which now writes float16
    assert ex1.kernel_report.num_kernels < ex0.kernel_report.num_kernels
    assert "float16" in ex1.kernel_report.crossing.nbytes


def test_idempotent():
    once = tr.CombineParallelCast()(before())
    check_relax(tr.CombineParallelCast(), once, once)


def _casts_of(producer: str, dtype: str, src: str = "float32"):
    @tvm.script.ir_module
    class M:
        @R.function
        def main(x: R.Tensor((4, 16), "float32")):
            with R.dataflow():
                a = R.nn.relu(x) if producer == "relu" else R.sum(x, axis=[1])
                c1 = R.astype(a, dtype)
                c2 = R.astype(a, dtype)
                e = R.add(c1, c2)
                R.output(e)
            return e

    return M


@pytest.mark.parametrize(
    "mod, reason",
    [
        (lambda: _casts_of("relu", "float64"), "widens"),
        (lambda: _casts_of("sum", "float16"), "fusion kind 3"),
    ],
    ids=["widening", "reduction-producer"],
)
def test_no_match_unchanged_with_reason(mod, reason, caplog):
    m = mod()
    with caplog.at_level(logging.DEBUG, logger="tvm_ext.relax.CombineParallelCast"):
        check_relax(tr.CombineParallelCast(), m, m)
    assert reason in caplog.text


def test_parameter_producer_and_other_users_rejected(caplog):
    @tvm.script.ir_module
    class M:
        @R.function
        def main(x: R.Tensor((4, 16), "float32")):
            with R.dataflow():
                c1 = R.astype(x, "float16")
                c2 = R.astype(x, "float16")
                a = R.nn.relu(x)
                c3 = R.astype(a, "float16")
                c4 = R.astype(a, "float16")
                e = R.add(R.add(c1, c2), R.add(R.add(c3, c4), R.astype(R.nn.relu(a), "float16")))
                R.output(e)
            return e

    with caplog.at_level(logging.DEBUG, logger="tvm_ext.relax.CombineParallelCast"):
        check_relax(tr.CombineParallelCast(), M, M)
    assert "parameter x" in caplog.text and "other users" in caplog.text


def test_in_sequential_and_disabled_by_name():
    seq = tvm.transform.Sequential([tr.CombineParallelCast()], name="p")
    assert not tvm.ir.structural_equal(seq(before()), before())
    with tvm.transform.PassContext(disabled_pass=["CombineParallelCast"]):
        tvm.ir.assert_structural_equal(seq(before()), before())


@pytest.mark.parametrize("bad", [1, 0, "2", True])
def test_bad_min_num_branches(bad):
    with pytest.raises(ValueError, match="CombineParallelCast"):
        tr.CombineParallelCast(bad)


def test_dynamic_shapes_merge():
    @tvm.script.ir_module
    class Dyn:
        @R.function
        def main(x: R.Tensor(("n", 16), "float32")):
            with R.dataflow():
                a = R.nn.relu(x)
                c1 = R.astype(a, "int8")
                c2 = R.astype(a, "int8")
                e = R.add(c1, c2)
                R.output(e)
            return e

    out = tr.CombineParallelCast()(Dyn)
    casts = []
    from tvm import relax

    relax.analysis.post_order_visit(
        out["main"],
        lambda e: casts.append(e) if isinstance(e, relax.Call) and getattr(e.op, "name", "") == "relax.astype"
        else None)
    assert len(casts) == 1 and relax.analysis.well_formed(out)
