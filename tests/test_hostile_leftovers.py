"""Hostile input, the cases issue 12 left: hub text nested in a query's struct, map or list cells; an id holding a
control character beside an id that spells out its escape (two nodes, never one); a fingerprint whose metadata lies
about its types; and a README or tokenizer file swapped for a FIFO between a check of its path and its open.

All on tiny inputs (no zoo, no Ray): a real DuckDB file, real XML and DOT parsers, real safetensors files, a real
FIFO. The swap is made at the moment the code under test looks at the path (os.stat), as an attacker racing it
would; code that opens first and checks the open descriptor never gives that moment.
"""

from __future__ import annotations

import json
import os
import stat
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path

import networkx as nx
import numpy as np
import pydot
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file
from typer.testing import CliRunner

from jobs.cli import app
from lineage_graph.export import read_graph, write_graph
from scanner.declared.cards import read_card
from scanner.errors import CheckpointError, FingerprintError
from scanner.fingerprints.fingerprint import Fingerprint, read_fingerprint, read_fingerprint_meta, write_fingerprint
from scanner.reading.checkpoint import open_checkpoint
from scanner.store import Store
from scanner.text_safety import xml_text
from tests.hang_support import hang_guard
from tests.synthetic_fingerprints import template_fingerprint
from tests.tiny_models import FAMILIES, save_random

runner = CliRunner()
#: What a terminal would act on: ESC (CSI/OSC sequences), BEL, a C1 CSI, a bidi override.
TERMINAL_ACTIVE = ("\x1b", "\x07", "\x9b", "\u202e")
HOSTILE = "x\x1b[2J\u202eevil\x07"  # clear screen, reverse the line, ring the bell
HANG_GUARD_S = 10


# -- query: text inside nested cells ------------------------------------------------------------------------------

NESTED = (f"SELECT {{'id': '{HOSTILE}', 'n': 1}} AS s, [{{'id': '{HOSTILE}'}}] AS list_of_structs, "
          f"map(['{HOSTILE}'], ['{HOSTILE}']) AS m, ['{HOSTILE}', 'y']::VARCHAR[2] AS arr, [['{HOSTILE}']] AS nested, "
          f"NULL::STRUCT(id VARCHAR) AS missing")


def test_query_table_escapes_text_in_struct_map_array_and_nested_list_cells(tmp_path: Path) -> None:
    db = tmp_path / "scan.duckdb"
    Store(db).close()  # an empty scan database: the text comes from the query, as a hub's would from a table
    result = runner.invoke(app, ["query", "--db", str(db), NESTED])
    assert result.exit_code == 0, result.output
    assert not any(c in result.stdout for c in TERMINAL_ACTIVE), repr(result.stdout)
    assert result.stdout.count("x\\x1b[2J\\u202eevil\\x07") == 6  # every cell shows the text, escapes visible
    assert result.stdout.count("null") == 1  # a null struct stays null, not a struct of nulls


# -- graph exports: an id with a control character and an id spelling out its escape are two nodes -----------------

TWINS = ("hostile/a\x01", "hostile/a\\x01")  # U+0001 itself, and backslash-x-0-1 typed out


def _graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    for n in TWINS:
        graph.add_node(n, label=n, family="hostile")
    return graph


@pytest.mark.parametrize("fmt", ["graphml", "gexf"])
def test_xml_exports_keep_an_id_and_its_spelled_out_escape_apart(fmt: str, tmp_path: Path) -> None:
    path = write_graph(_graph(), fmt, tmp_path / f"g.{fmt}")
    ET.parse(path)  # XML 1.0 holds both
    read = read_graph(path)
    assert read.number_of_nodes() == 2
    assert set(read.nodes) == {xml_text(n) for n in TWINS}


def test_dot_export_keeps_an_id_and_its_spelled_out_escape_apart(tmp_path: Path) -> None:
    path = write_graph(_graph(), "dot", tmp_path / "g.dot")
    (parsed,) = pydot.graph_from_dot_file(str(path))
    names = {n.get_name() for sub in parsed.get_subgraphs() for n in sub.get_nodes()} - {"node", "graph", "edge"}
    assert len(names) == 2, names


# -- fingerprint metadata that lies about its types ---------------------------------------------------------------

@pytest.fixture(scope="module")
def fingerprint(tmp_path_factory: pytest.TempPathFactory) -> Fingerprint:
    return template_fingerprint(tmp_path_factory.mktemp("llama"), 8)


LIES = [
    ("n_layers", "2", "n_layers"),                      # a number as a string
    ("n_layers", True, "n_layers"),                     # a boolean for a count
    ("hidden_size", 64.0, "hidden_size"),               # a float for a count
    ("tokenizer_hash", 5, "tokenizer_hash"),            # a number for a hash
    ("tensor_hashes", ["a"], "tensor_hashes"),          # a list for a mapping
    ("input_spec", {"seed": 0, "n_sequences": "1", "seq_len": 8, "version": 1}, "input_spec.n_sequences"),
    ("summaries", [], "summaries"),                     # a list for a mapping
    ("model", None, "model"),                           # null for an id
]


@pytest.mark.parametrize(("field", "lie", "named"), LIES)
def test_fingerprint_metadata_of_the_wrong_type_is_refused_in_one_line(
    fingerprint: Fingerprint, tmp_path: Path, field: str, lie: object, named: str
) -> None:
    file = tmp_path / "fp.safetensors"
    write_fingerprint(fingerprint, file)
    _rewrite_meta(file, {field: lie})
    for read in (read_fingerprint, read_fingerprint_meta):
        with pytest.raises(FingerprintError) as caught:
            read(file)
        message = str(caught.value)
        assert "\n" not in message and str(file) in message, message
        assert f"field '{named}' has the wrong type" in message, message


def _rewrite_meta(file: Path, changes: dict[str, object]) -> None:
    """The same tensors and content hash under metadata JSON with some fields replaced (what a forger writes)."""
    with safe_open(str(file), framework="numpy") as handle:
        metadata = dict(handle.metadata())
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    key = next(k for k in metadata if k != "content_sha256")
    metadata[key] = json.dumps({**json.loads(metadata[key]), **changes})
    save_file(tensors, str(file), metadata=metadata)


def _forge(file: Path, meta_changes: dict[str, object], tensors: dict[str, np.ndarray]) -> None:
    """A fingerprint file a forger writes from scratch: any tensors, any metadata, a content hash that matches."""
    from scanner.fingerprints.fingerprint import _content_sha256

    with safe_open(str(file), framework="numpy") as handle:
        metadata = dict(handle.metadata())
    key = next(k for k in metadata if k != "content_sha256")
    metadata[key] = json.dumps({**json.loads(metadata[key]), **meta_changes})
    metadata["content_sha256"] = _content_sha256(tensors)
    save_file(tensors, str(file), metadata=metadata)


FORGERIES = {
    "no blocks": ({"n_layers": 0}, {}, "holds no blocks"),
    "no tokens": ({"n_layers": 1, "input_spec": {"seed": 0, "n_sequences": 0, "seq_len": 64, "version": 1}},
                  {"blocks.0.0.gate": np.zeros((4, 0), np.float16), "blocks.0.0.up": np.zeros((4, 0), np.float16)},
                  "no tokens"),
    "zero-width block": ({"n_layers": 1}, {"blocks.0.0.gate": np.zeros((0, 256), np.float16),
                                           "blocks.0.0.up": np.zeros((0, 256), np.float16)}, "malformed"),
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_a_fingerprint_with_no_blocks_tokens_or_units_is_refused_in_one_line(
    fingerprint: Fingerprint, tmp_path: Path, forgery: str
) -> None:
    """Issue 24: such files raised from numpy or the statistics instead of being refused when read."""
    meta_changes, tensors, words = FORGERIES[forgery]
    file = tmp_path / "fp.safetensors"
    write_fingerprint(fingerprint, file)
    _forge(file, meta_changes, tensors)
    with pytest.raises(FingerprintError, match=words) as caught:
        read_fingerprint(file)
    assert "\n" not in str(caught.value)


def test_an_honest_fingerprint_still_reads_with_its_types(fingerprint: Fingerprint, tmp_path: Path) -> None:
    file = tmp_path / "fp.safetensors"
    write_fingerprint(fingerprint, file)
    assert asdict(read_fingerprint(file).meta) == asdict(fingerprint.meta)


# -- files swapped for a FIFO between a check and an open ---------------------------------------------------------

@pytest.fixture
def swap_on_stat(monkeypatch: pytest.MonkeyPatch):
    """Arm a race: the first os.stat of the given path answers for the regular file, then replaces it by a FIFO
    (the attacker wins the window between a check of the path and its open)."""
    def arm(target: Path) -> None:
        real_stat = os.stat

        def racing_stat(path, *args, **kwargs):
            result = real_stat(path, *args, **kwargs)
            if os.fspath(path) == str(target) and not stat.S_ISFIFO(os.lstat(target).st_mode):
                target.unlink()
                os.mkfifo(target)
            return result

        monkeypatch.setattr(os, "stat", racing_stat)

    return arm


def test_a_card_swapped_for_a_fifo_after_its_check_is_not_opened_blocking(tmp_path: Path, swap_on_stat) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("---\nlicense: mit\n---\n")
    swap_on_stat(readme)
    with hang_guard(HANG_GUARD_S):
        card = read_card(tmp_path)
    assert card.license == "mit" and not card.notes  # read from the file it checked


def test_a_card_that_is_a_fifo_is_a_note(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "README.md")
    with hang_guard(HANG_GUARD_S):
        assert read_card(tmp_path).notes == ("README.md is not a regular file",)


def test_a_tokenizer_file_swapped_for_a_fifo_after_its_check_is_not_opened_blocking(
    tmp_path: Path, swap_on_stat
) -> None:
    save_random(FAMILIES["llama"].config(), tmp_path)
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text('{"model": {"vocab": {"a": 0}}}')
    checkpoint = open_checkpoint(tmp_path)
    expected = checkpoint.tokenizer_hash()
    swap_on_stat(tokenizer)
    with hang_guard(HANG_GUARD_S):
        assert checkpoint.tokenizer_hash() == expected


def test_a_tokenizer_file_that_is_a_fifo_is_a_one_line_error(tmp_path: Path) -> None:
    save_random(FAMILIES["llama"].config(), tmp_path)
    checkpoint = open_checkpoint(tmp_path)
    os.mkfifo(tmp_path / "tokenizer.json")
    with hang_guard(HANG_GUARD_S), pytest.raises(CheckpointError, match="not a regular file") as caught:
        checkpoint.tokenizer_hash()
    assert "\n" not in str(caught.value)
