"""What an explanation holds: the reason kinds (``REASONS``, ordered data), kernels and boundaries.

A kernel is a group of the FuseOps replay whose root is an op call; a boundary is a kernel's
output read by another kernel, with the reason FuseOps kept it out of its reader's kernel.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

__all__ = ["REASONS", "Kernel", "Boundary"]


#: Reason kinds, in report order: (kind, one-line meaning in FuseOps' terms).
REASONS = (
    ("two_anchors", "both sides are anchors: a kOutEWiseFusable/kCommReduce group meets another; "
                    "FuseOps puts one anchor in a kernel"),
    ("after_reduction", "the producer is a kCommReduce group; FuseOps never fuses a reduction into its reader"),
    ("injective_after_anchor", "a kBroadcast/kInjective op (layout_transform, reshape, pad, ...) reads an anchor; "
                               "FuseOps fuses only elementwise epilogues into kOutEWiseFusable"),
    ("prologue_into_anchor", "an elementwise/injective op feeds an anchor (or a kernel already holding one); "
                             "FuseOps fuses epilogues, never prologues"),
    ("multiple_readers", "the value has several readers; its post-dominator lies past a join and a path to it "
                         "breaks FuseOps' CheckPath condition"),
    ("no_post_dominator", "the readers never join again (or the value is also a graph output): no post-dominator"),
    ("stop_fusion", "an annotation.stop_fusion barrier"),
    ("function_boundary", "a Primitive/Composite function (a pattern-table group) is opaque to FuseOps"),
    ("closure_call", "the value is an argument of a call of a closure, a global function or a function an If "
                     "returns (not an op): FuseOps makes such a call kOpaque and leaves it out of every kernel"),
    ("opaque_op", "an op whose TOpPattern is kOpaque"),
    ("dynamic_shape", "a data-dependent op with a dynamic shape is kOpaque"),
    ("tuple", "the value goes into a tuple; FuseOps fuses only injective producers into tuples (phase 2)"),
    ("max_depth", "relay.FuseOps.max_depth reached"),
    ("max_function_args", "the fused kernel would take more arguments than the target's max_function_args"),
    ("postponed_dropped", "at a target with max_function_args, FuseOps postponed the fusion into a join and "
                          "dropped it because the join's kernel took an anchor first (the join's earlier argument)"),
    ("fusion_disabled", "FuseOps ran at opt_level 0"),
    ("other", "not classified (see detail)"),
)


_REASON_DOC = dict(REASONS)


_REASON_ORDER = {k: i for i, (k, _) in enumerate(REASONS)}


@dataclass(frozen=True)
class Kernel:
    """One kernel (a fused group with at least one op).

    ``name`` is the built module's function name, as TVM's TE compiler gives it
    (``tvmgen_<mod_name>_fused_<ops>``, long names truncated with a hash, ``_1``, ``_2`` for
    different kernels of equal names, one name for structurally equal kernels); ``func_name`` is
    the graph executor's (and so the kernel report's and the debug executor's) name for the call:
    ``name``, or ``"__nop"`` for a reshape-only kernel, which the graph executor does not run.
    Both are ``None`` when the replay's kernel has no counterpart in TVM's FuseOps
    (``Explanation.verified`` is then ``False``).
    """

    index: int
    name: Optional[str]
    ops: tuple
    anchor: Optional[str]
    pattern: str
    outputs: tuple  # ((shape, dtype), ...)
    reshape_only: bool = False
    func_name: Optional[str] = None

    @property
    def title(self) -> str:
        """The built function name, with the graph executor's when it differs (``__nop``)."""
        if self.name is None:
            return "(no TVM kernel of these ops)"
        if self.func_name in (None, self.name):
            return self.name
        return f"{self.name} (graph executor: {self.func_name})"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ops"] = list(self.ops)
        d["outputs"] = [{"shape": list(s), "dtype": t} for s, t in self.outputs]
        return d


@dataclass(frozen=True)
class Boundary:
    """A tensor crossing kernels: producer kernel output read by consumer kernel(s), and why."""

    producer: int
    consumers: tuple
    output: Optional[int]  # field of a tuple-valued kernel, else None
    op: str  # op at the producer kernel's root (what writes the tensor)
    readers: tuple  # op names of the direct readers in the pre-fusion graph
    dtype: str
    shape: tuple
    nbytes: int
    kind: str
    detail: str
    rule: str  # the FuseOps rule that refused, e.g. "phase 0: dom pattern kInjective != kElemWise"
    join: Optional[str] = None  # the post-dominator, e.g. "add in kernel #12"
    blocker: Optional[str] = None  # the op that broke the rule
    entry: Optional[str] = None  # pattern-table entry / function name
    inserted_by: tuple = ()  # ((op, (pass, ...)), ...) for ops relay.build's prefix or user passes created
    remedy: Optional[str] = None
    producer_ops: tuple = ()  # ops of the producer kernel
    reader_casts: tuple = ()  # target dtypes of the readers that are casts
    pad_value: Optional[float] = None  # the constant pad value when the producer root is nn.pad
    pads_channels: bool = False  # the producer kernel holds an nn.pad of a 4-d tensor's axis 1

    def to_dict(self) -> dict:
        d = asdict(self)
        d["consumers"] = list(self.consumers)
        d["producer_ops"] = list(self.producer_ops)
        d["readers"] = list(self.readers)
        d["shape"] = list(self.shape)
        d["inserted_by"] = {op: list(ps) for op, ps in self.inserted_by}
        return d
