"""Hostile input, round 5 (issue 44), in the scanner: a hub's own files never reach outside the hub, every parser is
bounded by what it builds rather than by the file's size, every adapter shape is a one-line refusal, and the database
file is whole after a run and after a killed one.

Tiny inputs (no zoo, no Ray): LoRA adapters of a tiny Llama made with PEFT and then altered as an uploader would,
YAML that names millions of nodes in a few hundred bytes, configs that lie about their counts, and a real DuckDB file
left behind by a writer killed mid-run. A config that lies is opened in a child process whose address space is
capped, so a reader that builds what the config counts fails there, not in the suite.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from peft import LoraConfig, get_peft_model
from safetensors.numpy import load_file, save_file
from transformers import AutoModelForCausalLM, BertConfig, BertForMaskedLM

from scanner.declared.cards import MAX_DECLARED_BASES, MAX_TAGS, parse_card
from scanner.declared.fields import MAX_YAML_NODES
from scanner.declared.merge_config import parse_merge_config
from scanner.errors import CheckpointError, MissingBaseError
from scanner.reading.formats.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from scanner.reading.formats.lora_base import adapter_base
from scanner.reading.validate import validate_checkpoint
from scanner.sources.local import discover_local
from scanner.sources.records import SourceFailure
from scanner.store import Store
from tests.hang_support import hang_guard
from tests.peft_support import save_adapter, tiny_llama
from tests.tiny_models import FAMILIES

HANG_GUARD_S = 60


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``hub/org/base`` (a tiny Llama), a LoRA adapter of it kept aside as a template (``template``), and a copy of
    the base outside the hub (``outside/secret``)."""
    root = tmp_path_factory.mktemp("round5")
    base = tiny_llama(root / "hub" / "org" / "base", seed=0)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    save_adapter(model, root / "template", "org/base")
    shutil.copytree(root / "hub" / "org" / "base", root / "outside" / "secret")
    return root


def adapter(tree: Path, name: str, base: str, tensors: dict | None = None, **config: object) -> Path:
    """The template adapter copied to ``hub/org/<name>``, naming ``base``, its tensors and config changed as given."""
    folder = tree / "hub" / "org" / name
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(tree / "template", folder)
    config_file = folder / ADAPTER_CONFIG
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **config,
                                       "base_model_name_or_path": base}))
    if tensors is not None:
        save_file(tensors, str(folder / ADAPTER_WEIGHTS))
    return folder


# -- a hub's files stay inside the hub --------------------------------------------------------------------------


def test_an_adapter_base_outside_the_hub_is_refused_alike_whether_something_is_there_or_not(tree: Path) -> None:
    """Once, ``../../../outside/secret`` and an absolute path were fingerprinted through that folder, and the errors
    told an outside folder that exists ("has no config.json") from one that does not."""
    named = {"relative": "../../../outside/secret", "absolute": str(tree / "outside" / "secret"),
             "absent": str(tree / "outside" / "absent")}
    said = {}
    for case, base in named.items():
        folder = adapter(tree, f"lora-{case}", base)
        with pytest.raises(MissingBaseError) as refused:
            validate_checkpoint(folder)
        message = str(refused.value)
        assert "\n" not in message and "a path outside the scanned hub" in message and "--follow-links" in message
        said[case] = message.replace(str(folder), "ADAPTER").replace(base, "BASE")
        assert adapter_base(folder) is not None and adapter_base(folder).folder is None  # discovery: not found
    assert said["absolute"] == said["absent"] == said["relative"]  # nothing tells whether something is there
    found = {r.model_id: r for r in discover_local(tree / "hub")}
    assert found["org/lora-relative"].base_models == ("../../../outside/secret",)
    # the operator's leave (links and paths may lead out of this tree): followed
    for case in ("relative", "absolute"):
        checked = validate_checkpoint(tree / "hub" / "org" / f"lora-{case}", follow_links=True)
        assert checked.checkpoint.base_path == (tree / "outside" / "secret").resolve()
        assert adapter_base(tree / "hub" / "org" / f"lora-{case}", outside_paths=True).folder is not None


def test_merge_configs_and_cards_name_outside_paths_as_ids_and_open_nothing_there(tmp_path: Path) -> None:
    """A merge config's models and a card's bases are ids to match against scanned models: a path in them is never
    opened (FIFOs stand at those paths: opening one for reading would wait for ever)."""
    outside = tmp_path / "outside" / "org"
    outside.mkdir(parents=True)
    for name in ("trap", "bait"):
        os.mkfifo(outside / name)
    model = tmp_path / "hub" / "acme" / "merge"
    model.mkdir(parents=True)
    models = [{"model": str(outside / "trap")}, {"model": "../../../outside/org/bait"}]
    (model / "mergekit_config.yml").write_text(yaml.safe_dump({"merge_method": "linear", "models": models}))
    (model / "README.md").write_text(f"---\nbase_model: {outside / 'bait'}\n---\n")
    with hang_guard(HANG_GUARD_S):
        (record,) = discover_local(tmp_path / "hub")
    assert record.merge is not None and record.merge.parents == ("org/trap", "org/bait")
    assert str(outside / "bait") in record.base_models


@pytest.mark.parametrize("length", [300, 2_000_000], ids=["longer-than-a-file-name", "two-megabytes"])
def test_a_base_name_longer_than_a_file_name_is_one_short_line(tree: Path, length: int) -> None:
    """Once an OSError (ENAMETOOLONG, which Path.is_dir does not swallow), and a 2 MB name a 2 MB traceback."""
    folder = adapter(tree, "lora-long", "x" * length)
    with pytest.raises(CheckpointError) as refused:
        validate_checkpoint(folder)
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 1000, str(refused.value)[:300]
    assert adapter_base(folder) is None or adapter_base(folder).folder is None
    for found in discover_local(tree / "hub"):
        assert not isinstance(found, SourceFailure) or len(found.reason) < 1000


def test_a_base_in_the_home_of_a_user_this_machine_lacks_is_one_line(tree: Path) -> None:
    """Once a RuntimeError (Path.expanduser of ``~nosuchuser``)."""
    folder = adapter(tree, "lora-tilde", "~nosuchuser-hubtrace/models/base")
    with pytest.raises(MissingBaseError, match="~nosuchuser-hubtrace/models/base") as refused:
        validate_checkpoint(folder)
    assert "\n" not in str(refused.value)


# -- every adapter shape a one-line refusal ----------------------------------------------------------------------


def test_a_rank_0_adapter_is_refused_in_one_line(tree: Path) -> None:
    """Once a ZeroDivisionError (its scaling is lora_alpha / r)."""
    tensors = load_file(str(tree / "template" / ADAPTER_WEIGHTS))
    rank_0 = {name: value[:0] if ".lora_A." in name else value[:, :0] for name, value in tensors.items()}
    folder = adapter(tree, "lora-rank-0", "org/base", rank_0, r=0)
    with pytest.raises(CheckpointError, match="have rank 0") as refused:
        validate_checkpoint(folder)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(("kept", "missing"), [("A", "B"), ("B", "A")])
def test_half_a_lora_pair_is_refused_naming_the_half_it_has(tree: Path, kept: str, missing: str) -> None:
    """Once an adapter with lora_A and no lora_B was said to have lora_B without lora_A."""
    tensors = load_file(str(tree / "template" / ADAPTER_WEIGHTS))
    half = {name: value for name, value in tensors.items() if f".lora_{missing}." not in name}
    folder = adapter(tree, f"lora-only-{kept}", "org/base", half)
    with pytest.raises(CheckpointError, match=f"has lora_{kept} without lora_{missing}"):
        validate_checkpoint(folder)


# -- every parser bounded by what it builds ---------------------------------------------------------------------


def alias_bomb(levels: int) -> str:
    """YAML in which anchor ``a<levels-1>`` expands to 10**levels scalars, in about 60 bytes a level."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_yaml_aliases_past_the_node_budget_are_refused_in_merge_configs_and_cards() -> None:
    """Once a 506-byte merge config cost 11 s and 588 MB (a note quoted a field of 10^8 nodes), and a card whose
    base_model_relation was a list stopped discovery (TypeError)."""
    bomb = alias_bomb(7)  # 10^7 nodes
    merge = parse_merge_config(bomb + "merge_method: passthrough\n"
                                      "slices: [{sources: [{model: a/b, layer_range: *a6}]}]")
    assert merge.notes == (f"mergekit_config.yml refused: its aliases expand it to more than {MAX_YAML_NODES:,} "
                           "nodes",) and merge.sources == ()
    card = parse_card(f"---\n{bomb}base_model_relation: *a6\n---\n")
    assert card.notes == (f"model card front matter refused: its aliases expand it to more than {MAX_YAML_NODES:,} "
                          "nodes",)
    looped = parse_merge_config("a: &a [1, *a]\nmerge_method: *a\n")
    assert looped.notes == ("mergekit_config.yml refused: an alias refers to a node that contains it (a recursive "
                            "document)",)
    listed = parse_card("---\nbase_model_relation: [finetune]\nbase_model: org/base\n---\n")
    assert listed.base_model == ("org/base",) and listed.base_model_relation is None
    assert "base_model_relation" in listed.notes[0]
    honest = parse_merge_config("base_model: &b org/base\nmerge_method: ties\nmodels: [{model: org/a}, {model: *b}]")
    assert honest.parents == ("org/a", "org/base") and honest.notes == ()  # a few aliases still read


def test_a_card_with_thousands_of_base_model_tags_keeps_a_hundred_bases_and_says_so() -> None:
    """Once 50,000 ``base_model:`` tags took 12 s to parse (a list searched per tag) and made a 6.3 MB model page."""
    tags = [f"base_model:finetune:org/m{i}" for i in range(20_000)] + ["from-scratch"]
    card = parse_card("---\n" + yaml.safe_dump({"tags": tags}) + "---\n")
    assert card.base_model == tuple(f"org/m{i}" for i in range(MAX_DECLARED_BASES))
    assert card.base_model_relation == "finetune" and card.claims_from_scratch  # kept past the tag cap
    assert len(card.tags) == MAX_TAGS + 1
    assert f"20,001 tags; the first {MAX_TAGS} kept" in card.notes
    assert f"20,000 base models declared; the first {MAX_DECLARED_BASES} kept" in card.notes


CHILD = """
import json, resource, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from scanner.reading.validate import validate_checkpoint
for folder in sys.argv[2:]:
    try:
        validate_checkpoint(folder, check_values=False)
        print(json.dumps(["ok", ""]), flush=True)
    except BaseException as error:
        print(json.dumps([type(error).__name__, str(error)[:2000]]), flush=True)
"""
ADDRESS_SPACE = 3 << 30
"""The child's address space: importing torch and transformers takes under 1 GB of it."""


def opened_in_a_small_child(*folders: Path) -> list[tuple[str, str]]:
    """(exception type or "ok", message) of validating each folder in turn, in one child process of
    ``ADDRESS_SPACE`` bytes (one child: its imports are most of its time); a folder the child never answered for
    reads "crashed" or "TimeoutExpired"."""
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, str(ADDRESS_SPACE), *map(str, folders)],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(Path.cwd())})
        answers = [tuple(json.loads(line)) for line in done.stdout.splitlines()]
        missing = ("crashed", done.stderr[-500:])
    except subprocess.TimeoutExpired as timeout:
        answers = [tuple(json.loads(line)) for line in (timeout.stdout or b"").decode().splitlines()]
        missing = ("TimeoutExpired", "still building after 300 s")
    return answers + [missing] * (len(folders) - len(answers))


def bert(folder: Path) -> None:
    BertForMaskedLM(BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                               vocab_size=128, max_position_embeddings=64)).save_pretrained(folder)


def causal(family: str) -> object:
    return lambda folder: AutoModelForCausalLM.from_config(FAMILIES[family].config()).save_pretrained(folder)


@pytest.mark.parametrize(("make", "key"), [
    (causal("llama"), "num_hidden_layers"), (bert, "num_hidden_layers"), (causal("mixtral"), "num_local_experts"),
    (causal("qwen2_moe"), "num_experts"), (causal("llama"), "vocab_size"), (causal("llama"), "num_attention_heads"),
], ids=["llama-layers", "bert-layers", "mixtral-experts", "qwen2_moe-experts", "llama-vocab", "llama-heads"])
def test_a_config_whose_counts_its_tensors_cannot_hold_is_refused_before_anything_is_built(
        make, key: str, tmp_path: Path) -> None:
    """Once ``num_hidden_layers: 1000000000`` in a 1 KB config.json took a Llama to 3.3 GB in 9 s (a set of every
    layer number) and made BERT build 10^9 layers on the meta device."""
    make(tmp_path / "honest")
    shutil.copytree(tmp_path / "honest", tmp_path / "lying")
    config_file = tmp_path / "lying" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), key: 10**9}))
    honest, (kind, message) = opened_in_a_small_child(tmp_path / "honest", tmp_path / "lying")
    assert honest == ("ok", "")
    assert kind == "CheckpointError" and f"{key} is 1,000,000,000, more than its weights can hold" in message, \
        (kind, message)


# -- the database file is whole ----------------------------------------------------------------------------------


def runs_in_a_copy_of_the_file_alone(db: Path, folder: Path) -> dict[str, str]:
    """run id -> status, read from a copy of the database file without its write-ahead log."""
    folder.mkdir()
    shutil.copy(db, folder / db.name)
    with Store(folder / db.name, read_only=True) as copy:
        return dict(copy.query("SELECT run_id, status FROM scan_runs").rows())


def test_the_database_file_alone_holds_a_finished_run(tmp_path: Path) -> None:
    db = tmp_path / "scan.duckdb"
    with Store(db) as store:
        run = store.start_run({})
        store.finish_run(run, "succeeded", {})
        assert runs_in_a_copy_of_the_file_alone(db, tmp_path / "copy") == {run: "succeeded"}  # the store still open


KILLED_WRITER = """
import os, sys
from scanner.store import Store
store = Store(sys.argv[1])
print(store.start_run({"killed": True}), flush=True)
os._exit(9)
"""


def test_a_killed_writers_log_is_in_the_file_once_the_next_writer_opens_it(tmp_path: Path) -> None:
    """Once a killed scan, rerun, left the database in its write-ahead log: the file stayed the empty 12 KB one, so a
    copy of it was an empty database."""
    db = tmp_path / "scan.duckdb"
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(db)], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path.cwd())})
    run = killed.stdout.strip()
    assert killed.returncode == 9 and run and db.with_name(db.name + ".wal").exists()
    with Store(db):  # the rerun opens it: DuckDB replays the log, and the store writes it into the file
        assert not db.with_name(db.name + ".wal").exists()
        assert runs_in_a_copy_of_the_file_alone(db, tmp_path / "copy") == {run: "running"}
