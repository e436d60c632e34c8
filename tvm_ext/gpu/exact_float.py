"""Float arithmetic in GPU kernels as TIR states it: exact constants, no contraction.

An int8 graph keeps some float arithmetic inside its kernels (the input's quantize, QLinearAdd and
the QDQ add: ``round((a * s1 + b * s2) * (1 / s3))``), and rounding then moves a value next to a half
to the neighbouring 8-bit level. Two things make TVM's OpenCL C round otherwise than its LLVM code:

* TVM's C-like printers write a float constant with 7 significant digits (``std::scientific``), which
  names another float32 than the constant for most scales. :func:`ExactFloatConstants` (a TIR pass)
  writes every float32 / float64 constant that 7 digits do not name as the reinterpretation of its
  bits, so the kernel computes with the constant LLVM's code uses::

      # c : float32, float('%.6e' % c) != c  ->  reinterpret(int32 bits(c)) : float32   (as_float)
      # c : float64, float('%.6e' % c) != c  ->  reinterpret(int64 bits(c)) : float64   (as_double)

* OpenCL C contracts ``a * b + c`` into one rounding (``fma``) by default (``FP_CONTRACT ON``), as
  GPU compilers do. :func:`fp_contract_off` puts ``#pragma OPENCL FP_CONTRACT OFF`` at the top of
  every OpenCL program built while it is entered (TVM's ``tvm_callback_opencl_postproc``), so
  products and sums round separately, as TIR's ``Mul`` and ``Add`` say.

Float division keeps OpenCL's accuracy (2.5 ulp; TVM's runtime builds programs without
``-cl-fp32-correctly-rounded-divide-sqrt``): TVM turns a division by a constant into a product first.
docs/gpu.md, "Float arithmetic inside int8 kernels", has the trace and what CUDA does.
"""
from __future__ import annotations

import contextlib
import struct

from .._patch import Patch

__all__ = ["ExactFloatConstants", "fp_contract_off", "lower_config", "printed_exactly", "with_pragma",
           "PASS_NAME", "LOWER_PHASE", "PRAGMA"]

#: The pass's name in ``tir.add_lower_pass`` (one per PassContext).
PASS_NAME = "tvm_ext.gpu.ExactFloatConstants"
#: ``tir.add_lower_pass`` phase: after TVM's own simplifications, which fold constants.
LOWER_PHASE = 3
#: The first line of every OpenCL program built under :func:`fp_contract_off`.
PRAGMA = "#pragma OPENCL FP_CONTRACT OFF"

#: dtype -> (struct format, the integer of its bits, OpenCL C's reinterpreting built-in)
_BITS = {"float32": ("<f", "<i", "int32", "as_float"), "float64": ("<d", "<q", "int64", "as_double")}
_POSTPROC = "tvm_callback_opencl_postproc"


def printed_exactly(value: float, dtype: str) -> bool:
    """True when TVM's C-like printers (``std::scientific``: 7 significant digits) name ``value``."""
    import numpy as np

    if not np.isfinite(value):
        return True
    cast = np.float32 if dtype == "float32" else np.float64
    return bool(cast(float(f"{value:.6e}")) == cast(value))


def _exact(imm):
    """``imm`` (a float32 / float64 ``FloatImm``) as OpenCL C's reinterpretation of its bits
    (``as_float``, ``as_double``: TIR's ``reinterpret`` prints as a pointer cast of a literal)."""
    from tvm import tir

    dtype = str(imm.dtype)
    fmt, ifmt, itype, builtin = _BITS[dtype]
    bits = struct.unpack(ifmt, struct.pack(fmt, imm.value))[0]
    return tir.call_pure_extern(dtype, builtin, tir.IntImm(itype, bits))


def ExactFloatConstants():  # noqa: N802  (a TVM pass, named like TVM's)
    """A ``tir.PrimFunc`` pass: float32 and float64 constants that 7 significant digits do not name
    are written as the reinterpretation of their bits (module docstring)."""
    import tvm
    from tvm import tir

    def constant(node):
        if str(node.dtype) in _BITS and not printed_exactly(node.value, str(node.dtype)):
            return _exact(node)
        return None

    def kernel(node):
        # only inside a kernel (a thread_extent region): the host code is LLVM's, whose constants are exact
        if isinstance(node, tir.AttrStmt) and node.attr_key == "thread_extent":
            return tir.stmt_functor.ir_transform(node, None, constant, ["FloatImm"])
        return None

    def transform(func, _mod, _ctx):
        return func.with_body(tir.stmt_functor.ir_transform(func.body, kernel, None, ["tir.AttrStmt"]))

    return tvm.tir.transform.prim_func_pass(transform, opt_level=0, name=PASS_NAME)


def lower_config(config: dict | None = None) -> dict:
    """``config`` (PassContext options) with :func:`ExactFloatConstants` added to
    ``tir.add_lower_pass`` once, after the lower passes already there. ``config`` is not modified."""
    from .._lower_pass import with_lower_pass

    return with_lower_pass(config, LOWER_PHASE, PASS_NAME, ExactFloatConstants)


def with_pragma(code: str) -> str:
    """OpenCL C ``code`` with :data:`PRAGMA` as its first line (once)."""
    return code if code.startswith(PRAGMA) else f"{PRAGMA}\n{code}"


#: The callback registered before the outermost entry (None: none), restored on its exit.
_SAVED: list = []


def _install():
    import tvm

    previous = tvm.get_global_func(_POSTPROC, allow_missing=True)
    _SAVED[:] = [previous]

    def postproc(code, target=None):
        if previous is not None:
            code = previous(code, target)
        return with_pragma(str(code))

    tvm.register_func(_POSTPROC, postproc, override=True)


def _uninstall():
    import tvm

    previous = _SAVED.pop()
    if previous is None:
        tvm._ffi.registry.remove_global_func(_POSTPROC)
    else:
        tvm.register_func(_POSTPROC, previous, override=True)


_PATCH = Patch(_install, _uninstall)


@contextlib.contextmanager
def fp_contract_off():
    """Enter to build OpenCL programs that start with :data:`PRAGMA`. TVM looks the post-processing
    callback up by name, so it is process-wide while entered: the outermost entry registers it (after
    any callback already registered, which it calls first), the outermost exit restores what was there.
    Re-entrant and thread-safe (:class:`tvm_ext._patch.Patch`)."""
    with _PATCH.entered():
        yield
