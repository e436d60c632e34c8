"""AMX kernels run here: every tile instruction of tvm_ext.build(..., amx=True)'s code replaced by
scalar TIR that does what the instruction does (:func:`emulated_tiles`).

The emulated kernels run in a child process, after their assembly is checked free of tile instructions.
"""
import json
import os
import subprocess
import sys

import pytest
import tvm

from tvm_ext.x86 import amx, isa
from tvm_ext.x86.target import AMX_FEATURES


# --------------------------------------------------------------------------------------------
# Tile code run here through an emulation: every tile instruction replaced by scalar TIR


def emulated_tiles():
    """A TIR pass, run after ConfigureTiles, that replaces each tile instruction by scalar TIR doing
    what Intel's SDM says it does, on a tile file and a tile configuration of its own, allocated in
    each configured region (so per parallel task, as the hardware's state is per thread):

    * ``ldtilecfg`` reads the 64-byte configuration; a malformed one (palette other than 1, a
      reserved byte set, more than 16 rows or 64 bytes a row, rows without bytes or bytes without
      rows) leaves the tiles unconfigured, where the hardware raises #GP; ``tilerelease``
      unconfigures them;
    * ``tileloadd``/``tilestored``/``tilezero`` move ``rows x colsb`` of the *configured* shape;
    * ``tdpbusd`` multiplies only when the shapes agree (C rows = A rows, C colsb = B colsb,
      B rows = A colsb / 4), with uint8 x int8 products summed into int32.

    So kernels compute the right numbers only when their configuration matches the tiles they use
    and covers every tile instruction; unconfigured tile code computes nothing. Tile code outside
    a configured region is refused (AssertionError)."""
    from tvm import tir

    ids = amx._intrinsic_ids()
    by_name = {v: k for k, v in ids.items()}
    intrin = tvm.ir.Op.get("tir.call_llvm_intrin")
    access_ptr = tvm.ir.Op.get("tir.tvm_access_ptr")

    def i32(x):
        return x if x.dtype == "int32" else tir.Cast("int32", x)

    def pointer(arg):
        assert isinstance(arg, tir.Call) and arg.op.same_as(access_ptr), arg
        dtype = arg.args[0].dtype
        view = tir.decl_buffer((1 << 30,), dtype, data=arg.args[1], name="emulated_view")
        return view, tvm.DataType(dtype).bits // 8, i32(arg.args[2])

    def region(stmt):
        tiles = tir.decl_buffer((8 * 16 * 16,), "int32", name="emulated_tiles", scope="global")
        state = tir.decl_buffer((17,), "int32", name="emulated_tilecfg", scope="global")

        def emulate(name, args):
            ib = tvm.tir.ir_builder.create()
            t, s = ib.buffer_ptr(tiles), ib.buffer_ptr(state)
            reg = [int(a.value) for a in args if isinstance(a, tir.IntImm) and a.dtype == "uint8"]
            if name == "llvm.x86.ldtilecfg":
                view, size, base = pointer(args[0])
                assert size == 8
                w = [view[base + i] for i in range(8)]
                rows = [(w[6] >> (8 * k)) & 255 for k in range(8)]
                cols = [(w[2 + k // 4] >> (16 * (k % 4))) & 0xFFFF for k in range(8)]
                ok = tir.all(w[0] == 1, w[1] == 0, w[4] == 0, w[5] == 0, w[7] == 0,
                             *[tir.all(r <= 16, c <= 64, c % 4 == 0, (r == 0) == (c == 0)) for r, c in zip(rows, cols)])
                with ib.if_scope(ok):
                    s[0] = 1
                    for k in range(8):
                        s[1 + k] = i32(rows[k])
                        s[9 + k] = i32(cols[k])
                with ib.else_scope():
                    for k in range(17):
                        s[k] = 0
                return ib.get()
            if name == "llvm.x86.tilerelease":
                for k in range(17):
                    s[k] = 0
                return ib.get()
            tile = reg[0]
            rows, words = ib.let("rows", s[1 + tile]), ib.let("words", s[9 + tile] // 4)
            with ib.if_scope(s[0] == 1):
                if name == "llvm.x86.tdpbusd":
                    a, b = reg[1], reg[2]
                    ok = tir.all(s[1 + a] == rows, s[9 + b] // 4 == words, s[1 + b] == s[9 + a] // 4)
                    with ib.if_scope(ok):
                        with ib.for_range(0, rows, name="m") as m, ib.for_range(0, words, name="n") as n, \
                                ib.for_range(0, s[9 + a] // 4, name="k") as k, ib.for_range(0, 4, name="j") as j:
                            x = (t[a * 256 + m * 16 + k] >> (8 * j)) & 255
                            y = (t[b * 256 + k * 16 + n] >> (8 * j)) & 255
                            t[tile * 256 + m * 16 + n] = t[tile * 256 + m * 16 + n] + x * (y - ((y >> 7) << 8))
                else:
                    with ib.for_range(0, rows, name="r") as r, ib.for_range(0, words, name="c") as c:
                        cell = tile * 256 + r * 16 + c
                        if name == "llvm.x86.tilezero":
                            t[cell] = 0
                        else:
                            view, size, base = pointer(args[1])
                            byte = base * size + r * i32(args[2]) + 4 * c
                            if name == "llvm.x86.tilestored64":
                                assert size == 4, "tiles are stored as int32 here"
                                ib.emit(tir.BufferStore(view, t[cell], [byte // 4]))
                            elif size == 4:
                                t[cell] = view[byte // 4]
                            else:
                                t[cell] = sum(((i32(view[byte + j]) & 255) << (8 * j)) for j in range(4))
            return ib.get()

        def post(node):
            if isinstance(node, tir.Evaluate) and isinstance(node.value, tir.Call) and node.value.op.same_as(intrin):
                name = ids.get(int(node.value.args[0].value))
                if name is not None:
                    return emulate(name, list(node.value.args[2:]))
            return None

        body = tvm.tir.stmt_functor.ir_transform(stmt, None, post, ["tir.Evaluate"])
        init = tir.SeqStmt([tir.BufferStore(state, tir.const(0, "int32"), [k]) for k in range(17)] + [body])
        return tir.Allocate(tiles.data, "int32", [8 * 16 * 16], tir.const(True, "bool"), tir.DeclBuffer(
            tiles, tir.Allocate(state.data, "int32", [17], tir.const(True, "bool"), tir.DeclBuffer(state, init))))

    def pre(node):
        if isinstance(node, tir.Allocate) and node.buffer_var.name == "amx_tile_config":
            return region(node)
        return None

    def transform(func, _mod, _ctx):
        body = tvm.tir.stmt_functor.ir_transform(func.body, pre, None, ["tir.Allocate"])
        left = []
        tvm.tir.stmt_functor.post_order_visit(body, lambda n: left.append(n) if (
            isinstance(n, tir.Call) and n.op.same_as(intrin) and isinstance(n.args[0], tir.IntImm)
            and int(n.args[0].value) in ids) else None)
        names = [ids[int(c.args[0].value)] for c in left]
        assert not left, f"tile instructions outside a configured region: {names[:4]}"
        return func.with_body(body)

    assert "llvm.x86.tdpbusd" in by_name
    return tvm.tir.transform.prim_func_pass(transform, opt_level=0, name="EmulatedTiles")


_EMULATED = r"""
import json, re, sys
import numpy as np, tvm
from tvm import relay
from tvm.contrib import graph_executor
import tvm_ext
from tvm_ext.x86 import amx
sys.path.insert(0, sys.argv[1])
from x86.test_amx_emulated import emulated_tiles

AMX_CODE = re.compile(r"\b(tdp\w+|tileload\w*|tilestore\w*|tilezero|ldtilecfg|sttilecfg|tilerelease)\b|%tmm\d")
TARGET = "llvm -mcpu=sapphirerapids"
rng = np.random.default_rng(0)
if sys.argv[2] == "rows8":  # a configuration that does not match the tiles: results must go wrong
    amx.TILE_ROWS = 8


def dense(m, k, n, epilogue):
    x = relay.var("x", shape=(m, k), dtype="uint8")
    w = rng.integers(-128, 128, (n, k)).astype("int8")
    b = rng.integers(-99, 99, (n,)).astype("int32")
    y = relay.nn.dense(x, relay.const(w), out_dtype="int32")
    if epilogue:
        y = relay.nn.relu(relay.nn.bias_add(y, relay.const(b)))

    def ref(d):
        out = d.astype("int64") @ w.astype("int64").T
        return np.maximum(out + b, 0) if epilogue else out
    return tvm.IRModule.from_expr(relay.Function([x], y)), (m, k), ref


def batch_matmul(bs, m, k, n):
    x = relay.var("x", shape=(bs, m, k), dtype="uint8")
    w = rng.integers(-128, 128, (bs, n, k)).astype("int8")
    y = relay.nn.batch_matmul(x, relay.const(w), out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([x], y)), (bs, m, k), lambda d: np.einsum(
        "bmk,bnk->bmn", d.astype("int64"), w.astype("int64"))


def run(lib, data):
    g = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    g.set_input("x", data)
    g.run()
    return g.get_output(0).numpy()


out = {}
cases = {"dense": dense(64, 256, 64, False), "dense_parallel": dense(512, 512, 512, False),
         "dense_epilogue": dense(128, 512, 128, True), "batch_matmul": batch_matmul(2, 64, 256, 64)}
for name, (mod, shape, ref) in cases.items():
    emulated = tvm_ext.build(mod, target=TARGET, amx=True, config={
        "tir.add_lower_pass": [(3, amx.ConfigureTiles()), (3, emulated_tiles())]})
    asm = emulated.get_lib().get_source("asm")
    if AMX_CODE.search(asm):  # never execute a tile instruction here
        out[name] = {"refused": AMX_CODE.search(asm).group(0)}
        continue
    vnni = tvm_ext.build(mod, target=TARGET)
    data = rng.integers(0, 256, shape).astype("uint8")
    got, want = run(emulated, data), run(vnni, data)
    out[name] = {"emulated": "emulated_tiles" in emulated.get_lib().get_source("ll"),
                 "equal_vnni": bool(np.array_equal(got, want)), "equal_numpy": bool(np.array_equal(got, ref(data)))}
print("RESULT " + json.dumps(out))
"""


def _emulated_run(variant):
    if set(isa.missing_on_host("llvm -mcpu=sapphirerapids")) - set(AMX_FEATURES):
        pytest.skip("this host lacks Sapphire Rapids features besides AMX: the emulated kernels cannot run")
    r = subprocess.run([sys.executable, "-c", _EMULATED, os.path.dirname(os.path.dirname(__file__)), variant],
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.split("RESULT ", 1)[1])


def test_amx_kernels_compute_bit_exact_on_emulated_tiles():
    """TVM's AMX dense (parallel and serial with an epilogue) and batch_matmul, as tvm_ext.build(amx=True) compiles
    them, with every tile instruction emulated (:func:`emulated_tiles`, checked free of tile instructions before it
    runs, in a child process): bit-exact with the VNNI build and numpy. This checks the tile shapes ConfigureTiles
    declares, that its configuration reaches every tile instruction in every parallel task, and TVM's tile
    addressing; not the encoding of the real instructions or Linux's tile state."""
    got = _emulated_run("configured")
    for case, g in got.items():
        assert "refused" not in g, (case, g)
        assert g["emulated"] and g["equal_vnni"] and g["equal_numpy"], (case, g)


def test_emulated_tiles_detect_a_configuration_that_does_not_match():
    """The same kernels with 8-row tiles configured where TVM's intrinsics use 16: wrong results (the emulation
    would not catch a wrong configuration otherwise)."""
    got = _emulated_run("rows8")
    assert len(got) == 4, got
    assert all("refused" not in g and g["emulated"] and not g["equal_numpy"] for g in got.values()), got
