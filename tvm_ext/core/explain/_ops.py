"""Small readers of Relay ops and types shared by the explainer's analysis and naming.

Tensor shapes, dtypes and bytes of a type; the ops of a function literal; an op's ``TOpPattern``
and boolean attributes; the dataflow operands of a node (as the FuseOps replay walks them).
"""
from __future__ import annotations

import math

from ..._op_pattern import K_OPAQUE


def _dtype_bytes(dtype: str) -> int:
    from ..report import dtype_bytes

    return dtype_bytes(dtype)


def _tensor_info(ty):
    from tvm import relay, tir

    if isinstance(ty, relay.TensorType):
        shape = tuple(int(d) if isinstance(d, tir.IntImm) else -1 for d in ty.shape)
        nbytes = int(math.prod(max(d, 0) for d in shape) * _dtype_bytes(ty.dtype)) if -1 not in shape else 0
        return shape, str(ty.dtype), nbytes
    return (), "tuple", 0


def _outputs(ty) -> tuple:
    """``((shape, dtype), ...)`` of a kernel's output type, one per tuple field."""
    from tvm import relay

    if isinstance(ty, relay.TupleType):
        return tuple((_tensor_info(f)[0], _tensor_info(f)[1]) for f in ty.fields)
    s, d, _ = _tensor_info(ty)
    return ((s, d),)


def _fn_ops(fn) -> list:
    """Op names called inside a function literal, in post-order ([] for any other callee)."""
    import tvm
    from tvm import relay

    ops = []
    if not isinstance(fn, relay.Function):
        return ops
    relay.analysis.post_order_visit(fn.body, lambda x: ops.append(x.op.name) if isinstance(x, relay.Call)
                                    and isinstance(x.op, tvm.ir.Op) else None)
    return ops


def _pattern_of(op_name: str) -> int:
    from ..report import op_pattern

    return K_OPAQUE if op_name.startswith("fn:") else op_pattern(op_name)


def _operands(e) -> list:
    """The dataflow operands of a Call/Tuple/TupleGetItem (``_fusion_nodes._children``); none of other nodes."""
    from tvm import relay

    from ._fusion_nodes import _children

    return _children(e) if isinstance(e, (relay.Call, relay.Tuple, relay.TupleGetItem)) else []


def _is_dynamic_type(ty) -> bool:
    from ._fusion_nodes import _is_dynamic

    return _is_dynamic(ty)


def _bool_attr(op, name) -> bool:
    try:
        v = op.get_attr(name)
    except Exception:
        return False
    if v is None:
        return False
    try:
        return bool(v)
    except Exception:
        return True


def _bool_attr_name(op_name: str, name: str) -> bool:
    import tvm

    try:
        return _bool_attr(tvm.ir.Op.get(op_name), name)
    except Exception:
        return False
