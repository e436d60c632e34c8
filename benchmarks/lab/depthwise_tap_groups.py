#!/usr/bin/env python
"""8-bit depthwise convs with several taps per 32-bit lane, as TOPI compute + schedule: exact, faster
in llvm-mca's hot loop, slower when timed. The study behind docs/kernels-static.md's depthwise bullet.

The taps of a kernel row are taken ``G`` at a time: the input is copied once per conv into groups of
``G`` horizontally adjacent pixels per channel, the kernel into groups of ``G`` adjacent ``kw`` taps
(zero-padded), and one dot instruction multiplies a group per lane::

    xg[n, c, y, x, b, j] = x[n, c, y, x + j * dw, b]        (zero outside the input; once per conv)
    wg[c, ky, q, b, j]   = w[c, ky, G * q + j, b]           (zero for G * q + j >= kw)
    out[n, c, y, x, b]   = sum_{ky, q, j} xg[n, c, y*sh + ky*dh, x*sw + G*q*dw, b, j] * wg[c, ky, q, b, j]

``G = 2`` (int16 pairs, ``vpmaddwd``) on AVX2 / AVX-512, ``G = 4`` (bytes, ``vpdpbusd``) on AVX-512
VNNI for uint8 data. Not installed by tvm-ext: the regrouping stage costs more than the loop saves.
tvm-ext's AVX-512 VNNI kernel (``tvm_ext.x86.depthwise_taps``) permutes the taps in registers
instead; this script switches it off, so "TVM" below is TVM's own depthwise compute.

    python benchmarks/lab/depthwise_tap_groups.py time --target "llvm -mcpu=znver5" [--threads 1]
    python benchmarks/lab/depthwise_tap_groups.py mca --cpu znver5   # kernel_mca's table with the form

``time``: PP-OCR cls v2's depthwise convs alone (debug executor, min of repeats), TVM's form against
tap groups, each checked against numpy int64 first. ``mca``: the model built with the form installed,
depthwise hot loops counted by their products with a weight (:func:`hot_loop_macs`).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import sys

import numpy as np
import tvm
from tvm import te

os.environ.setdefault("TOPHUB_LOCATION", "NONE")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tvm_ext.x86 import _depthwise_template  # noqa: E402
from tvm_ext.x86.int8_policy import needs_operand_fix  # noqa: E402
from tvm_ext.x86.isa import isa_class, llvm_features  # noqa: E402

logger = logging.getLogger("depthwise_tap_groups")

TAG = "depthwise_conv2d_NCHWc_tap_groups"
_CLASSES = ("avx2", "avx512", "avx512_vnni", "amx")
#: ``(int16 vector, int32 vector, vpmaddwd)`` per count of int32 lanes.
_PMADDWD = {4: ("int16x8", "int32x4", "llvm.x86.sse2.pmadd.wd"),
            8: ("int16x16", "int32x8", "llvm.x86.avx2.pmadd.wd"),
            16: ("int16x32", "int32x16", "llvm.x86.avx512.pmaddw.d.512")}


def _lanes(block: int, target) -> int | None:
    """int32 lanes of one dot instruction for a channel block: the widest vector the target has that
    divides ``block``, or None."""
    feats = llvm_features(target)
    widest = 16 if "avx512bw" in feats else 8 if "avx2" in feats else 4
    for lanes in (16, 8, 4):
        if lanes <= widest and block % lanes == 0:
            return lanes
    return None


def group_size(data_dtype: str, kernel_dtype: str, out_dtype: str, block: int, target) -> int | None:
    """Taps per lane for a depthwise conv on ``target``: 4 (bytes, ``vpdpbusd``) for uint8 x int8 with
    AVX-512 VNNI and 16- or 8-lane blocks, 2 (int16 pairs) for other 8-bit convs on AVX2 and
    AVX-512, None where TVM's depthwise conv is kept."""
    if not ENABLED["on"] or target is None or isa_class(target) not in _CLASSES:
        return None
    if data_dtype not in ("uint8", "int8") or kernel_dtype not in ("uint8", "int8") or out_dtype != "int32":
        return None
    lanes = _lanes(block, target)
    if lanes is None:
        return None
    vnni = {"avx512vnni", "avx512vl"} <= llvm_features(target)
    if vnni and data_dtype == "uint8" and kernel_dtype == "int8" and lanes in (8, 16) and needs_operand_fix():
        return 4
    return 2


def _dot(lanes: int, group: int, data_t: str, kernel_t: str):
    """The tensor intrinsic ``int32[lanes] += sum_j data_t[lanes][group] * kernel_t[lanes][group]``."""
    data = te.placeholder((lanes, group), dtype=data_t, name="data")
    kernel = te.placeholder((lanes, group), dtype=kernel_t, name="kernel")
    j = te.reduce_axis((0, group), name="j")
    out = te.compute((lanes,), lambda i: te.sum(data[i, j].astype("int32") * kernel[i, j].astype("int32"), axis=j),
                     name="C")
    bufs = {t: tvm.tir.decl_buffer(t.shape, dtype=t.dtype, name=t.name + "_buf", offset_factor=1,
                                   strides=[group, 1]) for t in (data, kernel)}
    acc_t = f"int32x{lanes}"

    def product(a, b, acc):
        if group == 2:
            pairs_t, _, maddwd = _PMADDWD[lanes]
            dot = tvm.tir.call_llvm_pure_intrin(acc_t, maddwd, tvm.tir.const(2, "uint32"), a, b)
            return dot if acc is None else dot + acc
        acc = tvm.tir.const(0, acc_t) if acc is None else acc
        return tvm.tir.call_llvm_pure_intrin(acc_t, f"llvm.x86.avx512.vpdpbusd.{32 * lanes}",
                                             tvm.tir.const(3, "uint32"), acc, a, b)

    def intrin_func(ins, outs):
        def emit(kind):  # "body": c = dot, "reset": c = 0, "update": c += dot
            ib = tvm.tir.ir_builder.create()
            if kind == "reset":
                ib.emit(outs[0].vstore(0, tvm.tir.const(0, acc_t)))
                return ib.get()
            a = ins[0].vload([0, 0], f"{data_t}x{lanes * group}")
            b = ins[1].vload([0, 0], f"{kernel_t}x{lanes * group}")
            acc = outs[0].vload([0], acc_t) if kind == "update" else None
            ib.emit(outs[0].vstore(0, product(a, b, acc)))
            return ib.get()

        return emit("body"), emit("reset"), emit("update")

    return te.decl_tensor_intrin(out.op, intrin_func, binds={data: bufs[data], kernel: bufs[kernel]},
                                 default_buffer_params={"offset_factor": 1})


def compute(cfg, data, kernel, strides, padding, dilation, out_dtype, group):
    """The depthwise conv in tap groups of ``group`` (the module note) for NCHWc data ``[n, c, h, w, b]``
    and kernel ``[c, 1, kh, kw, 1, b]``; ``cfg`` gets TVM's knobs and fallback."""
    g = _depthwise_template.define_knobs(cfg, data, kernel, strides, padding, dilation, out_dtype)
    n, chunks, height, width, block = (g[k] for k in ("n", "chunks", "height", "width", "block"))
    kh, kw, sh, sw, dh, dw = (g[k] for k in ("kh", "kw", "sh", "sw", "dh", "dw"))
    top, left, out_h, out_w = (g[k] for k in ("top", "left", "out_h", "out_w"))

    groups = -(-kw // group)
    wide = "int16" if group == 2 else data.dtype
    # xg: the input in groups of `group` adjacent pixels per channel, zero outside it
    cols = (out_w - 1) * sw + (groups - 1) * group * dw + 1
    rows = (out_h - 1) * sh + (kh - 1) * dh + 1

    def pixel(b, c, y, x, i, j):
        yy, xx = y - top, x + j * dw - left
        inside = tvm.tir.all(yy >= 0, yy < height, xx >= 0, xx < width)
        value = data[b, c, tvm.te.max(tvm.te.min(yy, height - 1), 0), tvm.te.max(tvm.te.min(xx, width - 1), 0), i]
        return tvm.tir.Select(inside, value.astype(wide), tvm.tir.const(0, wide))

    xg = te.compute((n, chunks, rows, cols, block, group), pixel, name="tap_group_data")

    def weight(c, y, q, i, j):
        tap = q * group + j
        value = kernel[c, 0, y, tvm.te.min(tap, kw - 1), 0, i]
        return tvm.tir.Select(tap < kw, value.astype("int16" if group == 2 else kernel.dtype),
                              tvm.tir.const(0, "int16" if group == 2 else kernel.dtype))

    wg = te.compute((chunks, kh, groups, block, group), weight, name="tap_group_kernel")
    ry, rq, rj = (te.reduce_axis((0, kh), name="ky"), te.reduce_axis((0, groups), name="q"),
                  te.reduce_axis((0, group), name="j"))
    return te.compute(
        (n, chunks, out_h, out_w, block),
        lambda b, c, y, x, i: te.sum(
            xg[b, c, y * sh + ry * dh, x * sw + rq * group * dw, i, rj].astype(out_dtype)
            * wg[c, ry, rq, i, rj].astype(out_dtype), axis=[ry, rq, rj]),
        name="DepthwiseConv2dTapGroups", tag=TAG, attrs={"tap_group": group})


def schedule(cfg, s, conv, output):
    """Schedule ``conv`` (:func:`compute`) and its fused ``output`` in ``s``: the input groups and the kernel
    groups as loop nests of their own, then TVM's depthwise loop order (``tile_ow`` accumulators per
    row, parallel over channel blocks x rows) with one dot instruction per group and lane vector."""
    xg, wg = conv.op.input_tensors
    group = int(conv.op.attrs["tap_group"])
    lanes = _lanes(int(conv.shape[-1]), tvm.target.Target.current())
    b, c, y, x, i, j = s[xg].op.axis
    s[xg].parallel(s[xg].fuse(b, c, y))
    s[xg].reorder(x, j, i)
    s[xg].unroll(j)
    s[xg].vectorize(i)
    c, y, q, i, j = s[wg].op.axis
    s[wg].reorder(q, j, i)
    s[wg].unroll(j)
    s[wg].vectorize(i)

    cc, (_, chunk, oh, ow, blk), (ky, q, j) = _depthwise_template.row_loops(cfg, s, conv, output)
    outer, inner = s[cc].split(blk, factor=lanes)
    s[cc].reorder(chunk, oh, ky, q, ow, outer, inner, j)
    if cfg["unroll_kw"].val:
        s[cc].unroll(q)
    s[cc].unroll(ow)
    s[cc].unroll(outer)
    s[cc].tensorize(inner, _dot(lanes, group, xg.dtype, wg.dtype))


def _applies(data, kernel, out_dtype) -> int | None:
    """Taps per lane for TVM's depthwise compute arguments on the current target, or None."""
    if len(data.shape) != 5 or len(kernel.shape) != 6:
        return None
    block = int(data.shape[-1])
    if int(kernel.shape[1]) * int(kernel.shape[4]) != 1 or int(kernel.shape[-1]) != block:
        return None
    return group_size(str(data.dtype), str(kernel.dtype), str(out_dtype), block, tvm.target.Target.current())


def _choose(data, kernel, strides, padding, dilation, out_dtype, target):
    """:func:`compute` for these TOPI arguments, or why TVM's stays."""
    group = _applies(data, kernel, out_dtype)
    if group is None:
        return "not taken by group_size"
    logger.debug("depthwise_tap_groups: %s in groups of %d", tuple(data.shape), group)
    return lambda cfg: compute(cfg, data, kernel, strides, padding, dilation, out_dtype, group)


def wrap_compute(original):
    """TVM's ``depthwise_conv2d_NCHWc`` compute, with :func:`compute` for the convs :func:`group_size`
    takes: the same task name, workload and config as TVM's template."""
    return _depthwise_template.wrap_compute(original, _choose, "depthwise_tap_groups")


def wrap_schedule(original):
    """TVM's ``schedule_depthwise_conv2d_NCHWc``, with :func:`schedule` for the convs of :func:`compute`."""
    return _depthwise_template.wrap_schedule(original, TAG, schedule, "depthwise_tap_groups")


def hot_loop_macs(dots: dict, func, target) -> int | None:
    """Products with a weight per iteration of a depthwise kernel's loop that runs ``dots`` (``"mnemonic
    width"`` -> count, :mod:`tvm_ext.tools.mca`), when the depthwise conv of the Relay function ``func`` is
    built in tap groups for ``target``; None where it keeps TVM's form. A group's lane multiplies ``G``
    taps, of which ``kw / ceil(kw / G)`` per group carry a weight on average (zero-padded groups)."""
    from tvm import relay

    convs = []

    def visit(node):
        if isinstance(node, relay.Call) and getattr(node.op, "name", "") == "nn.contrib_depthwise_conv2d_NCHWc":
            convs.append(node)

    relay.analysis.post_order_visit(func, visit)
    if len(convs) != 1:
        return None
    call = convs[0]
    data, kernel = call.args[0].checked_type, call.args[1].checked_type
    out_dtype = str(call.attrs.out_dtype) or str(data.dtype)
    group = group_size(str(data.dtype), str(kernel.dtype), out_dtype, int(data.shape[-1]), tvm.target.Target(target))
    if group is None:
        return None
    kw = int(call.attrs.kernel_size[1])
    taps = kw / -(-kw // group)
    lanes = {"zmm": 16, "ymm": 8, "xmm": 4}
    return round(sum(n * lanes.get(form.split()[-1], 0) * taps for form, n in dots.items()
                     if form.split()[0] in ("vpmaddwd", "vpdpwssd", "vpdpbusd")))


#: PP-OCR cls v2's depthwise convs: (channels, input height, width, k, strides)
SHAPES = [(8, 24, 96, 3, (2, 1)), (24, 12, 96, 3, (2, 1)), (32, 6, 96, 3, (1, 1)), (32, 6, 96, 5, (2, 1)),
          (88, 3, 96, 5, (1, 1)), (40, 3, 96, 5, (1, 1)), (48, 3, 96, 5, (1, 1)), (104, 3, 96, 5, (2, 1)),
          (200, 2, 96, 5, (1, 1))]


@functools.lru_cache(maxsize=None)
def install():
    """Put the form in front of TVM's x86 depthwise conv for this process (it applies only inside
    ``tvm_ext.x86.int8_conv.kernels()``, where ``_fallback_schedule`` is tvm-ext's, to the convs
    :func:`group_size` takes; ``ENABLED`` switches it), with tvm-ext's own tap kernel switched off."""
    import tvm.topi.x86 as x86

    from tvm_ext.x86 import int8_policy

    int8_policy._DEPTHWISE_TAPS = frozenset()  # pylint: disable=protected-access
    x86.depthwise_conv2d_NCHWc = wrap_compute(x86.depthwise_conv2d_NCHWc)
    x86.schedule_depthwise_conv2d_NCHWc = wrap_schedule(x86.schedule_depthwise_conv2d_NCHWc)


ENABLED = {"on": True}


def _reference(x, w, strides, pad):
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    k, (sh, sw) = w.shape[-1], strides
    oh, ow = (xp.shape[2] - k) // sh + 1, (xp.shape[3] - k) // sw + 1
    out = np.zeros((1, x.shape[1], oh, ow), np.int64)
    for a in range(k):
        for b in range(k):
            out += xp[:, :, a:a + sh * (oh - 1) + 1:sh, b:b + sw * (ow - 1) + 1:sw] * w[None, :, 0, a, b, None, None]
    return np.clip((out + 1000) >> 7, 0, 255)


def time_shapes(target, rounds=8):
    """Per shape: ``(shape, TVM's us, tap groups' us)``, min over ``rounds`` alternating rounds."""
    from tvm import relay
    from tvm.contrib import graph_executor
    from tvm.contrib.debugger import debug_executor

    from tvm_ext.x86 import int8_conv as x86_int8

    install()
    rng, out = np.random.default_rng(0), []
    for c, h, w, k, st in SHAPES:
        x = relay.var("x", shape=(1, c, h, w), dtype="uint8")
        wt = rng.integers(-128, 128, (c, 1, k, k)).astype("int8")
        y = relay.nn.conv2d(x, relay.const(wt), kernel_size=(k, k), channels=c, groups=c, strides=st,
                            padding=(k // 2, k // 2), out_dtype="int32")
        y = relay.cast(relay.clip(relay.right_shift(y + relay.const(1000), relay.const(7)), 0, 255), "uint8")
        mod, xv = tvm.IRModule.from_expr(relay.Function([x], y)), rng.integers(0, 256, (1, c, h, w)).astype("uint8")
        runs = {}
        for on in (False, True):
            ENABLED["on"] = on
            with x86_int8.kernels(), tvm.transform.PassContext(opt_level=3):
                lib = relay.build(mod, target=target)
            g = graph_executor.GraphModule(lib["default"](tvm.cpu()))
            g.set_input("x", xv)
            g.run()
            if not np.array_equal(g.get_output(0).numpy().astype(np.int64), _reference(xv, wt, st, k // 2)):
                raise AssertionError(f"{'tap groups' if on else 'TVM'} differs from numpy on {(c, h, w, k, st)}")
            m = debug_executor.create(lib.get_graph_json(), lib.get_lib(), tvm.cpu())
            m.set_input("x", xv)
            nodes = [i for i, n in enumerate(m.debug_datum.get_graph_nodes()) if "depthwise" in n["name"]]
            runs[on] = (m, nodes)
        ENABLED["on"] = True
        best = {on: float("inf") for on in runs}
        for _ in range(rounds):
            for on, (m, nodes) in runs.items():
                best[on] = min(best[on], sum(min(m.run_individual_node(i, number=50, repeat=5).results)
                                             for i in nodes))
        out.append(((c, h, w, k, st), best[False] * 1e6, best[True] * 1e6))
    return out


def mca(cpu):
    """kernel_mca's analysis of PP-OCR cls v2 QDQ at ``cpu`` with the form installed."""
    from tvm_ext.tools import mca as tool
    from tvm_ext.tools import zoo

    install()
    model = zoo.load("ppocr_cls_v2_int8_qdq")
    target = tool.cpu_model(cpu).target
    orig = tool.analyze_factory

    def analyze_factory(factory, name):
        analysis = orig(factory, name)
        funcs = tool._kernel_funcs(factory)  # pylint: disable=protected-access
        for i, k in enumerate(analysis.kernels):
            grouped = k.hot and k.kind == "depthwise" and hot_loop_macs(k.hot.dots, funcs[k.name], target)
            if grouped:
                analysis.kernels[i] = dataclasses.replace(k, hot=dataclasses.replace(k.hot, macs=grouped))
        return analysis

    tool.analyze_factory = analyze_factory
    try:
        analysis = tool.analyze(model.mod, model.params, cpu=cpu)
    finally:
        tool.analyze_factory = orig
    return analysis


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("time")
    t.add_argument("--target", default="llvm -mcpu=x86-64-v3")
    t.add_argument("--rounds", type=int, default=8)
    m = sub.add_parser("mca")
    m.add_argument("--cpu", default="znver5")
    args = ap.parse_args(argv)
    if args.cmd == "time":
        rows = time_shapes(args.target, args.rounds)
        print("| depthwise conv (channels, input, k, strides) | TVM (us) | tap groups (us) | TVM / tap groups |")
        print("|---|---|---|---|")
        for shape, a, b in rows:
            print(f"| {shape} | {a:.2f} | {b:.2f} | {a / b:.2f} |")
        print(f"| sum | {sum(r[1] for r in rows):.1f} | {sum(r[2] for r in rows):.1f} | "
              f"{sum(r[1] for r in rows) / sum(r[2] for r in rows):.2f} |")
    else:
        from kernel_mca import kernel_rows

        analysis = mca(args.cpu)
        print(f"{args.cpu}: whole model {100 * analysis.share:.0f}%")
        print("\n".join(kernel_rows(analysis)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
