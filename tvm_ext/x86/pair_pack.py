"""``PairPackInt8Convs``: int8 convs whose ``vpmaddubsw`` pairs can saturate get their kernel packed
in pairs of input channels and widened to int16 once, at compile time, for the exact int16 kernel
(:func:`tvm_ext.x86.exact_dot.dot_int16_pairs`; the conv widens its data to int16 before its loops,
:mod:`tvm_ext.x86.exact_int8`).

The x86 back end runs it last before ``FuseOps`` where the int8 dot product has no VNNI
(:func:`packs_pairs`). One rule, in the shape of :mod:`tvm_ext._rules`.
"""
from __future__ import annotations

import logging
import re

import numpy as np
import tvm
from tvm import relay
from tvm.relay import dataflow_pattern as dfp

from .._reject import Reject
from .._rules import Rule, first_rewrite
from .exact_dot import pair_kernel, pairs_fit_int16
from .exact_record import SATURATING
from .isa import isa_class

logger = logging.getLogger(__name__)

__all__ = ["PairPackInt8Convs", "packs_pairs", "SATURATING_CLASSES", "RULES"]

PASS_NAME = "PairPackInt8Convs"
#: The instruction-set classes whose int8 dot product is ``vpmaddubsw`` (no VNNI).
SATURATING_CLASSES = ("avx512", "avx2", "sse")
_KERNEL_LAYOUT = re.compile(r"^OIHW(\d+)i(\d+)o4i$")


def packs_pairs(target) -> bool:
    """True when ``tvm_ext.build`` runs :func:`PairPackInt8Convs` for ``target``: an x86 target
    whose int8 dot product saturates (VNNI's ``vpdpbusd`` does not), outside :func:`saturating`."""
    return isa_class(target) in SATURATING_CLASSES and not SATURATING.get()



def _pairs_check(call, weight) -> bool | Reject:
    """Whether the conv ``call`` with constant kernel ``weight`` is packed in pairs, or why not."""
    attrs = call.attrs
    if call.args[0].checked_type.dtype != "uint8" or weight.dtype != np.int8:
        return Reject(f"not uint8 x int8 ({call.args[0].checked_type.dtype} x {weight.dtype})")
    if attrs.out_dtype not in ("int32", ""):
        return Reject(f"output {attrs.out_dtype}, not int32")
    if int(attrs.groups) != 1:
        return Reject(f"grouped conv ({int(attrs.groups)} groups): TVM's int8 template is for groups=1")
    if weight.ndim != 7 or not _KERNEL_LAYOUT.match(str(attrs.kernel_layout)):
        return Reject(f"kernel layout {attrs.kernel_layout} is not TVM's int8 OIHW{{i}}i{{o}}o4i")
    if pairs_fit_int16(weight):
        return Reject("every weight pair fits int16: vpmaddubsw is exact")
    return True



def _constant_kernel(call) -> tuple | Reject:
    """``(kernel array,)`` of a conv to pack in pairs, or the reason it is not packed."""
    weight = call.args[1].data.numpy()
    ok = _pairs_check(call, weight)
    return (weight,) if ok else ok


def _packed(call, found):
    (weight,) = found
    attrs = call.attrs
    ic_quads, oc_bn = (int(v) for v in _KERNEL_LAYOUT.match(str(attrs.kernel_layout)).groups())
    return relay.nn.contrib_conv2d_nchwc(
        call.args[0], relay.const(pair_kernel(weight).astype(np.int16)), strides=attrs.strides, padding=attrs.padding,
        dilation=attrs.dilation, groups=attrs.groups, channels=attrs.channels, kernel_size=attrs.kernel_size,
        data_layout=attrs.data_layout, kernel_layout=f"OIHW{2 * ic_quads}i{oc_bn}o2i", out_layout=attrs.out_layout,
        out_dtype=attrs.out_dtype)


#: The pass's rule table.
RULES = (
    # conv(x: u8, w: const i8[..., ic/4, oc, 4]) -> conv(x, int16(pair_kernel(w)): i16[..., ic/2, oc, 2])
    #   where some pair of w can saturate vpmaddubsw's int16 (not pairs_fit_int16(w))
    Rule(f"{PASS_NAME}.conv2d_NCHWc", lambda: dfp.is_op("nn.contrib_conv2d_NCHWc")(dfp.wildcard(), dfp.is_constant()),
         _constant_kernel, _packed),
)


class _Driver(dfp.DFPatternCallback):
    """Runs :data:`RULES` through TVM's rewriter: the checks read the typed call (``pre``), the
    rewrite builds on the rewritten inputs (``post``)."""

    def __init__(self):
        super().__init__(require_type=True)
        self.pattern = RULES[0].pattern()
        self.count = 0

    def callback(self, pre, post, node_map):
        found = first_rewrite(RULES, pre, logger)
        if not found:
            return post
        self.count += 1
        return found.rule.rewrite(post, found.found)


def PairPackInt8Convs():  # noqa: N802  (a pass factory, named as the pass)
    """Pack the kernels of int8 NCHWc convs whose ``vpmaddubsw`` pairs can saturate in pairs of input
    channels, widened to int16 (the same values), for the exact int16 ``vpmaddwd`` kernel.

    Runs on the module after relay.build's prefix (AlterOpLayout's ``nn.contrib_conv2d_NCHWc`` with
    constant kernels ``OIHW{i}i{o}o4i``). Convs whose pairs fit int16, that are not uint8 x int8,
    grouped, or already packed in pairs are kept (logged at DEBUG with the reason); untyped modules
    are typed first. Pure and idempotent.

    Returns
    -------
    tvm.transform.Pass
    """

    @relay.transform.function_pass(opt_level=0, name=PASS_NAME)
    def pair_pack(func, mod, ctx):
        driver = _Driver()
        out = dfp.rewrite(driver, func)
        if not driver.count:
            return func
        logger.info("%s: %d int8 conv(s) packed in pairs (exact int16 vpmaddwd)", PASS_NAME, driver.count)
        return out

    return tvm.transform.Sequential([relay.transform.InferType(), pair_pack], name=PASS_NAME)
