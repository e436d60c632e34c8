"""How far each graph output may move when every 8-bit level a ``qnn.quantize`` writes moves.

``QDQToInteger`` is approximate by design: a quantize point of the rewritten graph may hold a
level ``steps`` away from the float graph's. What that does to an output depends on the path: a
requantize divides the move by its scale ratio, a conv multiplies it by the sum of its kernel's
magnitudes. :func:`output_bounds` follows the move from every quantize point to the outputs, one
rule per op, each the op's worst case over its inputs' moves ``e`` (in the units of each tensor)::

    quantize(x, s)              steps + e(x) / s                 (new rounding, then the level moves)
    dequantize(x, s)            e(x) * s
    requantize(x, si, so)       e(x) * si / so + 1               (+1: one more rounding, when e > 0)
    conv2d(x, w) / dense(x, w)  e(x) * max over outputs of sum |w - wzp|   (w a constant)
    add / subtract / bias_add   e(a) + e(b)
    multiply(x, c) / divide(x, c)   e(x) * max |c| / e(x) / min |c| (+1 integer)   (c a constant)
    round, floor, float -> int cast, right_shift(x, k), fixed_point_multiply, int avg pool
                                e(x) (scaled) + 1
    relu, clip, max/min, max pool, float avg pool, data movement,
    an int cast that keeps every value (wider, or after a clip into its range)   e(x)

Constants and inputs move by 0. An op without a rule, a product of two moving tensors, or
arithmetic on 8- or 16-bit integers (it wraps around) gives None: the oracle then keeps its fixed
tolerance for that output (``compare.QDQ_STEPS`` levels). int32 arithmetic is taken not to overflow.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["output_bounds"]

#: ops whose output moves at most as far as their first argument's (data movement, 1-Lipschitz maps)
_SAME = frozenset({
    "nn.relu", "clip", "maximum", "minimum", "nn.max_pool2d", "nn.global_max_pool2d", "reshape", "transpose",
    "layout_transform", "nn.batch_flatten", "squeeze", "expand_dims", "strided_slice", "nn.pad", "copy",
    "annotation.stop_fusion", "negative", "abs", "sigmoid", "tanh", "split", "tile", "repeat",
    "nn.depth_to_space", "nn.space_to_depth", "reverse",
})
#: arithmetic that wraps around in 8- and 16-bit integers (no bound there; int32 sums of 8-bit values do not)
_WRAPPING = frozenset({"add", "subtract", "nn.bias_add", "multiply", "divide", "negative", "abs", "nn.avg_pool2d",
                       "nn.global_avg_pool2d", "nn.adaptive_avg_pool2d"})
#: ops that round once more: their output may move one more step than the (scaled) argument
_ROUNDING = frozenset({"round", "floor", "ceil", "trunc"})
#: pools that average: no further than the argument, plus a rounding for integer dtypes
_AVERAGES = frozenset({"nn.avg_pool2d", "nn.global_avg_pool2d", "nn.adaptive_avg_pool2d"})


def output_bounds(mod, steps: float) -> list:
    """Per graph output (tuples flattened as the graph executor returns them): the most the output
    can move when every ``qnn.quantize`` output moves ``steps`` levels, or None where no rule bounds it."""
    import tvm
    from tvm import relay

    from tvm_ext.passes._util import op_name, post_order

    mod = relay.transform.InferType()(mod)
    moves: dict = {}
    for node in post_order(mod["main"].body):
        if isinstance(node, (relay.Var, relay.Constant)):
            moves[node] = 0.0
        elif isinstance(node, relay.Tuple):
            moves[node] = [moves[f] for f in node.fields]
        elif isinstance(node, relay.TupleGetItem):
            inner = moves[node.tuple_value]
            moves[node] = inner[node.index] if isinstance(inner, list) else inner
        elif isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op):
            moves[node] = _call(op_name(node), node, [moves[a] for a in node.args], steps)
        else:
            moves[node] = None

    def leaves(expr):
        if isinstance(expr, relay.Tuple):
            return [leaf for f in expr.fields for leaf in leaves(f)]
        return [expr]

    out = []
    for leaf in leaves(mod["main"].body):
        m = moves[leaf]
        out.extend(m if isinstance(m, list) else [m] * _arity(leaf))
    return [None if m is None or isinstance(m, list) or not math.isfinite(m) else float(m) for m in out]


def _arity(expr) -> int:
    """How many outputs the graph executor returns for ``expr`` (a tuple-typed call returns its fields)."""
    from tvm import relay

    ty = expr.checked_type
    return len(ty.fields) if isinstance(ty, relay.TupleType) else 1


def _const(expr):
    """The numpy value of a constant argument, else None."""
    from tvm import relay

    return expr.data.numpy().astype(np.float64) if isinstance(expr, relay.Constant) else None


def _rounded(e: float) -> float:
    """A move of ``e`` before one more rounding."""
    return e + 1.0 if e > 0 else 0.0


def _weight_sum(w, zp, out_axis: int) -> float:
    """The largest sum of ``|w - zp|`` over one output's reduction (the axis ``out_axis`` kept)."""
    mag = np.abs(w - (0.0 if zp is None else zp))
    return float(np.moveaxis(mag, out_axis, 0).reshape(mag.shape[out_axis], -1).sum(axis=1).max(initial=0.0))


def _anchor(name, call, e, moves_w) -> float | None:
    """conv2d / dense: the data's move times the kernel's largest sum of magnitudes (constant kernels)."""
    if e == 0 and moves_w == 0:
        return 0.0
    w = _const(call.args[1])
    if w is None or moves_w != 0:
        return None
    qnn = name.startswith("qnn.")
    zp = _const(call.args[3]) if qnn else None
    if zp is not None and zp.size != 1:  # per-output zero points lie along the kernel's output axis
        layout = "OI" if "dense" in name else str(call.attrs.kernel_layout)
        zp = zp.reshape([-1 if c == "O" else 1 for c in layout])
    if "dense" in name:
        return e * _weight_sum(w, zp, 0)
    return e * _weight_sum(w, zp, str(call.attrs.kernel_layout).index("O"))


def _narrow_int(call) -> bool:
    """Whether ``call``'s result is an integer tensor of fewer than 32 bits."""
    dtype = str(call.checked_type.dtype)
    return dtype.startswith(("int", "uint")) and np.iinfo(dtype).bits < 32


def _fits(arg, src: str, to: str) -> bool:
    """Whether an integer cast from ``src`` to ``to`` keeps every value ``arg`` can hold: ``to``
    holds ``src``'s range, or ``arg`` is a clip into ``to``'s range."""
    from tvm_ext.passes._util import op_name

    try:
        lo, hi = np.iinfo(to).min, np.iinfo(to).max
        if np.iinfo(src).min >= lo and np.iinfo(src).max <= hi:
            return True
    except ValueError:  # bool
        return False
    return op_name(arg) == "clip" and lo <= float(arg.attrs.a_min) and float(arg.attrs.a_max) <= hi


def _call(name, call, args, steps) -> float | None:  # noqa: C901  (one rule per op, as the module note lists)
    if name == "concatenate":  # its one argument is the tuple of the joined tensors
        parts = args[0] if isinstance(args[0], list) else [args[0]]
        return None if any(p is None or isinstance(p, list) for p in parts) else max(parts, default=0.0)
    if not args or args[0] is None or isinstance(args[0], list) or name is None:
        return None
    e = args[0]
    others = [a for a in args[1:] if a is not None and not isinstance(a, list)]
    if name in _WRAPPING and _narrow_int(call) and (e or any(others)):
        return None  # 8- and 16-bit integer arithmetic wraps around
    if name == "qnn.quantize":
        scale = _const(call.args[1])
        return None if scale is None else steps + e / float(np.abs(scale).min())
    if name == "qnn.dequantize":
        scale = _const(call.args[1])
        return None if scale is None else e * float(np.abs(scale).max())
    if name == "qnn.requantize":
        si, so = _const(call.args[1]), _const(call.args[3])
        return None if si is None or so is None else _rounded(e * float(np.abs(si).max() / np.abs(so).min()))
    if name in ("qnn.conv2d", "nn.conv2d", "qnn.dense", "nn.dense"):
        return _anchor(name, call, e, args[1])
    if name in ("add", "subtract", "nn.bias_add"):
        return None if len(others) != 1 else e + others[0]
    if name == "qnn.add":
        sa, sb, so = (_const(call.args[i]) for i in (2, 4, 6))
        if sa is None or sb is None or so is None or len(others) < 1 or not isinstance(args[1], float):
            return None
        return _rounded((e * float(np.abs(sa).max()) + args[1] * float(np.abs(sb).max())) / float(np.abs(so).min()))
    if name in ("multiply", "divide"):
        c, moving = _const(call.args[1]), e
        if c is None and name == "multiply":
            c, moving = _const(call.args[0]), args[1]
        if c is None or moving is None or isinstance(moving, list):
            return 0.0 if e == 0 and args[1] == 0 else None
        if name == "multiply":
            return moving * float(np.abs(c).max())
        quotient = moving / float(np.abs(c).min())
        return quotient if str(call.checked_type.dtype).startswith("float") else _rounded(quotient)  # truncation
    if name == "right_shift":
        k = _const(call.args[1])
        return None if k is None else _rounded(e / 2.0 ** float(k.min()))
    if name == "fixed_point_multiply":
        return _rounded(e * int(call.attrs.multiplier) * 2.0 ** (int(call.attrs.shift) - 31))
    if name == "cast":
        to, src = str(call.checked_type.dtype), str(call.args[0].checked_type.dtype)
        if to.startswith("float") or src.startswith("float"):
            return _rounded(e) if src.startswith("float") and not to.startswith("float") else e
        return e if _fits(call.args[0], src, to) else None  # a narrowing cast wraps around
    if name in _ROUNDING:
        return _rounded(e)
    if name in _AVERAGES:
        return e if str(call.checked_type.dtype).startswith("float") else _rounded(e)
    if name in _SAME:
        return None if len(others) != len(args) - 1 else max([e] + others)
    return None
