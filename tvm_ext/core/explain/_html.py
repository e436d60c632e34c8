"""Self-contained HTML page for :meth:`tvm_ext.core.explain.Explanation.to_html`.

Design note
-----------
One file, no network: inline CSS, an inline SVG of the kernel graph and a few lines of inline JS
(click a kernel or an edge to highlight it and show its details; filter edges by reason). The
layout is computed here: kernels are placed in layers by longest path from the inputs, ordered
within a layer by two barycenter sweeps, so a CNN reads top to bottom and a detector's branches
sit side by side. Edges are the crossing tensors, labelled with dtype and bytes, coloured by reason.
Every kernel is one ``<g class="kernel">`` element (the browser test counts them).
"""
from __future__ import annotations

import html
import json

# one colour per reason kind (colour-blind friendly-ish, distinct on white)
COLOURS = {
    "two_anchors": "#7f7f7f",
    "after_reduction": "#8c564b",
    "injective_after_anchor": "#1f77b4",
    "prologue_into_anchor": "#17becf",
    "multiple_readers": "#ff7f0e",
    "no_post_dominator": "#bcbd22",
    "stop_fusion": "#d62728",
    "function_boundary": "#9467bd",
    "closure_call": "#aec7e8",
    "opaque_op": "#e377c2",
    "dynamic_shape": "#2ca02c",
    "tuple": "#393b79",
    "max_depth": "#000000",
    "max_function_args": "#637939",
    "postponed_dropped": "#8c6d31",
    "fusion_disabled": "#c49c94",
    "other": "#c7c7c7",
}
BOX_W, BOX_H, GAP_X, GAP_Y = 190, 34, 40, 46


def _layout(n, edges):
    """Layers by longest path, order by barycenter sweeps. Returns {kernel: (x, y)}, width, height."""
    preds = {i: [] for i in range(n)}
    succs = {i: [] for i in range(n)}
    for a, b in edges:
        if a != b:
            preds[b].append(a)
            succs[a].append(b)
    layer = [0] * n
    for i in range(n):  # kernels are in topological order
        layer[i] = max((layer[p] + 1 for p in preds[i] if p < i), default=0)
    layers: dict = {}
    for i in range(n):
        layers.setdefault(layer[i], []).append(i)
    pos = {}
    for lv in sorted(layers):
        for j, k in enumerate(layers[lv]):
            pos[k] = j
    for sweep in range(2):
        for lv in sorted(layers):
            nb = (lambda k: preds[k]) if sweep == 0 else (lambda k: succs[k])

            def key(k, nb=nb):  # used by the sort right below, in this iteration
                ns = nb(k)
                return sum(pos[m] for m in ns) / len(ns) if ns else pos[k]

            layers[lv].sort(key=key)
            for j, k in enumerate(layers[lv]):
                pos[k] = j
    width = max((len(v) for v in layers.values()), default=1)
    coords = {}
    for lv, ks in layers.items():
        off = (width - len(ks)) * (BOX_W + GAP_X) / 2
        for j, k in enumerate(ks):
            coords[k] = (20 + off + j * (BOX_W + GAP_X), 20 + lv * (BOX_H + GAP_Y))
    return coords, 40 + width * (BOX_W + GAP_X) + 80, 40 + (max(layers, default=0) + 1) * (BOX_H + GAP_Y)


def _kb(n: int) -> str:
    return f"{n / 1e3:.1f} KB" if n < 1e6 else f"{n / 1e6:.2f} MB"


def render(ex, title: str) -> str:
    """The page (a string)."""
    esc = html.escape
    edges = [(b.producer, c) for b in ex.boundaries for c in b.consumers]
    coords, width, height = _layout(len(ex.kernels), edges)
    svg = [f'<svg id="graph" xmlns="http://www.w3.org/2000/svg" width="{int(width)}" height="{int(height)}" '
           f'viewBox="0 0 {int(width)} {int(height)}">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" '
           'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#555"/></marker></defs>']
    for bi, b in enumerate(ex.boundaries):
        colour = COLOURS.get(b.kind, "#c7c7c7")
        for c in b.consumers:
            x1, y1 = coords[b.producer]
            x2, y2 = coords[c]
            sx, sy, tx, ty = x1 + BOX_W / 2, y1 + BOX_H, x2 + BOX_W / 2, y2
            my = (sy + ty) / 2
            label = f"{b.dtype} {_kb(b.nbytes)}"
            if ty - sy > BOX_H + GAP_Y and abs(tx - sx) < BOX_W:
                # an edge skipping layers (a residual): leave from the right side, bow out past the column
                sx, sy, tx, ty = x1 + BOX_W, y1 + BOX_H / 2, x2 + BOX_W, y2 + BOX_H / 2
                bow = sx + GAP_X * 0.8 + min(ty - sy, 600) / 30
                tip = (f"#{b.producer} -> #{c}: {b.dtype}{list(b.shape)} {_kb(b.nbytes)}\n"
                       f"{b.kind}: {b.detail}\nremedy: {b.remedy}")
                svg.append(f'<g class="edge" data-kind="{esc(b.kind)}" data-b="{bi}">'
                           f'<title>{esc(tip)}</title>'
                           f'<path d="M {sx:.0f} {sy:.0f} C {bow:.0f} {sy:.0f}, {bow:.0f} {ty:.0f}, {tx:.0f} {ty:.0f}" '
                           f'stroke="{colour}" stroke-width="2" fill="none" marker-end="url(#arrow)"/>'
                           f'<text x="{bow - 10:.0f}" y="{my:.0f}" font-size="9" fill="{colour}">'
                           f'{esc(label)}</text></g>')
                continue
            tip = (f"#{b.producer} -> #{c}: {b.dtype}{list(b.shape)} {_kb(b.nbytes)}\n"
                   f"{b.kind}: {b.detail}\nremedy: {b.remedy}")
            svg.append(f'<g class="edge" data-kind="{esc(b.kind)}" data-b="{bi}">'
                       f'<title>{esc(tip)}</title>'
                       f'<path d="M {sx:.0f} {sy:.0f} C {sx:.0f} {my:.0f}, {tx:.0f} {my:.0f}, {tx:.0f} {ty:.0f}" '
                       f'stroke="{colour}" stroke-width="2" fill="none" marker-end="url(#arrow)"/>'
                       f'<text x="{(sx + tx) / 2 + 4:.0f}" y="{my:.0f}" font-size="9" fill="{colour}">'
                       f'{esc(label)}</text></g>')
    for k in ex.kernels:
        x, y = coords[k.index]
        fill = "#fff3cd" if k.anchor else "#e8f0fe"
        name = k.title
        short = " ".join(k.ops)
        short = short if len(short) <= 34 else short[:31] + "..."
        tip = f"#{k.index} {name}\nops: {' '.join(k.ops)}\nanchor: {k.anchor or '-'}\noutput: " + \
              ", ".join(f"{t}{list(s)}" for s, t in k.outputs)
        svg.append(f'<g class="kernel" data-k="{k.index}"><title>{esc(tip)}</title>'
                   f'<rect x="{x:.0f}" y="{y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="4" fill="{fill}" '
                   f'stroke="#333"/><text x="{x + 4:.0f}" y="{y + 13:.0f}" font-size="10" font-weight="bold">'
                   f'#{k.index} {esc(k.anchor or "(no anchor)")}</text>'
                   f'<text x="{x + 4:.0f}" y="{y + 27:.0f}" font-size="9">{esc(short)}</text></g>')
    svg.append("</svg>")

    by = ex.by_reason()
    legend = "".join(
        f'<label><input type="checkbox" class="kf" value="{esc(k)}" checked> '
        f'<span class="sw" style="background:{COLOURS.get(k, "#ccc")}"></span>'
        f'{esc(k)} ({n}, {nb / 1e6:.3f} MB)</label> '
        for k, (n, nb) in by.items())
    data = json.dumps({"boundaries": [b.to_dict() for b in ex.boundaries],
                       "kernels": [k.to_dict() for k in ex.kernels]}).replace("</", "<\\/")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 12px; }}
pre {{ background: #f6f6f6; padding: 8px; overflow-x: auto; font-size: 12px; }}
.sw {{ display: inline-block; width: 12px; height: 12px; margin-right: 3px; vertical-align: middle; }}
#wrap {{ overflow: auto; border: 1px solid #ccc; max-height: 80vh; }}
#info {{ white-space: pre-wrap; font-family: monospace; font-size: 12px; min-height: 3em; }}
.kernel {{ cursor: pointer; }} .edge {{ cursor: pointer; }}
.hl rect {{ stroke: #d62728; stroke-width: 3; }} .hl path {{ stroke-width: 5; }}
.off {{ display: none; }}
</style></head><body>
<h1>{esc(title)}</h1>
<pre>{esc(ex.summary())}</pre>
<div>{legend}</div>
<div id="info">Click a kernel or an edge.</div>
<div id="wrap">{''.join(svg)}</div>
<script id="data" type="application/json">{data}</script>
<script>
(function () {{
  var data = JSON.parse(document.getElementById('data').textContent);
  var info = document.getElementById('info');
  function clear() {{ document.querySelectorAll('.hl').forEach(function (e) {{ e.classList.remove('hl'); }}); }}
  document.querySelectorAll('.kernel').forEach(function (g) {{
    g.addEventListener('click', function () {{
      clear(); g.classList.add('hl');
      var k = data.kernels[+g.getAttribute('data-k')];
      var title = k.name === null ? '(no TVM kernel of these ops)' :
        (k.func_name === null || k.func_name === k.name ? k.name : k.name + ' (graph executor: ' + k.func_name + ')');
      var lines = ['#' + k.index + ' ' + title, 'ops: ' + k.ops.join(' ')];
      data.boundaries.forEach(function (b) {{
        if (b.consumers.indexOf(k.index) >= 0)
          lines.push('<- #' + b.producer + ' ' + b.dtype + ' [' + b.kind + '] ' + b.detail);
        if (b.producer === k.index)
          lines.push('-> #' + b.consumers.join(', #') + ' ' + b.dtype + ' [' + b.kind + '] remedy: ' + b.remedy);
      }});
      info.textContent = lines.join('\\n');
    }});
  }});
  document.querySelectorAll('.edge').forEach(function (g) {{
    g.addEventListener('click', function () {{
      clear(); g.classList.add('hl');
      var b = data.boundaries[+g.getAttribute('data-b')];
      info.textContent = '#' + b.producer + ' -> #' + b.consumers.join(', #') + '  ' + b.dtype +
        ' [' + b.shape.join(',') + '] ' + b.nbytes + ' bytes\\n' + b.kind + ': ' + b.detail +
        '\\nrule: ' + b.rule + '\\nremedy: ' + b.remedy;
    }});
  }});
  document.querySelectorAll('.kf').forEach(function (cb) {{
    cb.addEventListener('change', function () {{
      document.querySelectorAll('.edge[data-kind="' + cb.value + '"]').forEach(function (e) {{
        e.classList.toggle('off', !cb.checked);
      }});
    }});
  }});
  document.body.setAttribute('data-kernels', String(document.querySelectorAll('.kernel').length));
}})();
</script>
</body></html>
"""
