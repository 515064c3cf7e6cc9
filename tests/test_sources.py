"""Model sources with real parts: local folder trees on disk, the real huggingface_hub client against a loopback
Hub (`tests.fixtures.fake_hub`, a real HTTP server), and the client's own cache layout."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.constants import DOWNLOAD_CHUNK_SIZE as HF_CHUNK
from safetensors.torch import load_file, save_file

from scanner.errors import CheckpointError, UnsafeCheckpointError
from scanner.reading.checkpoint import open_checkpoint
from scanner.sources import (
    WHOLE_SOURCE,
    ModelRecord,
    RetryPolicy,
    SourceFailure,
    SourceFetchError,
    discover_hf_cache,
    discover_hub,
    discover_local,
    hub_record,
    materialize,
)
from scanner.sources.hub import LIST_EXPAND
from scanner.zoo import Zoo
from tests.fixtures.fake_hub import FakeHub

FAST = RetryPolicy(attempts=3, base_wait=0.01, max_wait=0.05)
BASE, CHAT = "aurora-labs/aurora-base", "finch-nlp/aurora-chat"


def claims_from_scratch(m) -> bool:  # noqa: ANN001 - a ZooModel
    """Zoo ground truth: cards without a declared base carry the from-scratch tag unless the policy is silent."""
    return not m.declared_base_model and m.card != "silent"


@pytest.fixture
def hub(zoo: Zoo):
    with FakeHub(page_size=3) as fake:
        for model_id in zoo.ids:
            fake.add_folder(model_id, zoo[model_id].path)
        yield fake


def records(items: list) -> dict[str, ModelRecord]:
    assert all(isinstance(r, ModelRecord) for r in items), [r for r in items if isinstance(r, SourceFailure)]
    return {r.model_id: r for r in items}


def resolved_files(fake: FakeHub, method: str = "GET") -> list[str]:
    return [r.path.split("/resolve/", 1)[1] for r in fake.requests if r.method == method and "/resolve/" in r.path]


# -- local folders -----------------------------------------------------------------------------------------------
def test_local_tree_records_every_model_folder(zoo: Zoo, tmp_path: Path) -> None:
    root = tmp_path / "models"
    for model_id in (BASE, CHAT):
        shutil.copytree(zoo[model_id].path, root / model_id)
    (root / "broken" / "empty").mkdir(parents=True)              # broken models still get a record
    (root / "broken" / "pickled").mkdir()
    (root / "broken" / "pickled" / "pytorch_model.bin").write_bytes(b"\x80\x04not-unpickled")
    (root / "manifest.json").write_text("{}")                     # loose files are not models
    (root / ".cache" / "x" / "y").mkdir(parents=True)             # hidden tool state is skipped
    found = records(list(discover_local(root)))
    assert sorted(found) == sorted([BASE, CHAT, "broken/empty", "broken/pickled"])
    for model_id in (BASE, CHAT):
        r, m = found[model_id], zoo[model_id]
        assert (r.source, r.location) == ("local", str((root / model_id).resolve()))
        assert r.base_models == m.declared_base_model and r.base_model_relation == m.declared_relation
        assert r.license == m.license and r.claims_from_scratch == claims_from_scratch(m)
    assert found["broken/empty"].notes and found["broken/empty"].base_models == ()

    again = records(list(discover_local(root)))
    assert {k: r.revision for k, r in again.items()} == {k: r.revision for k, r in found.items()}
    config = root / CHAT / "config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 1_000_000))
    changed = records(list(discover_local(root)))
    assert changed[CHAT].revision != found[CHAT].revision and changed[BASE].revision == found[BASE].revision


def test_local_symlink_loops_and_escapes_are_source_errors(zoo: Zoo, tmp_path: Path) -> None:
    root = tmp_path / "models"
    shutil.copytree(zoo[BASE].path, root / BASE)
    outside = tmp_path / "elsewhere"
    shutil.copytree(zoo[CHAT].path, outside)
    (root / "loops").mkdir()
    os.symlink(root / "loops" / "a", root / "loops" / "b")
    os.symlink(root / "loops" / "b", root / "loops" / "a")          # org/name itself is a loop
    (root / "escapes").mkdir()
    os.symlink(outside, root / "escapes" / "whole-model")           # a model folder linked from outside
    shutil.copytree(zoo[BASE].path, root / "escapes" / "one-file")
    (root / "escapes" / "one-file" / "model.safetensors").unlink()
    os.symlink(outside / "model.safetensors", root / "escapes" / "one-file" / "model.safetensors")
    shutil.copytree(zoo[BASE].path, root / "loops" / "inner")
    os.symlink("self", root / "loops" / "inner" / "self")            # a loop inside a model folder
    os.symlink(root / BASE, root / "escapes" / "alias")             # a link that stays inside the root is fine

    items = list(discover_local(root))
    errors = {e.model_id: e.reason for e in items if isinstance(e, SourceFailure)}
    assert set(errors) == {"loops/a", "loops/b", "loops/inner", "escapes/whole-model", "escapes/one-file"}
    assert all("symlink loop" in errors[k] for k in ("loops/a", "loops/b", "loops/inner"))
    assert all("outside the model root" in errors[k] for k in ("escapes/whole-model", "escapes/one-file"))
    ok = records([r for r in items if isinstance(r, ModelRecord)])
    assert set(ok) == {BASE, "escapes/alias"} and ok["escapes/alias"].revision == ok[BASE].revision


def test_missing_local_root_is_one_source_error(tmp_path: Path) -> None:
    (error,) = discover_local(tmp_path / "nope")
    assert isinstance(error, SourceFailure) and error.model_id == WHOLE_SOURCE and "unreadable" in error.reason


# -- Hub listing ---------------------------------------------------------------------------------------------------
def test_hub_listing_pages_and_reads_declared_lineage(zoo: Zoo, hub: FakeHub) -> None:
    shas = {model_id: hub.add_folder(model_id, zoo[model_id].path) for model_id in zoo.ids}  # unchanged: same sha
    found = records(list(discover_hub(endpoint=hub.endpoint, token="hf_test")))
    assert sorted(found) == sorted(zoo.ids)
    listing = [r for r in hub.requests if r.path == "/api/models"]
    assert len(listing) == -(-len(zoo.ids) // 3)                    # every page, following Link: rel="next"
    assert all(r.authorized for r in listing) and listing[0].query["expand"] == LIST_EXPAND
    for model_id, r in found.items():
        m = zoo[model_id]
        assert r.revision == shas[model_id] and r.source == "hub"
        assert r.location == f"{hub.endpoint}/{model_id}"
        assert r.base_models == m.declared_base_model
        if m.declared_relation or not m.declared_base_model:
            assert r.base_model_relation == m.declared_relation
        assert r.license == m.license and r.claims_from_scratch == claims_from_scratch(m)
        assert r.created_at is not None and r.last_modified is not None


def test_hub_listing_limit_and_filters(zoo: Zoo, hub: FakeHub) -> None:
    limited = list(discover_hub(endpoint=hub.endpoint, limit=4))
    assert len(limited) == 4 and len([r for r in hub.requests if r.path == "/api/models"]) == 2
    by_author = records(list(discover_hub(endpoint=hub.endpoint, author="aurora-labs")))
    assert sorted(by_author) == sorted(i for i in zoo.ids if i.startswith("aurora-labs/"))
    by_search = records(list(discover_hub(endpoint=hub.endpoint, search="Aurora")))
    assert sorted(by_search) == sorted(i for i in zoo.ids if "aurora" in i)
    scratch = records(list(discover_hub(endpoint=hub.endpoint, filter="from-scratch")))
    assert sorted(scratch) == sorted(i for i in zoo.ids if claims_from_scratch(zoo[i]))


def test_declared_parents_from_base_models_or_tags_alone(zoo: Zoo, hub: FakeHub) -> None:
    api = HfApi(endpoint=hub.endpoint)
    for fields in (["sha", "tags", "baseModels"], ["sha", "tags"]):     # no cardData: the Hub's derived fields
        for model_id in (CHAT, "juniper/aurora-soup", BASE):
            r = hub_record(api.model_info(model_id, expand=fields), hub.endpoint)
            assert isinstance(r, ModelRecord) and set(r.base_models) == set(zoo[model_id].declared_base_model)


def test_hostile_cards_on_the_hub_become_notes(zoo: Zoo, hub: FakeHub) -> None:
    config = (zoo[BASE].path / "config.json").read_bytes()
    hub.add_repo("odd/no-card", {"config.json": config})
    hub.add_repo("odd/bad-yaml", {"config.json": config, "README.md": b"---\nbase_model: [\n---\n"})
    hub.add_repo("odd/wrong-types", {"config.json": config, "README.md": b"---\nbase_model: 42\ntags: {a: 1}\n---\n"})
    found = records(list(discover_hub(endpoint=hub.endpoint, author="odd")))
    assert all(r.base_models == () and r.base_model_relation is None for r in found.values())
    assert found["odd/no-card"].notes == () and found["odd/bad-yaml"].notes == ()  # the Hub sends no cardData
    assert any("base_model is a int" in n for n in found["odd/wrong-types"].notes)


def test_listing_errors_end_as_one_source_error(hub: FakeHub) -> None:
    hub.fail(r"^/api/models\?.*cursor=", 400, times=None)        # page 1 fine, every later page refused
    items = list(discover_hub(endpoint=hub.endpoint))
    assert [type(i) for i in items] == [ModelRecord] * 3 + [SourceFailure]
    assert items[-1].model_id == WHOLE_SOURCE and "400" in items[-1].reason


def test_listing_rate_limit_is_retried_by_the_client(zoo: Zoo, hub: FakeHub) -> None:
    hub.fail(r"^/api/models\?.*cursor=", 429, times=1, retry_after=0)
    assert sorted(records(list(discover_hub(endpoint=hub.endpoint)))) == sorted(zoo.ids)
    statuses = [r.status for r in hub.requests if r.path == "/api/models"]
    assert statuses.count(429) == 1 and statuses.count(200) == -(-len(zoo.ids) // 3)


# -- fetching ------------------------------------------------------------------------------------------------------
def hub_repo_record(fake: FakeHub, model_id: str) -> ModelRecord:
    (r,) = [r for r in discover_hub(endpoint=fake.endpoint, search=model_id) if r.model_id == model_id]
    assert isinstance(r, ModelRecord)
    return r


def test_materialize_fetches_only_what_fingerprints_read(zoo: Zoo, hub: FakeHub, tmp_path: Path) -> None:
    src = zoo[CHAT].path
    files = {p.name: p.read_bytes() for p in src.iterdir()}
    files |= {"pytorch_model.bin": b"pickle", "optimizer.pt": b"pickle", "tokenizer.json": b'{"model": {}}',
              "consolidated.safetensors": files["model.safetensors"], "original/params.json": b"{}"}
    sha = hub.add_repo("acme/chat-plus", files)
    record = hub_repo_record(hub, "acme/chat-plus")
    hub.clear_log()
    folder = materialize(record, tmp_path / "cache", retry=FAST)
    fetched = resolved_files(hub)
    assert sorted(fetched) == sorted(f"{sha}/{n}" for n in ("config.json", "README.md", "tokenizer.json",
                                                              "model.safetensors"))
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors",
                                                        "tokenizer.json"]
    with open_checkpoint(folder) as got, open_checkpoint(src) as want:
        assert got.tensor_names() == want.tensor_names()
        assert all(got.get(n).equal(want.get(n)) for n in want.tensor_names())

    hub.clear_log()
    assert materialize(record, tmp_path / "cache", retry=FAST) == folder
    assert resolved_files(hub) == []                            # pinned to a commit: cached files are not re-fetched


def test_materialize_sharded_fetches_the_named_shards(zoo: Zoo, hub: FakeHub, tmp_path: Path) -> None:
    src = zoo[BASE].path
    tensors = load_file(src / "model.safetensors")
    names = sorted(tensors)
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2:])):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: tensors[n].contiguous() for n in part}, shard_dir / shard)
        weight_map |= {n: shard for n in part}
    (shard_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (shard_dir / "unused-extra.safetensors").write_bytes((shard_dir / "model-00001-of-00002.safetensors").read_bytes())
    shutil.copy(src / "config.json", shard_dir / "config.json")
    sha = hub.add_folder("acme/sharded", shard_dir)
    hub.clear_log()
    folder = materialize(hub_repo_record(hub, "acme/sharded"), tmp_path / "cache", retry=FAST)
    assert sorted(n.split("/", 1)[1] for n in resolved_files(hub)) == sorted(
        ["config.json", "model.safetensors.index.json", *set(weight_map.values())])
    assert all(n.startswith(f"{sha}/") for n in resolved_files(hub))
    with open_checkpoint(folder) as got:
        assert got.tensor_names() == names and got.get(names[0]).equal(tensors[names[0]])


def test_pickle_only_and_configless_repos_are_refused_before_any_download(zoo: Zoo, hub: FakeHub,
                                                                           tmp_path: Path) -> None:
    config = (zoo[BASE].path / "config.json").read_bytes()
    hub.add_repo("acme/pickled", {"config.json": config, "pytorch_model.bin": b"\x80\x04evil"})
    hub.add_repo("acme/no-config", {"model.safetensors": (zoo[BASE].path / "model.safetensors").read_bytes()})
    pickled, no_config = hub_repo_record(hub, "acme/pickled"), hub_repo_record(hub, "acme/no-config")
    hub.clear_log()
    with pytest.raises(UnsafeCheckpointError, match="pytorch_model.bin"):
        materialize(pickled, tmp_path, retry=FAST)
    with pytest.raises(CheckpointError, match="config.json"):
        materialize(no_config, tmp_path, retry=FAST)
    assert resolved_files(hub, "GET") == [] and resolved_files(hub, "HEAD") == []


def test_range_reads_fetch_only_the_header(zoo: Zoo, hub: FakeHub) -> None:
    record = hub_repo_record(hub, BASE)
    size = (zoo[BASE].path / "model.safetensors").stat().st_size
    hub.clear_log()
    meta = HfApi(endpoint=hub.endpoint).get_safetensors_metadata(BASE, revision=record.revision)
    with open_checkpoint(zoo[BASE].path) as ckpt:
        tensors = meta.files_metadata["model.safetensors"].tensors
        assert sorted(tensors) == ckpt.tensor_names()
        assert all(tuple(tensors[n].shape) == ckpt.shape(n) for n in tensors)
    ranged = [r for r in hub.requests if r.range]
    assert ranged and all(r.status == 206 for r in ranged)
    assert sum(r.body_bytes for r in hub.requests) < size


def test_dropped_download_resumes_with_a_range_read(zoo: Zoo, hub: FakeHub, tmp_path: Path) -> None:
    # The client writes in 10 MiB chunks and resumes from what it wrote, so the weights must be larger than that.
    tensors = load_file(zoo[BASE].path / "model.safetensors") | {"padding": torch.zeros(3_000_000)}
    save_file(tensors, tmp_path / "model.safetensors")
    weights = (tmp_path / "model.safetensors").read_bytes()
    hub.add_repo("acme/big", {"config.json": (zoo[BASE].path / "config.json").read_bytes(),
                              "model.safetensors": weights})
    record = hub_repo_record(hub, "acme/big")
    cut = HF_CHUNK + 12_345
    hub.drop(r"/resolve/.*/model\.safetensors$", after_bytes=cut)
    hub.clear_log()
    folder = materialize(record, tmp_path / "cache", retry=FAST)
    gets = [(r.status, r.range, r.body_bytes) for r in hub.requests
            if r.method == "GET" and r.path.endswith("/model.safetensors")]
    assert gets == [(200, None, cut), (206, f"bytes={HF_CHUNK}-", len(weights) - HF_CHUNK)]
    assert (folder / "model.safetensors").read_bytes() == weights


def test_transient_errors_are_retried(zoo: Zoo, hub: FakeHub, tmp_path: Path) -> None:
    record = hub_repo_record(hub, CHAT)
    hub.clear_log()
    hub.fail(r"^/api/models/.*/revision/", 503, times=2)                     # model_info: not retried by the client
    hub.fail(r"/resolve/.*/model\.safetensors$", 503, times=1, method="GET")  # a download answering 5xx: neither
    hub.fail(r"/resolve/.*/config\.json$", 429, times=1, retry_after=0, method="GET")  # the client's own retry
    folder = materialize(record, tmp_path, retry=FAST)
    with open_checkpoint(folder) as ckpt:
        assert ckpt.tensor_names()
    statuses = [(r.method, r.path.rsplit("/", 1)[-1], r.status) for r in hub.requests]
    assert statuses.count(("GET", record.revision, 503)) == 2
    assert ("GET", "model.safetensors", 503) in statuses and ("GET", "model.safetensors", 200) in statuses
    assert ("GET", "config.json", 429) in statuses and ("GET", "config.json", 200) in statuses


def test_retry_after_is_honoured(hub: FakeHub, tmp_path: Path) -> None:
    record = hub_repo_record(hub, BASE)
    hub.fail(r"^/api/models/.*/revision/", 429, times=1, retry_after=1)
    start = time.monotonic()
    materialize(record, tmp_path, retry=FAST)                  # FAST alone would wait 0.01 s
    assert time.monotonic() - start >= 1.0


def test_persistent_server_errors_end_as_source_fetch_errors(hub: FakeHub, tmp_path: Path) -> None:
    record = hub_repo_record(hub, BASE)
    hub.clear_log()
    hub.fail(r"^/api/models/.*/revision/", 500, times=None)
    with pytest.raises(SourceFetchError, match="HTTP 500"):
        materialize(record, tmp_path, retry=FAST)
    assert [r.status for r in hub.requests] == [500] * FAST.attempts and resolved_files(hub) == []
    hub.clear_faults()
    hub.fail(r"/resolve/.*/model\.safetensors$", 500, times=None, method="GET")
    with pytest.raises(SourceFetchError, match="model.safetensors"):
        materialize(record, tmp_path, retry=FAST)


def test_vanished_revision_is_a_source_fetch_error(zoo: Zoo, hub: FakeHub, tmp_path: Path) -> None:
    record = hub_repo_record(hub, BASE)
    gone = dataclasses.replace(record, revision="0" * 40)
    with pytest.raises(SourceFetchError, match="revision no longer on the Hub"):
        materialize(gone, tmp_path, retry=FAST)


# -- the local Hugging Face cache ----------------------------------------------------------------------------------
def test_hf_cache_lists_materialized_and_downloaded_models(zoo: Zoo, hub: FakeHub, tmp_path: Path) -> None:
    cache = tmp_path / "hf"
    chat = materialize(hub_repo_record(hub, CHAT), cache, retry=FAST)           # pinned by sha, no refs/main
    soup = "juniper/aurora-soup"
    for name in ("config.json", "README.md", "model.safetensors"):
        hf_hub_download(soup, name, cache_dir=cache, endpoint=hub.endpoint)    # revision main: refs/main written
    hf_hub_download(BASE, "README.md", cache_dir=cache, endpoint=hub.endpoint)  # a card alone is not a model
    main_soup = hub_repo_record(hub, soup).revision
    readme = (zoo[soup].path / "README.md").read_text() + "\nMore prose.\n"
    hub.add_repo(soup, {**{p.name: p.read_bytes() for p in zoo[soup].path.iterdir()}, "README.md": readme.encode()})
    newer = materialize(hub_repo_record(hub, soup), cache, retry=FAST)         # a newer snapshot, not main
    assert newer.name != main_soup
    (cache / "models--broken--repo").mkdir()                                    # no snapshots folder: corrupted

    items = list(discover_hf_cache(cache))
    errors = [i for i in items if isinstance(i, SourceFailure)]
    assert [e.model_id for e in errors] == ["broken/repo"]
    found = records([i for i in items if isinstance(i, ModelRecord)])
    assert sorted(found) == [CHAT, soup]
    assert found[CHAT].location == str(chat) and found[CHAT].revision == chat.name
    assert found[soup].revision == main_soup and Path(found[soup].location).name == main_soup  # what main loads
    for model_id, r in found.items():
        assert r.source == "hf_cache" and r.base_models == zoo[model_id].declared_base_model
        with open_checkpoint(r.location) as ckpt:
            assert ckpt.tensor_names()
    assert materialize(found[soup], tmp_path / "unused") == Path(found[soup].location)


def test_missing_hf_cache_is_one_source_error(tmp_path: Path) -> None:
    (error,) = discover_hf_cache(tmp_path / "nothing-here")
    assert isinstance(error, SourceFailure) and error.model_id == WHOLE_SOURCE
