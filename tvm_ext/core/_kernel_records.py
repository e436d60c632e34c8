"""The records a kernel report is made of: kernels, tensor traffic per dtype, crossings and their
reasons (:data:`CROSSING_REASONS`), and the op facts they are computed from (anchor, dtype size).

:mod:`tvm_ext.core.report` reads them off a build and re-exports the public ones; import them from there.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

from .._op_pattern import K_COMM_REDUCE, op_pattern

__all__ = ["Kernel", "TensorTraffic", "Crossing", "CROSSING_REASONS", "PATTERN_NAMES", "dtype_bytes", "anchor_of"]


#: TOpPattern values (include/tvm/relay/op_attr_types.h).
PATTERN_NAMES = {
    0: "elemwise",
    1: "broadcast",
    2: "injective",
    3: "comm_reduce",
    4: "out_elemwise_fusable",
    7: "tuple",
    8: "opaque",
}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a TVM dtype string, as TVM's runtime allocates them.

    ``(bits * lanes + 7) // 8`` (``runtime::GetDataSize``): ``bool`` and ``int4`` take one byte.
    """
    import tvm

    t = tvm.DataType(dtype)
    return (t.bits * t.lanes + 7) // 8


def anchor_of(ops) -> Optional[str]:
    """The anchor op among ``ops`` (names), or None for a kernel of only elementwise/injective ops."""
    best, best_pat = None, -1
    for name in ops:
        pat = op_pattern(name)
        if pat >= K_COMM_REDUCE and pat != 7 and pat > best_pat:
            best, best_pat = name, pat
    return best


@dataclass(frozen=True)
class TensorTraffic:
    """Count and bytes of tensors, per dtype."""

    count: dict = field(default_factory=dict)
    nbytes: dict = field(default_factory=dict)

    @property
    def total_count(self) -> int:
        return sum(self.count.values())

    @property
    def total_bytes(self) -> int:
        return int(sum(self.nbytes.values()))

    def to_dict(self) -> dict:
        return {
            "count": dict(sorted(self.count.items())),
            "bytes": {k: int(v) for k, v in sorted(self.nbytes.items())},
            "total_count": self.total_count,
            "total_bytes": self.total_bytes,
        }


def _traffic(entries) -> TensorTraffic:
    count: dict = {}
    nbytes: dict = {}
    for shape, dtype in entries:
        count[dtype] = count.get(dtype, 0) + 1
        nbytes[dtype] = nbytes.get(dtype, 0) + int(math.prod(shape) * dtype_bytes(dtype))
    return TensorTraffic(count, nbytes)


@dataclass(frozen=True)
class Kernel:
    """One kernel launch of the graph executor."""

    index: int
    name: str
    func_name: str
    ops: tuple
    anchor: Optional[str]
    outputs: tuple  # ((shape, dtype), ...)
    inputs: tuple = ()  # ((shape, dtype), ...), weights included
    tuned: bool = False  # compiled with a tuning record (tvm_ext.x86.tuning), not TVM's rule
    #: Per input: what the kernel does with it first (tvm_ext.core._crossings), () when unknown.
    input_uses: tuple = ()
    #: Per output: "q8" (8-bit levels in float), "float", "int", "param:i" (moves input i), ...
    output_kinds: tuple = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ops"] = list(self.ops)
        d["outputs"] = [{"shape": list(s), "dtype": t} for s, t in self.outputs]
        d["inputs"] = [{"shape": list(s), "dtype": t} for s, t in self.inputs]
        d["input_uses"], d["output_kinds"] = list(self.input_uses), list(self.output_kinds)
        return d


def _relay_ops(func) -> list:
    """Op names called in a Relay function, in post-order."""
    from tvm import relay

    ops = []

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.op, __import__("tvm").ir.Op):
            ops.append(node.op.name)

    relay.analysis.post_order_visit(func, visit)
    return ops


#: reason -> (on purpose, explanation). Float reasons first, then wide-integer ones.
CROSSING_REASONS = {
    "graph_input": (True, "graph input: the model's float input, only moved or scaled (layout_transform, "
                          "normalization) and read by float compute"),
    "graph_output": (True, "graph output: the model returns this tensor (and another kernel reads it)"),
    "float_compute": (True, "float compute: the producer computes it in float and a reader computes in float "
                            "(e.g. a float first layer, a detector head, softmax)"),
    "dequantize_early": (False, "dequantized too early: it holds 8-bit levels and a reader computes in float; "
                                "crossing as 8-bit and dequantizing in the reader moves 1/4 of the bytes"),
    "dq_q_round_trip": (False, "dequantize -> quantize round trip: it holds 8-bit levels and every reader "
                               "quantizes it again"),
    "quantize_late": (False, "quantized too late: computed in float, every reader quantizes it first; "
                             "quantizing in the producer would cross 8-bit"),
    "requantize_not_fused": (False, "requantize not fused: int32 accumulators cross, every reader narrows "
                                    "them to 8 bits first"),
    "dequantize_not_fused": (False, "dequantize not fused: integers cross and a reader converts them to float "
                                    "first"),
    "int_compute": (False, "integer compute: a reader computes on the wide integers (e.g. a pool or an add "
                           "in int32)"),
    "unknown": (False, "not analysed: no Relay function for the producer or a reader (external codegen)"),
}


@dataclass(frozen=True)
class Crossing:
    """One float or wide-integer tensor crossing a kernel boundary, with the reason."""

    producer: int  # kernel index
    output: int  # output index of the producer
    readers: tuple  # kernel indices
    shape: tuple
    dtype: str
    nbytes: int
    reason: str  # a key of CROSSING_REASONS
    holds: str  # what the producer's output holds ("q8", "float", "int", ...)
    uses: tuple  # what the readers do with it first ("quantize", "float", "narrow", ...)

    @property
    def on_purpose(self) -> bool:
        return CROSSING_REASONS[self.reason][0]

    @property
    def why(self) -> str:
        return CROSSING_REASONS[self.reason][1]

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(shape=list(self.shape), readers=list(self.readers), uses=list(self.uses),
                 on_purpose=self.on_purpose, why=self.why)
        return d
