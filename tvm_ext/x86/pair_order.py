"""``OrderChannelsInSafePairs``: channels reordered so that int8 convs can keep ``vpmaddubsw`` exactly.

Without VNNI an x86 int8 conv multiplies with ``vpmaddubsw``, which adds each two neighbouring
uint8 x int8 products in int16 and saturates; a conv with one unsafe pair of neighbouring input
channels (:func:`tvm_ext.x86.exact_dot.pairs_fit_int16`) takes the exact int16 form instead, half the
products per instruction. Which channels are neighbours is only an order: renumbering a tensor's
channels in the convs that write it, the per-channel constants on the way and the convs that read
it computes the same values, and for quantized trained weights an order in which every pair is
safe usually exists (:mod:`tvm_ext.x86._pairing` finds one when there is one).

A channel group is a set of NCHW tensors that share one order: joined through elementwise and
broadcast ops, ``annotation.stop_fusion``, per-channel QNN (re)quantize, ``nn.pad`` (not on channels),
2-D pools and the flattening of ``N x C x 1 x 1`` to ``N x C``. Convs write it (any dtype); integer
convs read it and their pairs choose the order; a dense of the flattened channels follows it in its
input columns. A group keeps its order (why, at DEBUG) when a tensor of it is a function input,
output or constant or meets another op, or when no order suits every reading conv
(docs/x86-kernels.md)::

    # conv_r(g(conv_w(x, W)), V) -> conv_r(g'(conv_w(x, W[P])), V[:, P])
    #   g: elementwise / broadcast / pad / pool / flatten chain, its per-channel constants c -> c[P]
    #   dense(flatten(g(...)), D) -> dense(flatten(g'(...)), D[:, P])
    #   P: an order in which every (P[2p], P[2p + 1]) is a safe vpmaddubsw pair of every reading conv

Run by the x86 back end at the start of builds whose int8 dot product saturates (:func:`orders_pairs`),
before ``PairPackInt8Convs``. Pure and idempotent; an untyped module is typed first.
"""
from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relay
from tvm.relay import dataflow_pattern as dfp

from .._op_pattern import op_name
from .._reject import Reject
from ..ops import ROUND_HALF_TO_EVEN, TABLE_LOOKUP
from ._pairing import compatible, fits_in_order, pair_order

logger = logging.getLogger(__name__)

__all__ = ["OrderChannelsInSafePairs", "orders_pairs"]

PASS_NAME = "OrderChannelsInSafePairs"

#: Elementwise and broadcast ops: output channel ``c`` reads channel ``c`` of each operand (numpy
#: broadcasting), every operand a tensor.
_ELEMENTWISE = frozenset({
    "cast", "clip", "nn.relu", "nn.leaky_relu", "fixed_point_multiply", "round", "floor", "ceil", "trunc",
    "negative", "abs", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "erf", "copy", ROUND_HALF_TO_EVEN,
    "add", "subtract", "multiply", "divide", "floor_divide", "maximum", "minimum", "right_shift", "left_shift",
    "power", "where", "greater", "greater_equal", "less", "less_equal", "equal", "not_equal", "annotation.stop_fusion",
})
#: Pools that keep channels apart in their ``layout`` attribute (NCHW only).
_POOLS = frozenset({"nn.max_pool2d", "nn.avg_pool2d", "nn.global_avg_pool2d", "nn.global_max_pool2d"})
#: What each argument of the other channel-keeping ops is: "tensor" (as an elementwise operand),
#: "vector" (per-channel along the op's ``axis``, or one value), "scalar" (one value), "skip" (not
#: indexed by channel: a lookup table, a pad value).
_ROLES = {
    "nn.bias_add": ("tensor", "vector"),
    "qnn.requantize": ("tensor", "vector", "vector", "vector", "vector"),
    "qnn.quantize": ("tensor", "vector", "vector"),
    "qnn.dequantize": ("tensor", "vector", "vector"),
    "qnn.add": ("tensor", "tensor") + ("scalar",) * 6,
    "qnn.subtract": ("tensor", "tensor") + ("scalar",) * 6,
    "qnn.mul": ("tensor", "tensor") + ("scalar",) * 6,
    "nn.pad": ("tensor", "skip"),
    TABLE_LOOKUP: ("tensor", "skip"),
}
#: Convs whose channels can be renumbered, and the arguments of each that hold values per output
#: channel (kernel scale and zero point of ``qnn.conv2d``).
_CONVS = {"nn.conv2d": (), "qnn.conv2d": (3, 5)}
#: Denses whose input columns can be renumbered (their per-unit arguments do not move).
_DENSES = frozenset({"nn.dense", "qnn.dense"})
#: Ops that give an ``N x C x 1 x 1`` tensor as ``N x C``, channel ``c`` as column ``c``.
_FLATTENS = frozenset({"nn.batch_flatten", "reshape", "squeeze"})


def orders_pairs(target) -> bool:
    """True when ``tvm_ext.build`` runs :func:`OrderChannelsInSafePairs` for ``target``: its int8
    convs use ``vpmaddubsw`` (TVM's x86 int8 kernels need SSE4.2) and saturate
    (:func:`tvm_ext.x86.pair_pack.packs_pairs`)."""
    from .isa import llvm_features
    from .pair_pack import packs_pairs

    return packs_pairs(target) and "sse4.2" in llvm_features(target)


def _shape(node) -> tuple | None:
    ty = getattr(node, "checked_type", None)
    if not isinstance(ty, relay.TensorType) or not all(isinstance(d, tvm.tir.IntImm) for d in ty.shape):
        return None
    return tuple(int(d) for d in ty.shape)


def _dtype(node) -> str:
    return str(node.checked_type.dtype)


def _reorderable_conv(call) -> bool:
    """An NCHW/OIHW ungrouped conv (``nn.conv2d``, ``qnn.conv2d``) with a constant kernel, whose
    per-output-channel arguments are constants: its channels can be renumbered."""
    name = op_name(call)
    if name not in _CONVS or not isinstance(call.args[1], relay.Constant):
        return False
    if any(not isinstance(call.args[i], relay.Constant) for i in _CONVS[name]):
        return False
    a = call.attrs
    shape = _shape(call.args[0])
    return (int(a.groups) == 1 and a.data_layout == "NCHW" and a.kernel_layout == "OIHW"
            and a.out_layout in ("", "NCHW") and shape is not None and len(shape) == 4)


def _reorderable_dense(call) -> bool:
    """A dense (``nn.dense``, ``qnn.dense``) of a 2-D input and a constant 2-D weight."""
    if op_name(call) not in _DENSES or not isinstance(call.args[1], relay.Constant):
        return False
    shape = _shape(call.args[0])
    return shape is not None and len(shape) == 2 and len(call.args[1].data.shape) == 2


def _flattens_channels(call) -> bool:
    """``call`` gives its ``N x C x 1 x 1`` input as ``N x C``: the same values, channel ``c`` in column ``c``."""
    if op_name(call) not in _FLATTENS:
        return False
    shape, out = _shape(call.args[0]), _shape(call)
    return shape is not None and out is not None and len(shape) == 4 and shape[2:] == (1, 1) and out == shape[:2]


class _Groups:
    """Union-find over tensors that must share a channel order, with what each group holds."""

    def __init__(self):
        self.parent: dict = {}
        self.pinned: dict = {}  # node -> why its group keeps its order

    def find(self, node):
        self.parent.setdefault(node, node)
        root = node
        while not self.parent[root].same_as(root):
            root = self.parent[root]
        while not self.parent[node].same_as(root):
            self.parent[node], node = root, self.parent[node]
        return root

    def join(self, a, b):
        a, b = self.find(a), self.find(b)
        if not a.same_as(b):
            self.parent[a] = b

    def pin(self, node, why: str):
        shape = _shape(node)
        if shape is not None and len(shape) in (2, 4):  # NCHW tensors and flattened ones
            self.find(node)
            self.pinned.setdefault(node, why)


def _constant_operand(arg):
    """``arg`` as a Constant when it is one or folds to one (``expand_dims(constant)``), else None."""
    if isinstance(arg, relay.Constant):
        return arg
    if not isinstance(arg, relay.Call) or relay.analysis.free_vars(arg):
        return None
    try:
        folded = relay.transform.FoldConstantExpr(arg, tvm.IRModule())
    except tvm.TVMError:  # not foldable here: the operand is treated as computed at run time
        return None
    return folded if isinstance(folded, relay.Constant) else None


def _roles(call) -> tuple | None:
    """The role of each argument of ``call`` (:data:`_ROLES`), or None when it mixes channels."""
    name = op_name(call)
    if name in _ELEMENTWISE:
        return ("tensor",) * len(call.args)
    if name in _POOLS:
        return ("tensor",) if call.attrs.layout == "NCHW" else None
    if name == "nn.pad" and [int(v) for v in call.attrs.pad_width[1]] != [0, 0]:
        return None
    return _ROLES.get(name)


def _join_operands(call, roles, channels: int, groups: _Groups, constants: list):
    """Join the channel-keeping ``call`` with its tensor operands; note its per-channel constants
    ``(call, argument, constant, axis)`` in ``constants``; pin it where an operand cannot follow."""
    name = op_name(call)
    axis = getattr(call.attrs, "axis", 1) if "vector" in roles else None
    for i, (arg, role) in enumerate(zip(call.args, roles)):
        shape = _shape(arg)
        if role == "skip":
            continue
        if shape is None:
            groups.pin(call, f"{name} has an operand of dynamic shape")
            continue
        size = int(np.prod(shape, dtype=np.int64))
        if role in ("scalar", "vector") and size == 1:
            continue
        const = _constant_operand(arg)
        if role == "scalar" or const is None and role == "vector":
            groups.pin(call, f"{name} has per-channel parameters that are not constants")
            continue
        if role == "vector":
            if int(axis) % 4 != 1 or shape != (channels,):
                groups.pin(call, f"{name}'s parameters run along axis {int(axis)}, not the channels")
            else:
                constants.append((call, i, const, 0))
            continue
        channel_axis = len(shape) - 3 if len(shape) >= 3 else None
        per_channel = channel_axis is not None and shape[channel_axis] == channels
        if const is not None:
            if per_channel:
                constants.append((call, i, const, channel_axis))
        elif len(shape) == 4 and per_channel:
            groups.join(call, arg)
        elif per_channel:
            groups.pin(call, f"{name} has a per-channel operand computed at run time")


def _collect(nodes, body):
    """The channel groups of a function: ``(groups, readers, constants)``; the readers are the convs
    (which also write a group) and the denses."""
    groups, readers, constants = _Groups(), [], []
    for node in nodes:
        shape = _shape(node)
        four_d = shape is not None and len(shape) == 4
        if isinstance(node, relay.Var):
            groups.pin(node, f"{node.name_hint} is a function input")
        elif isinstance(node, relay.Call) and four_d and _reorderable_conv(node):
            groups.find(node)
            readers.append(node)
        elif isinstance(node, relay.Call) and _flattens_channels(node):
            groups.join(node, node.args[0])
        elif isinstance(node, relay.Call) and _reorderable_dense(node):
            groups.find(node.args[0])
            groups.pin(node, "a dense writes it")  # only its input columns are renumbered
            readers.append(node)
        elif isinstance(node, relay.Constant):
            groups.pin(node, "it is a constant")
        elif isinstance(node, relay.Call) and four_d and (roles := _roles(node)) is not None:
            groups.find(node)
            _join_operands(node, roles, shape[1], groups, constants)
        elif isinstance(node, (relay.Call, relay.Tuple, relay.TupleGetItem)):
            what = (op_name(node) or "a function call") if isinstance(node, relay.Call) else type(node).__name__
            args = node.args if isinstance(node, relay.Call) else (
                node.fields if isinstance(node, relay.Tuple) else [node.tuple_value])
            for arg in args:
                groups.pin(arg, f"{what} reads it")
            groups.pin(node, f"{what} writes it")
    for out in (body.fields if isinstance(body, relay.Tuple) else [body]):
        groups.pin(out, "it is a function output")
    return groups, readers, constants


def _order_for(readers_of, channels: int):
    """The order for one group, or a :class:`Reject` saying why it keeps its own."""
    if channels % 2:
        return Reject(f"{channels} channels (odd)")
    if any(not _dtype(r.args[0]).startswith(("int", "uint")) for r in readers_of):
        return Reject("a float conv or dense reads it (its sums would change order)")
    int8_convs = [r for r in readers_of if op_name(r) in _CONVS and r.args[1].data.dtype == "int8"]
    if not int8_convs:
        return Reject("no int8 conv reads it")
    oks = [compatible(r.args[1].data.numpy()) for r in int8_convs]
    if all(fits_in_order(ok) for ok in oks):
        return Reject("every pair is safe in the present order")
    order = pair_order(np.logical_and.reduce(oks))
    if order is None:
        return Reject(f"no order makes every pair safe for all {len(oks)} reading conv(s)")
    return order


#: Expressions whose values the groups cannot follow: a function holding one is left alone.
_UNSUPPORTED = (relay.If, relay.Let, relay.adt.Match, relay.RefCreate, relay.RefRead, relay.RefWrite, relay.Function)


def _dataflow(func):
    """The post-order nodes of ``func``'s body, or a :class:`Reject` when it is not plain dataflow."""
    nodes: list = []
    relay.analysis.post_order_visit(func.body, nodes.append)
    odd = next((type(n).__name__ for n in nodes if isinstance(n, _UNSUPPORTED)), None)
    if odd is not None:
        return Reject(f"the function holds a {odd} (only dataflow is reordered)")
    return [n for n in nodes if not isinstance(n, tvm.ir.Op)]


def _orders(groups, readers) -> dict:
    """group root -> the order its channels take, for every group that changes (``readers``: the
    convs and denses)."""
    members: dict = {}
    for node in groups.parent:
        members.setdefault(groups.find(node), []).append(node)
    pinned = {groups.find(n): why for n, why in groups.pinned.items()}
    reader_of: dict = {}
    for conv in readers:
        reader_of.setdefault(groups.find(conv.args[0]), []).append(conv)
    orders: dict = {}
    for root, readers_of in reader_of.items():
        if root in pinned:
            logger.debug("%s: a group of %d tensor(s) read by %d conv(s) or dense(s) keeps its order: %s", PASS_NAME,
                         len(members[root]), len(readers_of), pinned[root])
            continue
        order = _order_for(readers_of, _shape(root)[1])
        if isinstance(order, Reject):
            logger.debug("%s: a group read by %d conv(s) or dense(s) keeps its order: %s", PASS_NAME,
                         len(readers_of), order)
            continue
        orders[root] = order
    if orders:
        logger.info("%s: %d channel group(s) reordered so that %d int8 conv(s) keep vpmaddubsw exactly", PASS_NAME,
                    len(orders), sum(op_name(r) in _CONVS for root in orders for r in reader_of[root]))
    return orders


def _new_arguments(groups, readers, constants, orders) -> dict:
    """call -> {argument index: new constant} for every call the orders change."""
    new: dict = {}
    for conv in readers:
        out_order = orders.get(groups.find(conv)) if op_name(conv) in _CONVS else None
        in_order = orders.get(groups.find(conv.args[0]))
        if out_order is None and in_order is None:
            continue
        kernel = conv.args[1].data.numpy()
        kernel = kernel if out_order is None else kernel[out_order]
        new.setdefault(conv, {})[1] = relay.const(kernel if in_order is None else kernel[:, in_order])
        for i in _CONVS[op_name(conv)] if out_order is not None else ():
            value = conv.args[i].data.numpy()
            if value.size > 1:
                new[conv][i] = relay.const(value[out_order])
    for call, i, const, axis in constants:
        order = orders.get(groups.find(call))
        if order is not None:
            new.setdefault(call, {})[i] = relay.const(np.take(const.data.numpy(), order, axis=axis))
    return new


class _Substitute(dfp.DFPatternCallback):
    """Gives the calls in ``new`` (keyed by the original call) their new constant arguments, once,
    through TVM's rewriter (iterative, so deep graphs are no problem)."""

    def __init__(self, new: dict):
        super().__init__(rewrite_once=True)
        shapes = sorted({(call.op.name, len(call.args)) for call in new})
        patterns = [dfp.is_op(name)(*(dfp.wildcard() for _ in range(n))) for name, n in shapes]
        self.pattern = patterns[0]
        for pattern in patterns[1:]:
            self.pattern = self.pattern | pattern
        self.new = new

    def callback(self, pre, post, node_map):
        if not isinstance(pre, relay.Call) or pre not in self.new:
            return post
        args = list(post.args)
        for i, value in self.new[pre].items():
            args[i] = value
        return relay.Call(post.op, args, post.attrs, post.type_args, post.span)


def _reorder(func):
    if func.attrs is not None and "Primitive" in func.attrs.keys():
        return func
    nodes = _dataflow(func)
    if isinstance(nodes, Reject):
        logger.debug("%s: skipped a function: %s", PASS_NAME, nodes)
        return func
    groups, readers, constants = _collect(nodes, func.body)
    orders = _orders(groups, readers)
    if not orders:
        return func
    body = dfp.rewrite(_Substitute(_new_arguments(groups, readers, constants, orders)), func.body)
    return relay.Function(func.params, body, None, func.type_params, func.attrs, func.span)


def OrderChannelsInSafePairs():  # noqa: N802  (a pass factory, named as the pass)
    """Renumber the channels between int8 convs so that every ``vpmaddubsw`` pair of their readers is
    safe (the module's note): the same values, computed with the saturating instruction exactly.

    Returns
    -------
    tvm.transform.Pass
    """
    order = relay.transform.function_pass(lambda func, mod, ctx: _reorder(func), opt_level=0, name=PASS_NAME)
    return tvm.transform.Sequential([relay.transform.InferType(), order], name=PASS_NAME)
