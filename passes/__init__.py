"""tvm-ext Relay passes (installed as ``tvm_ext.passes``).

Every factory returns a ``tvm.transform.Pass`` registered with an explicit name equal to the
factory's name, so ``PassContext(disabled_pass=[...])``, instruments, the CLI and the benchmarks
all key on it. Each pass lives in its own module with a mirrored test module.
"""
from .add_as_onnxruntime import AddAsOnnxRuntime
from .affine_eight_bit_join import AffineEightBitJoin
from .anchored_argument_first import AnchoredArgumentFirst
from .combine_parallel_cast import CombineParallelCast
from .combine_parallel_op_batch import CombineParallelOpBatch
from .dequantize_in_conv_transpose import DequantizeInConvTranspose
from .epilogue_before_channel_slice import EpilogueBeforeChannelSlice
from .fold_channel_repad_into_conv import FoldChannelRepadIntoConv
from .fold_pad_into_conv import FoldPadIntoConv
from .fold_zero_point_pad_into_conv import FoldZeroPointPadIntoConv
from .fuse_by_pattern import FuseByPattern
from .fuse_widening_into_pool import FuseWideningIntoPool
from .hoist_uint8_shift import HoistUint8Shift
from .narrow_before_max_pool import NarrowBeforeMaxPool
from .narrow_kernel_boundaries import NarrowKernelBoundaries
from .nonnegative_conv_input_to_uint8 import NonNegativeConvInputToUint8
from .pad_channels_at_producer import PadChannelsAtProducer
from .qdq_to_integer import QDQToInteger
from .quantize_weights_as_onnxruntime import QuantizeWeightsAsOnnxRuntime
from .remove_stop_fusion import RemoveStopFusion
from .round_half_to_even import RoundHalfToEven
from .tabulate_eight_bit import TabulateEightBit
from .uniform_zero_points_to_scalar import UniformZeroPointsToScalar
from .widen_after_movement import WidenAfterMovement
from .widen_in_each_reader import WidenInEachReader

__all__ = [
    "AddAsOnnxRuntime",
    "AffineEightBitJoin",
    "AnchoredArgumentFirst",
    "CombineParallelCast",
    "CombineParallelOpBatch",
    "DequantizeInConvTranspose",
    "EpilogueBeforeChannelSlice",
    "FoldChannelRepadIntoConv",
    "FoldPadIntoConv",
    "FoldZeroPointPadIntoConv",
    "FuseByPattern",
    "FuseWideningIntoPool",
    "HoistUint8Shift",
    "NarrowBeforeMaxPool",
    "NarrowKernelBoundaries",
    "NonNegativeConvInputToUint8",
    "PadChannelsAtProducer",
    "QDQToInteger",
    "QuantizeWeightsAsOnnxRuntime",
    "RemoveStopFusion",
    "RoundHalfToEven",
    "TabulateEightBit",
    "UniformZeroPointsToScalar",
    "WidenAfterMovement",
    "WidenInEachReader",
]
