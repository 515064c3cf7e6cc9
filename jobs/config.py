"""The scan's YAML configuration: what to scan, where results go, how Ray runs it.

Every model forbids unknown keys, so a typo in a nightly config fails the job at once with the file, the key
path and the keys that are allowed, instead of silently scanning with a default. Relative paths are relative to
the working directory of the scan (under ``ray job submit --working-dir .`` that is the uploaded copy).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lineage_graph.evidence import DEFAULT_MIN_DIRECTION_CONFIDENCE
from lineage_graph.export import ExportFormat
from lineage_graph.multiple_testing import Method
from scanner.errors import HubtraceError, one_line
from scanner.fingerprints.cache import DEFAULT_CACHE_BYTES
from scanner.fingerprints.inputs import InputSpec
from scanner.retrieval.candidates import MAP_THRESHOLD
from scanner.retrieval.index import DEFAULT_SEARCH
from scanner.sources import SOURCE_KINDS
from scanner.stats.matching import MatchingRule
from scanner.stats.registry import FingerprintStatistic, WeightStatisticName
from scanner.stats.sequential import SequentialDesign

LOCAL_FOLDER_OUTPUT = Path("hubtrace-out/local")
"""Where ``hubtrace scan --local DIR`` without ``--config`` writes (as configs/local-folder.yaml)."""


class ConfigError(HubtraceError):
    """A scan configuration that cannot be used; the message names the file and the offending keys, one problem
    to a line (``problems``; the message alone when there is one)."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        self.problems = [f"{message}: {problem}" for problem in problems] if problems else [message]
        super().__init__("; ".join(self.problems))

    def lines(self) -> list[str]:
        return self.problems


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LocalSourceConfig(_Strict):
    """A folder laid out like the Hub: ``<path>/<org>/<name>/`` holding Hugging Face-format models."""

    kind: Literal["local"]
    path: Path
    follow_links: bool = False  # follow links out of path: a person's own tree of linked downloads, never by default


class HfCacheSourceConfig(_Strict):
    """Models already in a Hugging Face cache (``HF_HUB_CACHE`` when ``cache_dir`` is not given)."""

    kind: Literal["hf_cache"]
    cache_dir: Path | None = None


class HubSourceConfig(_Strict):
    """The Hub (or a mirror at ``endpoint``), listed with the Hub's own filters; at most ``limit`` models."""

    kind: Literal["hub"]
    endpoint: str | None = None
    author: str | None = None
    search: str | None = None
    filter: str | None = None
    limit: int | None = Field(default=None, ge=1)
    token_env: str = "HF_TOKEN"   # name of the environment variable holding the token; never the token itself
    download_dir: Path | None = None  # node-local scratch for downloads; default <system temp>/hubtrace-scratch


SourceConfig = Annotated[LocalSourceConfig | HfCacheSourceConfig | HubSourceConfig, Field(discriminator="kind")]


class InputsConfig(_Strict):
    """The canonical input set every fingerprint is taken on (see scanner.fingerprints.inputs)."""

    seed: int = 0
    n_sequences: int = Field(default=InputSpec.n_sequences, ge=1)
    seq_len: int = Field(default=InputSpec.seq_len, ge=1)

    def spec(self) -> InputSpec:
        return InputSpec(seed=self.seed, n_sequences=self.n_sequences, seq_len=self.seq_len)


class SequentialConfig(_Strict):
    """Screen a few blocks of each pair first and stop when they settle it (scanner.stats.sequential)."""

    screen_blocks: int = Field(default=SequentialDesign.screen_blocks, ge=1)
    stop_below_log10_p: float = Field(default=SequentialDesign.stop_below_log10_p, lt=0)
    stop_above_log10_p: float = Field(default=SequentialDesign.stop_above_log10_p, le=0)

    @model_validator(mode="after")
    def _ordered(self) -> SequentialConfig:
        if self.stop_below_log10_p >= self.stop_above_log10_p:
            raise ValueError("stop_below_log10_p must be below stop_above_log10_p")
        return self

    def design(self) -> SequentialDesign:
        return SequentialDesign(self.screen_blocks, self.stop_below_log10_p, self.stop_above_log10_p)


class PairsConfig(_Strict):
    """Which pairs are tested: every comparable pair, and/or each model with the bases its card declares;
    ``sequential: null`` compares every block of every pair. ``select: candidates`` (default) tests of the
    comparable pairs only those candidate retrieval finds (scanner.retrieval: unit collisions of at least
    ``min_score``, their families, pairs sharing a byte-identical tensor); ``all`` tests every one.
    ``map_threshold``: the cosine down to which a retrieved pair's signature hits draw its block map (and so the
    family closure), at most the collision cosine 0.6 (0.6 itself: block maps from collisions only).
    ``matching``: how phi_MATCH pairs units (scanner.stats.matching): ``screened`` (default: the greedy matching,
    then the paper's maximum-weight assignment for the blocks it finds related), ``greedy`` (the greedy matching
    alone: a GPU never waits on the host; a little less power and closeness on related pairs) or ``exact`` (the
    paper's assignment everywhere, for a scan whose results settle a dispute); a test made by another rule than the
    default notes it."""

    select: Literal["candidates", "all"] = "candidates"
    min_score: int = Field(default=4, ge=1)
    map_threshold: float = Field(default=MAP_THRESHOLD, gt=0, le=DEFAULT_SEARCH.threshold)
    index: Literal["auto", "flat", "ivf"] = "auto"   # the faiss index a (re)build makes (docs/retrieval.md)
    comparable: bool = True
    declared: bool = True
    batch_size: int = Field(default=16, ge=1)  # pairs per Ray task: fingerprints read once per batch
    sequential: SequentialConfig | None = SequentialConfig()
    matching: MatchingRule = "screened"
    #: Weight fingerprints of public disputes recorded beside each tested pair (off by default; never used to
    #: draw families): each model's weight profile is read once more when it is fingerprinted (docs/disputes.md).
    extra_stats: list[WeightStatisticName] = []


class RayConfig(_Strict):
    """Where Ray runs and how much of it the scan takes.

    ``address`` None: join the cluster in ``RAY_ADDRESS`` (set by ``ray job submit``), else start a local one
    with ``num_cpus``. ``actors`` "auto": one per GPU on a GPU cluster, else one per ``cpus_per_actor`` CPUs.
    ``actor_start_timeout_s``: how long the scan waits for its first fingerprint actor to start (the cluster
    finding room for it) before it stops with an error; actors that start later join when they do.
    """

    address: str | None = None
    num_cpus: int | None = Field(default=None, ge=1)
    actors: int | Literal["auto"] = "auto"
    cpus_per_actor: float = Field(default=1.0, gt=0)
    cpus_per_pair_task: float = Field(default=1.0, gt=0)
    max_in_flight: int | None = Field(default=None, ge=1)  # default: two per actor
    max_restarts: int = Field(default=2, ge=0)
    max_task_retries: int = Field(default=2, ge=0)
    actor_start_timeout_s: float = Field(default=600.0, gt=0)

    @model_validator(mode="after")
    def _positive_actors(self) -> RayConfig:
        if self.actors != "auto" and self.actors < 1:
            raise ValueError("actors must be 'auto' or at least 1")
        return self


class DevicesConfig(_Strict):
    """``auto``: GPU actors (``num_gpus`` each) when the cluster has GPUs, CPU actors otherwise;
    ``gpu`` requires GPUs (the scan stops with an error instead of waiting forever); ``cpu`` never asks.
    Pair tasks follow the actors: on GPUs each asks for ``gpus_per_pair_task`` (a fraction shares a GPU)."""

    mode: Literal["auto", "cpu", "gpu"] = "auto"
    gpus_per_actor: float = Field(default=1.0, gt=0)
    gpus_per_pair_task: float = Field(default=0.5, gt=0, le=1)


class LineageConfig(_Strict):
    """False-discovery control for calling tested pairs dependent, and the confidence below which a direction is
    not claimed (lineage_graph.persist.rebuild_lineage; docs/lineage.md, "Calibrated confidence")."""

    q: float = Field(default=0.05, gt=0, lt=1)
    method: Method = "bh"
    min_direction_confidence: float = Field(default=DEFAULT_MIN_DIRECTION_CONFIDENCE, ge=0.5, le=1.0)


class FingerprintCacheConfig(_Strict):
    """Each node's disk cache of fingerprint parts read from a remote fingerprint_store (scanner.fingerprints.cache)."""

    dir: str | None = None            # node-local folder; default <system temp>/hubtrace-<uid>/fingerprint-cache
    max_bytes: int = Field(default=DEFAULT_CACHE_BYTES, ge=0)   # per node; least recently used parts go first; 0: off


class ScanConfig(_Strict):
    """One scan: sources, the canonical inputs and statistic, pair policy, Ray, devices, lineage, outputs."""

    sources: list[SourceConfig] = Field(min_length=1)
    output_dir: Path = Path("hubtrace-out")
    db: Path | None = None            # default <output_dir>/hubtrace.duckdb
    fingerprint_store: str | None = None  # path or URL (s3://bucket/prefix); default <output_dir>/fingerprints
    fingerprint_store_shared: bool = False  # a local fingerprint_store that every node of the cluster mounts
    fingerprint_cache: FingerprintCacheConfig = FingerprintCacheConfig()  # used when fingerprint_store is a URL
    inputs: InputsConfig = InputsConfig()
    statistic: FingerprintStatistic = "match"
    pairs: PairsConfig = PairsConfig()
    ray: RayConfig = RayConfig()
    devices: DevicesConfig = DevicesConfig()
    lineage: LineageConfig = LineageConfig()
    exports: list[ExportFormat] = ["html", "graphml", "json"]
    rescan_errors: bool = False       # retry models that failed at an unchanged revision (fetch errors always are)

    @property
    def db_path(self) -> Path:
        return self.db if self.db is not None else self.output_dir / "hubtrace.duckdb"

    @property
    def fingerprint_location(self) -> str:
        return self.fingerprint_store or str(self.output_dir / "fingerprints")

    @property
    def export_dir(self) -> Path:
        return self.output_dir / "exports"

    def with_overrides(self, *, local: Path | None = None, db: Path | None = None,
                       output_dir: Path | None = None, follow_links: bool = False) -> ScanConfig:
        """The command line's overrides: ``local`` replaces every source with that one folder; ``follow_links``
        turns follow_links on for every local source."""
        update: dict[str, Any] = {}
        if local is not None:
            update["sources"] = [LocalSourceConfig(kind="local", path=local)]
        if follow_links:
            update["sources"] = [s.model_copy(update={"follow_links": True}) if isinstance(s, LocalSourceConfig)
                                 else s for s in update.get("sources", self.sources)]
        if db is not None:
            update["db"] = db
        if output_dir is not None:
            update["output_dir"] = output_dir
        return self.model_copy(update=update)

    def to_json_dict(self) -> dict:
        return self.model_dump(mode="json")


def local_folder_config(root: Path) -> ScanConfig:
    """``hubtrace scan --local DIR`` with no ``--config``: that folder with every default, written under
    hubtrace-out/local (what configs/local-folder.yaml says)."""
    return ScanConfig(sources=[LocalSourceConfig(kind="local", path=root)], output_dir=LOCAL_FOLDER_OUTPUT)


def load_config(path: str | Path) -> ScanConfig:
    """Read and validate a YAML scan config; every problem becomes one `ConfigError` naming file and key."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {one_line(e)}") from e
    except RecursionError as e:  # PyYAML composes nested nodes recursively: 50,000 levels overflow Python's stack
        raise ConfigError(f"{path}: not valid YAML: nested deeper than the parser can follow") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the config must be a mapping of keys to values, got {type(raw).__name__}")
    try:
        return ScanConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(f"{path}: invalid scan config", [_describe(err) for err in e.errors()]) from e


def _describe(error: dict) -> str:
    loc = tuple(error["loc"])
    key = _key_path(loc)
    if error["type"] == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        return f"{key}: unknown key; allowed here: {', '.join(allowed)}"
    if error["type"] == "missing":
        return f"{key}: required key is missing"
    if error["type"] == "union_tag_invalid":
        return f"{key}: unknown source kind; allowed: {', '.join(SOURCE_KINDS)}"
    if error["type"] == "union_tag_not_found":
        return f"{key}: a source needs 'kind' ({', '.join(SOURCE_KINDS)})"
    return f"{key}: {error['msg']} (got {error.get('input')!r})"


def _key_path(loc: tuple) -> str:
    """``sources[0].limit`` for pydantic's ("sources", 0, "hub", "limit")."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif not (i >= 2 and loc[i - 2] == "sources" and part in SOURCE_CONFIGS):
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _allowed_keys(loc: tuple) -> list[str]:
    """The field names of the model at ``loc``; a source's loc names its kind after the list index."""
    model: type[BaseModel] = ScanConfig
    for part in loc:
        if isinstance(part, int):
            continue
        if model is ScanConfig and part in SOURCE_CONFIGS:
            model = SOURCE_CONFIGS[part]
            continue
        annotation = model.model_fields[part].annotation if part in model.model_fields else None
        nested = [t for t in (annotation, *get_args(annotation)) if isinstance(t, type) and issubclass(t, BaseModel)]
        if nested:  # a plain sub-model, or one that may be null
            model = nested[0]
    return sorted(model.model_fields)


SOURCE_CONFIGS: dict[str, type[BaseModel]] = {
    "local": LocalSourceConfig, "hf_cache": HfCacheSourceConfig, "hub": HubSourceConfig,
}
