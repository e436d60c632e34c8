"""tvm-ext pattern tables."""
