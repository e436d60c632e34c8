"""``FuseSlicedInt8Dense``: a padded 8-bit dense, its slice and its epilogue in one kernel.

:mod:`tvm_ext.x86.dense_padding` pads a ``uint8 x int8`` dense to a multiple of 16 outputs and slices
the result back. The slice is injective, and FuseOps fuses only elementwise and broadcast consumers
into a dense, so the slice would start a kernel of its own, reading the dense's int32 result. This pass
makes the dense, the slice and the elementwise/broadcast calls after it (what FuseOps would have
fused into the dense without the slice) one ``Primitive`` function, which FuseOps leaves as it
is. TVM's int8 dense schedule computes the dense per 16 outputs of the kernel's output::

    # E(strided_slice(dense_pack(x, w: NC16n4c), :N))  ->  fn(x, w, ...) {E(strided_slice(dense_pack(x, w), :N))}
    #   where the dense drops fewer than 16 outputs and keeps at least 16; E: elementwise/broadcast
    #   calls (at most _EPILOGUE_MAX), every value in the region but E's last read only inside it

The epilogue is a region of any length, found by counting each value's readers, which the dataflow
pattern language cannot express, so the pass walks it by hand. Below 16 kept outputs, TVM's bounds
would give the dot product's tensorized loop fewer than 16 lanes, so the slice starts the next
kernel. The x86 back end runs the pass before ``FuseOps`` where :func:`tvm_ext.x86.dense_padding.applies`.
A module without such a dense comes back unchanged.
"""
from __future__ import annotations

import logging

import tvm
from tvm import relay

from .._op_pattern import K_BROADCAST, call_pattern
from .._reject import Reject
from .dense_padding import BLOCK, static_dims
from .exact_dot import pairs_fit_int16
from .exact_record import RECORD, dense_key, shape_of

logger = logging.getLogger(__name__)

__all__ = ["FuseSlicedInt8Dense", "PASS_NAME"]

PASS_NAME = "FuseSlicedInt8Dense"
#: Most elementwise/broadcast calls after the slice that go into the dense's kernel.
_EPILOGUE_MAX = 64


class _Readers(relay.ExprVisitor):
    """``readers``: ``{expr: [calls, tuples and projections reading it]}`` (a value read twice by one
    call is listed twice). ``Primitive`` functions (kernels already made) are not entered."""

    def __init__(self):
        super().__init__()
        self.readers: dict = {}

    def _read(self, node, args):
        for arg in args:
            self.readers.setdefault(arg, []).append(node)

    def visit_call(self, call):
        self._read(call, call.args)
        super().visit_call(call)

    def visit_tuple(self, tup):
        self._read(tup, tup.fields)
        super().visit_tuple(tup)

    def visit_tuple_getitem(self, t):
        self._read(t, [t.tuple_value])
        super().visit_tuple_getitem(t)

    def visit_function(self, fn):
        if not (fn.attrs and "Primitive" in fn.attrs):
            super().visit_function(fn)


def _readers(body) -> dict:
    visitor = _Readers()
    visitor.visit(body)
    return visitor.readers


def _is_op(expr, name: str) -> bool:
    return isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == name


def _sliced_dense(call, readers):
    """True for ``strided_slice(nn.contrib_dense_pack(x, w, NC16n4c), :N on the last axis)`` whose dense
    only the slice reads, dropping fewer than 16 outputs and keeping at least 16; else a Reject."""
    if not _is_op(call, "strided_slice"):
        return Reject("not a strided_slice")
    dense = call.args[0]
    if not _is_op(dense, "nn.contrib_dense_pack") or str(dense.attrs.weight_layout) != "NC16n4c":
        return Reject("the slice does not read a dense packed NC16n4c")
    if len(readers.get(dense, [])) != 1:
        return Reject("the dense has other readers than the slice")
    full, kept = static_dims(dense.checked_type.shape), static_dims(call.checked_type.shape)
    if full is None or kept is None or full[:-1] != kept[:-1] or not 0 < full[-1] - kept[-1] < BLOCK:
        return Reject(f"not the slice of a padded dense ({full} -> {kept})")
    if kept[-1] < BLOCK:
        return Reject(f"{kept[-1]} outputs: fewer than one block of {BLOCK}")
    attrs = call.attrs
    strides = [1] if attrs.strides is None else [int(v) for v in attrs.strides]
    if any(int(b) for b in attrs.begin) or any(v != 1 for v in strides):
        return Reject("the slice does not start at 0 with step 1")
    return True


def _epilogue(slice_call, readers, order) -> list:
    """The calls after ``slice_call`` that FuseOps would put in the dense's kernel without the slice,
    in topological order: elementwise/broadcast calls reached from the slice, ending in one call that
    every other call of the region only feeds (branches that join again are in), as large as found."""
    reached, queue = [], [slice_call]
    while queue and len(reached) < _EPILOGUE_MAX:
        for user in readers.get(queue.pop(0), []):
            if (user not in reached and isinstance(user, relay.Call) and call_pattern(user) <= K_BROADCAST
                    and isinstance(user.checked_type, relay.TensorType) and static_dims(user.checked_type.shape)):
                reached.append(user)
                queue.append(user)
    best: list = []
    for end in reached:
        region, stack = {end}, [end]
        while stack:  # the reached calls (and the slice) that feed ``end``
            for arg in stack.pop().args:
                if arg not in region and (arg in reached or arg.same_as(slice_call)):
                    region.add(arg)
                    stack.append(arg)
        inner = [e for e in region if not e.same_as(end)]
        if slice_call in region and all(r in region for e in inner for r in readers.get(e, [])) \
                and len(region) - 1 > len(best):
            best = sorted((e for e in region if not e.same_as(slice_call)), key=order.__getitem__)
    return best


def _note_weight(dense):
    """The dense's constant weight, noted in the build's exactness record (:mod:`.exact_record`): in a
    function of its own the weight is a parameter, which the record's instrument does not read."""
    record, weight = RECORD.get(), dense.args[1]
    if record is not None and isinstance(weight, relay.Constant) and weight.data.dtype == "int8":
        record.note(dense_key(shape_of(dense.args[0].checked_type), weight.data.shape),
                    pairs_fit_int16(weight.data.numpy()))


def _of_constants(expr) -> bool:
    """An elementwise/broadcast call whose arguments are constants (``zeros`` has none): FuseOps would
    compute it in the kernel that reads it."""
    return (isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op) and call_pattern(expr) <= K_BROADCAST
            and all(isinstance(a, relay.Constant) for a in expr.args))


class _Fuse(relay.ExprMutator):
    """Replaces the last call of each region (``ends``: last call -> (slice, epilogue calls)) with a
    call of a ``Primitive`` function computing the region."""

    def __init__(self, ends: dict):
        super().__init__()
        self.ends = ends
        self.count = 0

    def visit_call(self, call):
        region = self.ends.get(call)
        return super().visit_call(call) if region is None else self._kernel(*region)

    def _kernel(self, slice_call, chain):
        params, args, memo = [], [], {}

        def outside(expr):  # a value computed outside the region: a parameter (scalar constants inline)
            if isinstance(expr, relay.Constant) and not expr.data.shape:
                return expr
            if _of_constants(expr):  # zeros(), or an elementwise call of constants: computed here too
                return relay.Call(expr.op, [outside(a) for a in expr.args], expr.attrs)
            if expr not in memo:
                memo[expr] = relay.var(f"p{len(params)}", type_annotation=expr.checked_type)
                params.append(memo[expr])
                args.append(self.visit(expr))
            return memo[expr]

        dense = slice_call.args[0]
        _note_weight(dense)
        new_of = {dense: relay.Call(dense.op, [outside(a) for a in dense.args], dense.attrs)}
        for call in (slice_call, *chain):
            new_of[call] = relay.Call(call.op, [new_of[a] if a in new_of else outside(a) for a in call.args],
                                      call.attrs)
        new = new_of[chain[-1] if chain else slice_call]
        self.count += 1
        return relay.Call(relay.Function(params, new).with_attr("Primitive", tvm.tir.IntImm("int32", 1)), args)


def _topological(body) -> dict:
    order: dict = {}
    relay.analysis.post_order_visit(body, lambda e: order.setdefault(e, len(order)))
    return order


def _regions(body) -> dict:
    readers, order = _readers(body), _topological(body)
    calls = {user for users in readers.values() for user in users if isinstance(user, relay.Call)}
    ends = {}
    for call in calls:
        found = _sliced_dense(call, readers)
        if not found:
            if _is_op(call, "strided_slice"):
                logger.debug("%s: slice %s kept: %s", PASS_NAME, call.checked_type, found)
            continue
        chain = _epilogue(call, readers, order)
        ends[chain[-1] if chain else call] = (call, chain)
    return ends


def FuseSlicedInt8Dense():  # noqa: N802  (a pass factory, named as the pass)
    """Put each padded 8-bit dense (:mod:`tvm_ext.x86.dense_padding`), its slice and the elementwise
    epilogue after it in one kernel (module note).

    Returns
    -------
    tvm.transform.Pass
        A module pass named ``"FuseSlicedInt8Dense"``, for the module after relay.build's prefix
        (AlterOpLayout's ``nn.contrib_dense_pack``). Pure; a module without such a dense is
        returned as given.
    """

    @tvm.transform.module_pass(opt_level=0, name=PASS_NAME)
    def fuse(given, _ctx):
        mod = relay.transform.InferType()(given)
        out, count = tvm.IRModule({}, mod.type_definitions), 0
        for gv in mod.get_global_vars():
            func = mod[gv]
            attrs = func.attrs if isinstance(func, relay.Function) else None
            if isinstance(func, relay.Function) and not (attrs and ("Primitive" in attrs or "Compiler" in attrs)):
                ends = _regions(func.body)
                if ends:
                    mutator = _Fuse(ends)
                    func = relay.Function(func.params, mutator.visit(func.body), func.ret_type, func.type_params,
                                          func.attrs)
                    count += mutator.count
            out[gv] = func
        if not count:
            return given
        logger.debug("%s: %d padded dense(s) with their slice and epilogue in one kernel", PASS_NAME, count)
        return relay.transform.InferType()(out)

    return fuse
