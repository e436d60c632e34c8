"""The benchmark's builds run on a remote board (``tvm-ext bench --rpc``): uploaded, run and timed there.

A build exported by :func:`._jobs._build_job` for the board's target is linked here with the cross
compiler (or uploaded as a ``.tar`` the board links: :func:`tvm_ext.tools._remote.shared_object`),
loaded through the session and run with ``graph_executor`` on the remote CPU. Its
:class:`._measure.Engine` is timed by the remote's ``time_evaluator`` (``timer``), so neither the
network nor this host is in the numbers. All engines share the one session: TVM's server serves
one session at a time.
"""
from __future__ import annotations

from pathlib import Path

from .. import _remote
from ._measure import Engine


class RemoteBuild:
    """A module exported by :func:`._jobs._build_job`, loaded on the board behind ``sess``."""

    def __init__(self, built: dict, sess, target: str, where: str, workdir):
        from tvm import relay

        lib = _remote.shared_object(Path(built["lib"]), target, Path(workdir))
        self.sess = sess
        self.lib = _remote.upload_and_load(sess, lib, target, where)
        self.graph = Path(built["graph"]).read_text()
        self.params = relay.load_param_dict(Path(built["params"]).read_bytes())

    def engine(self, name, input_name) -> Engine:
        import tvm
        from tvm.contrib import graph_executor

        dev = self.sess.cpu(0)
        gm = graph_executor.create(self.graph, self.lib, dev)
        gm.load_params(tvm.runtime.save_param_dict(self.params))

        def call(x):
            gm.set_input(input_name, x)
            gm.run()
            return gm.get_output(0).numpy()

        def timer(x, n):
            gm.set_input(input_name, x)
            evaluator = gm.module.time_evaluator("run", dev, number=1, repeat=n)
            return [t * 1e3 for t in evaluator().results]

        return Engine(name, call, timer=timer)
