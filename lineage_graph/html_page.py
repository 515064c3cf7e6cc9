"""A self-contained interactive HTML view of the lineage graph: one file, inline SVG and script, no CDN,
so it opens offline (an investigator can mail it or attach it to a story's evidence folder)."""

from __future__ import annotations

import networkx as nx

from lineage_graph.link_routes import link_bends
from lineage_graph.link_styles import LINK_STYLES, OTHER_COLOR, arrow_drawn, link_kind
from scanner.text_safety import html_text, script_json, visible

_STYLE = """
body{font:14px system-ui,sans-serif;margin:0;display:flex;height:100vh;overflow:hidden}
#side{width:340px;flex:none;padding:12px;overflow:auto;border-right:1px solid #ccc;background:#fafafa;
box-sizing:border-box}
#side h2{margin:0 0 8px}#search{width:100%;box-sizing:border-box;font-size:15px;padding:6px}
#view{flex:1;min-width:0;min-height:0}#canvas{display:block;width:100%;height:100%;cursor:grab}
@media (max-width:720px){body{flex-direction:column}#side{width:auto;max-height:42vh;border-right:none;
border-bottom:1px solid #ccc;order:0}#view{order:1}}
.node rect{fill:#eef4fb;stroke:#24527a;rx:6}.node.flag rect{fill:#fde2e2;stroke:#c0392b}
.node.root text{font-weight:bold}.node.dim{opacity:.2}.node.hit rect{stroke-width:3}
.edge{fill:none}.edge.dim{opacity:.1}#legend{list-style:none;padding:0}#legend svg{vertical-align:middle}
td{vertical-align:top;padding:1px 4px}td:first-child{color:#555}
"""

_SCRIPT = r"""
const G = JSON.parse(document.getElementById('graph-data').textContent);
const NS = 'http://www.w3.org/2000/svg', svg = document.getElementById('canvas');
const root = document.getElementById('world');
// Node boxes hold the id on two lines (organisation, name) at FONT px; boxes stay at least MIN_BOX_PX wide on screen.
const SX = 162, BOX_W = 150, BOX_H = 42, FONT = 14, MIN_BOX_PX = 110, byId = {};
// Levels spread out vertically until the drawing's shape roughly matches the window's (wide hubs stay legible).
const span = i => {
  const v = Object.values(G.pos).map(p => p[i]); return Math.max(1, Math.max(...v) - Math.min(...v)); };
const SY = Math.min(400, Math.max(120, SX * span(0) / span(1) * svg.clientHeight / Math.max(1, svg.clientWidth)));
function el(tag, attrs, parent) { const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]); parent.appendChild(e); return e; }
function draw() {
  root.innerHTML = '';
  const showAll = document.getElementById('all').checked;
  for (const e of G.edges) {
    if (!e.tree_link && !showAll) continue;
    const a = G.pos[e.source], b = G.pos[e.target];
    const w = 1 + 4 * Math.log1p(e.strength) / Math.log1p(G.maxStrength);
    const x1 = a[0]*SX, y1 = -a[1]*SY, x2 = b[0]*SX, y2 = -b[1]*SY, len = Math.hypot(x2 - x1, y2 - y1) || 1;
    const dx = Math.abs(x2 - x1), dy = Math.abs(y2 - y1);  // leave each box where the line crosses its edge
    const cut = Math.min(0.45, Math.min(dx ? BOX_W / 2 / dx : 1, dy ? BOX_H / 2 / dy : 1) + 4 / len);
    const attrs = {'stroke-width': w, class: 'edge ' + e.style, 'marker-end': e.arrow ? 'url(#arrow)' : '',
      'data-source': e.source, 'data-target': e.target};
    const line = e.bend ? el('path', Object.assign({d: bent(a, b, e.bend)}, attrs), root) :
      el('line', Object.assign({x1: x1 + (x2 - x1) * cut, y1: y1 + (y2 - y1) * cut, x2: x2 - (x2 - x1) * cut,
        y2: y2 - (y2 - y1) * cut}, attrs), root);
    el('title', {}, line).textContent = e.source + ' -> ' + e.target + '\nlog10 p = ' + e.log10_p.toFixed(1) +
      '\nconfidence ' + e.confidence.toFixed(2) + ' (' + e.direction + ')\n' + e.reasons;
    e.svg = line;
  }
  for (const n of G.nodes) {
    const p = G.pos[n.id], g = el('g', {class: 'node' + (n.discrepancies ? ' flag' : '') + (n.is_root ? ' root' : ''),
      transform: 'translate(' + p[0]*SX + ',' + (-p[1]*SY) + ')', 'data-id': n.id}, root);
    el('rect', {x: -BOX_W / 2, y: -BOX_H / 2, width: BOX_W, height: BOX_H}, g);
    const cut = n.id.indexOf('/') + 1, lines = cut > 0 ? [n.id.slice(0, cut), n.id.slice(cut)] : [n.id];
    const t = el('text', {'text-anchor': 'middle', 'font-size': FONT}, g);
    lines.forEach((line, i) => { const span = el('tspan', {x: 0, y: (i - (lines.length - 1) / 2) * (FONT + 2) + 4.5},
      t); span.textContent = line.length > 22 ? line.slice(0, 21) + '\u2026' : line; });
    el('title', {}, g).textContent = n.id;
    g.addEventListener('click', () => select(n.id)); byId[n.id] = g;
  }
}
// A link the layout bends (past the boxes between its ends: link_routes.link_bends): the same quadratic curve as the
// PNG's, its middle control point `bend` layout units across the line, drawn between the two boxes.
function bent(a, b, bend) {
  const len = Math.hypot(b[0] - a[0], b[1] - a[1]) || 1;
  const c = [(a[0] + b[0]) / 2 - bend * (b[1] - a[1]) / len, (a[1] + b[1]) / 2 + bend * (b[0] - a[0]) / len];
  const out = (q, p) => Math.abs(q[0] - p[0] * SX) > BOX_W / 2 + 3 || Math.abs(q[1] + p[1] * SY) > BOX_H / 2 + 3;
  const pts = [];
  for (let k = 0; k <= 32; k++) {
    const t = k / 32, s = 1 - t, q = [s * s * a[0] + 2 * t * s * c[0] + t * t * b[0],
      s * s * a[1] + 2 * t * s * c[1] + t * t * b[1]], px = [q[0] * SX, -q[1] * SY];
    if (out(px, a) && out(px, b)) pts.push(px);
  }
  return 'M' + pts.map(q => q[0].toFixed(1) + ',' + q[1].toFixed(1)).join('L');
}
function select(id) {
  const n = G.nodes.find(x => x.id === id), rows = Object.entries(n).filter(([k]) => k !== 'id')
    .map(([k, v]) => '<tr><td>' + k + '</td><td>' + esc(v) + '</td></tr>').join('');
  const rel = G.edges.filter(e => e.source === id || e.target === id).map(e => '<li>' + esc(e.source) +
    (e.arrow ? ' &rarr; ' : ' &mdash; ') + esc(e.target) + ' (log10 p ' + e.log10_p.toFixed(1) + ', conf ' +
    e.confidence.toFixed(2) + (e.arrow ? '' : ', direction ' + esc(e.direction)) + ')<br><small>' +
    esc(e.reasons) + '</small></li>').join('');
  document.getElementById('detail').innerHTML = '<h3>' + esc(id) + '</h3><table>' + rows +
    '</table><h4>Dependences</h4><ul>' + rel + '</ul>';
}
function esc(s) { return String(s).replace(/[&<>"]/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c])); }
document.getElementById('search').addEventListener('input', ev => {
  const q = ev.target.value.toLowerCase();
  for (const id in byId) { const hit = q && id.toLowerCase().includes(q);
    byId[id].classList.toggle('hit', !!hit); byId[id].classList.toggle('dim', !!q && !hit); }
});
document.getElementById('all').addEventListener('change', draw);
let view = {x: 0, y: 0, k: 1}, drag = null;
function apply() { root.setAttribute('transform', 'translate(' + view.x + ',' + view.y + ') scale(' + view.k + ')'); }
function fit() {  // the whole graph in view on opening, never magnified beyond 1.5x, never below readable: a graph
  // too large for the window (a phone, a big family) opens at the smallest readable zoom with its topmost family
  // root centred at the top, to pan from there
  const b = root.getBBox(), W = svg.clientWidth, H = svg.clientHeight, pad = 30;
  const whole = Math.min((W - 2 * pad) / Math.max(b.width, 1), (H - 2 * pad) / Math.max(b.height, 1), 1.5);
  const k = Math.max(whole, MIN_BOX_PX / BOX_W);
  if (k === whole) {
    view = {k: k, x: (W - b.width * k) / 2 - b.x * k, y: (H - b.height * k) / 2 - b.y * k};
    return;
  }
  const roots = G.nodes.filter(n => n.is_root).map(n => G.pos[n.id]);
  const top = (roots.length ? roots : Object.values(G.pos)).reduce((p, q) => (q[1] > p[1] ? q : p));
  view = {k: k, x: W / 2 - top[0] * SX * k, y: pad + BOX_H / 2 * k - (-top[1] * SY) * k};
}
svg.addEventListener('wheel', ev => { ev.preventDefault(); const f = ev.deltaY < 0 ? 1.1 : 1 / 1.1;
  view.x = ev.offsetX - (ev.offsetX - view.x) * f; view.y = ev.offsetY - (ev.offsetY - view.y) * f;
  view.k *= f; apply(); });
svg.addEventListener('mousedown', ev => { drag = [ev.clientX - view.x, ev.clientY - view.y]; });
window.addEventListener('mouseup', () => { drag = null; });
window.addEventListener('mousemove', ev => {
  if (drag) { view.x = ev.clientX - drag[0]; view.y = ev.clientY - drag[1]; apply(); } });
draw(); fit(); apply();
"""


def _shown(value: object) -> object:
    """Every string (keys too) with invisible and reordering characters visible: the page shows text as it is."""
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, dict):
        return {_shown(k): _shown(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_shown(v) for v in value]
    return value


def _edge_css() -> str:
    """One rule per link kind from LINK_STYLES (the PNG and DOT draw from the same table)."""
    rules = [f".edge.{kind}{{stroke:{s.color}{';stroke-dasharray:6 4' if s.dashed else ''}}}"
             for kind, s in LINK_STYLES.items()]
    return "".join(rules) + f".edge.other{{stroke:{OTHER_COLOR};stroke-dasharray:2 3}}\n"


def _legend() -> str:
    """A legend entry per link kind: a short line drawn with the kind's own class, and its meaning."""
    items = []
    for kind, s in LINK_STYLES.items():
        arrow = ' marker-end="url(#arrow)"' if s.arrow else ""
        items.append(f'<li data-link="{kind}"><svg width="44" height="10"><line class="edge {kind}" x1="2" y1="5" '
                     f'x2="36" y2="5" stroke-width="2"{arrow}/></svg> {html_text(s.legend)}</li>')
    return '<ul id="legend">' + "".join(items) + "</ul>"


def render_html(graph: nx.DiGraph, pos: dict[str, tuple[float, float]], title: str = "hubtrace lineage") -> str:
    """The page as one string: graph data as inline JSON, drawing and interaction in inline script. Links the layout
    bends past other boxes (link_routes.link_bends) carry their bend, drawn as the PNG draws them."""
    bends = link_bends(graph, pos)
    data = {
        "nodes": [{"id": n, **{k: v for k, v in a.items() if k != "label"}} for n, a in sorted(graph.nodes(data=True))],
        "edges": [{"source": u, "target": v, **a, "arrow": arrow_drawn(a), "style": link_kind(a) or "other",
                   "bend": bends.get((u, v), 0.0)} for u, v, a in sorted(graph.edges(data=True))],
        "pos": {n: [x, y] for n, (x, y) in pos.items()},
        "maxStrength": max((a["strength"] for *_, a in graph.edges(data=True)), default=1.0),
    }
    payload = script_json(_shown(data))  # card text cannot end or comment out the script element
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html_text(title)}</title><style>{_STYLE}{_edge_css()}</style></head>
<body><div id="side"><h2>{html_text(title)}</h2>
<p>{graph.number_of_nodes()} models, {graph.number_of_edges()} dependent pairs
(q = {graph.graph.get('q')}, {html_text(str(graph.graph.get('method')))}). Click a model for its evidence;
red boxes: the card disagrees with the weights.</p>
<input id="search" placeholder="find a model">
<label><input type="checkbox" id="all"> show every dependent pair, not just the tree</label>
{_legend()}
<div id="detail"></div></div>
<div id="view"><svg id="canvas"><defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7"
markerHeight="7" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" fill="#24527a"/></marker></defs>
<g id="world"></g></svg></div>
<script type="application/json" id="graph-data">{payload}</script>
<script>{_SCRIPT}</script></body></html>
"""
