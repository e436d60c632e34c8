"""WidenAfterMovement: data movement runs on the 8-bit values; the widening follows it to its reader.

Rewrites::

    # M(g(n))                -> g'(M(n))               M unary data movement
    # concat(g_1(n_1), .., g_k(n_k), axis)
    #                        -> G(concat(n_1, .., n_k)) every g_i the same calls with their own
    #                                                   constants; G's constant = the g_i's constants,
    #                                                   broadcast to each part and concatenated
    # split(g(n))[i]         -> g_i(split(n)[i])        g_i's constants: the i-th part of g's
    # (n a clip: n's place is taken by cast(cast(n, u8|i8), dtype(n)), equal to n)
    # (a link of g below M's input also read by others: M's chain is a copy, the link stays
    #  for them, when each of them takes the widening into its kernel; see below)

Walked by hand: widening chains of any length, joined by a concatenation of any number of them.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``WidenAfterMovement``.
"""
from __future__ import annotations

import tvm
from tvm import relay

from tvm_ext._op_pattern import K_BROADCAST, call_pattern
from ._registry import register_pass

from ._chains import narrow_type, takes_widening
from ._doc import factory_sections
from ._util import (Reject, count_calls, fixed_point, function_pass, op_name, pass_logger, static_shape,
                    static_tensor_type, substitute)

__all__ = ["WidenAfterMovement", "MOVEMENT", "MAX_ROUNDS"]

PASS_NAME = "WidenAfterMovement"
_log = pass_logger(PASS_NAME)

#: Unary data-movement calls the widening moves past (``split`` and ``concatenate`` have rules of
#: their own).
MOVEMENT = ("reshape", "transpose", "layout_transform", "squeeze", "expand_dims", "strided_slice",
            "nn.batch_flatten")
#: Sweeps at least allowed (one movement per sweep along a sequence of movements); a function with
#: more movement calls gets one sweep per movement call, plus one (each sweep that rewrites turns at
#: least one movement into a reader of an 8-bit value, which no later sweep rewrites again).
MAX_ROUNDS = 16
_MAX_CHAIN = 64


def _widening(v, users):
    """``(n, dtype, kind, links)`` for ``v = l_1(...l_k(n)...)`` (``links`` from ``v`` back); or a Reject.

    ``v`` is read by the movement only (the caller checks); every other link has one reader, or
    readers that all take the widening into their kernels (:func:`_readers_take_widening`).
    """
    ok = static_tensor_type(v)
    if not ok:
        return ok
    links, node = [], v
    for _ in range(_MAX_CHAIN):
        nt = narrow_type(node)
        if nt:
            break
        if not isinstance(node, relay.Call) or call_pattern(node) > K_BROADCAST:
            what = op_name(node) or type(node).__name__
            return Reject(f"no 8-bit value behind its elementwise chain (reached {what})")
        live = [a for a in node.args if not isinstance(a, relay.Constant)]
        if len(live) != 1:
            return Reject(f"{op_name(node)} has {len(live)} non-constant operands")
        if links and len(users.get(node, ())) != 1:
            ok = _readers_take_widening(users[node])
            if not ok:
                return Reject(f"{op_name(node)} in the chain has other readers: {ok}")
        ok = static_tensor_type(live[0])
        if not ok:
            return ok
        if static_shape(node) != static_shape(live[0]):
            return Reject(f"{op_name(node)} broadcasts the value to a larger shape")
        links.append(node)
        node = live[0]
    else:
        return Reject(f"chain longer than {_MAX_CHAIN} calls")
    if not links:
        return Reject(f"it moves the {nt[0]} value already")
    n, (dtype, kind) = node, nt
    if kind == "clip" and len(users.get(n, ())) != 1:
        return Reject("the 8-bit clip has other readers")
    return n, dtype, kind, links


def _readers_take_widening(readers):
    """True when every reader of a shared link takes the widening into its own kernel; or a Reject.

    The movement then gets its own copy of the chain from the 8-bit value, and the link keeps its
    other readers. A reader takes it when it is elementwise/broadcast or a reduction (FuseOps fuses
    an elementwise producer into it) or a pool / softmax (``FuseWideningIntoPool``, run after this
    pass): the readers ``WidenInEachReader`` gives a copy each. Any other reader (a convolution,
    data movement, a tuple) would leave the link as a kernel writing the wide value, and the copy
    would add one: the chain is left alone.
    """
    for reader, _ in readers:
        name = op_name(reader)
        if name is None:
            return Reject(f"a {type(reader).__name__} reads it")
        if not takes_widening(reader):
            return Reject(f"{name} reads it and would not fuse the widening")
    return True


def _source(n, dtype, kind):
    """(the 8-bit value that moves, the link restoring n's dtype or None)."""
    if kind == "typed":
        return n, None
    return relay.cast(n, dtype), str(n.checked_type.dtype)


def _full(const, shape):
    import numpy as np

    return np.broadcast_to(const.data.numpy(), shape)


def _shrink(arr):
    """``arr`` as a constant of size 1 along every axis it does not vary on."""
    import numpy as np

    index = []
    for ax in range(arr.ndim):
        first = np.take(arr, [0], axis=ax)
        index.append(slice(0, 1) if np.array_equal(np.broadcast_to(first, arr.shape), arr) else slice(None))
    return relay.const(np.ascontiguousarray(arr[tuple(index)]), str(arr.dtype))


def _fold(call, arr):
    """What the unary movement ``call`` does to the array ``arr`` (TVM's constant folding)."""
    expr = relay.Call(call.op, [relay.const(arr, str(arr.dtype))], call.attrs, call.type_args)
    with tvm.transform.PassContext(opt_level=3):
        mod = relay.transform.FoldConstant()(relay.transform.InferType()(tvm.IRModule.from_expr(expr)))
    body = mod["main"].body
    if not isinstance(body, relay.Constant):
        raise RuntimeError(f"{PASS_NAME}: constant folding left {op_name(call)} unfolded")
    return body.data.numpy()


def _relink(links, x, restore, new_const):
    """``links`` (outermost first) applied to ``x``. ``new_const(i, j, const)`` gives link ``i``'s
    constant operand ``j`` after the move; ``restore``: a dtype to cast ``x`` to first (the clip
    form: ``cast(cast(n, u8), dtype(n)) == n``), or None."""
    if restore is not None:
        x = relay.cast(x, restore)
    for i in range(len(links) - 1, -1, -1):
        link = links[i]
        args = [x if not _is_const(a) else new_const(i, j, a) for j, a in enumerate(link.args)]
        x = relay.Call(link.op, args, link.attrs, link.type_args, link.span)
    return x


def _is_const(x) -> bool:
    return isinstance(x, relay.Constant)


def _is_scalar(const) -> bool:
    return const.data.numpy().size == 1


def _moved(call, users):
    """``(links, moved, restore)``: the movement ``call`` on the 8-bit source of its input's widening
    chain ``links`` (:func:`_widening`, :func:`_source`); or a Reject."""
    v = call.args[0]
    if len(users.get(v, ())) != 1:
        return Reject("its input has other readers")
    m = _widening(v, users)
    if isinstance(m, Reject):
        return m
    n, dtype, kind, links = m
    src, restore = _source(n, dtype, kind)
    return links, relay.Call(call.op, [src], call.attrs, call.type_args, call.span), restore


def _unary(call, users):
    """M(g(n)) -> g'(M(n)); or a Reject."""
    m = _moved(call, users)
    if isinstance(m, Reject):
        return m
    links, moved, restore = m

    def new_const(i, _j, const):
        if _is_scalar(const):
            return const
        return _shrink(_fold(call, _full(const, static_shape(links[i]))))

    return _relink(links, moved, restore, new_const)


def _same_calls(chains):
    """True when every chain has the same calls (ops, attributes, dtypes, operand positions)."""
    first = chains[0]
    for other in chains[1:]:
        if len(other) != len(first):
            return Reject("its parts' chains differ in length")
        for a, b in zip(first, other):
            if op_name(a) != op_name(b) or not tvm.ir.structural_equal(a.attrs, b.attrs) \
                    or str(a.checked_type.dtype) != str(b.checked_type.dtype):
                return Reject(f"its parts' chains differ ({op_name(a)} vs {op_name(b)})")
            if [_is_const(x) for x in a.args] != [_is_const(x) for x in b.args]:
                return Reject(f"its parts' chains differ in the operands of {op_name(a)}")
            if any(_is_const(x) and str(x.data.dtype) != str(y.data.dtype) for x, y in zip(a.args, b.args)):
                return Reject(f"its parts' chains differ in a constant's dtype ({op_name(a)})")
    return True


def _concat(call, users):
    """concat(g_1(n_1), .., g_k(n_k)) -> G(concat(n_1, .., n_k)); or a Reject."""
    import numpy as np

    tup = call.args[0]
    if not isinstance(tup, relay.Tuple) or len(users.get(tup, ())) != 1:
        return Reject("its operand is not a tuple of its own")
    parts = []
    for f in tup.fields:
        if len(users.get(f, ())) != 1:
            return Reject("a part has other readers")
        m = _widening(f, users)
        if isinstance(m, Reject):
            return m
        parts.append(m)
    if len({(p[1], p[2], str(p[0].checked_type.dtype)) for p in parts}) != 1:
        return Reject("its parts' 8-bit values differ in dtype or form")
    chains = [p[3] for p in parts]
    ok = _same_calls(chains)
    if not ok:
        return ok
    rank = len(static_shape(call))
    axis = int(call.attrs.axis)
    axis = axis + rank if axis < 0 else axis
    srcs = [_source(n, dtype, kind) for n, dtype, kind, _ in parts]
    moved = relay.Call(call.op, [relay.Tuple([s for s, _ in srcs], tup.span)], call.attrs, call.type_args,
                       call.span)

    def new_const(i, j, const):
        consts = [ch[i].args[j] for ch in chains]
        if all(_is_scalar(c) for c in consts) and \
                len({c.data.numpy().reshape(()).tobytes() for c in consts}) == 1 and const.data.ndim <= rank:
            return const  # one scalar for every part
        pieces = [_full(c, static_shape(ch[i])) for c, ch in zip(consts, chains)]
        return _shrink(np.concatenate(pieces, axis=axis))

    return _relink(chains[0], moved, srcs[0][1], new_const)


def _split(call, users):
    """{split(g(n))[i]: g_i(split(n)[i])}; or a Reject."""
    import numpy as np

    m = _moved(call, users)
    if isinstance(m, Reject):
        return m
    links, moved, restore = m
    items = users.get(call, ())
    if not items or any(not isinstance(u, relay.TupleGetItem) for u, _ in items):
        return Reject("its result is used other than through its fields")
    rank = len(static_shape(call.args[0]))
    axis = int(call.attrs.axis)
    axis = axis + rank if axis < 0 else axis
    fields = [[int(d) for d in t.shape] for t in call.checked_type.fields]
    bounds = np.cumsum([0] + [f[axis] for f in fields])
    out = {}
    for item, _ in dict.fromkeys(items):
        k = int(item.index)

        def new_const(i, _j, const, k=k):
            if _is_scalar(const):
                return const
            piece = np.take(_full(const, static_shape(links[i])), np.arange(bounds[k], bounds[k + 1]), axis=axis)
            return _shrink(piece)

        out[item] = _relink(links, relay.TupleGetItem(moved, k), restore, new_const)
    return out


def _collect(nodes, users, body) -> dict:
    """One sweep: each movement (or its fields' readers) rewritten to move the 8-bit value."""
    subst: dict = {}
    for node in nodes:
        name = op_name(node) if isinstance(node, relay.Call) else None
        if name not in MOVEMENT and name not in ("concatenate", "split"):
            continue
        ok = static_tensor_type(node) if name != "split" else True
        if not ok:
            _log.debug("%s not rewritten: %s", name, ok)
            continue
        out = _split(node, users) if name == "split" else _concat(node, users) if name == "concatenate" \
            else _unary(node, users)
        if isinstance(out, Reject):
            _log.debug("%s not rewritten: %s", name, out)
            continue
        _log.info("%s now moves 8-bit values; the widening follows it", name)
        if isinstance(out, dict):
            subst.update(out)
        else:
            subst[node] = out
    return subst


def _sweep(func):
    return substitute(func, PASS_NAME, _collect)


def _run(func):
    """Sweeps of :func:`_sweep` until none rewrites (at most one per movement call, or
    :data:`MAX_ROUNDS` if more; the bound is a guard: see MAX_ROUNDS)."""
    rounds = max(MAX_ROUNDS, count_calls(func.body, (*MOVEMENT, "concatenate", "split")) + 1)
    return fixed_point(func, _sweep, PASS_NAME, rounds, on_cap="warn")


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def WidenAfterMovement():  # pylint: disable=invalid-name
    """Move a widening (dequantize) chain past data movement, so the movement runs on 8-bit values.

    ``M(g(n))`` becomes ``g'(M(n))`` for a private elementwise chain ``g`` from an 8-bit ``n``
    and a data-movement call ``M`` (reshape, transpose, layout_transform, squeeze, expand_dims,
    strided_slice, batch_flatten, split; a concatenation of such chains with the same calls
    becomes one chain on the concatenated 8-bit values). Constants move with the data. Exact; no
    kernel added; the movement's kernel reads and writes 8 bits, and the widening reaches the
    reader that computes on it (docs/passes.md).

    Use at stage ``before_fuse``, before ``WidenInEachReader`` and ``FuseWideningIntoPool``.

    Notes
    -----
    Rejections are logged at DEBUG on ``tvm_ext.passes.WidenAfterMovement``, rewrites at INFO.
    """
    return function_pass(PASS_NAME, _run)
