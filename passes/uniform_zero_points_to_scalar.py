"""UniformZeroPointsToScalar: a QNN zero-point vector whose entries are all equal becomes a scalar.

Rewrites::

    # op(..., zp = const([c, c, ..., c]), ...)  ->  op(..., zp = const(c), ...)
    #     (the op broadcasts a scalar zero point over the axis: same numbers, same result)

As data: :data:`RULES`, one ``tvm.relay.dataflow_pattern`` rule per op of :data:`ZERO_POINT_ARGS`.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``UniformZeroPointsToScalar``.
"""
from __future__ import annotations

from tvm import relay
from tvm.relay import dataflow_pattern as dfp

from tvm_ext._rules import Rule, rewrites
from ._registry import register_pass

from ._doc import factory_sections
from ._util import Check, Reject, pass_logger, substitution_pass

__all__ = ["UniformZeroPointsToScalar", "ZERO_POINT_ARGS", "RULES"]

PASS_NAME = "UniformZeroPointsToScalar"
_log = pass_logger(PASS_NAME)

#: QNN op -> (number of arguments, positions of its zero-point arguments) in TVM 0.19's order.
ZERO_POINT_ARGS = {
    "qnn.conv2d": (6, (2, 3)),  # data, kernel, input_zp, kernel_zp, input_scale, kernel_scale
    "qnn.conv2d_transpose": (6, (2, 3)),
    "qnn.dense": (6, (2, 3)),
    "qnn.batch_matmul": (6, (2, 3)),
    "qnn.requantize": (5, (2, 4)),  # data, input_scale, input_zp, output_scale, output_zp
    "qnn.quantize": (3, (2,)),  # data, output_scale, output_zp
    "qnn.dequantize": (3, (2,)),  # data, input_scale, input_zp
    "qnn.add": (8, (3, 5, 7)),  # lhs, rhs, lhs_scale, lhs_zp, rhs_scale, rhs_zp, out_scale, out_zp
    "qnn.subtract": (8, (3, 5, 7)),
    "qnn.mul": (8, (3, 5, 7)),
}


def _check(zp) -> Check:
    if not isinstance(zp, relay.Constant):
        return Reject(f"zero point is a {type(zp).__name__}, not a constant")
    value = zp.data.numpy()
    if value.ndim == 0:
        return Reject("zero point is already a scalar")
    if value.size == 0:
        return Reject("zero point is an empty tensor")
    flat = value.reshape(-1)
    if not (flat == flat[0]).all():
        return Reject(f"zero points differ across the axis ({int(flat.min())} .. {int(flat.max())})")
    return True


def _uniform_zero_points(positions, rule_name):
    """The rule's check: the positions among ``positions`` that hold a uniform constant zero-point
    vector (each other one logged with its reason), or a Reject when none does."""
    def check(call):
        changed = []
        for i in positions:
            ok = _check(call.args[i])
            if not ok:
                _log.debug("%s: arg %d not rewritten: %s", rule_name, i, ok)
                continue
            changed.append(i)
        if not changed:
            return Reject("no zero point is a uniform constant vector")
        return changed

    return check


def _scalar_zero_points(rule_name):
    """The rule's rewrite: ``call`` reading each uniform zero-point vector the check found as its scalar."""
    def rewrite(call, changed):
        args = list(call.args)
        for i in changed:
            value = args[i].data.numpy()
            args[i] = relay.const(value.reshape(-1)[0], dtype=str(value.dtype))
        _log.info("%s: zero point(s) at %s are uniform vectors: now scalars", rule_name, changed)
        return relay.Call(call.op, args, call.attrs, call.type_args, call.span)

    return rewrite


def _rule(op: str, arity: int, positions: tuple) -> Rule:
    name = f"{PASS_NAME}.{op}"
    return Rule(name, lambda: dfp.is_op(op)(*(dfp.wildcard() for _ in range(arity))),
                _uniform_zero_points(positions, name), _scalar_zero_points(name))


#: One rule per op of :data:`ZERO_POINT_ARGS`, each
#: ``# op(..., zp = const([c, c, ..., c]), ...) -> op(..., zp = const(c), ...)`` at its zero-point positions.
RULES = tuple(_rule(op, arity, positions) for op, (arity, positions) in ZERO_POINT_ARGS.items())


def _collect(nodes, users, body) -> dict:
    """Each QNN call with a uniform zero-point vector, reading the scalar instead."""
    return rewrites(nodes, RULES, _log)


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def UniformZeroPointsToScalar():  # pylint: disable=invalid-name
    """Replace QNN zero-point vectors whose entries are all equal by the scalar.

    ``qnn.conv2d(x, w, zp_x, const([0, 0, ..., 0]), s_x, s_w)`` becomes
    ``qnn.conv2d(x, w, zp_x, const(0), s_x, s_w)``; likewise the zero points of ``qnn.dense``,
    ``qnn.batch_matmul``, ``qnn.conv2d_transpose``, ``qnn.requantize``, ``qnn.quantize``,
    ``qnn.dequantize``, ``qnn.add``, ``qnn.subtract`` and ``qnn.mul``
    (:data:`ZERO_POINT_ARGS`). Bit-exact: a scalar zero point is broadcast over the axis. With
    a scalar zero weight point TVM's QNN canonicalization drops the ``zp_w * sum(x)`` term, so
    per-channel quantized convs lose three kernels each (channel sum, window average, multiply).

    Run it before relay.build's prefix: stage ``"start"`` of :func:`tvm_ext.build`.

    Notes
    -----
    Zero points that are not constants, already scalar, or differ across the axis are left
    unchanged, as are functions with ``If``/``Let``/``Match``/references/closures; each reason is
    logged at DEBUG on ``tvm_ext.passes.UniformZeroPointsToScalar``.
    """
    return substitution_pass(PASS_NAME, _collect)
