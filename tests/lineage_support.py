"""A zoo as the lineage sees it: every pair's phi_MATCH test (with closeness) and every model's metadata, from one
fingerprint per model (what a scan stores), with or without what the cards and dates say."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from lineage_graph.block_maps import wanted
from lineage_graph.evidence import ModelInfo, PairTest
from lineage_graph.persist import activation_scale
from scanner.declared.merge_config import read_merge_config
from scanner.fingerprints.fingerprint import Fingerprint, fingerprint_model
from scanner.pairs.block_map import BlockMap, any_order_map
from scanner.pairs.fingerprint_compare import compare_fingerprints
from scanner.sources.records import record_from_card
from scanner.zoo import Zoo, read_card


def zoo_lineage_inputs(zoo: Zoo, prints: Mapping[str, Fingerprint] | None = None
                       ) -> tuple[list[PairTest], list[ModelInfo]]:
    """phi_MATCH of all pairs (sorted ids, as scans order them) and the models with what their cards and merge configs
    declare (as a local scan reads them), no dates; prints:
    the models' fingerprints on the default inputs when the caller has them (taken here otherwise)."""
    prints = prints if prints is not None else {m: fingerprint_model(zoo[m].path) for m in zoo.ids}
    tests = []
    for a, b in itertools.combinations(sorted(zoo.ids), 2):
        r = compare_fingerprints(prints[a], prints[b], "match")
        layers = tuple({"layer_a": b.layer_a, "layer_b": b.layer_b, "log10_p": b.log10_p, "rho": b.rho,
                        "n_units": b.n_units, "closeness": b.closeness} for b in r.layers)
        tests.append(PairTest(a, b, "match", r.log10_p, r.n_layers, layers, r.inputs or "", closeness=r.closeness))
    return tests, zoo_models(zoo, prints)


def zoo_models(zoo: Zoo, prints: Mapping[str, Fingerprint]) -> list[ModelInfo]:
    """The zoo's models with what their cards and merge configs declare and what their fingerprints hold."""
    models = []
    for model_id in zoo.ids:
        path = Path(zoo[model_id].path)
        meta = prints[model_id].meta
        record = record_from_card(model_id, "r0", "local", str(path), read_card(path), merge=read_merge_config(path))
        models.append(ModelInfo(model_id, "r0", meta.architecture, meta.n_layers, meta.hidden_size,
                                meta.intermediate_size, meta.n_experts, record.base_models, record.base_model_relation,
                                record.claims_from_scratch, record.license, None,
                                tuple(meta.summaries["activation_effective_rank"]), activation_scale(meta.summaries),
                                record.merge, meta.value_sample().tobytes(), meta.mlp_layout))
    return models


def zoo_block_maps(zoo: Zoo, tests: list[PairTest], models: list[ModelInfo],
                   prints: Mapping[str, Fingerprint] | None = None) -> dict[tuple[str, str], BlockMap]:
    """The any-order block maps a scan's lineage would read for the zoo's depth-changed related pairs
    (lineage_graph.block_maps.wanted; scanner.pairs.block_map makes them), from the models' fingerprints (taken here for
    the models that need one, unless given)."""
    pairs = wanted({m.model_id: m for m in models}, tests)
    needed = {m for pair in pairs for m in pair}
    prints = {m: (prints or {}).get(m) or fingerprint_model(zoo[m].path) for m in needed}
    return {(a, b): any_order_map(prints[a], prints[b]) for a, b in pairs}


def withhold_cards(models: list[ModelInfo]) -> list[ModelInfo]:
    """The models as a folder of downloads shows them: no declared bases or relations, no merge configs, no claims,
    no dates."""
    return [replace(m, declared_base_models=(), declared_relation=None, claims_from_scratch=False, created_at=None,
                    declared_merge=None) for m in models]


FAMILY_LEVEL = 1e-3
"""The family-wise level (compute_lineage's q) at which tests on trained zoos join families. A zoo holds 70-110 pairs
of unrelated models; on a valid null Holm joins any of them with probability at most q, so at the product's default
0.05 one zoo build in twenty could join two families, and CI trains its own zoos (two of its builds did: the merge
zoo's twin, and a rebuild of the default zoo under other CPU kernels that joined ember-small at p = 8.5e-5;
BENCHMARKS.md, "Tests on other machines' zoos"). At 1e-3 a join needs p below ~1e-5; true pairs sit below 1e-14."""


def true_parent_links(zoo: Zoo) -> set[tuple[str, str]]:
    return {(p, m.id) for m in zoo.models.values() for p in m.parents}


def ground_truth(zoo: Zoo) -> dict[str, dict]:
    return {m["id"]: m for m in json.loads((Path(zoo.root) / "ground_truth.json").read_text())["models"]}


SMALL_SPEC = dict(base_steps=150, finetune_steps=80, long_finetune_steps=300, heal_steps=40, retrain_steps=300,
                  retrain_batch_size=64)
"""A zoo of the default recipe with about a fifth of its training: same relations, built in well under a minute."""


def seed_zoo(cache: Path, seed: int) -> Zoo:
    """The default recipe from another seed, with SMALL_SPEC's training, cached (file-locked) under cache."""
    from scanner.zoo import ZooSpec, build_zoo

    return build_zoo(cache / f"zoo-small-seed{seed}", spec=ZooSpec(seed=seed, **SMALL_SPEC))


#: Measured in the page after its script ran, in screen pixels: the view, the drawn graph, each node box (its width
#: and its label's font size at the fitted zoom), the search box, and the fitted zoom itself.
GEOMETRY_PROBE = """
<script>
(() => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; };
  const world = document.getElementById('world'), scale = world.getScreenCTM().a;
  const nodes = [...document.querySelectorAll('#world .node')].map(g => ({id: g.dataset.id,
    box: box(g.querySelector('rect')), font: parseFloat(g.querySelector('text').getAttribute('font-size')) * scale}));
  const legend = [...document.querySelectorAll('#legend svg')].map(box);
  document.title = 'GEOMETRY ' + JSON.stringify({view: box(document.getElementById('canvas')), world: box(world),
    nodes: nodes, search: box(document.getElementById('search')), zoom: scale, legend: legend,
    window: [innerWidth, innerHeight]});
})();
</script>
"""


def page_geometry(page: Path, profile: Path, width: int, height: int, screenshot: Path | None = None) -> dict:
    """What a person sees of ``page`` in a ``width`` x ``height`` window of headless chromium (`GEOMETRY_PROBE`),
    and a screenshot of it when asked."""
    probed = page.with_name(page.stem + ".probed.html")
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", GEOMETRY_PROBE + "</body>"),
                      encoding="utf-8")
    dom = _chromium(probed, profile, f"--window-size={width},{height}", "--dump-dom")
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        _chromium(page, profile, f"--window-size={width},{height}", f"--screenshot={screenshot}",
                  "--hide-scrollbars")
    title = dom.split("<title>GEOMETRY ", 1)[1].split("</title>", 1)[0]
    return json.loads(title.replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


def _chromium(page: Path | str, profile: Path, *options: str) -> str:
    """Headless chromium on a file (a Path) or a URL (a str, e.g. a running `hubtrace serve`)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's chromium is needed: apt-get install chromium (make browser)"
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
         "--disable-background-networking", "--disable-component-update", f"--user-data-dir={profile}",
         "--virtual-time-budget=5000", *options, page.as_uri() if isinstance(page, Path) else page],
        capture_output=True, text=True, check=True,
    ).stdout


def headless_dom(page: Path, profile: Path) -> str:
    """The DOM headless chromium builds from ``page`` after its scripts ran (Debian's chromium; ``make browser``)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's chromium is needed: apt-get install chromium (make browser)"
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
         "--disable-background-networking", "--disable-component-update", f"--user-data-dir={profile}",
         "--virtual-time-budget=5000", "--dump-dom", page.as_uri()], capture_output=True, text=True, check=True,
    ).stdout
