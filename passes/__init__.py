"""tvm-ext Relay passes."""
