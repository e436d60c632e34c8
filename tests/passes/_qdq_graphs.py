"""QDQ building blocks shared by the tests of tvm_ext.passes.qdq_to_integer: a dequantize and a quantize at one
scale and zero point, and a plain ``llvm`` build to run graphs with."""
import tvm
from tvm import relay

S, ZP = relay.const(0.05), relay.const(0, "int32")


def dq(x, scale=S, zp=ZP):
    return relay.qnn.op.dequantize(x, scale, zp)


def q(x, scale=S, zp=ZP):
    return relay.qnn.op.quantize(x, scale, zp, out_dtype="uint8")


def llvm(mod):
    """relay.build at plain ``llvm``, once per module: the numerics tests run it on several inputs."""
    with tvm.transform.PassContext(opt_level=3):
        return relay.build(mod, target="llvm")
