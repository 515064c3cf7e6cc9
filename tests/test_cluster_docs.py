"""The configs the documentation shows are configs the validator accepts: the cluster guide's example is
configs/cluster-s3.yaml word for word, and every YAML block in README.md and docs/ validates as a scan config
(a fragment completed with a source), so an operator can paste any of them."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from jobs.config import load_config
from scanner.fingerprints.store import FingerprintStore

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def yaml_blocks(page: Path) -> list[str]:
    """The text of each ```yaml fenced block of a Markdown page (indented ones too, e.g. in a list)."""
    blocks, current, indent = [], None, ""
    for line in page.read_text(encoding="utf-8").splitlines():
        if current is None and line.strip() == "```yaml":
            current, indent = [], line[: len(line) - len(line.lstrip())]
        elif current is not None and line.strip() == "```":
            blocks.append(textwrap.dedent("\n".join(current)) + "\n")
            current = None
        elif current is not None:
            current.append(line.removeprefix(indent))
    return blocks


def test_the_cluster_guide_shows_the_shipped_config_and_it_validates(tmp_path):
    shipped = REPO / "configs" / "cluster-s3.yaml"
    full = [b for b in yaml_blocks(REPO / "docs" / "cluster.md") if "sources:" in b]
    assert full == [shipped.read_text(encoding="utf-8")]
    config = load_config(shipped)
    assert not FingerprintStore(config.fingerprint_location).is_local  # reachable from every node
    assert config.devices.mode == "gpu" and config.ray.actors == "auto"
    assert config.db_path.is_absolute() and config.sources[0].download_dir.is_absolute()


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_yaml_block_in_the_docs_validates(page, tmp_path):
    for i, block in enumerate(yaml_blocks(page)):
        data = yaml.safe_load(block)
        assert isinstance(data, dict), (page.name, block)
        data.setdefault("sources", [{"kind": "hf_cache"}])
        path = tmp_path / f"{page.stem}-{i}.yaml"
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        load_config(path)  # raises ConfigError naming the key on any drift between docs and validator
