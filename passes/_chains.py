"""Chains of elementwise calls and their 8-bit points, shared by the passes that move or cut them.

Design note
-----------
A *chain link* is a call of TOpPattern <= broadcast (or, when asked, a one-argument injective call)
whose other arguments are constants: its one live argument is the previous link. A *private chain*
is a run of links where each link's only user is the next one; FuseOps fuses such a run into the
kernel of the anchor it starts at. An *8-bit point* on a chain is a value that fits in 8 bits
exactly: a uint8/int8 tensor, or a ``clip`` to 8-bit integral bounds of integer values (or of float
values known to be integral: a quantize's ``clip(round(x / s) + zp)``).

Contract: functions here only read the graph (``copy_chain`` builds new calls); callers pass the
``users`` map of :func:`~tvm_ext.passes._util.consumers` and the function's body (a chain never
continues past the function's result). Rejections are :class:`~tvm_ext._reject.Reject` values
with the reason.
"""
from __future__ import annotations

from tvm import relay

from tvm_ext._op_pattern import K_BROADCAST, K_COMM_REDUCE, K_INJECTIVE, call_pattern

from ._util import Reject, op_name, static_tensor_type

__all__ = ["NARROW", "POOLS", "narrow_type", "chain_arg", "walk_chain", "copy_chain", "takes_widening"]

#: the 8-bit dtypes and their ranges
NARROW = {"uint8": (0, 255), "int8": (-128, 127)}
_INTEGRAL_FLOAT_OPS = ("round", "floor", "ceil", "trunc")

#: Readers that take a widening chain into their kernel: pools (each reads every input element
#: about once) and softmax (a classifier's 8-bit logits; TVM's schedule recomputes the inlined
#: widening in its 2-3 passes over a row, a few elementwise ops next to an ``exp``).
POOLS = ("nn.global_avg_pool2d", "nn.avg_pool2d", "nn.adaptive_avg_pool2d", "nn.global_max_pool2d", "nn.softmax",
         "nn.log_softmax")

#: Links a chain walk follows at most; a chain is acyclic, so this only guards against a malformed graph.
_MAX_WALK = 10_000


def _integral_float(expr, depth: int = 0) -> bool:
    """True when the float ``expr`` holds integral values: ``round``/``floor``/``ceil``/``trunc``,
    or such a value plus or minus an integral constant (a quantize's zero point, ``round(x/s) + zp``:
    below 2**24 the sum is exact, above it every float is an integer)."""
    import numpy as np

    if depth > 8 or not isinstance(expr, relay.Call):
        return False
    name = op_name(expr)
    if name in _INTEGRAL_FLOAT_OPS:
        return True
    if name in ("add", "subtract") and len(expr.args) == 2:
        a, b = list(expr.args)
        for x, c in ((a, b), (b, a)):
            if isinstance(c, relay.Constant) and np.all(np.mod(c.data.numpy(), 1) == 0) \
                    and _integral_float(x, depth + 1):
                return True
    return False


def narrow_type(node):
    """The 8-bit dtype ``node``'s value fits in and how, or a Reject.

    Returns ``(dtype, "typed")`` for a uint8/int8 tensor, ``(dtype, "clip")`` for a ``clip`` with
    integral bounds within uint8 (preferred) or int8, on an integer tensor or on a float tensor of
    integral values (the clip reads ``round``/``floor``/``ceil``/``trunc``, possibly plus an
    integral constant: a quantize ``clip(round(x / s) + zp)``).
    """
    ok = static_tensor_type(node)
    if not ok:
        return ok
    dtype = node.checked_type.dtype
    if dtype in NARROW:
        return dtype, "typed"
    if not (isinstance(node, relay.Call) and op_name(node) == "clip"):
        return Reject(f"{dtype} value, not a clip")
    if dtype.startswith("float"):
        if not _integral_float(node.args[0]):
            return Reject(f"clip on {dtype} values not known to be integral")
        if int(dtype[5:] or 32) < 16:
            return Reject(f"clip on {dtype}: cannot hold every 8-bit integer exactly")
    elif not dtype.startswith(("int", "uint")):
        return Reject(f"clip on {dtype}")
    lo, hi = float(node.attrs.a_min), float(node.attrs.a_max)
    if lo != int(lo) or hi != int(hi):
        return Reject(f"clip bounds [{lo:g}, {hi:g}] are not integers")
    for cand, (tlo, thi) in NARROW.items():
        if tlo <= lo and hi <= thi:
            return cand, "clip"
    return Reject(f"clip bounds [{lo:g}, {hi:g}] exceed 8 bits")


def chain_arg(call, injective: bool = False):
    """The one non-constant argument of an elemwise/broadcast call, else None.

    With ``injective``, also the one argument of a one-argument injective call (``layout_transform``,
    ``reshape``, ``squeeze``, ``transpose``, ...).
    """
    if not isinstance(call, relay.Call):
        return None
    kind = call_pattern(call)
    if kind > (K_INJECTIVE if injective else K_BROADCAST):
        return None
    if kind == K_INJECTIVE and len(call.args) != 1:
        return None
    live = [a for a in call.args if not isinstance(a, relay.Constant)]
    return live[0] if len(live) == 1 else None


def walk_chain(arg, users, body, pass_name: str, injective: bool = False):
    """Follow a private chain back from ``arg`` (a join's argument, a reader's input).

    Returns (source, narrow) where ``source`` is the first node that is not a private chain
    call and ``narrow`` the (node, dtype, kind) narrow point nearest to ``arg`` (or None).

    With ``injective``, the chain may also pass through one-argument injective calls
    (``layout_transform``, ``reshape``, ...). FuseOps fuses an anchor only through elemwise and
    broadcast calls, so the anchor's kernel ends in front of the first of them: ``narrow`` is then
    the narrow point nearest to ``arg`` *upstream* of every injective call (a cut further down
    would start a kernel of its own). ``pass_name`` names the caller in the error raised on a
    malformed (cyclic) graph.
    """
    node, narrow, steps = arg, None, 0
    while True:
        steps += 1
        if steps > _MAX_WALK:
            raise RuntimeError(f"{pass_name}: chain walk did not terminate")
        if narrow is None:
            nt = narrow_type(node)
            if nt:
                narrow = (node, *nt)
        if injective and isinstance(node, relay.Call) and call_pattern(node) == K_INJECTIVE:
            narrow = None  # points at or below an injective call are outside the anchor's kernel
        prev = chain_arg(node, injective)
        if prev is None or len(users.get(node, ())) != 1 or node.same_as(body):
            return node, narrow
        node = prev


def copy_chain(chain, x):
    """A fresh copy of ``chain`` (links listed from the last back to the first) applied to ``x``.

    Each link's live argument (:func:`chain_arg`) is replaced by the copy of the link before it;
    constants, attributes and spans are kept.
    """
    for node in reversed(chain):
        prev = chain_arg(node)
        x = relay.Call(node.op, [x if a.same_as(prev) else a for a in node.args], node.attrs, node.type_args,
                       node.span)
    return x


def takes_widening(reader) -> bool:
    """True when ``reader`` takes a widening chain on its input into its own kernel.

    An elementwise/broadcast call or a reduction (``mean``, ``sum``, ``max``, ...: FuseOps fuses an
    elementwise producer into a post-dominator that is injective or a reduction,
    ``graph_partitioner.cc``), or a pool / softmax of :data:`POOLS`, which ``FuseWideningIntoPool``
    takes the chain into. Another reader (a convolution, data movement, a tuple, a function call)
    would leave the chain in a kernel writing the wide value.
    """
    name = op_name(reader)
    if name is None:
        return False
    pat = call_pattern(reader)
    return pat <= K_BROADCAST or pat == K_COMM_REDUCE or name in POOLS


def postpones_join_fusions() -> bool:
    """True when the current target (``tvm.target.Target.current()``, the build's) has
    ``max_function_args`` (GPU targets: 128 at ``opencl``). There TVM's FuseOps postpones a fusion
    into a join until it reaches the join, retries the postponed ones latest first and drops one
    whose join already holds an anchor (``graph_partitioner.cc``, ``RunFuse``): a chain fuses into a
    join holding an anchor only from the join's later argument."""
    import tvm

    tgt = tvm.target.Target.current(allow_none=True)
    return tgt is not None and int(tgt.attrs.get("max_function_args", 0) or 0) > 0
