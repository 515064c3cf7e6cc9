"""Hostile input, as an attacker would upload it: model ids and card text crafted for every library that interprets
text (Markdown, HTML, JavaScript, XML, DOT, mathtext, terminals, spreadsheets, SQL, rich markup), and model folders
crafted to hang, exhaust or mislead whatever opens them.

Two corpora, both built from one good model folder:

* `build_hostile_hub`: ``<root>/<org>/<name>/`` copies of the good model (so every pair of them is dependent and the
  lineage has edges, reasons and a family to draw) whose folder names are `HOSTILE_NAMES` and whose cards carry
  `HOSTILE_TEXTS` in every field a card has. Every output hubtrace writes about them must show the text and
  obey none of it.
* `build_hostile_folders`: `HOSTILE_FOLDERS`, each with the fragment its one-line refusal must contain.

Used by tests/test_hostile_input.py; a security reviewer can point hubtrace at either corpus by hand.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from scanner.checkpoint import JSON_LIMITS

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
ORG = "hostile"
#: A path an attacker would like embedded in a report, a page or an export.
SECRET_FILE = "/etc/passwd"

HOSTILE_TEXTS: tuple[str, ...] = (
    f"x\n![a]({SECRET_FILE})\ny",                              # Markdown image of a local file (report inlining)
    "<img src=x onerror=alert(1)>",                               # HTML
    "<svg onload=alert(1)>",
    "</script><script>alert(1)</script>",                       # ends the page's data script
    "<!--<script>",                                               # script-data escape state: the page stops
    "[click](javascript:alert(1)) <javascript:alert(1)>",        # Markdown link and autolink
    "\n\n# Verdict: INDEPENDENT\n\n**Verdict:** forged",          # forged report structure
    "]]><evil/><![CDATA[ -- --> &amp; &#0; &unknown;",            # XML CDATA, comments, entities
    "\x00nul \x08\x0b\x0c\x1f controls \x7f\x85",                 # characters XML 1.0 forbids
    "\x1b[31mred\x1b[0m \x1b]8;;http://evil.example/\x07link\x1b]8;;\x07 \x1b[2J",  # SGR, OSC 8, clear screen
    "\u202eevil.exe\u202c \u2066iso\u2069 zero\u200bwidth \u2028line",  # bidi override, isolates, separators
    "ba\u00adse tag\U000e0041\U000e007f var\ufe0f\U000e0100 \u180e\u115f\u3164\uffa0 \u034f\u17b4",  # invisible
    "nonchar \ufffe \uffff \U0001fffe \ufdd0",                      # noncharacters XML 1.0 forbids
    r"$\frac{1}{0}$ $x^{$ \$ $$",                                 # mathtext (and a broken one)
    'dot "quote" \\l \\N \\G; node [label="x"]',                  # DOT escStrings and quoting
    "=cmd|' /C calc'!A0",                                         # CSV formula injection
    "@SUM(1+1)*cmd|' /C calc'!A0",
    "o'brien\"; DROP TABLE models; --",                           # SQL quotes
    "[link=https://evil.example/]rich[/link] [bold red]markup[/]",  # rich console markup
    "{{7*7}} ${jndi:ldap://x} %s%n",                               # template and format strings
    "A" * 5000,                                                    # very long text
)

HOSTILE_NAMES: tuple[str, ...] = (
    "md ![a](%2Fetc%2Fpasswd)",
    "<svg onload=alert(1)>",
    "<!--<script>",
    "]]>--&amp;",
    r"$\frac{1}{0}$",
    "\x1b[31mred\x1b]8;;http:%2F%2Fevil\x07",
    "\u202eexe.txt",
    "acme-ba\u00adse\ufffe",
    'dot"\\l\\N',
    "=cmd|' %2FC calc'!A0",
    "o'brien\"; DROP TABLE models; --",
    "[link=https:%2F%2Fevil]x[%2Flink]",
    "new\nline",
    "L" * 150,
)
"""Folder names (any byte but '/' and NUL); each becomes the id ``hostile/<name>``."""


def _card(texts: tuple[str, ...], base: str) -> str:
    """A card whose every field holds the texts: license, base_model (after a real base), tags and the body."""
    meta = {"license": texts[0], "base_model": [base, *texts], "base_model_relation": "finetune",
            "tags": [*texts, "ok"]}
    return "---\n" + yaml.safe_dump(meta, allow_unicode=False, width=10_000) + "---\n\n" + "\n\n".join(texts) + "\n"


def build_hostile_hub(root: Path, good_model: Path) -> list[str]:
    """Write one copy of good_model per `HOSTILE_NAMES` entry under ``root/hostile/``, their cards sharing out
    `HOSTILE_TEXTS` (every text in some card) and each declaring the previous copy as its base; returns the ids."""
    root, good_model = Path(root), Path(good_model)
    ids = [f"{ORG}/{name}" for name in HOSTILE_NAMES]
    for i, model_id in enumerate(ids):
        folder = root / model_id
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        for name in (CONFIG, WEIGHTS):
            shutil.copyfile(good_model / name, folder / name)
        (folder / "README.md").write_text(_card(HOSTILE_TEXTS[i::len(ids)], ids[i - 1]), encoding="utf-8")
    return ids


# -- hostile folders ---------------------------------------------------------------------------------------------


ACCEPTED = ""
"""`HostileFolder.followed` of a folder that opens once links are followed (a person's own linked downloads)."""


@dataclass(frozen=True)
class HostileFolder:
    """A model folder built to hang, exhaust or mislead its reader; its refusal must contain `reason`."""

    name: str
    reason: str
    build: Callable[[Path, Path], None]  # (folder, good model folder)
    followed: str | None = None  # the refusal with --follow-links: None the same one, ACCEPTED none (it opens)

    @property
    def model_id(self) -> str:
        return f"{ORG}-folders/{self.name}"


def _copy(folder: Path, good: Path, *skip: str) -> None:
    for name in (CONFIG, WEIGHTS):
        if name not in skip:
            shutil.copyfile(good / name, folder / name)


def _fifo(name: str) -> Callable[[Path, Path], None]:
    def build(folder: Path, good: Path) -> None:
        _copy(folder, good, name)
        os.mkfifo(folder / name)
    return build


def _sparse(name: str, size: int) -> Callable[[Path, Path], None]:
    """A file that claims size bytes and occupies none (a hole): reading it whole costs size bytes of memory."""
    def build(folder: Path, good: Path) -> None:
        _copy(folder, good, name)
        with open(folder / name, "wb") as handle:
            handle.write(b"{")
            handle.truncate(size)
    return build


def _link(name: str, target: str) -> Callable[[Path, Path], None]:
    def build(folder: Path, good: Path) -> None:
        _copy(folder, good, name)
        os.symlink(target, folder / name)
    return build


def _linked_weights(folder: Path, good: Path) -> None:
    """A person's own layout: the weights live elsewhere and the model folder links to them."""
    _copy(folder, good, WEIGHTS)
    os.symlink((good / WEIGHTS).resolve(), folder / WEIGHTS)


def _config_edit(edit: Callable[[dict], object]) -> Callable[[Path, Path], None]:
    def build(folder: Path, good: Path) -> None:
        _copy(folder, good)
        config = json.loads((good / CONFIG).read_text())
        edit(config)
        (folder / CONFIG).write_text(json.dumps(config))
    return build


def _config_text(text: str) -> Callable[[Path, Path], None]:
    def build(folder: Path, good: Path) -> None:
        _copy(folder, good, CONFIG)
        (folder / CONFIG).write_text(text)
    return build


_BIG = 1 << 40  # a terabyte of hole
HOSTILE_FOLDERS: tuple[HostileFolder, ...] = (
    HostileFolder("fifo-config", "not a regular file", _fifo(CONFIG)),
    HostileFolder("fifo-weights", "not a regular file", _fifo(WEIGHTS)),
    HostileFolder("fifo-tokenizer", "not a regular file", _fifo("tokenizer.json")),
    HostileFolder("sparse-config", f"over the {JSON_LIMITS[CONFIG]}-byte limit for config.json",
                  _sparse(CONFIG, _BIG)),
    HostileFolder("sparse-tokenizer", f"over the {JSON_LIMITS['tokenizer.json']}-byte limit for tokenizer.json",
                  _sparse("tokenizer.json", _BIG)),
    HostileFolder("sparse-generation-config", "over the", _sparse("generation_config.json", _BIG)),
    HostileFolder("config-to-environ", "points outside the model", _link(CONFIG, "/proc/self/environ"),
                  followed="is not valid JSON"),
    HostileFolder("weights-to-dev-zero", "points outside the model", _link(WEIGHTS, "/dev/zero"),
                  followed="not a regular file"),
    HostileFolder("linked-weights", "points outside the model", _linked_weights, followed=ACCEPTED),
    HostileFolder("huge-integer", "is not valid JSON", _config_text('{"hidden_size": ' + "9" * 5000 + "}")),
    HostileFolder("deep-json", "is not valid JSON", _config_text("[" * 100_000)),
    HostileFolder("wrong-type", "hidden_size", _config_edit(lambda c: c.update(hidden_size="sixty-four"))),
    HostileFolder("zero-head-dim", "could not build the model", _config_edit(lambda c: c.update(head_dim=0))),
    HostileFolder("billion-layers", "num_hidden_layers is 1,000,000,000, more than its weights can hold",
                  _config_edit(lambda c: c.update(num_hidden_layers=10**9))),
    HostileFolder("string-rope-factor", "could not build the model",
                  _config_edit(lambda c: c.update(rope_scaling={"rope_type": "linear", "factor": "2"}))),
    HostileFolder("architectures-dict", "architectures must be a list",
                  _config_edit(lambda c: c.update(architectures={"0": "LlamaForCausalLM"}))),
    HostileFolder("architectures-string", "architectures must be a list",
                  _config_edit(lambda c: c.update(architectures="LlamaForCausalLM"))),
    HostileFolder("escape-in-config", "is not supported",
                  _config_edit(lambda c: c.update(model_type="\x1b]8;;http://evil/\x07x\x1b[2J", architectures=None))),
)


def build_hostile_folders(root: Path, good_model: Path) -> dict[str, HostileFolder]:
    """Write every `HOSTILE_FOLDERS` entry as ``root/hostile-folders/<name>/``; model id -> entry."""
    root, good_model = Path(root), Path(good_model)
    for entry in HOSTILE_FOLDERS:
        folder = root / entry.model_id
        if os.path.lexists(folder):
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        entry.build(folder, good_model)
    return {entry.model_id: entry for entry in HOSTILE_FOLDERS}
