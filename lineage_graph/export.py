"""Exports of the lineage graph: GraphML and GEXF (Gephi), node-link JSON, DOT, an offline interactive HTML
page, and a PNG family tree. One networkx graph feeds them all, so every format says the same thing."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

import networkx as nx

from lineage_graph.discrepancies import ACCUSATIONS
from lineage_graph.evidence import Direction
from lineage_graph.lineage import Lineage
from lineage_graph.link_routes import label_point, link_bends, link_curve
from lineage_graph.link_styles import LINK_STYLES, OTHER_COLOR, arrow_drawn, link_kind
from scanner.text_safety import PLOT_TEXT, dot_string, json_document, plot_label, xml_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ExportFormat = Literal["graphml", "gexf", "json", "dot", "html", "png"]
FORMATS: tuple[str, ...] = get_args(ExportFormat)


def lineage_graph(lineage: Lineage, *, family: str | None = None, model: str | None = None) -> nx.DiGraph:
    """Models as nodes, dependent pairs as edges (parent -> child when a direction is known).

    family keeps one family; model keeps one model and every model it depends on. Attributes are plain
    str/int/float/bool (None dropped) so GraphML and GEXF keep them.
    """
    if family is not None and family not in {f.family_id for f in lineage.families}:
        raise KeyError(f"no family {family!r}")
    if model is not None and model not in lineage.models:
        raise KeyError(f"no model {model!r}")
    graph = nx.DiGraph(q=lineage.q, method=lineage.method, statistic=lineage.statistic)
    flagged: dict[str, list[str]] = {}
    for d in lineage.discrepancies:
        if d.kind in ACCUSATIONS:  # a "cannot tell" entry accuses no one: no red box
            flagged.setdefault(d.model_id, []).append(d.kind)
    links = {}
    for f in lineage.families:
        for m in f.members:
            info = lineage.models[m]
            attrs = {
                "label": m, "family": f.family_id, "is_root": m == f.root and f.root_decided,
                "revision": info.revision,
                "architecture": info.architecture, "n_layers": info.n_layers, "hidden_size": info.hidden_size,
                "intermediate_size": info.intermediate_size,
                "declared_base_models": ", ".join(info.declared_base_models),
                "declared_relation": info.declared_relation, "claims_from_scratch": info.claims_from_scratch,
                "license": info.license, "created_at": info.created_at.isoformat() if info.created_at else None,
                "discrepancies": ", ".join(flagged.get(m, [])),
            }
            graph.add_node(m, **{k: v for k, v in attrs.items() if v is not None})
        links.update({(p, c): kind for p, c, kind in f.tree_edges()})
    for e in lineage.edges:
        if not e.dependent:
            continue
        d = e.direction
        u, v = (d.parent, d.child) if d.parent else e.pair
        link = links.get((u, v)) or links.get((v, u)) or ""
        if link and (u, v) not in links:
            u, v = v, u  # the tree chose the other orientation: draw the edge the way the tree reads
        graph.add_edge(u, v, log10_p=e.test.log10_p, log10_q=e.log10_q, joins_family=e.joins_family,
                       strength=e.strength, statistic=e.test.statistic, directed=d.claimed,
                       direction=_direction_word(d, link),
                       confidence=(d.confidence if (u, v) == (d.parent, d.child) or d.parent is None
                                   else 1 - d.confidence),
                       reasons="; ".join(d.reasons), tree_link=link, kinship=e.kinship or "",
                       blocks_matched=len(e.block_map),
                       block_map=" ".join(f"{a}:{b}" for a, b in e.block_map))
    if family is not None:
        graph = graph.subgraph([n for n, a in graph.nodes(data=True) if a["family"] == family]).copy()
    if model is not None:
        graph = graph.subgraph({model} | set(graph.predecessors(model)) | set(graph.successors(model))).copy()
    return graph


def _direction_word(direction: Direction, link: str) -> str:
    """What an export says of an edge's direction, in one word an investigator can filter on."""
    if link == "copy":
        return "copy"
    if direction.claimed:
        return "decided"
    return "undecided" if direction.parent is not None else "unknown"


ROW_SLOTS = 10
"""Leaf slots per row of the layout: families are packed into rows this wide (or as wide as the widest family),
so a hub of many small families comes out as a block a page or a screen can show, not one endless row."""


BESIDE_SLOTS = 2.0
"""How far right of its parent a model joined by an undecided or copy link sits, at least: one slot puts the two boxes
side by side with no room for the link's label between them (the demo's copy of cobalt-base hid its p-value)."""


def tree_layout(graph: nx.DiGraph) -> dict[str, tuple[float, float]]:
    """Each family drawn top-down along its tree links (x in leaf slots, y = -depth), families packed into rows. Only
    a claimed direction puts a model below another: a model joined to its tree parent by an undecided or a copy link
    sits beside it on the same row (to its right, at least BESIDE_SLOTS from the box before it), so the drawing never
    shows an order the evidence leaves open; a link to such a model past other boxes is bent around them
    (link_bends)."""
    tree = nx.DiGraph((u, v) for u, v, a in graph.edges(data=True) if a.get("tree_link") in ("tree", "copy"))
    tree.add_nodes_from(graph.nodes)
    roots = sorted((n for n in tree.nodes if tree.in_degree(n) == 0),
                   key=lambda n: (graph.nodes[n].get("family", n), -len(nx.descendants(tree, n)), n))

    def place(node: str, depth: int, local: dict[str, tuple[float, float]], slot: list[float]) -> float:
        children = sorted(tree.successors(node))
        below = [c for c in children if arrow_drawn(graph.edges[node, c])]
        beside = [c for c in children if c not in below]
        if not below:
            x = slot[0]
            slot[0] += 1.0
        else:
            xs = [place(c, depth + 1, local, slot) for c in below]
            x = sum(xs) / len(xs)
        local[node] = (x, float(depth))
        last = x
        for c in beside:  # each BESIDE_SLOTS right of the box before it on the row: room for the link's label
            slot[0] = max(slot[0], last + BESIDE_SLOTS)
            last = place(c, depth, local, slot)
        return x

    trees = []
    for root in roots:
        local: dict[str, tuple[float, float]] = {}
        slot = [0.0]
        place(root, 0, local, slot)
        trees.append((local, slot[0], max(d for _, d in local.values())))
    row_slots = max([ROW_SLOTS, *(width for _, width, _ in trees)])
    pos: dict[str, tuple[float, float]] = {}
    x0 = top = row_depth = 0.0
    for local, width, depth in trees:
        if x0 and x0 + width > row_slots:
            x0, top, row_depth = 0.0, top + row_depth + 1.0, 0.0
        pos |= {n: (x0 + x, -(top + d)) for n, (x, d) in local.items()}
        x0 += width + 0.5
        row_depth = max(row_depth, depth)
    return pos


def write_dot(graph: nx.DiGraph, path: Path) -> None:
    """Graphviz DOT: families as clusters, tree links bold, merges dashed, copies dashed without an arrow, other
    dependences dotted grey."""
    lines = ["digraph lineage {", "  rankdir=TB; node [shape=box, style=rounded];"]
    by_family: dict[str, list[str]] = {}
    for n, a in graph.nodes(data=True):
        by_family.setdefault(a.get("family", ""), []).append(n)
    for i, (fid, nodes) in enumerate(sorted(by_family.items())):
        lines.append(f"  subgraph cluster_{i} {{ label={dot_string(fid)};")
        for n in sorted(nodes):
            a = graph.nodes[n]
            attrs = {k: v for k, v in a.items() if k != "label"}
            color = ', color="red"' if a.get("discrepancies") else ""
            lines.append(f"    {dot_string(n)} [label={dot_string(n)}{color}, "
                         + ", ".join(f"{k}={dot_string(v)}" for k, v in sorted(attrs.items())) + "];")
        lines.append("  }")
    for u, v, a in sorted(graph.edges(data=True)):
        kind = link_kind(a)
        link = LINK_STYLES[kind] if kind else None
        style = "dotted" if link is None else "dashed" if link.dashed else "bold"
        extra = f", color={dot_string(link.color if link else OTHER_COLOR)}"
        extra += "" if arrow_drawn(a) else ", dir=none"
        label = f"log10 p {a['log10_p']:.0f}, {_confidence_label(a)}"
        lines.append(f"  {dot_string(u)} -> {dot_string(v)} [style={style}{extra}, label={dot_string(label)}, "
                     f"penwidth={1 + math.log10(1 + a['strength']):.2f}, reasons={dot_string(a.get('reasons', ''))}];")
    lines.append("}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _confidence_label(attrs: dict) -> str:
    """The confidence as an edge label: undecided links say so (their confidence is below the level set)."""
    word = attrs.get("direction")
    return f"conf {attrs['confidence']:.2f}" + (" undecided" if word == "undecided" else "")


def write_png(graph: nx.DiGraph, path: Path, title: str = "hubtrace lineage") -> None:
    """A family tree a person can read: labelled boxes, arrows parent -> child, width by -log10 p."""
    import matplotlib.pyplot as plt

    fig = draw_tree(graph, title)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def draw_tree(graph: nx.DiGraph, title: str = "hubtrace lineage") -> Figure:
    """The PNG's figure (tree links in their LINK_STYLES, a legend entry per kind drawn), for write_png to save. The
    model boxes are laid out first; a link the layout bends (link_bends) is drawn along its curve between the boxes
    as rendered, a straight one between them as an arrow."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    pos = tree_layout(graph)
    width = max((x for x, _ in pos.values()), default=0) + 1
    depth = -min((y for _, y in pos.values()), default=0) + 1
    fig, ax = plt.subplots(figsize=(max(8.0, 1.6 * width), max(4.5, 2.4 * depth + 1.5)))
    drawn = [(u, v, a) for u, v, a in graph.edges(data=True) if a.get("tree_link")]
    boxes = {}
    for n, (x, y) in pos.items():
        a = graph.nodes[n]
        flagged = bool(a.get("discrepancies"))
        boxes[n] = ax.text(x, y, plot_label(n).replace("/", "/\n", 1), ha="center", va="center", fontsize=8.5,
                           **PLOT_TEXT, fontweight="bold" if a.get("is_root") else "normal", zorder=3,
                           bbox=dict(boxstyle="round,pad=0.4", fc="#fde2e2" if flagged else "#eef4fb",
                                     ec="#c0392b" if flagged else "#24527a", lw=1.5 if flagged else 1.0))
    ax.set_xlim(-0.8, width - 0.2)
    ax.set_ylim(-depth + 0.4, 0.6)
    ax.axis("off")
    ax.set_title(title)
    kinds = {link_kind(a) for *_, a in drawn} | {"tree"}
    ax.legend(handles=[
        *(Line2D([], [], color=s.color, lw=2.5 if k == "tree" else 2, ls="--" if s.dashed else "-",
                 label=s.legend + ("; width: −log10 p" if k == "tree" else "")) for k, s in LINK_STYLES.items()
          if k in kinds),
        Line2D([], [], marker="s", ls="", mfc="#fde2e2", mec="#c0392b", label="card disagrees with weights"),
    ], loc="lower right", fontsize=8, frameon=False)
    fig.tight_layout()
    fig.canvas.draw()  # the boxes' rendered extents, which a curved link starts and ends at
    _draw_links(ax, graph, pos, {n: _box_extent(fig, ax, t) for n, t in boxes.items()})
    return fig


def link_id(parent: str, child: str) -> str:
    """The id a drawn link carries (matplotlib's gid, an SVG export's id): its two models, one per line."""
    return f"{parent}\n{child}"


def _box_extent(fig: Figure, ax: object, text: object) -> object:
    """A drawn model box's extent in data coordinates."""
    extent = text.get_bbox_patch().get_window_extent(fig.canvas.get_renderer())  # type: ignore[attr-defined]
    return ax.transData.inverted().transform_bbox(extent)  # type: ignore[attr-defined]


def _draw_links(ax: object, graph: nx.DiGraph, pos: dict[str, tuple[float, float]], extents: dict[str, object]
                ) -> None:
    """Every tree link in its style, width by -log10 p, labelled with its p-value and confidence: straight where
    nothing lies between its boxes, else along its bent curve with the label at the bend."""
    from matplotlib.patches import FancyArrowPatch
    from matplotlib.path import Path as CurvePath

    drawn = [(u, v, a) for u, v, a in graph.edges(data=True) if a.get("tree_link")]
    top = max((a["strength"] for *_, a in drawn), default=1.0)
    bends = link_bends(graph, pos)
    order = {(u, v): k for u in pos for k, v in enumerate(sorted(graph.successors(u), key=lambda c: pos[c][0]))}
    for u, v, a in drawn:
        link = LINK_STYLES[link_kind(a)]
        style = dict(arrowstyle="-|>" if arrow_drawn(a) else "-", mutation_scale=18,
                     linestyle="--" if link.dashed else "-", color=link.color,
                     lw=0.8 + 4.0 * math.log1p(a["strength"]) / math.log1p(top))
        curve = link_curve(pos[u], pos[v], bends[(u, v)])
        if bends[(u, v)]:
            between = [q for q in curve if not extents[u].contains(*q) and not extents[v].contains(*q)]
            ax.add_patch(FancyArrowPatch(path=CurvePath(between if len(between) >= 2 else curve), zorder=2,
                                         gid=link_id(u, v), **style))  # type: ignore[attr-defined]
        else:
            ax.annotate("", xy=pos[v], xytext=pos[u],  # type: ignore[attr-defined]
                        arrowprops=dict(shrinkA=22, shrinkB=22, gid=link_id(u, v), **style))
        merge = a["tree_link"] in ("merge", "alternative")
        # a bend's label at its top, one along a row between the boxes; else merge labels nearer the child and
        # siblings' labels alternating along their links, so a parent with many children does not stack them in a row
        prefer = (0.5 if bends[(u, v)] or pos[u][1] == pos[v][1] else 0.3 if merge
                  else 0.4 + 0.2 * (order[(u, v)] % 2))
        mx, my = label_point(curve, pos, prefer)
        ax.text(mx, my, f"p=1e{a['log10_p']:.0f}\n{_confidence_label(a)}", fontsize=7,  # type: ignore[attr-defined]
                ha="center", va="center", color="#333", zorder=4,
                bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8))


def styled(graph: nx.DiGraph) -> nx.DiGraph:
    """A copy whose tree links say how they are drawn: ``line_style`` (solid/dashed) and ``arrow`` for GraphML,
    which has no style of its own, and Gephi's viz color and shape for GEXF (added by write_graph)."""
    out = graph.copy()
    for *_, a in out.edges(data=True):
        if (kind := link_kind(a)) is not None:
            link = LINK_STYLES[kind]
            a.update(line_style="dashed" if link.dashed else "solid", arrow=arrow_drawn(a))
    return out


def _gexf_viz(graph: nx.DiGraph) -> nx.DiGraph:
    """Tree links with GEXF's edge viz (colour and shape), which Gephi draws; other edges as they are."""
    for *_, a in graph.edges(data=True):
        if (kind := link_kind(a)) is not None:
            link = LINK_STYLES[kind]
            r, g, b = (int(link.color[i:i + 2], 16) for i in (1, 3, 5))
            a["viz"] = {"color": {"r": r, "g": g, "b": b, "a": 1.0}, "shape": "dashed" if link.dashed else "solid"}
    return graph


def xml_safe(graph: nx.DiGraph) -> nx.DiGraph:
    """A copy whose ids and text attributes XML 1.0 can hold (a control character in a card field would otherwise
    make a GraphML or GEXF file that no XML parser reads); the XML writers escape markup themselves."""
    def clean(attrs: dict) -> dict:
        return {k: xml_text(v) if isinstance(v, str) else v for k, v in attrs.items()}

    safe = nx.DiGraph(**clean(graph.graph))
    safe.add_nodes_from((xml_text(n), clean(a)) for n, a in graph.nodes(data=True))
    safe.add_edges_from((xml_text(u), xml_text(v), clean(a)) for u, v, a in graph.edges(data=True))
    return safe


def _gexf_edge_types(graph: nx.DiGraph) -> nx.DiGraph:
    """Each edge with GEXF's own ``type``: undirected where no direction is claimed (an undecided or unknown
    direction, a copy), directed where one is, so Gephi draws an arrow only on a claimed direction."""
    for *_, a in graph.edges(data=True):
        a["type"] = "directed" if a.get("directed") and a.get("direction") == "decided" else "undirected"
    return graph


def _undirected_edges_graphml(graph: nx.DiGraph, path: Path) -> None:
    """GraphML with every edge's own ``directed`` attribute (GraphML allows it per edge; networkx writes only the
    graph's default): false where no direction is claimed, so a reader draws no arrow on an undecided link."""
    from xml.etree import ElementTree

    writer = nx.readwrite.graphml.GraphMLWriter(graph, encoding="utf-8", prettyprint=True)
    directed = {(str(u), str(v)): bool(a.get("directed")) and a.get("direction") == "decided"
                for u, v, a in graph.edges(data=True)}
    for element in writer.xml.iter("edge"):
        element.set("directed", "true" if directed[(element.get("source"), element.get("target"))] else "false")
    ElementTree.ElementTree(writer.xml).write(path, encoding="utf-8", xml_declaration=True)


def read_graph(path: str | Path) -> nx.DiGraph:
    """A GraphML or GEXF file this module wrote, read back into networkx. Their edges are directed or undirected one
    by one (as both formats allow, and Gephi and yEd read), a mix networkx's own readers refuse; read here, every edge
    is a directed networkx edge whose attributes ``directed`` and ``direction`` say whether a direction is claimed."""
    from xml.etree import ElementTree

    tree = ElementTree.parse(path)
    for element in tree.iter():
        if element.tag.rsplit("}", 1)[-1] == "edge":
            element.attrib.pop("directed", None)
            element.attrib.pop("type", None)
    text = ElementTree.tostring(tree.getroot(), encoding="unicode")
    if Path(path).suffix == ".gexf":
        import io

        return nx.read_gexf(io.BytesIO(text.encode("utf-8")))
    return nx.parse_graphml(text)


def write_graph(graph: nx.DiGraph, fmt: str, path: str | Path) -> Path:
    """Write graph in one of FORMATS to path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "graphml":
        _undirected_edges_graphml(xml_safe(styled(graph)), path)
    elif fmt == "gexf":
        nx.write_gexf(_gexf_viz(_gexf_edge_types(xml_safe(styled(graph)))), path)
    elif fmt == "json":
        path.write_text(json_document(nx.node_link_data(graph, edges="links"), indent=1), encoding="utf-8")
    elif fmt == "dot":
        write_dot(graph, path)
    elif fmt == "html":
        from lineage_graph.html_page import render_html

        path.write_text(render_html(graph, tree_layout(graph)), encoding="utf-8")
    elif fmt == "png":
        write_png(graph, path)
    else:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return path

