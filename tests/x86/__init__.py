"""Tests of tvm_ext.x86, one module per module tested. A package, so that its module names may
repeat those of tests/arm (test_int8_conv)."""
