"""DequantizeInConvTranspose: a transposed conv's kernel reads 8 bits and writes 8 bits.

Rewrites::

    # t = conv2d_transpose(d_k(...d_1(n)...), w),  e_m(...e_1(t)...) -> ... (readers outside)
    #   n 8-bit typed (else the 8-bit point nearest to the conv, read as cast(n, u8) and widened
    #   inside: exact); d_i private elementwise/broadcast calls or one-argument injective calls
    #   (layout_transform, strided_slice), constants as their other arguments;
    #   e_j the private elementwise chain after t, N the last 8-bit point on it (a uint8/int8 value,
    #   or a clip to 8-bit bounds of integral values: a quantize)
    #   -> c = Primitive fn(n, w, ...) { cast(N', u8) }   (N' = N computed from d, t, e_1..e_j)
    #      the readers of N read cast(c, dtype(N))
    # If the chain after t ends at the function's result, the group ends there (no cut).

Walked by hand: the chains around the transposed conv have any length, one reader per link.

Why, what it rejects and where it runs: docs/passes.md, section "Design notes", ``DequantizeInConvTranspose``.
"""
from __future__ import annotations

import tvm
from tvm import relay

from tvm_ext._op_pattern import K_INJECTIVE, call_pattern
from ._registry import register_pass

from ._chains import chain_arg, narrow_type
from ._doc import factory_sections
from ._util import (Reject, consumers, dataflow_nodes, fixed_point, function_pass, lift_constants, op_name, pass_logger,
                    rebuild, static_tensor_type, with_body)

__all__ = ["DequantizeInConvTranspose"]

PASS_NAME = "DequantizeInConvTranspose"
_log = pass_logger(PASS_NAME)
_MAX_CHAIN = 64
#: transposed convs grouped in one function at most; one more is taken for a malformed graph
_MAX_GROUPS = _MAX_CHAIN - 1
_8BIT = ("uint8", "int8")
#: ops whose float result holds integers, beyond narrow_type's round/floor/ceil/trunc
_INTEGRAL_EXTRA = ("tvm_ext.round_half_to_even",)


def _eight_bit_point(node):
    """The 8-bit dtype ``node`` holds (a typed 8-bit value, or a clip to 8-bit bounds of integral values), or None."""
    import numpy as np

    nt = narrow_type(node)
    if nt:
        return nt[0]
    # ``clip(round_half_to_even(x) [+ integral c], lo, hi)`` (pipelines.int8(numerics="onnxruntime"))
    if op_name(node) != "clip" or not str(node.checked_type.dtype).startswith("float32"):
        return None
    arg = node.args[0]
    if op_name(arg) in ("add", "subtract") and isinstance(arg.args[1], relay.Constant) \
            and np.all(np.mod(arg.args[1].data.numpy(), 1) == 0):
        arg = arg.args[0]
    if op_name(arg) not in _INTEGRAL_EXTRA:
        return None
    lo, hi = float(node.attrs.a_min), float(node.attrs.a_max)
    for dtype, (tlo, thi) in (("uint8", (0, 255)), ("int8", (-128, 127))):
        if lo == int(lo) and hi == int(hi) and tlo <= lo and hi <= thi:
            return dtype
    return None


def _is_typed_8bit(node) -> bool:
    return static_tensor_type(node) and str(node.checked_type.dtype) in _8BIT


def _conv_ok(t):
    """True for a float32 NCHW / IOHW transposed conv whose stride equals its kernel, else a Reject."""
    from tvm_ext.x86.conv_transpose import stride_equals_kernel

    for e in (t, t.args[0], t.args[1]):
        ok = static_tensor_type(e)
        if not ok:
            return ok
    a = t.attrs
    dtypes = (str(t.checked_type.dtype), str(t.args[0].checked_type.dtype), str(t.args[1].checked_type.dtype))
    # float32, or the integer form QNN lowers a quantized ConvTranspose to (int16/int8 in, int32 out)
    if dtypes != ("float32",) * 3 and not (dtypes[0] == "int32" and set(dtypes[1:]) <= {"int16", "int8", "uint8"}):
        return Reject(f"a {dtypes[1]} x {dtypes[2]} -> {dtypes[0]} transposed conv (float32, or integer into int32, "
                      "are grouped)")
    if (str(a.data_layout), str(a.kernel_layout), str(a.out_layout or a.data_layout)) != ("NCHW", "IOHW", "NCHW"):
        return Reject(f"layouts {a.data_layout}/{a.kernel_layout} (the direct schedule takes NCHW/IOHW)")
    if int(a.groups) != 1:
        return Reject(f"groups={int(a.groups)}")
    w_shape = [int(d) for d in t.args[1].checked_type.shape]
    if (not stride_equals_kernel(w_shape, a.strides, a.padding, a.output_padding)
            or any(int(d) != 1 for d in a.dilation)):
        return Reject("stride differs from the kernel, or padding/dilation: TVM's schedule would not inline the chain")
    return True


def _data_chain(t, users):
    """(n, chain from the conv's data down to the call reading n) or a Reject.

    ``n`` is an 8-bit typed value; failing one, the 8-bit point nearest to the conv (a clip to 8-bit
    bounds of integral values: the int32 ``clip`` of a requantize that AVX2 builds dequantize
    directly, without a cast to uint8), which the group then reads narrowed (:func:`_group`)."""
    node, chain = t.args[0], []
    if len(users.get(node, [])) != 1:
        return Reject("the conv's input has other readers")
    fallback = None
    for _ in range(_MAX_CHAIN):
        if fallback is None and chain and not _is_typed_8bit(node) and _eight_bit_point(node) \
                and len(users.get(node, [])) == 1:
            fallback = (node, list(chain))
        if _is_typed_8bit(node):
            inner = chain_arg(node, injective=True)
            if (inner is None or call_pattern(node) != K_INJECTIVE or not _is_typed_8bit(inner)
                    or len(users.get(inner, [])) != 1):
                if not chain:
                    return Reject("the conv reads an 8-bit value already")
                return node, chain
            chain.append(node)  # an 8-bit layout_transform / strided_slice: into the group too
            node = inner
            continue
        # float one-argument injective calls too (a layout_transform of the dequantized value: at
        # -mcpu=znver3 the det head conv's dequantize is fused before the NCHW8c -> NCHW transform)
        prev = chain_arg(node, injective=True)
        if prev is None:
            return fallback or Reject("no 8-bit value at the start of its private elementwise input chain")
        if len(users.get(prev, [])) != 1:
            return fallback or Reject("a value of its input chain has other readers")
        chain.append(node)
        node = prev
    return fallback or Reject(f"input chain longer than {_MAX_CHAIN} calls")


def _epilogue(t, users, body):
    """(epilogue calls after t, index of the last 8-bit point in [t] + epilogue or None, ends at result)."""
    epi, node = [], t
    for _ in range(_MAX_CHAIN):
        if node.same_as(body):
            break
        us = users.get(node, [])
        if len(us) != 1:
            break
        u = us[0][0]
        if not isinstance(u, relay.Call) or chain_arg(u) is None or not chain_arg(u).same_as(node):
            break
        epi.append(u)
        node = u
    cut = None
    for i, n in enumerate([t, *epi]):
        if _eight_bit_point(n):
            cut = i
    return epi, cut, node.same_as(body)


def _group(n, chain, t, epi_kept, out_dtype):
    """Call of a Primitive function computing ``epi_kept[-1]`` (cast to ``out_dtype``) from ``n``."""
    memo, params, args = {}, [], []

    def param_for(e):
        if e not in memo:
            v = relay.var(f"p{len(params)}", e.checked_type)
            memo[e] = v
            params.append(v)
            args.append(e)
        return memo[e]

    narrow = _eight_bit_point(n)
    if _is_typed_8bit(n) or not narrow:
        param_for(n)
    else:  # an 8-bit point of a wider type: the kernel reads it as 8 bits and widens it (exact)
        v = relay.var("p0", relay.TensorType(n.checked_type.shape, narrow))
        params.append(v)
        args.append(relay.cast(n, narrow))
        memo[n] = relay.cast(v, str(n.checked_type.dtype))
    last = None
    for node in [*reversed(chain), t, *epi_kept]:
        new_args = []
        for a in node.args:
            if a in memo:
                new_args.append(memo[a])
            elif isinstance(a, relay.Constant):
                new_args.append(a)
            else:
                new_args.append(param_for(a))
        last = relay.Call(node.op, new_args, node.attrs, node.type_args, node.span)
        memo[node] = last
    if out_dtype is not None:
        last = relay.cast(last, out_dtype)
    fn = relay.Function(params, last)
    fn, consts = lift_constants(fn)
    attrs = tvm.ir.make_node("DictAttrs", **{"Primitive": tvm.tir.IntImm("int32", 1), "tvm_ext.pattern": PASS_NAME})
    fn = relay.Function(fn.params, fn.body, None, fn.type_params, attrs)
    return relay.Call(fn, [*args, *consts], span=t.span)


def _one(func):
    """``func`` with its first groupable transposed conv grouped, or ``func`` itself."""
    nodes = dataflow_nodes(func, PASS_NAME)
    if nodes is None:
        return func
    users = consumers(nodes)
    for t in nodes:
        if not (isinstance(t, relay.Call) and op_name(t) == "nn.conv2d_transpose"):
            continue
        ok = _conv_ok(t)
        if ok:
            ok = _data_chain(t, users)
        if isinstance(ok, Reject) or not ok:
            _log.debug("nn.conv2d_transpose %s: not rewritten: %s", t.checked_type.shape, ok)
            continue
        n, chain = ok
        epi, cut, at_result = _epilogue(t, users, func.body)
        if at_result:  # the group ends at the function's result, as FuseOps would end it
            call = _group(n, chain, t, epi, None)
            subst = {epi[-1] if epi else t: call}
            where = "the function's result"
        elif cut is None:
            _log.debug("nn.conv2d_transpose %s: not rewritten: no 8-bit point after it", t.checked_type.shape)
            continue
        else:
            kept = epi[:cut]
            point = ([t, *epi])[cut]
            dtype = _eight_bit_point(point)
            typed = str(point.checked_type.dtype) == dtype
            call = _group(n, chain, t, kept, None if typed else dtype)
            subst = {point: call if typed else relay.cast(call, str(point.checked_type.dtype))}
            where = f"{dtype} {[int(d) for d in point.checked_type.shape]}"
        _log.info("nn.conv2d_transpose %s: one kernel from %s %s (%d op(s) in front) to %s",
                  [int(d) for d in t.checked_type.shape],
                  n.checked_type.dtype if _is_typed_8bit(n)
                  else f"{_eight_bit_point(n)} (narrowed {n.checked_type.dtype})",
                  [int(d) for d in n.checked_type.shape], len(chain), where)
        return with_body(func, rebuild(func.body, subst))
    return func


def _run(func):
    tgt = tvm.target.Target.current(allow_none=True)
    if tgt is not None and tgt.kind.name != "llvm" and "gpu" not in tgt.keys:
        # the grouped chain in front of the conv needs a schedule that inlines it (TVM's traverse_inline
        # stops at the conv): tvm_ext.x86.conv_transpose's at llvm, tvm_ext.gpu.schedules' at GPU targets
        _log.info("skipped: target %s is neither llvm nor a GPU (the grouped kernel needs tvm-ext's "
                  "schedules)", tgt.kind.name)
        return func
    return fixed_point(func, _one, PASS_NAME, _MAX_GROUPS)


@register_pass(PASS_NAME)
@factory_sections(PASS_NAME)
def DequantizeInConvTranspose():  # pylint: disable=invalid-name
    """Make a float transposed conv one kernel from its 8-bit input to its 8-bit output.

    ``conv2d_transpose(d(n), w)`` with ``n`` 8-bit and ``d`` a private elementwise chain (a
    dequantize, BatchNorm, ReLU), stride equal to its kernel, followed by a private elementwise chain
    down to an 8-bit point ``N`` (a quantize): one ``Primitive`` function from ``n`` to
    ``cast(N, u8)``, so neither the dequantized input nor the float output crosses kernels. Exact.

    Use last at stage ``before_fuse``.

    Notes
    -----
    Rejections are logged at DEBUG on ``tvm_ext.passes.DequantizeInConvTranspose``, rewrites at INFO.
    """
    return function_pass(PASS_NAME, _run)
