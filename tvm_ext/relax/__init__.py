"""tvm-ext on Relax: the same pattern tables, passes and kernel reports for ``tvm.relax`` modules.

* :func:`translate_table` - a Relay pattern table as Relax ``FusionPattern``s (same names, same
  checks; entries without a Relax counterpart say why);
* :func:`FuseByPattern` - one pass that groups a table's matches into fused functions, which the
  stock ``FuseOps``/``FuseTIR`` then compile;
* :func:`CombineParallelCast` - parallel narrowing ``R.astype`` merged, as the Relay pass;
* :func:`build` / :func:`kernel_report` - ``relax.build`` with a slot for passes before fusion,
  and the same :class:`tvm_ext.core.report.KernelReport` for what it runs.
"""
from .build import build, lower
from .combine_parallel_cast import CombineParallelCast
from .frontend import from_onnx
from .fuse_by_pattern import FuseByPattern, composite_counts
from .patterns import RelaxEntry, RelaxMatchContext, RelaxTable, translate_table
from .report import kernel_report

__all__ = [
    "translate_table",
    "RelaxTable",
    "RelaxEntry",
    "RelaxMatchContext",
    "FuseByPattern",
    "composite_counts",
    "CombineParallelCast",
    "build",
    "lower",
    "kernel_report",
    "from_onnx",
]
