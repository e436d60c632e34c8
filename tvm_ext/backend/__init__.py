"""Back ends: one package per target family behind one small interface.

:mod:`tvm_ext.backend.interface` is the interface (:class:`~tvm_ext.backend.interface.Backend`, what a
build asks of a family); :mod:`tvm_ext.backend.select` is the ordered table of families and picks the
one a target belongs to. The families are :mod:`tvm_ext.x86`, :mod:`tvm_ext.arm` (aarch64) and
:mod:`tvm_ext.gpu`; a target of no family (``c``, an LLVM triple none of them claims) gets the
interface's defaults: ``relay.build`` as it is. ``tvm_ext.build`` asks the selected back end and has
no branch of its own on instruction sets or families. docs/backends.md says how to add a family.
"""
