"""Candidate retrieval at hub scale: N 7B-shaped models (32 blocks x 11008 units), planted families.

    PYTHONPATH=. python bench/bench_retrieval_scale.py --models 1000 2000 5000 10000 [--family 8] [--index auto]
    PYTHONPATH=. python bench/bench_retrieval_scale.py --models 2000 --through-scan   # the scan's own path

Each N runs in a fresh process (peak RSS per N). Entries are generated in signature space, not from full
fingerprints (10,000 of those would be 3.6 TB): a family base draws, per block, the signatures of its
``2 * query_units_per_block`` units furthest along the selection direction out of 11008 (unit vectors whose
projection on the direction is an upper order statistic of 11008 draws); a derivative perturbs them (fine-tune
noise, a unit permutation is a no-op on a set, width prunes drop a quarter, depth prunes drop blocks, merges
average two siblings, retrained MLPs redraw half the blocks) and keeps the top ones again, less their component
along the direction, as scanner.retrieval.signatures does. Prints wall time (index build + every model's query +
the selected pairs' block maps, as a scan draws them: scanner.retrieval.candidates.with_wide_block_maps),
peak RSS, index size on disk, candidate pairs per model against the planted family size, and pair recall; then
the growth exponent. ``--through-scan`` times the scan's own path instead: the entries are written as entry files
by another process, and ``scanner.retrieval.hub.update_indexes`` reads them, builds, queries, maps and saves, so its
peak RSS is what a scan's driver needs for a full rebuild.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BLOCKS, UNITS = 32, 11008


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def synthetic_entries(n_models: int, family: int, seed: int = 0):  # noqa: ANN201
    from scanner.retrieval.signatures import RetrievalEntry, SignatureParams, projection, without_direction

    params = SignatureParams()
    _, direction = projection(256, params)
    dim, q, s = 2 * params.dim, params.query_units_per_block, params.units_per_block
    rng = np.random.default_rng(seed)
    # the top 2q of 11008 projections of a random unit vector in `dim` dimensions lie about this far along it
    top = np.sort(rng.standard_normal(UNITS))[::-1][:2 * q] / np.sqrt(dim)

    def base_units() -> np.ndarray:   # (blocks, 2q, dim): the units near the top of every block
        noise = _unit(rng.standard_normal((BLOCKS, 2 * q, dim)).astype(np.float32))
        noise -= (noise @ direction)[..., None] * direction
        noise = _unit(noise) * np.sqrt(np.maximum(1 - top**2, 0))[None, :, None]
        return (noise + top[None, :, None] * direction).astype(np.float32)

    def entry(units: np.ndarray) -> RetrievalEntry:
        units = _unit(units)
        order = np.argsort(-(units @ direction), axis=1)[:, :q]
        kept = np.take_along_axis(units, order[..., None], axis=1).reshape(-1, dim)
        kept = without_direction(kept, direction)
        blocks = np.repeat(np.arange(units.shape[0], dtype=np.int32), q)
        indexed = np.tile(np.arange(q) < s, units.shape[0])
        # float16 as the entry files store them: 10,000 entries are 2.6 GB in memory, not 5.2
        return RetrievalEntry(kept.astype(np.float16), blocks, indexed, units.shape[0], "bench", params)

    kinds = ("finetune", "long-finetune", "camouflage", "width-prune", "depth-prune", "merge", "retrained-mlp")
    entries, families, kinds_of = [], [], []
    while len(entries) < n_models:
        fam = len(set(families))
        base = base_units()
        members = [base]
        entries.append(entry(base))
        families.append(fam)
        kinds_of.append("base")
        for k in range(min(family - 1, n_models - len(entries))):
            kind = kinds[k % len(kinds)]
            sigma = {"long-finetune": 0.06}.get(kind, 0.03)
            units = members[0] + sigma * rng.standard_normal(members[0].shape).astype(np.float32)
            if kind == "width-prune":
                units = units[:, rng.permutation(2 * q)[: 3 * q // 2]]
            elif kind == "depth-prune":
                units = units[np.sort(rng.permutation(BLOCKS)[: BLOCKS * 3 // 4])]
            elif kind == "merge" and len(members) > 1:
                units = 0.6 * _unit(members[1]) + 0.4 * _unit(units)
            elif kind == "retrained-mlp":
                fresh = base_units()
                units[1::2] = fresh[1::2]
            members.append(units)
            entries.append(entry(units))
            families.append(fam)
            kinds_of.append(kind)
    return entries, families, kinds_of


def run_one(n_models: int, family: int, kind: str) -> dict:
    from scanner.retrieval.candidates import MIN_SCORE, scored_pairs, with_wide_block_maps
    from scanner.retrieval.index import RetrievalIndex, SearchParams

    generated = time.perf_counter()
    entries, families, kinds = synthetic_entries(n_models, family)
    generated = time.perf_counter() - generated
    keys = [(f"m{i:06d}", "r") for i in range(n_models)]
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        index = RetrievalIndex(folder, "bench", search=SearchParams(kind=kind))
        index.sync({key: (lambda e=e: e) for key, e in zip(keys, entries)})
        built = time.perf_counter()
        found = scored_pairs(index, dict(zip(keys, entries)), MIN_SCORE)
        searched = time.perf_counter()
        number_of = {key: i for i, key in enumerate(keys)}
        found = with_wide_block_maps(found, lambda key: entries[number_of[key]],
                                     threshold=index.search_params.threshold, depth_of=index.depth)
        mapped = time.perf_counter()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        index.save()
        size = sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
    direct, outcome = _candidates_against_planted(found, [key[0] for key in keys], family, families, kinds)
    return {"models": n_models, "kind": index.kind, "load_avg": [round(load_before, 1), round(os.getloadavg()[0], 1)],
            "entries_s": round(generated, 1), "vectors": index.ntotal, "build_s": round(built - started, 1),
            "query_s": round(searched - built, 1), "maps_s": round(mapped - searched, 1),
            "total_s": round(mapped - started, 1),
            "cpu_s_incl_entries": round(usage.ru_utime + usage.ru_stime, 1),
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
            "index_mib": round(size / 2**20, 1), "direct_pairs": len(direct), **outcome}


def write_entry_files(n_models: int, family: int, folder: Path) -> None:
    """The generator's entries as a scan keeps them (entry files beside the index folder ``folder/db.retrieval``,
    one per fingerprint address ``folder/fp/<model>``), and the planted truth as ``folder/truth.json``."""
    from scanner.retrieval.index import entry_path, write_entry

    entries, families, kinds = synthetic_entries(n_models, family)
    for i, entry in enumerate(entries):
        write_entry(entry, entry_path(folder / "db.retrieval", folder / "fp" / f"m{i:06d}"))
    (folder / "truth.json").write_text(json.dumps({"families": families, "kinds": kinds}))


def run_one_through_scan(n_models: int, family: int, kind: str) -> dict:
    """The scan's own path: ``update_indexes`` reads every entry file, builds the index, queries it with every
    model and draws the selected pairs' block maps, then saves the index. The entry files are written by another
    process, so the peak RSS is what a scan's driver needs for a full rebuild."""
    from scanner.retrieval.candidates import MIN_SCORE
    from scanner.retrieval.hub import IndexedModel, update_indexes
    from scanner.retrieval.index import SearchParams

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        generated = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--write-entries", str(folder), "--models", str(n_models),
                        "--family", str(family)], check=True)
        generated = time.perf_counter() - generated
        truth = json.loads((folder / "truth.json").read_text())
        models = [IndexedModel(f"m{i:06d}", "r", "bench", str(folder / "fp" / f"m{i:06d}")) for i in range(n_models)]
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        run = update_indexes(folder / "db.retrieval", models, min_score=MIN_SCORE, search=SearchParams(kind=kind))
        seconds = time.perf_counter() - started
        usage = resource.getrusage(resource.RUSAGE_SELF)
        index_bytes = sum(p.stat().st_size for p in (folder / "db.retrieval").rglob("*")
                          if p.is_file() and "entries" not in p.parts)
    _, outcome = _candidates_against_planted([pair for _, pair in run.pairs], [m.model_id for m in models],
                                             family, truth["families"], truth["kinds"])
    return {"models": n_models, "path": "update_indexes", "load_avg": [round(load_before, 1),
                                                                       round(os.getloadavg()[0], 1)],
            "entries_written_s": round(generated, 1), "total_s": round(seconds, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1), "peak_rss_gib": round(usage.ru_maxrss / 2**20, 2),
            "index_mib": round(index_bytes / 2**20, 1), **outcome}


def _candidates_against_planted(found: list, names: list[str], family: int, families: list[int],
                                kinds: list[str]) -> tuple[set, dict]:
    """The direct pairs as model numbers, and how the candidates (those and their block closure) compare with the
    planted families: per model, recall, false pairs, misses by kind."""
    from scanner.retrieval.hub import family_pairs

    number = {name: i for i, name in enumerate(names)}
    direct = {(number[p.model_a], number[p.model_b]) for p in found}
    got = {(number[a[0]], number[b[0]]) for a, b in
           family_pairs(((p.model_a, p.revision_a), (p.model_b, p.revision_b), p.block_map) for p in found)} | direct
    n_models = len(names)
    planted = {(i, j) for i in range(n_models) for j in range(i + 1, min(n_models, i + family))
               if families[i] == families[j]}
    missed = sorted(planted - got)
    return direct, {"candidates_per_model": round(2 * len(got) / n_models, 2), "family_size": family,
                    "planted_pairs": len(planted), "recall": round(1 - len(missed) / len(planted), 5),
                    "false_pairs": len(got - planted), "missed_by_kind": _by_kind(missed, kinds)}


def _by_kind(missed: list[tuple[int, int]], kinds: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i, j in missed:
        key = "/".join(sorted((kinds[i], kinds[j])))
        out[key] = out.get(key, 0) + 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", type=int, nargs="+", default=[1000, 2000, 5000, 10000])
    parser.add_argument("--family", type=int, default=8)
    parser.add_argument("--index", choices=("auto", "flat", "ivf"), default="auto")
    parser.add_argument("--through-scan", action="store_true",
                        help="time the scan's own path (update_indexes over entry files) instead of the index calls")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--write-entries", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_entries:
        write_entry_files(args.models[0], args.family, args.write_entries)
        return
    if args.one:
        run = run_one_through_scan if args.through_scan else run_one
        print(json.dumps(run(args.models[0], args.family, args.index)))
        return
    rows = []
    for n in args.models:
        out = subprocess.run([sys.executable, __file__, "--one", "--models", str(n), "--family", str(args.family),
                              "--index", args.index, *(["--through-scan"] if args.through_scan else [])],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    if len(rows) > 1:
        n = np.log([r["models"] for r in rows])
        t = np.log([r["total_s"] for r in rows])
        print(f"growth exponent (total time ~ N^k): k = {np.polyfit(n, t, 1)[0]:.2f}")


if __name__ == "__main__":
    main()
