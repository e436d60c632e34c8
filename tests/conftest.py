"""Session-wide test set-up.

Every test runs under a PassContext whose instrument checks, after each Relay pass, that every
Relay function in the module is well formed (no variable bound twice, no free variables in
``main``). tvm_ext.build forwards the current context's instruments, so passes run through it are
checked too. Tests that open their own PassContext replace it (TVM does not nest instruments).
"""
import logging
import os

os.environ.setdefault("TOPHUB_LOCATION", "NONE")
# Two pytest workers share the cores. After each parallel call TVM's idle pool threads yield in a loop for
# TVM_THREAD_POOL_SPIN_COUNT rounds (about half a second at the benchmark's setting), taking the core the other
# worker compiles on (on 2 cores the default tier takes about 1.3x as long with it); tests check results, not
# speed, so the pool's threads sleep at once. Set before any TVM module runs: the pool reads it when it starts.
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")

import pytest  # noqa: E402
import tvm  # noqa: E402
from tvm import relay  # noqa: E402

import tvm_ext  # noqa: E402,F401
from tvm_ext.testing import with_instruments  # noqa: E402


@tvm.instrument.pass_instrument
class WellFormed:
    """Fails the pass that leaves a malformed Relay function behind."""

    def run_after_pass(self, mod, info):
        if info.name.startswith("tir.") or info.name in ("InferType", "sequential"):
            return
        for gv in mod.get_global_vars():
            try:
                func = mod[gv]
            except tvm.TVMError:  # PartitionGraph's sub-passes rename globals in steps
                continue
            if not isinstance(func, relay.Function):
                continue
            if not relay.analysis.well_formed(func):
                raise AssertionError(f"pass {info.name} left {gv.name_hint} malformed")
            if gv.name_hint == "main" and relay.analysis.free_vars(func):
                raise AssertionError(f"pass {info.name} left free variables in main")


@pytest.fixture(autouse=True)
def _well_formed_instrument():
    with with_instruments(WellFormed()):
        yield


@pytest.fixture(autouse=True, scope="session")
def _libinfo_read_once():
    """TVM's ``te_compiler.get_shape`` calls ``tvm.support.libinfo()`` for every dimension of every op it
    lowers, and each call copies the library's ~100 compile-time flags from C++ into a new dict: a fifth
    to a third of a ``relay.build`` in these tests (constant folding lowers every constant op). The flags
    are fixed when the library is built, so the suite reads them once; what gets built is unchanged."""
    from tvm.relay.backend import te_compiler

    info = tvm.support.libinfo()
    original = te_compiler.libinfo
    te_compiler.libinfo = lambda: dict(info)
    yield
    te_compiler.libinfo = original


@pytest.fixture(autouse=True, scope="session")
def _quiet_tvm_loggers():
    logging.getLogger("autotvm").setLevel(logging.ERROR)
    logging.getLogger("te_compiler").setLevel(logging.WARNING)
    yield



# -- builds of the small zoo ResNets that tests in several modules check --------------------------
# A small zoo ResNet takes most of a minute to build on 2 cores. Tests that check the same build
# (model, pipeline, at the host target) take it from this per-process cache and carry the mark
# ``xdist_group("small_zoo:<model>")``, so that `make test` (``--dist loadgroup``) runs them in one
# pytest-xdist worker, which builds it once. (A test's xdist_group marks join into one group name:
# one mark per test.)
_SMALL_ZOO_PIPELINES = ("stock", "int8")


def pytest_configure(config):
    """``--dist loadgroup`` groups by a suffix that pytest-xdist (3.8 and older) writes into
    ``Item._nodeid``; pytest 9 no longer reads it, so each group would be spread over the workers and
    its builds made once per worker. Stop rather than run the suite at twice its cost."""
    if config.getoption("dist", "no") != "loadgroup" or int(pytest.__version__.split(".")[0]) < 9:
        return
    from importlib.metadata import version

    xdist = version("pytest-xdist")
    if tuple(int(p) for p in xdist.split(".")[:2]) <= (3, 8):
        raise pytest.UsageError(
            f"--dist loadgroup: pytest-xdist {xdist} does not group tests under pytest {pytest.__version__} "
            "(its group suffix is lost from the node ids); install the test extra's pytest<9 (pyproject.toml)")
_small_zoo_builds: dict = {}


@pytest.fixture
def small_zoo_build(request):
    """``build(name, pipeline)``: the small zoo model ``name`` (a ``ZooModel``) and its build at the
    host target, ``"stock"`` (relay.build at opt_level 3) or ``"int8"`` (tvm_ext.build with
    ``pipelines.int8()``), made once per worker process. Callers only read and run the factory.
    A test without the build's ``xdist_group`` mark is an error: it would build again elsewhere."""
    from tvm_ext.core import pipelines
    from tvm_ext.tools import zoo

    marks = request.node.iter_markers("xdist_group")
    groups = {mark.args[0] if mark.args else mark.kwargs.get("name") for mark in marks}

    def build(name: str, pipeline: str):
        if pipeline not in _SMALL_ZOO_PIPELINES:
            raise ValueError(f"small_zoo_build: pipeline must be one of {_SMALL_ZOO_PIPELINES}, not {pipeline!r}")
        group = f"small_zoo:{name}"
        if group not in groups:
            raise ValueError(f"small_zoo_build: {request.node.nodeid} needs @pytest.mark.xdist_group({group!r})")
        if (name, pipeline) not in _small_zoo_builds:
            m = zoo.load(name, small=True)
            target = tvm_ext.host_target()
            if pipeline == "stock":
                with tvm.transform.PassContext(opt_level=3):
                    lib = relay.build(tvm_ext.copy_module(m.mod), target=target, params=m.params)
            else:
                lib = tvm_ext.build(m.mod, target, m.params, passes=pipelines.int8())
            _small_zoo_builds[name, pipeline] = (m, lib)
        return _small_zoo_builds[name, pipeline]

    return build
