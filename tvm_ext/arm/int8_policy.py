"""tvm-ext's aarch64 int8 kernel policy as data: per instruction-set class, which kernel each kind of
int8 conv and dense takes, each choice with the reason behind it.

:data:`POLICIES` is ordered as :data:`tvm_ext.arm.isa.ISA_CLASSES` (most capable first) and keyed by
:func:`tvm_ext.arm.isa.isa_class`; :func:`policy` reads it for one target. :mod:`tvm_ext.arm.int8_conv`
applies it while a build runs. The rules, their equations and measurements: docs/arm-kernels.md.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from .isa import ISA_CLASSES, isa_class

__all__ = ["KernelPolicy", "POLICIES", "policy", "policy_for", "MIN_INT8_CHANNELS", "INT8_LANES",
           "CHANNEL_MULTIPLE"]

#: TVM 0.19's lower bound on input channels for its NCHWc int8 conv, which ``few_channel_nchwc`` lifts.
MIN_INT8_CHANNELS = 64

#: Int8 lanes per int32 lane of the NCHWc dot-product kernel: its input channels are a multiple of this.
INT8_LANES = 4

#: TVM's channel multiple for aarch64 int8 convs, kept above ``few_channel_pad`` input channels and for
#: output channels: the NCHWc kernel's channel blocks must be multiples of 8 (or the whole count below 8).
CHANNEL_MULTIPLE = 8


@dataclass(frozen=True)
class KernelPolicy:
    """How tvm-ext compiles aarch64 int8 convs and denses for one instruction-set class.

    Attributes
    ----------
    isa : str
        The class (:func:`tvm_ext.arm.isa.isa_class`).
    dot : str
        The instruction of the int8 NCHWc kernels: ``smmla``, ``sdot`` or ``smull`` (+ ``saddlp``).
    int8_operands : bool
        Legalize qnn convs (NCHW, depthwise too) and denses with int8 x int8 operands, as TVM does with a
        dot product, instead of TVM's int16 ones (NEON only: TVM's NCHWc int8 kernel runs on NEON, exact).
    few_channel_nchwc : bool
        Offer TVM's NCHWc int8 conv below :data:`MIN_INT8_CHANNELS` input channels (4, or multiples of
        8), instead of TVM's NCHW spatial pack between layout_transform kernels.
    few_channel_pad : int
        Up to this many input channels are padded to it, not to :data:`CHANNEL_MULTIPLE` (one int32 lane).
    float_stem_nchwc : bool
        A float conv on an image's channels in an 8-bit graph takes TVM's x86 float conv (NCHWc after
        TVM's layout rules), so no layout_transform kernel sits before the int8 NCHWc convs.
    mmla_conv : bool
        8-bit convs whose channels are multiples of 8 (rows two or more pixels wide) take
        :mod:`tvm_ext.arm.mmla_conv`'s ``smmla`` kernel (32 multiply-adds per instruction, ``sdot`` 16).
    mmla_block : int
        With ``mmla_conv``: the convs that keep the dot product (or float) read and write NCHW of this
        block, and up to ``few_channel_pad`` channels sliced from a padded conv are padded to it.
    dense_kernels : tuple of str
        :mod:`tvm_ext.arm.int8_dense`'s kernels 8-bit denses may take, in order: ``"mmla"`` (two or more
        rows), ``"dot"``; none keeps TVM's ``dense_pack`` (widening multiplies).
    mixed_sign_dot : bool
        A dot product takes uint8 x int8 operands (``usdot``, +i8mm).
    conv_tile : str
        NCHW4c int8 convs (TVM's layout at the class) take :mod:`tvm_ext.arm.dot_conv`'s register tile
        of several output blocks by four-pixel groups in this form, ``"sdot"`` or ``"smull"`` (+
        ``sadalp``), instead of TVM's schedule, whose reduction runs into one accumulator (one
        dependency chain); ``""`` keeps TVM's.
    depthwise_nchwc : bool
        An 8-bit depthwise conv after an NCHWkc producer becomes ``contrib_depthwise_conv2d_nchwc`` with
        the producer's block k.
    depthwise_dot : bool
        Those NCHWc depthwise convs take :mod:`tvm_ext.arm.depthwise_dot`'s kernel (a dot instruction
        over 4 adjacent taps of 4 channels) instead of TVM's (a widening multiply per tap).
    evidence : str
        Why the class's kernels are what they are (docs/arm-kernels.md has the measurements).
    """

    isa: str
    dot: str
    int8_operands: bool
    mmla_conv: bool
    dense_kernels: tuple
    mixed_sign_dot: bool
    evidence: str
    few_channel_nchwc: bool = True
    few_channel_pad: int = INT8_LANES
    float_stem_nchwc: bool = True
    mmla_block: int = 0
    conv_tile: str = ""
    depthwise_nchwc: bool = True
    depthwise_dot: bool = False

    def __post_init__(self):
        if self.isa not in ISA_CLASSES:
            raise ValueError(f"KernelPolicy: {self.isa!r} is not an aarch64 class ({', '.join(ISA_CLASSES)})")
        unknown = set(self.dense_kernels) - {"mmla", "dot"}
        if unknown:
            raise ValueError(f"KernelPolicy {self.isa}: unknown dense kernels {sorted(unknown)}")
        if self.conv_tile not in ("", "sdot", "smull"):
            raise ValueError(f"KernelPolicy {self.isa}: unknown conv tile form {self.conv_tile!r}")
        if self.mmla_conv and not self.mmla_block:
            raise ValueError(f"KernelPolicy {self.isa}: mmla_conv needs an mmla_block")

    def as_dict(self) -> dict:
        """The record as a JSON-friendly dict."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: The policy per class, most capable first (the order of :data:`tvm_ext.arm.isa.ISA_CLASSES`).
POLICIES: tuple = (
    KernelPolicy("aarch64_i8mm", "smmla", int8_operands=False, mmla_conv=True, mmla_block=8, conv_tile="sdot",
                 depthwise_dot=True,
                 dense_kernels=("mmla", "dot"), mixed_sign_dot=True,
                 evidence="smmla: 32 multiply-adds per instruction where sdot does 16; NCHW8c between the "
                          "dot-product and matrix convs: no layout_transform kernel; conv_tile: the convs that keep "
                          "sdot (ResNet's stem, 4 input channels) in register tiles (Neoverse-V1/V2, llvm-mca)"),
    KernelPolicy("aarch64_dotprod", "sdot", int8_operands=False, mmla_conv=False, conv_tile="sdot",
                 depthwise_dot=True,
                 dense_kernels=("dot",), mixed_sign_dot=False,
                 evidence="sdot: 16 multiply-adds per instruction; TVM's dense_pack widens to int16; conv_tile: "
                          "ResNet-50's convs at 96% of the sdot peak, TVM's schedule 25% (llvm-mca, Neoverse-N1)"),
    KernelPolicy("aarch64_neon", "smull", int8_operands=True, mmla_conv=False, conv_tile="smull",
                 dense_kernels=(), mixed_sign_dot=False,
                 evidence="smull on int8 operands: exact, no int16 tensor between kernels (TVM widens the "
                          "operands to int16 before each conv); conv_tile: ResNet-50's convs at 86% of the smull "
                          "peak, TVM's schedule (saddlp + add) 50% (llvm-mca, Cortex-A72)"),
)

_BY_CLASS = {p.isa: p for p in POLICIES}
if tuple(_BY_CLASS) != ISA_CLASSES:
    raise ValueError(f"POLICIES must list {ISA_CLASSES} in that order, not {tuple(_BY_CLASS)}")


def policy_for(cls: str) -> KernelPolicy:
    """The policy of the aarch64 class ``cls`` (one of :data:`tvm_ext.arm.isa.ISA_CLASSES`)."""
    try:
        return _BY_CLASS[cls]
    except KeyError:
        raise ValueError(f"no aarch64 int8 policy for class {cls!r} ({', '.join(ISA_CLASSES)})") from None


def policy(target) -> KernelPolicy:
    """The int8 kernel choices tvm-ext makes for the aarch64 ``target`` (see :class:`KernelPolicy`)."""
    return policy_for(isa_class(target))
