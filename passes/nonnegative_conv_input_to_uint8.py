"""NonNegativeConvInputToUint8: feed int8 convolutions uint8 data when the data is provably >= 0.

Rewrites::

    # conv2d(stop*(cast(v, i8)), w: i8),  range(v) ⊆ [0, 127]
    #     -> conv2d(stop*(cast(v, u8)), w)          (stop* = any stop_fusion wrappers, kept)

As data: :data:`RULES` (the shared shape, ``tvm_ext._rules.Rule``); any number of barriers is peeled by hand.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``NonNegativeConvInputToUint8``.
"""
from __future__ import annotations

import tvm
from tvm import relay
from tvm.relay import dataflow_pattern as dfp

from tvm_ext._rules import Rule, first_rewrite
from ._registry import register_pass
from tvm_ext.x86.isa import isa_class

from ._doc import factory_sections
from ._intervals import value_ranges
from ._util import Check, Reject, op_calls, op_name, pass_logger, static_tensor_type, substitution_pass

__all__ = ["NonNegativeConvInputToUint8", "RULES"]

PASS_NAME = "NonNegativeConvInputToUint8"
RULE = f"{PASS_NAME}.conv2d_data"
_log = pass_logger(PASS_NAME)
_STOP = "annotation.stop_fusion"


def _peel(data):
    """``(v, cast, stops)``: data = stop*(cast(v, t)); stops outermost first. ``cast`` None if no cast."""
    stops = []
    node = data
    while isinstance(node, relay.Call) and op_name(node) == _STOP:
        stops.append(node)
        node = node.args[0]
    if isinstance(node, relay.Call) and op_name(node) == "cast":
        return node.args[0], node, stops
    return None, None, stops


def _check(conv, ranges) -> Check:
    attrs = conv.attrs
    if int(attrs.groups) != 1:
        return Reject(f"groups={int(attrs.groups)}: the x86 legalization does not shift grouped convs")
    if any(int(d) != 1 for d in attrs.dilation):
        return Reject(f"dilation {list(map(int, attrs.dilation))}: the x86 legalization does not shift it")
    data, weight = conv.args
    ok = static_tensor_type(data)
    if not ok:
        return Reject(f"conv data: {ok}")
    ddt, wdt = str(data.checked_type.dtype), str(weight.checked_type.dtype)
    if ddt != "int8":
        return Reject(f"data is {ddt}, not int8: nothing to retype")
    if wdt != "int8":
        return Reject(f"weight is {wdt}, not int8: the legalization does not shift this conv")
    v, cast, _ = _peel(data)
    if cast is None:
        return Reject("data is not (stop_fusion of) a cast to int8: no value to recast")
    lo, hi = ranges.get(v, (None, None))
    if lo is None or lo < 0 or hi > 127:
        return Reject(f"cannot prove the cast's input in [0, 127]: range [{lo}, {hi}]")
    return True


def _conv(data):
    return dfp.is_op("nn.conv2d")(data, dfp.wildcard())


def _proven_nonnegative(conv, ranges, new_data) -> Check:
    """The rules' check: :func:`_check`."""
    return _check(conv, ranges)


def _uint8_data(conv, found, ranges, new_data):
    """The rules' rewrite: ``conv`` reading stop*(cast(v, u8)) for its data stop*(cast(v, i8)) (the
    same barriers; one new data node per old one, shared by the convs reading it)."""
    data = conv.args[0]
    if data not in new_data:
        v, _, stops = _peel(data)
        expr = relay.cast(v, "uint8")
        for _stop in reversed(stops):  # innermost first
            expr = relay.annotation.stop_fusion(expr)
        new_data[data] = expr
    return relay.Call(conv.op, [new_data[data], conv.args[1]], conv.attrs, conv.type_args, conv.span)


#: Ordered rules, with the checks of :func:`_check`: groups 1, dilation 1, int8 data and weight,
#: ``range(v)`` within [0, 127] by the function's value ranges.
RULES = (
    # conv2d(cast(v, i8), w: i8)               -> conv2d(cast(v, u8), w)
    Rule(f"{PASS_NAME}.conv2d_data", lambda: _conv(dfp.is_op("cast")(dfp.wildcard())),
         _proven_nonnegative, _uint8_data, depth=2),
    # conv2d(stop*(cast(v, i8)), w: i8)        -> conv2d(stop*(cast(v, u8)), w)
    #     (stop* = one or more stop_fusion barriers, kept; peeled by hand: a pattern has no repetition)
    Rule(f"{PASS_NAME}.conv2d_data_behind_barriers", lambda: _conv(dfp.is_op(_STOP)(dfp.wildcard())),
         _proven_nonnegative, _uint8_data, depth=2),
)


def _collect(nodes, users, body) -> dict:
    """Each conv2d whose int8 input is proven in [0, 127], reading it as uint8 (x86 targets only)."""
    tgt = tvm.target.Target.current(allow_none=True)
    if tgt is not None and isa_class(tgt) == "other":
        # aarch64's dot products are int8 x int8: a uint8 input would get the shift back (QNN legalization)
        _log.debug("skipped: target %s is not x86 (uint8 x int8 is x86's instruction form)", tgt)
        return {}
    ranges = value_ranges(nodes)
    subst: dict = {}
    new_data: dict = {}  # old data arg -> new data arg (shared by every conv reading it)
    for node in op_calls(nodes, ("nn.conv2d",)):
        found = first_rewrite(RULES, node, _log, ranges, new_data)
        if not found:
            _log.debug("%s: not rewritten: %s", RULE, found)
            continue
        subst[node] = found.new
        _log.info("%s: conv2d reads uint8 data (input proven in [0, 127])", found.rule.name)
    return subst


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def NonNegativeConvInputToUint8():  # pylint: disable=invalid-name
    """Retype an int8 conv input proven to lie in ``[0, 127]`` as uint8, so x86 needs no shift.

    ``conv2d(cast(v, int8), w_int8)`` becomes ``conv2d(cast(v, uint8), w_int8)`` when interval
    analysis proves ``0 <= v <= 127`` (stop_fusion wrappers around the cast are kept). The values
    are the same, so the result is bit-identical; on x86 the conv2d legalization then inserts no
    ``+128`` shift, no explicit ``nn.pad`` and no compensation subtract (one kernel and one
    padded copy fewer per such conv).

    Run it before ``Legalize``: stage ``"start"`` of :func:`tvm_ext.build`.

    Notes
    -----
    Skipped (every function) when the current target is not x86: aarch64's dot products take
    int8 x int8, so its legalization would shift the uint8 input back. Grouped or dilated convs,
    non-int8 operands, data that is not a cast, ranges that cannot be
    proven and dynamic shapes are left unchanged, as are functions with ``If``/``Let``/``Match``/
    references/closures; each reason is logged at DEBUG on
    ``tvm_ext.passes.NonNegativeConvInputToUint8``.
    """
    return substitution_pass(PASS_NAME, _collect)
