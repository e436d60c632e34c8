"""RoundHalfToEven: Relay's ``round`` (ties away from zero) becomes round-half-to-even.

Rewrites::

    # round(v) -> tvm_ext.round_half_to_even(v)     (ties go to the even neighbour)
    # round(divide(x, c)) -> the above of divide(x, const([c]))     (c a float scalar constant)
    #     (a true division, as ONNX's QuantizeLinear defines x / y_scale)
    # round(add(v, z)) -> add(<the above of v>, z)       (z an integer-valued float scalar constant)
    #     (a zero point added after rounding, as ONNX Runtime's requantize does)

    # f(a...) with f = fn(p...) {...round(v)...} Primitive=1
    #     -> f'(a..., k...) with f' = fn(p..., q...) {...rne(v)...} Primitive=1

As data: :data:`RULES` (the shared shape, ``tvm_ext._rules.Rule``), applied inside ``Primitive`` groups too.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``RoundHalfToEven``.
"""
from __future__ import annotations

from tvm import relay
from tvm.relay import dataflow_pattern as dfp

from tvm_ext.ops import round_half_to_even  # the replacement (re-exported: AddAsOnnxRuntime, tests)
from tvm_ext._rules import Rule, rewrites
from ._registry import register_pass

from ._doc import factory_sections
from ._util import (Check, Reject, is_primitive, lift_constants, op_name, pass_logger, post_order, rebuild,
                    substitution_pass, with_body)

__all__ = ["RoundHalfToEven", "RULES"]

PASS_NAME = "RoundHalfToEven"
RULE = f"{PASS_NAME}.round"
_log = pass_logger(PASS_NAME)
_FLOATS = ("float32", "float64")


def _check(call) -> Check:
    dtype = getattr(call.checked_type, "dtype", None)
    if dtype not in _FLOATS:
        return Reject(f"round of {dtype} (only {'/'.join(_FLOATS)} are rewritten)")
    return True


def _true_division(v):
    """``divide(x, const([c]))`` for ``v = divide(x, c)``, ``c`` a float scalar constant and ``x`` of rank
    >= 1 (TIR would multiply by ``1 / c``; a one-element tensor it divides by); else a Reject."""
    c = v.args[1].data.numpy()
    if c.ndim != 0:
        return Reject("the divisor is not a scalar")
    if len(v.args[0].checked_type.shape) == 0:
        return Reject("the dividend is a scalar")
    _log.debug("%s: divide by the scalar constant %r kept a true division", RULE, float(c))
    return relay.divide(v.args[0], relay.const(c.reshape(1), str(c.dtype)))  # (float64 stays float64)


def _rounded(v):
    """rne(v), a rounded division by a scalar constant kept a true division."""
    if isinstance(v, relay.Call) and op_name(v) == "divide" and isinstance(v.args[1], relay.Constant):
        kept = _true_division(v)
        if kept:
            return round_half_to_even(kept)
    return round_half_to_even(v)


def _integer_zero_point(call):
    """Check: ``(v, z)`` for ``call = round(add(v, z))`` (either order), ``z`` an integer-valued
    float scalar constant; else a Reject."""
    ok = _check(call)
    if not ok:
        return ok
    add = call.args[0]
    for i in (1, 0):
        z = add.args[i]
        if isinstance(z, relay.Constant) and z.data.numpy().ndim == 0:
            value = float(z.data.numpy())
            if value == int(value):
                return add.args[1 - i], z
    return Reject("no integer-valued scalar constant is added")


def _zero_point_after(call, found):
    """``add(rne(v), z)`` for ``call = round(add(v, z))``."""
    v, z = found
    return relay.add(_rounded(v), z)


def _scalar_division(call):
    """Check: ``round(divide(x, c))`` keeps a true division (see :func:`_true_division`)."""
    ok = _check(call)
    if not ok:
        return ok
    return _true_division(call.args[0])


def _divide(call, kept):
    return round_half_to_even(kept)


def _round(call, found):
    return round_half_to_even(call.args[0])


#: Ordered rules (order is priority), tried on each float ``round``:
RULES = (
    # round(add(v, z)) -> add(rne(v), z)       z an integer-valued float scalar constant; v may be a division below
    Rule(f"{PASS_NAME}.zero_point_after", lambda: dfp.is_op("round")(dfp.is_op("add")(dfp.wildcard(), dfp.wildcard())),
         _integer_zero_point, _zero_point_after, depth=2),
    # round(divide(x, c)) -> rne(divide(x, const([c])))     c a float scalar constant, rank(x) >= 1
    Rule(f"{PASS_NAME}.true_divide", lambda: dfp.is_op("round")(dfp.is_op("divide")(dfp.wildcard(), dfp.is_constant())),
         _scalar_division, _divide, depth=2),
    # round(v) -> rne(v)                        v float32 or float64
    Rule(RULE, lambda: dfp.is_op("round")(dfp.wildcard()), _check, _round),
)


def _rounds(nodes) -> dict:
    """Each float ``round`` among ``nodes``, replaced by rounding half to even."""
    return rewrites(nodes, RULES, _log)


def _group_calls(nodes) -> tuple[dict, int]:
    """Each call of a ``Primitive`` function whose body rounds, replaced by the call of the rewritten
    function (docs/passes.md, "Inside groups"; new non-scalar constants become parameters), and the
    number of rounds rewritten inside them."""
    subst: dict = {}
    rounds = 0
    for node in nodes:
        if not (isinstance(node, relay.Call) and isinstance(node.op, relay.Function) and is_primitive(node.op)):
            continue
        fn = node.op
        inner = _rounds(post_order(fn.body))
        if not inner:
            continue
        lifted, consts = lift_constants(with_body(fn, rebuild(fn.body, inner)))
        subst[node] = relay.Call(lifted, [*node.args, *consts], node.attrs, node.type_args, node.span)
        rounds += len(inner)
    return subst, rounds


def _collect(nodes, users, body) -> dict:
    """Each round, in the function and inside its ``Primitive`` groups, replaced by rounding half to even."""
    subst = _rounds(nodes)
    groups, inside = _group_calls(nodes)
    if subst or groups:
        _log.info("%s: %d round(s) now round half to even (%d of them inside %d Primitive group(s))", RULE,
                  len(subst) + inside, inside, len(groups))
    return {**subst, **groups}


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def RoundHalfToEven():  # pylint: disable=invalid-name
    """Make every float ``round`` round halfway cases to even, as ONNX and ONNX Runtime do.

    TVM's ``round`` (and so its lowered ``qnn.quantize``, ``clip(round(x / s) + zp)``) rounds
    ties away from zero; ONNX's ``Round`` and ``QuantizeLinear`` round them to even. Each
    ``round(v)`` becomes ``tvm_ext.round_half_to_even(v)`` (one ``nearbyint`` per element, as
    ``vroundps``): equal to ``round(v)`` except on exact ties, elementwise
    (it fuses with its neighbours). A rounded ``divide(x, c)`` by a scalar float constant gets
    the divisor as a one-element tensor, so TIR keeps a true division instead of multiplying by
    ``1 / c`` (ONNX's ``QuantizeLinear`` divides); ``round(v + zp)`` with an integer scalar
    constant ``zp`` (TVM's float requantize) becomes ``rne(v) + zp``, as ONNX Runtime adds the
    zero point after rounding. The rounds inside ``Primitive`` functions made before it (the pool
    groups of ``FuseWideningIntoPool``) are rewritten too, the group's new non-scalar constants passed
    in as parameters. Part of ``tvm_ext.core.pipelines.int8(numerics="onnxruntime")``.

    Run it after QNN ops are lowered: stage ``"before_fuse"`` of :func:`tvm_ext.build`.

    Notes
    -----
    Non-float ``round`` calls and functions with ``If``/``Let``/``Match``/references/closures are
    left unchanged; each reason is logged at DEBUG on ``tvm_ext.passes.RoundHalfToEven``.
    """
    return substitution_pass(PASS_NAME, _collect)
