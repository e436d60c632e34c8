"""tvm-ext Relay passes (installed as ``tvm_ext.passes``).

Every factory returns a ``tvm.transform.Pass`` registered with an explicit name equal to the
factory's name, so ``PassContext(disabled_pass=[...])``, instruments, the CLI and the benchmarks
all key on it. Each pass lives in its own module with a mirrored test module.
"""
from .combine_parallel_cast import CombineParallelCast
from .combine_parallel_op_batch import CombineParallelOpBatch
from .fuse_by_pattern import FuseByPattern
from .nonnegative_conv_input_to_uint8 import NonNegativeConvInputToUint8
from .remove_stop_fusion import RemoveStopFusion

__all__ = [
    "CombineParallelCast",
    "CombineParallelOpBatch",
    "FuseByPattern",
    "NonNegativeConvInputToUint8",
    "RemoveStopFusion",
]
