"""Text and Markdown renderings of an explanation (the HTML page is :mod:`._html`)."""
from __future__ import annotations

from typing import Optional

from ._result import _REASON_DOC, _REASON_ORDER


def _kb(n: int) -> str:
    return f"{n / 1e3:.1f} KB" if n < 1e6 else f"{n / 1e6:.2f} MB"


def _table(rows) -> list:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join(r[i].ljust(widths[i]) for i in range(len(widths))) + "  " + r[-1] for r in rows]


def summary_dict(ex) -> dict:
    """JSON-able summary of an :class:`~tvm_ext.core.explain.Explanation`: kernels, non-anchor kernels by
    reason, boundaries and bytes by reason."""
    return {
        "num_kernels": ex.num_kernels,
        "num_launched_kernels": sum(1 for k in ex.kernels if k.func_name != "__nop"),
        "verified": ex.verified,
        "non_anchor_by_reason": ex.non_anchor_kernels_by_reason(),
        "by_reason": {k: {"boundaries": n, "bytes": nb} for k, (n, nb) in ex.by_reason().items()},
    }


def summary_markdown(explanations: dict) -> str:
    """Markdown table of non-anchor kernels and crossing bytes by reason, one row per variant.

    Parameters
    ----------
    explanations : dict of str to Explanation or to :func:`summary_dict` output
        Variant name -> explanation (e.g. the benchmark's variants).
    """
    lines = ["| variant | kernels | non-anchor kernels by reason | crossing MB by reason |", "|---|---|---|---|"]
    for name, ex in explanations.items():
        d = ex if isinstance(ex, dict) else summary_dict(ex)
        na = d["non_anchor_by_reason"]
        na_txt = ", ".join(f"{k} {v}"
                           for k, v in sorted(na.items(), key=lambda kv: _REASON_ORDER.get(kv[0], 99))) or "none"
        br = d["by_reason"]
        mb = ", ".join(f"{k} {v['bytes'] / 1e6:.2f}"
                       for k, v in sorted(br.items(), key=lambda kv: _REASON_ORDER.get(kv[0], 99))) or "none"
        lines.append(f"| {name} | {d['num_kernels']} | {na_txt} | {mb} |")
    return "\n".join(lines) + "\n"


def summary_text(ex) -> str:
    """The summary table: reason -> boundaries, MB; then remedies."""
    nk, na = ex.num_kernels, sum(1 for k in ex.kernels if k.anchor)
    nop = sum(1 for k in ex.kernels if k.func_name == "__nop")  # reshape only: aliased, not launched
    check = {True: "yes", False: "NO (" + ex.verify_note + ")", None: "not checked"}[ex.verified]
    lines = [f"{nk} kernels ({na} with an anchor{f'; {nk - nop} launched, {nop} reshape-only __nop' if nop else ''}), "
             f"{len(ex.boundaries)} tensors / "
             f"{ex.crossing_bytes / 1e6:.2f} MB crossing kernels; FuseOps replay matches TVM's FuseOps: {check}",
             ""]
    rows = [("reason", "boundaries", "MB", "meaning")]
    for kind, (n, nb) in ex.by_reason().items():
        rows.append((kind, str(n), f"{nb / 1e6:.3f}", _REASON_DOC.get(kind, "")))
    lines += _table(rows)
    lines.append("")
    rows = [("what would remove it", "boundaries", "MB", "measured: kernels / MB saved, named left")]
    for r in ex.remedies:
        if r.measured:
            m = f"{r.kernels_saved} / {r.bytes_saved / 1e6:.3f}, {r.remaining} left"
        elif r.error:
            m = "not applied: " + r.error
        elif r.kind == "none":
            m = "-"
        else:
            m = "structural estimate (check_remedies() / --check measures it)"
        rows.append((r.remedy, str(r.boundaries), f"{r.nbytes / 1e6:.3f}", m))
    lines += _table(rows)
    if ex.inserted_by:
        lines.append("")
        lines.append("ops created before FuseOps: " + "; ".join(
            f"{op} by {', '.join(f'{p} (+{n})' for p, n in ps.items())}"
            for op, ps in sorted(ex.inserted_by.items())))
    return "\n".join(lines)


def table_text(ex, max_rows: Optional[int] = None) -> str:
    """Text: the summary, then every boundary, then the kernels with what they read."""
    lines = [summary_text(ex), "", "boundaries (producer -> readers: tensor, reason):"]
    shown = ex.boundaries if max_rows is None else ex.boundaries[:max_rows]
    for b in shown:
        cons = ", ".join(f"#{c}" for c in b.consumers)
        out = f".{b.output}" if b.output is not None else ""
        lines.append(f"  #{b.producer}{out} {b.op} -> {cons}: {b.dtype}{list(b.shape)} {_kb(b.nbytes)}")
        lines.append(f"      {b.kind}: {b.detail}")
        lines.append(f"      rule: {b.rule}; remedy: {b.remedy}")
    if max_rows is not None and len(ex.boundaries) > max_rows:
        lines.append(f"  ... {len(ex.boundaries) - max_rows} more (--all)")
    lines.append("")
    lines.append("kernels (inputs from other kernels, with reasons):")
    incoming: dict = {}
    for b in ex.boundaries:
        for c in b.consumers:
            incoming.setdefault(c, []).append(b)
    shown_k = ex.kernels if max_rows is None else ex.kernels[:max_rows]
    for k in shown_k:
        name = k.title
        anchor = f" anchor {k.anchor}" if k.anchor else ""
        lines.append(f"  #{k.index} {name}{anchor}: {' '.join(k.ops)}")
        for b in incoming.get(k.index, []):
            lines.append(f"      <- #{b.producer} {b.dtype}{list(b.shape)} [{b.kind}]")
    if max_rows is not None and len(ex.kernels) > max_rows:
        lines.append(f"  ... {len(ex.kernels) - max_rows} more kernels (--all)")
    return "\n".join(lines)
