"""Two commits' results of one model compared (pure: two ``result.json`` dicts in, a list of
differences out), and the summary table."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from .child import MODULE_TAIL

#: Kinds of difference :func:`compare_results` reports (``--ignore`` takes these names).
KINDS = {
    "error": "the model could not be loaded, built or run at one commit",
    "model": "the model as loaded differs (ONNX file or Relay module), so nothing else is comparable",
    "kernel count": "a different number of kernels",
    "kernel": "a kernel's name, ops, anchor or tensors differ",
    "tuned": "a kernel compiled from a tuning record at one commit only",
    "bytes": "bytes (or tensors) by dtype crossing between kernels, entering or leaving the graph",
    "crossings": "the reasons float or int32 tensors cross between kernels",
    "code": "the assembly of a function, or the built params, differ",
    "outputs": "outputs not bit-identical",
}


@dataclasses.dataclass(frozen=True)
class Difference:
    """One way a model's results differ between the two commits."""

    model: str
    kind: str  # a key of KINDS
    detail: str

    def __str__(self) -> str:
        return f"{self.model}: {self.kind}: {self.detail}"


_KERNEL_FIELDS = ("name", "func_name", "ops", "anchor", "inputs", "outputs")


def _kernel_label(k: dict) -> str:
    return f"kernel {k.get('index')} {k.get('func_name') or k.get('name')}"


def _short(value, n: int = 160) -> str:
    s = json.dumps(value) if not isinstance(value, str) else value
    return s if len(s) <= n else s[: n - 3] + "..."


def _compare_kernels(model: str, bk: list, hk: list) -> list:
    diffs = []
    if len(bk) != len(hk):
        diffs.append(Difference(model, "kernel count", f"{len(bk)} -> {len(hk)}"))
        bnames = [k.get("func_name") for k in bk]
        hnames = [k.get("func_name") for k in hk]
        for name in sorted(set(bnames) | set(hnames)):
            nb, nh = bnames.count(name), hnames.count(name)
            if nb != nh:
                k = (bk[bnames.index(name)] if nb else hk[hnames.index(name)])
                diffs.append(Difference(model, "kernel", f"{name} (ops {_short(k.get('ops'))}): {nb} in base, "
                                                          f"{nh} in head"))
        return diffs
    for b, h in zip(bk, hk):
        for field in _KERNEL_FIELDS:
            if field in b and field in h and b[field] != h[field]:
                diffs.append(Difference(model, "kernel", f"{_kernel_label(b)}: {field} {_short(b[field])} -> "
                                                          f"{_short(h[field])}"))
        if "tuned" in b and "tuned" in h and b["tuned"] != h["tuned"]:
            diffs.append(Difference(model, "tuned", f"{_kernel_label(b)}: tuned {b['tuned']} -> {h['tuned']}"))
    return diffs


def _compare_traffic(model: str, where: str, b: dict, h: dict) -> list:
    diffs = []
    for field in ("bytes", "count"):
        bd, hd = (b or {}).get(field, {}), (h or {}).get(field, {})
        for dtype in sorted(set(bd) | set(hd)):
            if bd.get(dtype, 0) != hd.get(dtype, 0):
                diffs.append(Difference(model, "bytes", f"{where} {field} {dtype}: {bd.get(dtype, 0)} -> "
                                                         f"{hd.get(dtype, 0)}"))
    return diffs


def _compare_code(model: str, b: dict, h: dict, kernels: list) -> list:
    bf, hf = (b.get("code") or {}).get("functions", {}), (h.get("code") or {}).get("functions", {})
    if not bf or not hf:
        return []
    names = [k.get("func_name") for k in kernels]

    def owner(fn):  # the kernel a function belongs to (its compute function, its parallel lambdas)
        best = max((n for n in names if n and (fn == n or fn.startswith(n + "_compute_"))), key=len, default=None)
        return f" (kernel {best})" if best and best != fn else ""

    diffs = []
    for fn in sorted((set(bf) | set(hf)) - {MODULE_TAIL}):
        if fn not in bf or fn not in hf:
            side = "head" if fn in hf else "base"
            diffs.append(Difference(model, "code", f"function {fn}{owner(fn)} only in {side}"))
        elif bf[fn] != hf[fn]:
            diffs.append(Difference(model, "code", f"function {fn}{owner(fn)}: assembly differs"))
    if not diffs and bf.get(MODULE_TAIL) != hf.get(MODULE_TAIL):  # debug info follows every function's code
        diffs.append(Difference(model, "code", f"assembly {MODULE_TAIL} differs"))
    if b.get("params_sha256") and h.get("params_sha256") and b["params_sha256"] != h["params_sha256"]:
        diffs.append(Difference(model, "code", "built params differ"))
    return diffs


def _compare_runs(model: str, b: dict, h: dict, base_dir=None, head_dir=None) -> list:
    br, hr = b.get("runs"), h.get("runs")
    if br is None or hr is None:
        return []
    diffs = []
    hmap = {r["seed"]: r for r in hr}
    for rb in br:
        rh = hmap.get(rb["seed"])
        if rh is None:
            diffs.append(Difference(model, "outputs", f"seed {rb['seed']}: not run at head"))
            continue
        if rb.get("inputs_sha256") != rh.get("inputs_sha256"):
            diffs.append(Difference(model, "outputs", f"seed {rb['seed']}: the inputs differ"))
        ob, oh = rb["outputs"], rh["outputs"]
        if len(ob) != len(oh):
            diffs.append(Difference(model, "outputs", f"seed {rb['seed']}: {len(ob)} -> {len(oh)} outputs"))
            continue
        for i, (xb, xh) in enumerate(zip(ob, oh)):
            if (xb["shape"], xb["dtype"]) != (xh["shape"], xh["dtype"]):
                diffs.append(Difference(model, "outputs", f"seed {rb['seed']} output {i}: {xb['dtype']}{xb['shape']} "
                                                           f"-> {xh['dtype']}{xh['shape']}"))
            elif xb["sha256"] != xh["sha256"]:
                diffs.append(Difference(model, "outputs", f"seed {rb['seed']} output {i}: not bit-identical"
                                                           + _max_diff(base_dir, head_dir, xb["file"], xh["file"])))
    return diffs


def _max_diff(base_dir, head_dir, fb, fh) -> str:
    """`` (max |diff| x, n of m elements differ)`` from the saved arrays, or ``""`` without them."""
    if base_dir is None or head_dir is None:
        return ""
    try:
        import numpy as np

        a, b = np.load(Path(base_dir) / fb), np.load(Path(head_dir) / fh)
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
        return f" (max |diff| {np.nanmax(d):.6g}, {int(np.count_nonzero(a != b))} of {a.size} elements differ)"
    except (OSError, ValueError) as err:  # the hashes already say they differ
        return f" (arrays not readable: {err})"


def compare_results(base: dict, head: dict, base_dir=None, head_dir=None, ignore=()) -> list:
    """Every difference between two ``result.json`` dicts of the same model, as :class:`Difference`.

    ``base_dir``/``head_dir`` (the folders of the results) let an output difference say how large
    it is. ``ignore``: kinds (keys of :data:`KINDS`) left out. An empty list means identical.
    """
    unknown = set(ignore) - set(KINDS)
    if unknown:
        raise ValueError(f"compare_results: unknown kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    model = base.get("model") or head.get("model") or "?"
    if base.get("error") or head.get("error"):
        diffs = [Difference(model, "error", f"{side}: {r['error']}") for side, r in (("base", base), ("head", head))
                 if r.get("error")]
        return [d for d in diffs if d.kind not in ignore]
    diffs = []
    bm, hm = base.get("model_digest") or {}, head.get("model_digest") or {}
    for key in sorted(set(bm) & set(hm)):
        if bm[key] != hm[key]:
            diffs.append(Difference(model, "model", f"{key} {_short(bm[key], 20)} -> {_short(hm[key], 20)}"))
    br, hr = base["report"], head["report"]
    bk, hk = br.get("kernels") or [], hr.get("kernels") or []
    if br.get("num_kernels", len(bk)) != hr.get("num_kernels", len(hk)) and len(bk) == len(hk):
        diffs.append(Difference(model, "kernel count", f"{br.get('num_kernels')} -> {hr.get('num_kernels')}"))
    diffs += _compare_kernels(model, bk, hk)
    for where in ("crossing", "inputs", "outputs"):
        diffs += _compare_traffic(model, where, br.get(where), hr.get(where))
    for key in ("float_crossings", "int_crossings"):
        if key in br and key in hr and br[key] != hr[key]:
            nb, nh = len(br[key] or []), len(hr[key] or [])
            diffs.append(Difference(model, "crossings", f"{key}: {nb} -> {nh} entries, "
                                                        f"{'contents differ' if nb == nh else 'counts differ'}"))
    diffs += _compare_code(model, base, head, bk)
    diffs += _compare_runs(model, base, head, base_dir, head_dir)
    return [d for d in diffs if d.kind not in ignore]


def summary_row(base: dict, head: dict, diffs: list) -> dict:
    """One table row: kernels, crossing bytes, code and outputs identical, for two results."""

    def kernels(r):
        return "error" if r.get("error") else str(r["report"].get("num_kernels"))

    def nbytes(r):
        return "error" if r.get("error") else str(r["report"].get("crossing", {}).get("total_bytes"))

    kinds = {d.kind for d in diffs}
    failed = base.get("error") or head.get("error")
    ran = not failed and base.get("runs") is not None and head.get("runs") is not None
    return {
        "model": base.get("model") or head.get("model"),
        "kernels": f"{kernels(base)} / {kernels(head)}",
        "bytes": f"{nbytes(base)} / {nbytes(head)}",
        "code": "-" if failed or not (base.get("code") and head.get("code")) else ("n" if "code" in kinds else "y"),
        "outputs": "-" if not ran else ("n" if "outputs" in kinds else "y"),
        "differences": len(diffs),
    }


def table(rows: list) -> str:
    """Markdown table of :func:`summary_row` rows."""
    lines = [("| model | kernels base / head | crossing bytes base / head | code identical | outputs identical "
              "| differences |"), "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['kernels']} | {r['bytes']} | {r['code']} | {r['outputs']} "
                     f"| {r['differences']} |")
    return "\n".join(lines)
