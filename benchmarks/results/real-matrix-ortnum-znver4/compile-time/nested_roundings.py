"""Nested roundings in one fused kernel: compile time and bit-exactness, formula vs op."""
import sys, time
import numpy as np
import tvm
from tvm import relay
from tvm.contrib import graph_executor
from tvm_ext.ops import round_half_to_even as op


def formula(v, dtype="float32"):
    """The Relay formula RoundHalfToEven emitted before tvm_ext.round_half_to_even (reads v 7 times)."""
    c = lambda x: relay.const(x, dtype)  # noqa: E731
    f = relay.floor(v)
    d = relay.subtract(v, f)
    odd = relay.subtract(f, relay.multiply(c(2.0), relay.floor(relay.multiply(c(0.5), f))))
    tie = relay.where(relay.equal(d, c(0.5)), odd, c(0.0))
    return relay.add(f, relay.where(relay.greater(d, c(0.5)), c(1.0), tie))


k = int(sys.argv[1]); which = sys.argv[2]
rne = formula if which == "formula" else (lambda v, dtype="float32": op(v))
x = relay.var("x", shape=(1, 16, 32, 32), dtype="uint8")
v = relay.cast(x, "float32")
for i in range(k):
    v = relay.multiply(relay.subtract(v, relay.const(3.0)), relay.const(0.5, "float32"))
    v = relay.sigmoid(v) if i == 0 else v
    v = relay.clip(rne(v), 0, 255)
y = relay.cast(v, "uint8")
mod = tvm.IRModule.from_expr(relay.Function([x], y))
t0 = time.perf_counter()
with tvm.transform.PassContext(opt_level=3):
    lib = relay.build(mod, target="llvm")
bt = time.perf_counter() - t0
gm = graph_executor.GraphModule(lib["default"](tvm.cpu()))
gm.set_input("x", np.random.RandomState(0).randint(0, 256, (1, 16, 32, 32)).astype("uint8")); gm.run()
out = gm.get_output(0).numpy()
print(which, k, f"{bt:.2f}s")
