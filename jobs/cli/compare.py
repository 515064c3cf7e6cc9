"""`hubtrace test A B`: one pair, any statistic, from model folders or fingerprint files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from jobs.cli.refusals import CommandError
from scanner.fingerprints.inputs import InputSpec
from scanner.pairs.results import PairTestResult
from scanner.stats.registry import EMPIRICAL_NULL_STATISTICS, FINGERPRINT_STATISTICS, STATISTIC_NAMES, STATISTICS
from scanner.text_safety import json_visible, terminal_lines

if TYPE_CHECKING:
    from scanner.stats.matching import MatchingRule
    from scanner.stats.weight_statistics import PairKind


STAT_HELP = ("The statistic (default match, the robust one): " + " | ".join(
    f"{entry.name} ({entry.validity})" for entry in STATISTICS) + "; what each reads, its null and what defeats it: "
    "docs/statistics.md (the weight fingerprints of public disputes: docs/disputes.md).")


def test_command(
    model_a: Annotated[str, typer.Argument(
        help="First model: a Hugging Face-format directory, a GGUF file (or a fingerprint file or URL, "
             "e.g. s3://bucket/prefix/org/model/REVISION/INPUT_SET.safetensors).")],
    model_b: Annotated[str, typer.Argument(
        help="Second model: a Hugging Face-format directory, a GGUF file (or a fingerprint file or URL).")],
    stat: Annotated[str, typer.Option("--stat", help=STAT_HELP)] = "match",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    sequences: Annotated[int, typer.Option(
        help="Canonical input sequences (activation statistics).")] = InputSpec.n_sequences,
    seq_len: Annotated[int, typer.Option(help="Tokens per canonical sequence.")] = InputSpec.seq_len,
    seed: Annotated[int, typer.Option(help="Seed of the canonical inputs and of PERMTEST.")] = 0,
    permutations: Annotated[int, typer.Option(
        help="PERMTEST samples T for --stat l2 (--stat layernorm takes at least 999).")] = 99,
    null_db: Annotated[Path | None, typer.Option(
        "--null-db", help=f"A scan database whose pairs give --stat {' or '.join(EMPIRICAL_NULL_STATISTICS)} an "
                          "empirical null (its pairs with phi_MATCH p > 0.05, recorded with pairs.extra_stats, of the "
                          "same model types, depths and widths as the pair tested).")] = None,
    device: Annotated[str, typer.Option(help="torch device for forward passes, e.g. cpu or cuda.")] = "cpu",
    fingerprint: Annotated[
        bool, typer.Option("--fingerprint", help="Compare fingerprints (implied when a side is a fingerprint file).")
    ] = False,
    follow_links: Annotated[bool, typer.Option(
        "--follow-links", help="Follow links out of a model folder (your own linked downloads); off by default.")
    ] = False,
    matching: Annotated[str, typer.Option(
        help="How MATCH pairs units (--stat match, up, hidden): screened (default: greedily, then exactly where that "
             "finds a block related), greedy (greedily only: fastest) or exact (the paper's maximum-weight "
             "assignment everywhere; slower on unrelated models; for disputes).")] = "screened",
) -> None:
    """Test whether MODEL_A and MODEL_B were trained independently."""
    from scanner.fingerprints.fingerprint import is_fingerprint_file
    from scanner.fingerprints.store import is_url
    from scanner.pairs.compare import compare_models
    from scanner.pairs.results import render_table
    from scanner.stats.matching import MATCHING_RULES

    if stat not in STATISTIC_NAMES:
        raise CommandError(f"unknown statistic {stat!r}; choose one of {', '.join(STATISTIC_NAMES)}")
    if matching not in MATCHING_RULES:
        raise CommandError(f"unknown matching rule {matching!r}; choose one of {', '.join(MATCHING_RULES)}")
    spec = InputSpec(seed=seed, n_sequences=sequences, seq_len=seq_len)
    if fingerprint or any(is_url(side) or is_fingerprint_file(side) for side in (model_a, model_b)):
        result = compare_sides(model_a, model_b, stat, spec, device, follow_links=follow_links, rule=matching)
    else:
        null = _empirical_null(null_db, stat, (Path(model_a), Path(model_b))) if null_db is not None else None
        result = compare_models(Path(model_a), Path(model_b), stat, inputs=spec, permutations=permutations,
                                seed=seed, device=device, follow_links=follow_links, null=null, rule=matching)
    typer.echo(json_visible(json.dumps(result.to_json_dict(), indent=2)) if as_json
               else terminal_lines(render_table(result)))


def _empirical_null(db: Path, stat: str, sides: tuple[Path, Path]) -> dict[PairKind, list[float]]:
    """The values of ``stat`` on the database's pairs that phi_MATCH found independent, by kind of pair (model types,
    depths, widths), less the pairs of a model under test when the database scanned it from the same folder (a pair
    is never part of its own null)."""
    from scanner.store import Store, queries

    if stat not in EMPIRICAL_NULL_STATISTICS:
        raise CommandError(f"--null-db is for --stat {' or '.join(EMPIRICAL_NULL_STATISTICS)}: {stat} has a null "
                           "of its own")
    with Store(db, read_only=True) as store:
        tested = queries.models_at(store, [str(side.resolve()) for side in sides])
        null = [(value, kind) for a, b, value, kind in queries.empirical_null(store, stat) if not {a, b} & tested]
    if not null:
        raise CommandError(f"{db} records no {stat} values on independent pairs: scan with pairs.extra_stats "
                           f"including {stat} (docs/disputes.md)")
    by_kind: dict[PairKind, list[float]] = {}
    for value, kind in null:
        by_kind.setdefault(kind, []).append(value)
    return by_kind


def compare_sides(path_a: str | Path, path_b: str | Path, statistic: str, spec: InputSpec, device: str, *,
                  follow_links: bool = False, rule: MatchingRule = "screened") -> PairTestResult:
    """`hubtrace test --fingerprint`: phi_MATCH or phi_H from fingerprints (files, or URLs of an object store read
    through scanner.fingerprints.store), computing any side given as a folder."""
    from scanner.errors import IncomparableError
    from scanner.fingerprints.fingerprint import fingerprint_pair
    from scanner.fingerprints.store import fingerprint_side
    from scanner.pairs.fingerprint_compare import compare_fingerprints

    if statistic not in FINGERPRINT_STATISTICS:
        raise IncomparableError(
            f"--stat {statistic} needs the checkpoints; fingerprints carry activations for "
            f"{', '.join(FINGERPRINT_STATISTICS)}"
        )
    pair = fingerprint_pair(fingerprint_side(path_a), fingerprint_side(path_b), inputs=spec, device=device,
                            follow_links=follow_links)
    return compare_fingerprints(*pair, statistic, device=device, rule=rule)
