"""`hubtrace serve` on a hub-sized database: response times of its pages from a real server process.

    PYTHONPATH=. python bench/bench_serve.py                        # 10,000 models, one family of 1,000
    PYTHONPATH=. python bench/bench_serve.py --models 2000 --big-family 300 --requests 20

The database is synthetic and built through the Store's own API, once, then kept under
.hubtrace-cache/bench/serve-<models>-<big family>.duckdb (the build takes a few minutes: every model is one
`upsert_model` and one `put_fingerprint`, all in one transaction): one family of --big-family models (a tree, each
node with three children, every member also tested against the root, its parent and three random relatives), families
of five (every pair inside tested), the rest models with no relative; every model also tested against a few random
unrelated ones (about 5 pair tests per model, each with 4 per-block layers), a discrepancy for every seventh
derivative, and the lineage tables written by `lineage_tables.replace_lineage_tables` as a rebuild would leave them
(the lineage is laid out here, not computed: `rebuild_lineage` at this size is another bench's subject).

Prints, per page, the median and 95th percentile of --requests timed requests after one warm-up (the whole body read,
over HTTP from this process), and the first request of the pair page (the report is drawn then, and kept).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

from scanner.sources import ModelRecord
from scanner.store import PairTestRow, Store, lineage_tables
from tests.serve_support import page_url, serving
from tests.store_support import Meta

CACHE = Path(__file__).resolve().parent.parent / ".hubtrace-cache" / "bench"
T0 = datetime(2024, 1, 1, tzinfo=UTC)
LICENSES = ("apache-2.0", "mit", "llama2", "other", "cc-by-nc-4.0")
FAMILY = 5


def layout(n_models: int, big: int, seed: int = 0) -> tuple[dict[str, str | None], list[tuple[str, str, bool]]]:
    """model id -> its parent (None for a root or a model alone), and the tested pairs (a, b, dependent)."""
    rng = random.Random(seed)
    parent: dict[str, str | None] = {"bigco/base": None}
    big_ids = ["bigco/base"] + [f"bigco/ft-{i:04d}" for i in range(1, big)]
    parent |= {big_ids[i]: big_ids[(i - 1) // 3] for i in range(1, big)}
    families = (n_models - big) // 2 // FAMILY
    for f in range(families):
        base, names = f"fam{f:04d}/base", [f"fam{f:04d}/ft-{k}" for k in range(1, FAMILY)]
        parent |= {base: None, names[0]: base, names[1]: names[0], names[2]: base, names[3]: names[2]}
    parent |= {f"solo{j:05d}/model": None for j in range(n_models - len(parent))}
    ids = list(parent)
    pairs: set[tuple[str, str, bool]] = set()

    def test(a: str, b: str, dependent: bool) -> None:
        if a != b:
            pairs.add((min(a, b), max(a, b), dependent))

    for model in big_ids[1:]:
        test(model, parent[model], True)
        test(model, "bigco/base", True)
        for other in rng.sample(big_ids, 3):
            test(model, other, True)
    for f in range(families):
        members = [m for m in parent if m.startswith(f"fam{f:04d}/")]
        for i, a in enumerate(members):
            for b in members[i + 1:]:
                test(a, b, True)
    for model in ids:
        for other in rng.sample(ids, 3):
            if not _related(model, other):
                test(model, other, False)
    dependent = {(a, b) for a, b, d in pairs if d}
    return parent, sorted(p for p in pairs if p[2] or (p[0], p[1]) not in dependent)


def _related(a: str, b: str) -> bool:
    return not a.startswith("solo") and a.split("/")[0] == b.split("/")[0]


def build(path: Path, n_models: int, big: int) -> None:
    """The synthetic database (see the module docstring), through the Store's API."""
    parent, pairs = layout(n_models, big)
    ids = list(parent)
    created = {m: T0 + timedelta(minutes=i) for i, m in enumerate(ids)}
    rng = random.Random(1)
    scratch = {m for i, m in enumerate(ids) if parent[m] is not None and i % 7 == 0}
    started = time.perf_counter()
    with Store(path) as store:
        run = store.start_run({"bench": "serve"})
        with store.transaction():
            for i, model in enumerate(ids):
                declared = (parent[model],) if parent[model] and model not in scratch else ()
                store.upsert_model(ModelRecord(
                    model_id=model, revision="r1", source="local", location=f"/hub/{model}", base_models=declared,
                    base_model_relation="finetune" if declared else None, claims_from_scratch=model in scratch,
                    license=LICENSES[i % len(LICENSES)], tags=("text-generation", f"tag-{i % 20}"),
                    created_at=created[model], last_modified=created[model]), Meta(), run, "ok")
                store.put_fingerprint(model, "r1", Meta().input_set, f"/fingerprints/{model}.safetensors",
                                      f"{i:064x}", 2048, run)
        print(f"models and fingerprints: {time.perf_counter() - started:.0f} s", flush=True)
        log10_p = {(a, b): -rng.uniform(60, 600) if dependent else -rng.uniform(0, 1.5) for a, b, dependent in pairs}
        store.put_pair_tests([PairTestRow(
            a, "r1", b, "r1", "match", Meta().input_set, log10_p[(a, b)], 4,
            [{"layer_a": k, "layer_b": k, "log10_p": log10_p[(a, b)] / 4, "rho": 0.9 if dependent else 0.01,
              "n_units": 128} for k in range(4)], [], "comparable", run, 0.6 if dependent else 0.02)
            for a, b, dependent in pairs])
        for i in range(0, len(ids), 200):
            store.record_error(run, ids[i], "r1", f"/hub/{ids[i]}", "validate", "CheckpointError", "NaN weights")
        lineage_tables.replace_lineage_tables(store, _lineage(parent, pairs, log10_p, scratch, created))
        store.finish_run(run, "succeeded", {})
    print(f"built {path} ({len(ids)} models, {len(pairs)} pair tests) in {time.perf_counter() - started:.0f} s",
          flush=True)


def cached_database(folder: Path, n_models: int, big: int) -> Path:
    """The synthetic database in ``folder``, built the first time (under another name until it is whole)."""
    db = folder / f"serve-{n_models}-{big}.duckdb"
    if not db.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = db.with_suffix(".building")
        partial.unlink(missing_ok=True)
        build(partial, n_models, big)
        partial.rename(db)
    return db


def _lineage(parent: dict[str, str | None], pairs: list[tuple[str, str, bool]], log10_p: dict,
             scratch: set[str], created: dict[str, datetime]) -> dict[str, pl.DataFrame]:
    """The four lineage tables as a rebuild would leave them for this layout."""
    now = datetime.now(UTC)
    root = {}
    for model in parent:
        top = model
        while parent[top] is not None:
            top = parent[top]
        root[model] = top
    n_tests = len(pairs)
    edges = []
    for a, b, dependent in pairs:
        tree = parent.get(b) == a or parent.get(a) == b
        older, younger = (a, b) if created[a] <= created[b] else (b, a)
        if tree:
            older, younger = (a, b) if parent.get(b) == a else (b, a)
        edges.append({
            "model_a": a, "model_b": b, "statistic": "match", "input_set": Meta().input_set,
            "log10_p": log10_p[(a, b)], "log10_q": min(0.0, log10_p[(a, b)] + math.log10(n_tests)),
            "dependent": dependent, "joins_family": dependent, "parent": older if dependent else None,
            "child": younger if dependent else None,
            "direction_confidence": 0.95 if tree else 0.7 if dependent else 0.5,
            "direction_reasons": [f"dates: {older} was created before {younger}",
                                  "activation_rank: activation effective rank falls"] if dependent else [],
            "blocks_matched": 4 if dependent else 0,
            "block_map": json.dumps([{"layer_a": k, "layer_b": k} for k in range(4)] if dependent else []),
            "family_id": root[a] if dependent else None, "tree_link": "tree" if tree else None, "q": 0.05,
            "method": "bh", "built_at": now})
    members: dict[str, list[str]] = {}
    for model in parent:
        members.setdefault(root[model], []).append(model)
    families = pl.DataFrame([{"family_id": r, "root": r, "n_members": len(ms), "first_built_at": now, "built_at": now,
                              "q": 0.05, "method": "bh"} for r, ms in members.items()])
    family_members = pl.DataFrame(
        [{"family_id": root[m], "model_id": m, "revision": "r1", "is_root": parent[m] is None,
          "parents": [parent[m]] if parent[m] else [], "merge_parents": []} for m in parent],
        schema_overrides={"parents": pl.List(pl.String), "merge_parents": pl.List(pl.String)})
    discrepancies = pl.DataFrame([
        {"model_id": m, "kind": "false_from_scratch", "related_model": parent[m], "confidence": 0.95,
         "detail": f"{m} claims to be trained from scratch, but its weights depend on {parent[m]}",
         "evidence": "{}", "built_at": now} for m in sorted(scratch)])
    return {"lineage_edges": pl.DataFrame(edges, infer_schema_length=None), "families": families,
            "family_members": family_members, "discrepancies": discrepancies}


def timed(url: str, requests: int) -> list[float]:
    """Milliseconds of each of ``requests`` requests (after one warm-up), the body read whole."""
    def one() -> float:
        started = time.perf_counter()
        with urllib.request.urlopen(url) as response:
            assert response.status == 200, url
            response.read()
        return (time.perf_counter() - started) * 1000

    one()
    return [one() for _ in range(requests)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--big-family", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args()
    db = cached_database(CACHE, args.models, args.big_family)
    pages = [
        ("front page", "/", {}),
        ("model page (fine-tune in a family of 5)", "/model", {"id": "fam0100/ft-2"}),
        ("model page (member of the big family)", "/model", {"id": f"bigco/ft-{args.big_family // 2:04d}"}),
        (f"model page (root of the big family, {args.big_family - 1} relatives)", "/model", {"id": "bigco/base"}),
        (f"family view ({args.big_family} members, page 1)", "/family", {"id": "bigco/base"}),
        (f"family view ({args.big_family} members, page 4)", "/family", {"id": "bigco/base", "page": "4"}),
        ("family view (member search)", "/family", {"id": "bigco/base", "q": "ft-05"}),
        ("family view (family of 5, drawn)", "/family", {"id": "fam0100/base"}),
        (f"interactive drawing ({args.big_family} members)", "/family/graph", {"id": "bigco/base"}),
        ("search (middle of an id)", "/search", {"q": "ft-05"}),
        ("SQL box (GROUP BY over models)", "/sql", {"q": "SELECT license, count(*) FROM current_models GROUP BY 1"}),
        ("SQL box (100 strongest dependences)", "/sql",
         {"q": "SELECT model_a, model_b, log10_p FROM lineage_edges WHERE dependent ORDER BY log10_p LIMIT 100"}),
    ]
    with tempfile.TemporaryDirectory() as tmp, serving(db, Path(tmp) / "stderr.txt") as server:
        print("| page | median ms | p95 ms | requests |\n|---|---|---|---|")
        for label, path, params in pages:
            times = sorted(timed(page_url(server.url, path, **params), args.requests))
            p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
            print(f"| {label} | {statistics.median(times):.1f} | {p95:.1f} | {len(times)} |", flush=True)
        started = time.perf_counter()
        with urllib.request.urlopen(page_url(server.url, "/pair", a="bigco/base", b="bigco/ft-0001")) as response:
            response.read()
        print(f"| pair page, first request (report drawn) | {(time.perf_counter() - started) * 1000:.0f} | | 1 |")
        started = time.perf_counter()
        with urllib.request.urlopen(page_url(server.url, "/tables/lineage_edges.csv")) as response:
            size = len(response.read())
        print(f"| lineage_edges as CSV ({size / 2**20:.1f} MiB) | {(time.perf_counter() - started) * 1000:.0f} | | 1 |")


if __name__ == "__main__":
    main()
