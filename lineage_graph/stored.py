"""The lineage as the last rebuild stored it (lineage_edges, families, family_members, discrepancies), turned back
into lineage_graph's own objects for one pair, one family or the whole hub: what `hubtrace report`, `graph` and
`discrepancies` and `hubtrace serve`'s pair page write from, and serve's family view draws, without recomputing the
whole hub's lineage (`lineage_graph.persist.read_lineage` takes minutes at 10^4 models)."""

from __future__ import annotations

import json

import polars as pl

from lineage_graph.evidence import DEFAULT_MIN_DIRECTION_CONFIDENCE, Direction, Discrepancy, Edge, ModelInfo, PairTest
from lineage_graph.families import Family
from lineage_graph.lineage import Lineage
from scanner.declared.merge_config import MergeDeclaration
from scanner.store import Store, lineage_tables, queries

TREE_KINDS = ("tree", "copy")
"""Kinds of link that family_members.parents holds (merge parents are in merge_parents)."""


def pair_lineage(store: Store, model_a: str, model_b: str) -> Lineage | None:
    """The stored verdict on one pair, with its two models, their family (id, root and members: the report reads
    no more of it) and their discrepancies; None when the last rebuild did not judge the pair."""
    row = queries.pair_evidence(store, model_a, model_b)
    setting = lineage_tables.last_fdr_setting(store)
    if row is None or setting is None:
        return None
    pair = [row["model_a"], row["model_b"]]
    found = queries.model_family(store, row["model_a"])
    families = [] if found is None else [Family(
        found["family_id"], tuple(queries.family_member_ids(store, found["family_id"])), found["root"])]
    return Lineage(setting[0], setting[1], row["statistic"], _models(store, pair), [_edge(row)], families,
                   _discrepancies(store, pair), _direction_level(store))


def family_lineage(store: Store, family_id: str) -> Lineage | None:
    """One family as stored: its members, every dependent pair among them, its tree (link kinds from
    lineage_edges.tree_link) and its members' discrepancies; None for an unknown family id."""
    family = queries.family(store, family_id)
    if family is None:
        return None
    members = queries.family_members(store, family_id)
    ids = members["model_id"].to_list()
    rows = queries.lineage_edges_among(store, ids).rows(named=True)
    tree = Family(family_id, tuple(sorted(ids)), family["root"], _parents(members, rows), family["root_decided"])
    edges = [_edge(r) for r in rows]
    statistic = edges[0].test.statistic if edges else "match"
    return Lineage(family["q"], family["method"], statistic, _models(store, ids), edges, [tree],
                   _discrepancies(store, ids), _direction_level(store))


def hub_lineage(store: Store) -> Lineage | None:
    """The whole lineage as stored: every family with its tree, every dependent pair, every current model and every
    discrepancy; None when no lineage was built yet (nothing stored to read)."""
    setting = lineage_tables.last_fdr_setting(store)
    if setting is None:
        return None
    rows = queries.dependent_edges(store).rows(named=True)
    members = queries.all_family_members(store)
    by_family: dict[str, pl.DataFrame] = dict(members.group_by("family_id")) if members.height else {}
    edges_of: dict[str, list[dict]] = {}
    family_of = dict(zip(members["model_id"], members["family_id"])) if members.height else {}
    for r in rows:
        fid = family_of.get(r["model_a"])
        if fid is not None and family_of.get(r["model_b"]) == fid:
            edges_of.setdefault(fid, []).append(r)
    families = []
    for f in queries.all_families(store).iter_rows(named=True):
        group = by_family.get((f["family_id"],))
        if group is None:
            continue
        families.append(Family(f["family_id"], tuple(sorted(group["model_id"])), f["root"],
                               _parents(group, edges_of.get(f["family_id"], [])), f["root_decided"]))
    ids = sorted(family_of)  # every model the rebuild read is in a family (a lone one in its own)
    discrepancies = [Discrepancy(r["model_id"], r["kind"], r["related_model"], r["confidence"], r["detail"],
                                 json.loads(r["evidence"] or "{}"))
                     for r in queries.all_discrepancies(store).iter_rows(named=True)]
    statistic = rows[0]["statistic"] if rows else "match"
    return Lineage(setting[0], setting[1], statistic, _models(store, ids), [_edge(r) for r in rows], families,
                   discrepancies, _direction_level(store))


def _direction_level(store: Store) -> float:
    """The confidence a direction needed to be claimed in the last rebuild (the default for older builds)."""
    level = lineage_tables.last_direction_level(store)
    return DEFAULT_MIN_DIRECTION_CONFIDENCE if level is None else level


def _parents(members: pl.DataFrame, edges: list[dict]) -> dict[str, tuple[tuple[str, str], ...]]:
    """child -> ((parent, kind), ...) as lineage_graph.families.Family holds it: tree and copy parents and merge
    parents from family_members (a link's kind from lineage_edges.tree_link), and any other kind of link the tree
    drew (an alternative parent) from lineage_edges, oriented parent -> child."""
    kinds = {(e["model_a"], e["model_b"]): e["tree_link"] for e in edges}

    def kind(a: str, b: str) -> str:
        stored = kinds.get((min(a, b), max(a, b)))
        return stored if stored in TREE_KINDS else "tree"

    links = {r["model_id"]: [(p, kind(p, r["model_id"])) for p in r["parents"] or ()]
             + [(p, "merge") for p in r["merge_parents"] or ()] for r in members.iter_rows(named=True)}
    for e in edges:
        if e["tree_link"] not in (None, "merge", *TREE_KINDS) and e["parent"] and e["child"] in links:
            links[e["child"]].append((e["parent"], e["tree_link"]))
    return {child: tuple(found) for child, found in links.items() if found}


def _models(store: Store, ids: list[str]) -> dict[str, ModelInfo]:
    """ModelInfo of each id from its current row (a bare one for a member no longer current)."""
    rows = queries.current_model_rows(store, list(ids))
    return {m: ModelInfo(
        model_id=m, revision=r.get("revision") or "", architecture=r.get("architecture"), n_layers=r.get("n_layers"),
        hidden_size=r.get("hidden_size"), intermediate_size=r.get("intermediate_size"),
        n_experts=r.get("n_experts"), declared_base_models=tuple(r.get("declared_base_models") or ()),
        declared_relation=r.get("declared_relation"), claims_from_scratch=bool(r.get("claims_from_scratch")),
        license=r.get("license"), created_at=r.get("created_at"),
        declared_merge=MergeDeclaration.from_json(r.get("merge_config")))
        for m, r in ((m, rows.get(m, {})) for m in ids)}


def _edge(row: dict) -> Edge:
    """An Edge from a lineage_edges row (with its pair test's columns where the query joined them)."""
    layers = row.get("layers")
    test = PairTest(row["model_a"], row["model_b"], row["statistic"], float(row["log10_p"]),
                    int(row.get("n_layers") or 0), tuple(json.loads(layers) if isinstance(layers, str) else ()),
                    row["input_set"] or "", row.get("reason") or "comparable", row.get("revision_a") or "",
                    row.get("revision_b") or "", row.get("closeness"))
    confidence = row["direction_confidence"]
    direction = Direction(row["parent"], row["child"], 0.5 if confidence is None else float(confidence),
                          tuple(row["direction_reasons"] or ()),
                          bool(row["direction_decided"]) or row["parent"] is None)  # stored as claimed
    block_map = tuple((int(b["layer_a"]), int(b["layer_b"])) for b in json.loads(row["block_map"] or "[]"))
    return Edge(test, float(row["log10_q"]), bool(row["dependent"]), direction, block_map, bool(row["joins_family"]),
                row.get("kinship"))


def _discrepancies(store: Store, ids: list[str]) -> list[Discrepancy]:
    return [Discrepancy(r["model_id"], r["kind"], r["related_model"], r["confidence"], r["detail"],
                        json.loads(r["evidence"] or "{}"))
            for r in queries.discrepancies_of(store, ids).iter_rows(named=True)]
