"""tvm_ext.families: which back end builds a target, and what a target is described as.

Compiled nothing for a foreign CPU: targets are resolved and described, never built, except a tiny
module at the ``c`` target (plain C, runs anywhere) against ``relay.build``.
"""
import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.target import codegen

import tvm_ext
from tvm_ext import families
from tvm_ext.arm.backend import AArch64
from tvm_ext.backend import Backend, BuildPlan, BuildRequest
from tvm_ext.gpu.backend import GPU
from tvm_ext.x86.backend import X86

ON_X86_HOST = str(codegen.llvm_get_system_triple()).split("-")[0] in ("x86_64", "amd64")


def test_families_are_asked_in_table_order_and_named_once():
    assert [type(b) for b in families.FAMILIES] == [X86, AArch64, GPU]
    names = [b.family for b in families.FAMILIES]
    assert len(set(names)) == len(names) and "generic" not in names


@pytest.mark.parametrize("target", ["llvm -mcpu=x86-64-v3", "llvm -mcpu=znver4",
                                    "llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512",
                                    tvm.target.Target("llvm -mcpu=x86-64-v2")])
def test_x86_triples_belong_to_x86(target):
    assert families.family(target) == "x86"
    assert isinstance(families.for_target(target), X86)


@pytest.mark.skipif(not ON_X86_HOST, reason="the suite's host is x86-64; this host is not")
def test_the_host_belongs_to_x86():
    assert families.family(None) == "x86"
    assert families.family("llvm") == "x86"  # no triple: the host's


@pytest.mark.parametrize("target", ["llvm -mtriple=aarch64-linux-gnu",
                                    "llvm -mtriple=aarch64-linux-gnu -mattr=+neon,+dotprod",
                                    "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-v1",
                                    "llvm -mtriple=arm64-apple-macos"])
def test_aarch64_triples_belong_to_aarch64(target):
    assert families.family(target) == "aarch64"
    assert isinstance(families.for_target(target), AArch64)


@pytest.mark.parametrize("target", ["opencl", "cuda"])
def test_gpu_kinds_belong_to_gpu(target):
    assert families.family(target) == "gpu"
    assert isinstance(families.for_target(target), GPU)


@pytest.mark.parametrize("target", ["c", "llvm -mtriple=riscv64-unknown-linux-gnu"])
def test_a_target_no_family_claims_gets_the_backend_defaults(target):
    """``c``, and an LLVM triple no family claims (resolved, never built: this LLVM may have no
    back end for it), get :class:`tvm_ext.backend.Backend` itself, whose plan adds nothing."""
    backend = families.for_target(target)
    assert type(backend) is Backend and backend.family == "generic" == families.family(target)
    assert families.isa_class(target) == "other"
    plan = backend.plan(BuildRequest(target=families.as_target(target), mod=None, kernels=True, tuned=True,
                                     eight_bit=True))
    assert isinstance(plan, BuildPlan)
    assert (plan.passes, plan.contexts, plan.instruments) == ({}, [], [])
    assert plan.configure({"a": 1}) == {"a": 1} and plan.finish("factory") == "factory"
    assert backend.records(families.as_target(target)) == [] and backend.records_path(target) is None


def test_generic_build_is_relay_build():
    """At ``c`` tvm_ext.build runs relay.build unchanged: the same graph, the same outputs."""
    x = relay.var("x", shape=(2, 3), dtype="float32")
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.nn.relu(x + relay.const(1.0))))
    with tvm.transform.PassContext(opt_level=3):
        stock = relay.build(mod, target="c")
    ours = tvm_ext.build(mod, target="c")
    assert ours.get_graph_json() == stock.get_graph_json()


@pytest.mark.parametrize("target,option", [("llvm -mtriple=aarch64-linux-gnu", {"amx": True}),
                                           ("llvm -mtriple=aarch64-linux-gnu", {"allow_vnni": True}),
                                           ("opencl", {"amx": True}),
                                           ("c", {"allow_vnni": False})])
def test_a_family_option_the_family_lacks_raises_type_error_naming_it(target, option):
    x = relay.var("x", shape=(4,), dtype="float32")
    mod = tvm.IRModule.from_expr(relay.Function([x], x * relay.const(2.0)))
    (name,) = option
    with pytest.raises(TypeError, match=rf"\['{name}'\] are not options of the"):
        tvm_ext.build(mod, target=target, **option)


def test_an_unknown_option_raises_type_error_naming_it():
    with pytest.raises(TypeError, match=r"\['lanes'\] are not options of the x86 back end"):
        families.build_target("llvm -mcpu=x86-64-v3", lanes=8)
    with pytest.raises(TypeError, match=r"\['amx'\] are not options of the aarch64 back end"):
        families.build_target("llvm -mtriple=aarch64-linux-gnu", amx=True)


def test_build_target_of_none_is_the_host():
    tgt = families.build_target(None)
    assert tgt.kind.name == "llvm"
    assert str(tgt.attrs["mcpu"]) == str(codegen.llvm_get_system_cpu())
    assert tgt.host is not None and tgt.host.kind.name == "llvm"
    assert families.family(tgt) == families.family(None)


def test_build_target_keeps_a_gpu_target_and_gives_it_a_cpu_host():
    tgt = families.build_target("opencl")
    assert tgt.kind.name == "opencl" and tgt.host.kind.name == "llvm"


@pytest.mark.parametrize("target,family,isa", [
    ("llvm -mcpu=x86-64-v3", "x86", "avx2"),
    ("llvm -mcpu=x86-64-v4", "x86", "avx512"),
    ("llvm -mcpu=znver4", "x86", "avx512_vnni"),
    ("llvm -mtriple=aarch64-linux-gnu", "aarch64", "aarch64_neon"),
    ("llvm -mtriple=aarch64-linux-gnu -mattr=+neon,+dotprod", "aarch64", "aarch64_dotprod"),
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-v1", "aarch64", "aarch64_i8mm"),
    ("opencl", "gpu", "opencl"),
    ("c", "generic", "other"),
])
def test_describe_target_gives_family_and_isa(target, family, isa):
    d = families.describe_target(target)
    assert (d["family"], d["isa"]) == (family, isa)
    assert d["kind"] == tvm.target.Target(target).kind.name
    assert d == families.describe_target(tvm.target.Target(target)), "a Target and its string agree"
    assert isinstance(d["features"], list) and np.all([isinstance(f, str) for f in d["features"]])
