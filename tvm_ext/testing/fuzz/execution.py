"""Where the oracle compiles and where it runs what it compiled.

Design note
-----------
*Targets.* :func:`targets` gives what ``tvm_ext.build`` compiles for at a target (default: the
host CPU) and what a plain ``relay.build`` compiles for there. The exact integer reference is
always :data:`EXACT_TARGET`, plain ``llvm`` for this host (no SIMD dot product), and always runs
here, whatever the target under test: on an aarch64 campaign the builds under test run on the
RPC server and are compared with what this host computed.

*Execution.* :func:`executor` says how the builds for a target run: here (code of this host's
architecture using only features it has, :func:`tvm_ext.x86.isa.runs_on_host`); on a TVM RPC
server (``rpc="HOST:PORT"``: an aarch64 board, or the qemu-user server of
:mod:`tvm_ext.testing.aarch64`); or not at all, with the reason (compiled only). A remote build is
linked here with the cross compiler, uploaded and loaded in a session of its own, run on every
input and its outputs fetched: TVM's server serves one session at a time, so two fuzzing workers
take turns only while they run a module, not while they compile.

*The prefix.* :func:`prefixed` runs the back end's ``start`` passes and relay.build's prefix as
``tvm_ext.build`` does, and :func:`build_prefixed` finishes such a module the way ``tvm_ext.build``
does after its user ``before_fuse`` passes (the back end's ``before_fuse`` passes, then the rest),
inside the contexts it compiles a pipeline's graph in (the kernel policy of the target's
architecture, tuned records, and on aarch64 the generic ``q_multiply_shift`` lowering), so the
oracle runs the prefix once per graph.
"""
from __future__ import annotations

import itertools
import os
import tempfile

__all__ = ["EXACT_TARGET", "NUM_INPUTS", "targets", "foreign_arch", "executor", "compiled_only_reason", "prefixed",
           "build_prefixed", "run_factory", "run_remote", "seeded_inputs"]

#: Seeded inputs every built graph is run on.
NUM_INPUTS = 3
#: What the exact integer reference is built for: this host, no -mcpu (no SIMD dot product).
EXACT_TARGET = "llvm"
#: Seconds an RPC session may last (one module: upload, load, NUM_INPUTS runs).
SESSION_TIMEOUT = 300

_UPLOADS = itertools.count()


def targets(target=None):
    """``(what tvm_ext.build compiles for, what a plain relay.build compiles for)`` at ``target``
    (None: the host CPU)."""
    import tvm

    from tvm_ext.x86.target import build_target, host_target, safe_target

    tgt = build_target(target, None)
    if tgt.kind.name != "llvm":  # a device target (opencl): its back end gives it the host CPU's host code
        from tvm_ext import families

        tgt = families.build_target(tgt)
        return tgt, tgt
    return tvm.target.Target(tgt, host=tgt), host_target() if target is None else safe_target(target)


def foreign_arch(target) -> str | None:
    """The target triple when ``target`` compiles for another architecture than this host's, else
    None (also for None, the host CPU)."""
    from tvm_ext.tools.deploy import foreign_arch as triple_if_foreign

    return None if target is None else triple_if_foreign(target)


def compiled_only_reason(target, rpc: str | None = None) -> str | None:
    """None when the builds for ``target`` run (here, or on the RPC server ``rpc`` for code of
    another architecture), else why outputs are not compared (every build is still made)."""
    from tvm_ext.x86.isa import missing_on_host, runs_on_host

    tgt, _ = targets(target)
    arch = foreign_arch(tgt)
    if arch:
        return None if rpc else f"outputs not compared, compiled only ({arch} code, and no RPC server to run it on)"
    if tgt.kind.name == "opencl":  # runs on OpenCL device 0 (make gpu-env: PoCL) in each worker
        from tvm_ext.gpu import opencl

        why = opencl.missing()
        return f"outputs not compared, compiled only (no OpenCL device: {why})" if why else None
    if runs_on_host(tgt):
        return None
    missing = missing_on_host(tgt) if tgt.kind.name == "llvm" else [tgt.kind.name]
    return f"outputs not compared, compiled only (the target needs {','.join(missing)}, which this host lacks)"


def executor(target, rpc: str | None = None):
    """``(run, why_not)``: ``run(factory, inputs_list) -> outputs`` for the builds at ``target``
    (None with ``why_not`` when they are compiled only)."""
    why = compiled_only_reason(target, rpc)
    if why:
        return None, why
    if rpc and foreign_arch(targets(target)[0]):
        return (lambda factory, inputs_list: run_remote(rpc, factory, inputs_list)), None
    return (lambda factory, inputs_list: run_factory(factory, inputs_list)), None


def run_factory(factory, inputs_list) -> list:
    """Outputs of a built module run here, per input dict (the graph executor's outputs in order).
    A build with OpenCL kernels runs on ``tvm.opencl(0)``: TVM's OpenCL runtime is loaded in this
    process, and a source-only OpenCL module (plain ``relay.build``, or a build made before the
    runtime was loaded) is handed to it first (:func:`tvm_ext.gpu.opencl.runnable`)."""
    import tvm
    from tvm.contrib import graph_executor

    from tvm_ext.gpu import opencl

    lib = factory.get_lib()
    if not any(m.type_key == "opencl" for m in opencl._walk(lib)):
        return _run_all(graph_executor.GraphModule(factory["default"](tvm.cpu())), inputs_list)
    why = opencl.missing()
    if why:
        raise RuntimeError(f"an opencl build runs on an OpenCL device: {why}")
    gm = graph_executor.create(factory.get_graph_json(), opencl.runnable(lib), tvm.opencl(0))
    gm.load_params(tvm.runtime.save_param_dict(factory.get_params()))
    return _run_all(gm, inputs_list)


def run_remote(address: str, factory, inputs_list) -> list:
    """:func:`run_factory` on the TVM RPC server at ``address`` (``HOST:PORT``), in a session of its own."""
    from tvm import rpc

    from tvm_ext.testing.aarch64 import load_on_session
    from tvm_ext.tools.rpc import parse_address

    host, port = parse_address(address)
    with tempfile.TemporaryDirectory(prefix="tvm-ext-fuzz-") as tmp:
        session = rpc.connect(host, port, session_timeout=SESSION_TIMEOUT)
        try:
            gm = load_on_session(session, factory, tmp, f"fuzz-{os.getpid()}-{next(_UPLOADS)}")
            return _run_all(gm, inputs_list)
        finally:
            del session  # the last reference: the server ends the session and serves the next client


def _run_all(gm, inputs_list) -> list:
    outs = []
    for inputs in inputs_list:
        for k, v in inputs.items():
            gm.set_input(k, v)
        gm.run()
        outs.append([gm.get_output(i).numpy() for i in range(gm.get_num_outputs())])
    return outs


def seeded_inputs(mod) -> list:
    """:data:`NUM_INPUTS` input dicts for ``mod`` (seeds 0, 1, ...)."""
    from tvm_ext.testing import random_inputs

    return [random_inputs(mod, seed=s) for s in range(NUM_INPUTS)]


def _prepared(tgt, mod):
    """``tvm_ext.build``'s resolution of a pipeline's build of ``mod`` at ``tgt``: its back end's
    contexts and PassContext options (:func:`tvm_ext.core.build.prepare` with the kernel policy and
    tuned records on)."""
    from tvm_ext.core.build import prepare

    return prepare(mod, tgt, kernels=True, tuned=True)


def _back_end_passes(prep, stage, mod, tgt):
    """``mod`` after the back end's own passes at ``stage`` (those ``tvm_ext.build`` runs after the
    user's there: at x86 without VNNI, the channel orders and pair packing of exact int8 convs)."""
    from tvm_ext.core.build import _run_user_passes

    passes = prep.plan.passes.get(stage, [])
    return _run_user_passes(mod, passes, tgt, 3, prep.plan.configure({}), [], []) if passes else mod


def prefixed(mod, tgt):
    """The module ``tvm_ext.build`` hands to ``before_fuse`` passes (the back end's ``start`` passes
    and relay.build's prefix applied), and the names of the prefix passes that ran."""
    from tvm_ext.core.build import _run_prefix, copy_module

    prep = _prepared(tgt, mod)
    with prep.contexts():
        return _run_prefix(_back_end_passes(prep, "start", copy_module(mod), tgt), tgt, 3)


def build_prefixed(pre, tgt, prefix_names):
    """What ``tvm_ext.build`` does after its prefix and the user's ``before_fuse`` passes: the back
    end's ``before_fuse`` passes, then relay.build with the prefix's passes disabled, inside the same
    contexts. The oracle uses it to build modules whose
    prefix it already ran (the prefix is deterministic), instead of running the prefix again for
    every pass."""
    import tvm
    from tvm import relay

    from tvm_ext.core.build import copy_module

    prep = _prepared(tgt, pre)
    with prep.contexts():  # the back end's PassContext options too (the GPU back end's lowering pass)
        pre = _back_end_passes(prep, "before_fuse", copy_module(pre), tgt)
        with tvm.transform.PassContext(opt_level=3, disabled_pass=list(prefix_names), config=prep.plan.configure({})):
            return relay.build(pre, target=tgt)
