"""``tvm_ext.explain``: why every kernel boundary exists, and what would remove it.

Design note
-----------
*What is explained*: the module FuseOps sees. ``explain`` runs the stages :func:`tvm_ext.build`
runs (bind params, relay.build's prefix, the user passes, under the same target, PassContext and
kernel contexts) and stops right before FuseOps. Each kernel carries the name the build gives it
(TVM 0.19's naming replayed without compiling; ``compile=True`` checks it against a real build).

*How a reason is found*: :mod:`._fusion_sim` replays FuseOps with a decision log. FuseOps only
fuses a node into its immediate post-dominator, so a boundary's reason is the rule that refused to
fuse the producing group's root into it, with the node where the rule failed. Nothing is inferred
from kernel names; the replay is checked against TVM's own FuseOps (``Explanation.verified``).
Reasons (``REASONS``) and remedies (``REMEDIES``) are ordered data;
:meth:`Explanation.check_remedies` applies each remedy and measures what it removed.

*Layout*: this module runs the pipeline and holds the result (:func:`explain`,
:class:`Explanation`). ``_fusion_sim`` replays FuseOps; ``_analysis`` finds kernels, boundaries
and their reasons, held in ``_result``'s records (``_ops`` reads ops and types); ``_naming`` names
kernels as TVM does; ``_remedies`` is the remedy table; ``_instruments`` holds the pass
instruments; ``_render`` and ``_html`` render text, Markdown and HTML. Design: docs/explain.md.
"""
from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Optional, Sequence

from ..build import copy_module
from ._analysis import _Analysis
from ._ops import _fn_ops, _pattern_of, _tensor_info
from ._result import _REASON_DOC, _REASON_ORDER, REASONS, Boundary, Kernel
from ._fusion_nodes import node_label
from ._fusion_sim import K_INJECTIVE, MAX_FUSED_OPS, FusionGraph
from ._instruments import FuseOpsInput, _OpCounter
from ._naming import _check_report_names, _name_kernels, _tvm_fused_functions, _tvm_kernel_names
from ._remedies import _REMEDY_BY_NAME, REMEDIES, RemedyResult, _with_start_pass
from ._render import summary_dict, summary_markdown, summary_text, table_text

logger = logging.getLogger(__name__)

__all__ = ["explain", "explain_prefused", "FuseOpsInput", "Explanation", "Kernel", "Boundary", "RemedyResult",
           "REASONS", "REMEDIES", "summary_markdown", "summary_dict"]


# -- applying a remedy: explain again --------------------------------------------------------------
def _apply_remedy(ex, remedy) -> Optional["Explanation"]:
    """Explain again with ``remedy`` applied. A pass remedy runs on the cached module FuseOps saw
    (it would run last among the before_fuse passes: the same module); a FuseOps config re-runs
    the replay; anything else re-runs the whole pipeline."""
    pre, tgt, cfg, opt_level = ex._prefused
    if remedy.pass_name is not None and remedy.stage == "start":
        if "mod" not in ex._request:
            return None
        return explain(**_with_start_pass(dict(ex._request), remedy.pass_name))
    if remedy.pass_name is not None:
        from .. import build as b
        from ..registry import create_pass

        counter = _OpCounter()
        prep = b.prepare(pre, tgt, ex._request.get("passes", ()), kernels=ex._request.get("kernels"),
                         tuned=ex._request.get("tuned"))
        with prep.contexts():
            counter._last = _OpCounter.counts(pre)
            mod = b._run_user_passes(copy_module(pre), [create_pass(remedy.pass_name)], tgt, opt_level, cfg,
                                     list(ex._request.get("disabled_pass", ())), [counter.make()])
        created = {op: dict(ps) for op, ps in ex.inserted_by.items()}
        for op, ps in counter.created.items():
            for p, n in ps.items():
                created.setdefault(op, {})[p] = created.get(op, {}).get(p, 0) + n
        return _explain_prefused(mod, tgt, cfg, opt_level, created, ex.settings, ex._request)
    if remedy.config is not None:
        cfg2 = remedy.config(dict(cfg))
        return _explain_prefused(pre, tgt, cfg2, opt_level, ex.inserted_by, ex.settings, ex._request)
    if remedy.apply is None or "mod" not in ex._request:
        return None
    kw = remedy.apply(dict(ex._request))
    if kw is None:
        return None
    return explain(**kw)


# -- the result --------------------------------------------------------------------------------
class Explanation:
    """Kernels, the tensors crossing them with a reason each, and remedies.

    Attributes
    ----------
    kernels : list of Kernel
    boundaries : list of Boundary
        One per kernel output read by other kernels (counted once, as in ``KernelReport``).
    verified : bool or None
        The FuseOps replay produced the same kernels as TVM's FuseOps (None: not checked).
    inserted_by : dict
        ``{op: {pass: count}}`` ops that passes before FuseOps created.
    remedies : list of RemedyResult
        Filled by :meth:`check_remedies` (measured); structural before that.
    """

    def __init__(self, kernels, boundaries, *, settings: dict, verified=None, verify_note: str = "",
                 inserted_by=None, kernel_report=None, request=None):
        self.kernels: list[Kernel] = list(kernels)
        self.boundaries: list[Boundary] = list(boundaries)
        self.settings = settings
        self.verified = verified
        self.verify_note = verify_note
        self.inserted_by = inserted_by or {}
        self.kernel_report = kernel_report
        self._request = request
        self._prefused = None  # (module FuseOps saw, target, config, opt_level), set by explain
        self._fusion_graph = None  # the FuseOps replay (FusionGraph), set by explain
        self.remedies: list[RemedyResult] = self._structural_remedies()

    # -- numbers ---------------------------------------------------------------------------
    @property
    def num_kernels(self) -> int:
        return len(self.kernels)

    @property
    def crossing_bytes(self) -> int:
        return sum(b.nbytes for b in self.boundaries)

    def by_reason(self) -> dict:
        """``{kind: (boundaries, bytes)}`` in ``REASONS`` order."""
        out: dict = {}
        for b in sorted(self.boundaries, key=lambda b: _REASON_ORDER.get(b.kind, 99)):
            n, nb = out.get(b.kind, (0, 0))
            out[b.kind] = (n + 1, nb + b.nbytes)
        return out

    def non_anchor_kernels_by_reason(self) -> dict:
        """Kernels without an anchor, by the reason their output was not fused onward."""
        out: dict = {}
        reason_of = {b.producer: b.kind for b in self.boundaries}
        for k in self.kernels:
            if k.anchor is None:
                kind = reason_of.get(k.index, "graph_output")
                out[kind] = out.get(kind, 0) + 1
        return out

    def _structural_remedies(self) -> list:
        res: dict = {}
        for b in self.boundaries:
            r = _REMEDY_BY_NAME[b.remedy]
            cur = res.get(r.name) or RemedyResult(r.name, r.kind, r.text, 0, 0)
            cur.boundaries += 1
            cur.nbytes += b.nbytes
            res[r.name] = cur
        order = {r.name: i for i, r in enumerate(REMEDIES)}
        return sorted(res.values(), key=lambda r: order[r.remedy])

    def check_remedies(self, names: Optional[Sequence[str]] = None) -> list:
        """Apply each remedy (or those in ``names``), explain again and measure what it removed.

        Returns the updated :attr:`remedies`: ``kernels_saved``, ``bytes_saved`` (crossing bytes)
        and ``remaining`` (boundaries the remedy still names afterwards) per remedy.
        """
        if self._request is None:
            raise ValueError("explain: this Explanation has no request to re-run (built by hand?)")
        for rr in self.remedies:
            if names is not None and rr.remedy not in names:
                continue
            remedy = _REMEDY_BY_NAME[rr.remedy]
            if remedy.kind == "none":
                continue
            try:
                after = _apply_remedy(self, remedy)
            except Exception as err:  # reported per remedy, the others still run
                rr.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                logger.warning("explain: applying %s failed: %s", rr.remedy, rr.error)
                continue
            if after is None:
                rr.error = "not applicable automatically to this pass list"
                continue
            rr.measured = True
            rr.kernels_saved = self.num_kernels - after.num_kernels
            rr.bytes_saved = self.crossing_bytes - after.crossing_bytes
            rr.remaining = sum(1 for b in after.boundaries if b.remedy == rr.remedy and remedy.matches(b))
        return self.remedies

    # -- output ----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """JSON-serialisable form."""
        return {
            "settings": self.settings,
            "verified": self.verified,
            "verify_note": self.verify_note,
            "num_kernels": self.num_kernels,
            "num_anchor_kernels": sum(1 for k in self.kernels if k.anchor),
            "num_boundaries": len(self.boundaries),
            "crossing_bytes": self.crossing_bytes,
            "by_reason": {k: {"boundaries": n, "bytes": nb, "meaning": _REASON_DOC.get(k, "")}
                          for k, (n, nb) in self.by_reason().items()},
            "remedies": [r.to_dict() for r in self.remedies],
            "inserted_by": self.inserted_by,
            "kernels": [k.to_dict() for k in self.kernels],
            "boundaries": [b.to_dict() for b in self.boundaries],
        }

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), indent=kw.pop("indent", 2), **kw)

    def summary(self) -> str:
        """The summary table: reason -> boundaries, MB; then remedies."""
        return summary_text(self)

    def table(self, max_rows: Optional[int] = None) -> str:
        """Text: the summary, then every boundary, then the kernels with what they read."""
        return table_text(self, max_rows)

    def to_html(self, title: str = "tvm-ext explain") -> str:
        """One self-contained HTML page: the kernel graph (SVG), coloured by reason, and tables."""
        from ._html import render

        return render(self, title)

    def __repr__(self) -> str:
        return (f"Explanation({self.num_kernels} kernels, {len(self.boundaries)} boundaries, "
                f"{self.crossing_bytes / 1e6:.2f} MB, verified={self.verified})")


def explain_prefused(mod, target=None, opt_level: int = 3, config: Optional[dict] = None,
                     mod_name: str = "default") -> "Explanation":
    """Explain a module exactly as FuseOps receives it (e.g. captured by :class:`FuseOpsInput`).

    No pass runs first, so ops created earlier are not attributed and remedies that re-run the
    pipeline are not applied; pass remedies and the max_depth config still are. Kernels are named
    as ``relay.build(..., mod_name=mod_name)`` names them. Control flow and closures as in
    :func:`explain`.
    """
    import tvm

    from ...x86.target import build_target

    tgt = build_target(target) if not isinstance(target, tvm.target.Target) else target
    cfg = dict(config or {})
    settings = {"target": str(tgt), "opt_level": opt_level, "at": "FuseOps input", "passes": [],
                "disabled_pass": [], "config": {k: str(v) for k, v in cfg.items()}, "mod_name": mod_name}
    request = {"tuned": False, "mod_name": mod_name}
    return _explain_prefused(copy_module(mod), tgt, cfg, opt_level, {}, settings, request)


def _prefuse_module(mod, target, params, passes, at, opt_level, config, disabled_pass, instruments, allow_vnni,
                    kernels, tuned):
    """The module relay.build hands to FuseOps, built as tvm_ext.build builds it."""
    from .. import build as b

    options = {} if allow_vnni is None else {"allow_vnni": allow_vnni}
    prep = b.prepare(mod, target, passes, at, kernels=kernels, tuned=tuned, **options)
    stages, mod, tgt = prep.stages, prep.mod, prep.target
    cur_config, cur_disabled, cur_instr = b._current_ctx_settings()
    cfg = prep.plan.configure({**cur_config, **(config or {})})
    disabled = list(dict.fromkeys([*cur_disabled, *disabled_pass]))
    instr = [*cur_instr, *instruments]
    with prep.contexts():
        mod = b._bind_params(mod, params)
        if stages["start"]:
            mod = b._run_user_passes(mod, stages["start"], tgt, opt_level, cfg, disabled, instr)
        mod, _ = b._run_prefix(mod, tgt, opt_level, cfg, disabled, instr)
        if stages["before_fuse"]:
            mod = b._run_user_passes(mod, stages["before_fuse"], tgt, opt_level, cfg, disabled, instr)
    return mod, tgt, cfg


def _closure_calls(fg) -> list:
    """Labels of the calls of closures (or other non-op callees) in the explained function."""
    return [node_label(n) for n in fg.nodes if n.kind == "closure_call"]


def explain(
    mod,
    target=None,
    params=None,
    passes=(),
    at: str = "before_fuse",
    opt_level: int = 3,
    *,
    config: Optional[dict] = None,
    disabled_pass: Sequence[str] = (),
    compile: bool = False,  # noqa: A002  (the natural name)
    check_remedies: bool = False,
    allow_vnni: Optional[bool] = None,
    kernels: Optional[bool] = None,
    tuned: Optional[bool] = None,
    mod_name: str = "default",
) -> Explanation:
    """Explain every kernel boundary FuseOps leaves in ``mod``, and what would remove it.

    Parameters
    ----------
    mod : tvm.IRModule or relay.Function
        The model (never modified).
    target, params, passes, at, opt_level, config, disabled_pass, allow_vnni, kernels, tuned, mod_name
        As for :func:`tvm_ext.build`: the explained graph is the one FuseOps sees in that build.
        ``config["relay.FuseOps.max_depth"]`` is honoured; kernels are named as that build names
        them (``tvmgen_<mod_name>_fused_...``, see :class:`Kernel`), without compiling.
    compile : bool
        Also build with :func:`tvm_ext.build`, attach its ``KernelReport`` and check the kernels'
        names against it (slower: compiles every kernel). A difference sets ``verified`` to False.
    check_remedies : bool
        Apply every applicable remedy and measure what it removes
        (:meth:`Explanation.check_remedies`).

    Returns
    -------
    Explanation

    Control flow and closures are explained as FuseOps handles them: kernels inside a closure's
    body or an ``If``/``Match`` branch are kernels; a ``Let``, ``If``, ``Match`` or reference
    node fuses nothing through it (a value read across one is a ``no_post_dominator``
    boundary); a call of a ``let``-bound closure, of a function an ``If`` returns, of a global
    function or of a constructor is no kernel and fuses nothing into it (``closure_call``).
    Values passed into a closure's parameters or returned by a closure call or an ``If`` are not
    followed across it: a kernel reading one has no boundary recorded for it.

    Raises
    ------
    TypeError, ValueError
        Bad module, passes or ``at`` (from the build stages, naming ``tvm_ext.build``).
    tvm_ext.core.tvm_bugs.UnsupportedByTVM
        A ``ValueError``: ``compile=True`` on a graph relay.build's graph executor cannot run, naming
        the construct: a call of a closure (``let``-bound, returned by an ``If``, ...) here, or
        ``If``/``Match``/references from :func:`tvm_ext.build`. ``compile=False`` explains them.
    """
    request = dict(mod=mod, target=target, params=params, passes=passes, at=at, opt_level=opt_level,
                   config=config, disabled_pass=list(disabled_pass), allow_vnni=allow_vnni, kernels=kernels,
                   tuned=tuned, mod_name=mod_name)
    counter = _OpCounter()
    logger.info("explain: running relay.build's stages up to FuseOps")
    pre, tgt, cfg = _prefuse_module(mod, target, params, passes, at, opt_level, config, disabled_pass,
                                    [counter.make()], allow_vnni, kernels, tuned)
    settings = {"target": str(tgt), "opt_level": opt_level, "at": at,
                "passes": _pass_names(passes), "disabled_pass": list(disabled_pass),
                "config": {k: str(v) for k, v in (config or {}).items()}, "mod_name": mod_name}
    ex = _explain_prefused(pre, tgt, cfg, opt_level, {op: dict(ps) for op, ps in counter.created.items()},
                           settings, request)
    if compile:
        from ..build import build
        from ..tvm_bugs import UnsupportedByTVM

        closures = _closure_calls(ex._fusion_graph)
        if closures:
            raise UnsupportedByTVM(f"explain(compile=True): main makes a {closures[0]}: relay.build's graph "
                                   "executor cannot run closures (explain with compile=False, or relay.vm)")
        factory = build(mod, target=target, params=params, passes=passes, at=at, opt_level=opt_level,
                        config=config, disabled_pass=disabled_pass, allow_vnni=allow_vnni, kernels=kernels,
                        tuned=tuned, mod_name=mod_name)
        report = factory.kernel_report
        ex.kernel_report = report
        note = _check_report_names(ex.kernels, report)
        if note:
            ex.verified = False
            ex.verify_note = (ex.verify_note + "; " if ex.verify_note else "") + note
    if check_remedies:
        ex.check_remedies()
    return ex


def _explain_prefused(pre, tgt, cfg, opt_level, created, settings, request) -> "Explanation":
    """Replay FuseOps on the module relay.build would fuse and explain its boundaries."""
    import tvm

    pre = tvm.relay.transform.InferType()(pre)
    max_depth = int(cfg.get("relay.FuseOps.max_depth", MAX_FUSED_OPS))
    logger.info("explain: replaying FuseOps")
    fg = FusionGraph(pre["main"], opt_level=opt_level, max_depth=max_depth,
                     max_function_args=int(tgt.attrs.get("max_function_args", 0)) if tgt is not None else 0)
    an = _Analysis(fg, created)
    kernels = an.kernel_list()

    # check the replay against TVM's FuseOps, and name the kernels as the build will
    mine = sorted(tuple(sorted(k.ops)) for k in kernels)
    try:  # on a copy: FuseOps may rewrite the module object it is given
        fns = _tvm_fused_functions(copy_module(pre), tgt, opt_level, cfg)
        theirs = sorted(tuple(sorted(_fn_ops(f))) for f in fns)
        verified = mine == theirs
        note = "" if verified else f"replay {len(mine)} kernels, TVM {len(theirs)}; first difference: " + \
            next((f"{a} vs {b}" for a, b in zip(mine, theirs) if a != b), "count")
        kernels, unnamed = _name_kernels(kernels, fns, _tvm_kernel_names(fns, request.get("mod_name", "default")))
        if unnamed and verified:
            verified, note = False, f"{unnamed} kernels without a TVM kernel of the same ops and outputs"
    except Exception as err:  # the check must not hide the explanation
        verified, note = None, f"TVM FuseOps failed: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
    if verified is False:
        logger.warning("explain: FuseOps replay differs from TVM's FuseOps: %s", note)

    boundaries = []
    for (ki, field_), consumers in sorted(an.boundaries().items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        r = an.kernel_roots[ki]
        ty = fg.nodes[r].expr.checked_type
        if field_ is not None and hasattr(ty, "fields"):
            ty = ty.fields[field_]
        shape, dtype, nbytes = _tensor_info(ty)
        info = an.reason(r)
        # ops a pass created, among the producer and its readers (layout_transform, pad, cast, ...; not anchors)
        ops_involved = {fg.nodes[r].op, *info["readers"]}
        inserted = tuple((op, tuple(created[op])) for op in sorted(o for o in ops_involved if o)
                         if op in created and (_pattern_of(op) <= K_INJECTIVE or op == "annotation.stop_fusion"))
        b = Boundary(ki, tuple(sorted(consumers)), field_, fg.nodes[r].op or fg.nodes[r].kind, info["readers"],
                     dtype, shape, nbytes, info["kind"], info["detail"], info["rule"], info["join"],
                     info["blocker"], info["entry"], inserted, None, kernels[ki].ops,
                     an.reader_casts(r), an.pad_value(r), an.pads_channels(r))
        if inserted:
            b = replace(b, detail=b.detail + "; created by "
                        + ", ".join(f"{op}: {'/'.join(ps)}" for op, ps in inserted))
        remedy = next(rm for rm in REMEDIES if rm.matches(b))
        boundaries.append(replace(b, remedy=remedy.name))
    settings = {**settings, "max_depth": max_depth}
    ex = Explanation(kernels, boundaries, settings=settings, verified=verified, verify_note=note,
                     inserted_by=created, request=request)
    ex._prefused = (pre, tgt, cfg, opt_level)
    ex._fusion_graph = fg
    return ex


def _pass_names(passes):
    from collections.abc import Mapping

    import tvm

    if isinstance(passes, Mapping):
        names = getattr(passes, "pass_names", None)
        if callable(names):
            return names()
        return {k: [p.info.name for p in v] for k, v in passes.items()}
    if isinstance(passes, tvm.transform.Pass):
        return [passes.info.name]
    return [p.info.name for p in passes]
