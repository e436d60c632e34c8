#!/usr/bin/env python
"""Kernel counts of the full-size int8 ResNet-50 zoo models under single tvm-ext passes.

Prints one table: stock kernels at opt_level 2 and 3, with CombineParallelCast, the composites
MergeComposite finds per entry of the `qnn` and `generic` tables, and kernels with
FuseByPattern(table): what each pass and table does to kernel counts on its own
(``docs/benchmarks.md``); about 10 minutes on 2 cores.

    python benchmarks/lab/pass_effects.py [--small] [--models qoperator,qdq,relay]
"""
import argparse
import logging
from collections import Counter

from tvm import relay

import tvm_ext
from tvm_ext.tools import zoo
from tvm_ext.passes import CombineParallelCast, FuseByPattern
from tvm_ext.patterns import get_table, merge_composite

NAMES = {"qoperator": "resnet50_int8_qoperator", "qdq": "resnet50_int8_qdq", "relay": "resnet50_int8_relay"}


def composites(m, table):
    mod = relay.transform.InferType()(m.mod)
    if m.params:
        mod["main"] = relay.build_module.bind_params_by_name(mod["main"], m.params)
        mod = relay.transform.InferType()(mod)
    counts = Counter()

    def visit(node):
        if isinstance(node, relay.Function) and node.attrs and "Composite" in node.attrs:
            counts[str(node.attrs["Composite"])] += 1

    relay.analysis.post_order_visit(merge_composite(table)(mod)["main"], visit)
    return dict(sorted(counts.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--models", default="qoperator,qdq,relay")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("autotvm").setLevel(logging.ERROR)
    print("| model | stock opt2 | +CombineParallelCast opt2 | stock opt3 | +CombineParallelCast opt3 |"
          " FuseByPattern(qnn) | FuseByPattern(generic) | qnn composites | generic composites |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in args.models.split(","):
        m = zoo.load(NAMES[key], small=args.small)
        k = lambda m=m, **kw: tvm_ext.build(m.mod, params=m.params, **kw).kernel_report.num_kernels  # noqa: E731
        row = [key, k(opt_level=2), k(opt_level=2, passes=[CombineParallelCast()]), k(opt_level=3),
               k(opt_level=3, passes=[CombineParallelCast()]),
               k(passes=[FuseByPattern(get_table("qnn"))]), k(passes=[FuseByPattern(get_table("generic"))]),
               composites(m, get_table("qnn")), composites(m, get_table("generic"))]
        print("| " + " | ".join(str(c) for c in row) + " |", flush=True)


if __name__ == "__main__":
    main()
