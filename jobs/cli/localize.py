"""`hubtrace localize A B`: the block map and unit maps between two models, from fingerprints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from scanner.errors import HubtraceError
from scanner.fingerprints.inputs import InputSpec
from scanner.text_safety import json_visible, terminal_lines

if TYPE_CHECKING:
    from scanner.pairs.localize import LocalizeResult


def localize_command(
    model_a: Annotated[str, typer.Argument(
        help="Model A (the candidate parent): a model directory, a fingerprint file or a fingerprint URL (s3://...).")],
    model_b: Annotated[str, typer.Argument(
        help="Model B: a model directory, a fingerprint file or a fingerprint URL (s3://...).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    threshold: Annotated[
        float,
        typer.Option("--threshold", help="Map a block pair when its Bonferroni-corrected log10 p is at most this."),
    ] = -2.0,
    any_order: Annotated[
        bool,
        typer.Option("--any-order", help="Map each block of B to its best block of A, without keeping block order."),
    ] = False,
    plot_dir: Annotated[
        Path | None,
        typer.Option("--plot-dir", "--plot", help="Write one unit-map scatter PNG per mapped block pair here."),
    ] = None,
    sequences: Annotated[int, typer.Option(
        help="Canonical input sequences, for a side given as a directory.")] = InputSpec.n_sequences,
    seq_len: Annotated[int, typer.Option(help="Tokens per canonical sequence.")] = InputSpec.seq_len,
    seed: Annotated[int, typer.Option(help="Seed of the canonical inputs.")] = 0,
    device: Annotated[str, typer.Option(help="torch device for forward passes and similarity products.")] = "cpu",
    replay: Annotated[
        bool | None,
        typer.Option("--replay/--no-replay", help="Run every block of B on the residual stream entering each block of "
                     "A (both sides directories). Default: when both are directories of different depths."),
    ] = None,
    follow_links: Annotated[bool, typer.Option(
        "--follow-links", help="Follow links out of a model folder (your own linked downloads); off by default.")
    ] = False,
    matching: Annotated[str, typer.Option(
        help="How MATCH pairs units: screened (default), greedy or exact (the paper's maximum-weight assignment); "
             "docs/statistics.md.")] = "screened",
) -> None:
    """Find which blocks (and hidden units) of MODEL_B derive from which of MODEL_A (phi_MATCH on all block pairs)."""
    from scanner.fingerprints.fingerprint import fingerprint_pair
    from scanner.fingerprints.store import fingerprint_side, is_url
    from scanner.pairs.localize import localize, localize_replayed, plot_unit_map
    from scanner.reading.validate import validate_checkpoint
    from scanner.stats.matching import MATCHING_RULES

    if matching not in MATCHING_RULES:
        raise HubtraceError(f"unknown matching rule {matching!r}; choose one of {', '.join(MATCHING_RULES)}")
    spec = InputSpec(seed=seed, n_sequences=sequences, seq_len=seq_len)
    if replay is None:
        replay = _depths_differ(model_a, model_b, follow_links)
    if replay:
        if any(is_url(side) or Path(side).is_file() for side in (model_a, model_b)):
            raise HubtraceError("--replay runs the blocks themselves: give both models as directories")
        for model in (model_a, model_b):  # the same gate as every other command, before any block runs
            validate_checkpoint(model, follow_links=follow_links).checkpoint.close()
        result = localize_replayed(Path(model_a), Path(model_b), inputs=spec, threshold_log10=threshold,
                                   monotone=not any_order, device=device, rule=matching)
    else:
        fp_a, fp_b = fingerprint_pair(fingerprint_side(model_a), fingerprint_side(model_b), inputs=spec,
                                      device=device, follow_links=follow_links)
        result = localize(fp_a, fp_b, threshold_log10=threshold, monotone=not any_order, device=device,
                          rule=matching)
    plots = []
    if plot_dir is not None:
        for (layer_a, layer_b), unit_map in result.unit_maps.items():
            path = plot_dir / f"unit-map-a{layer_a}-b{layer_b}.png"
            names = {"model_a": _short(result.model_a), "model_b": _short(result.model_b)}
            plots.append(str(plot_unit_map(unit_map, path, layer_a=layer_a, layer_b=layer_b, **names)))
    if as_json:
        typer.echo(json_visible(json.dumps({**result.to_json_dict(), "plots": plots}, indent=2)))
    else:
        typer.echo(terminal_lines(render_localize(result, plots)))


def _depths_differ(path_a: str, path_b: str, follow_links: bool) -> bool:
    """Both sides are model directories with different block counts (a depth prune: the case replay is for)."""
    from scanner.reading.validate import validate_checkpoint

    if not (Path(path_a).is_dir() and Path(path_b).is_dir()):
        return False
    depth_a, depth_b = (validate_checkpoint(p, check_values=False, follow_links=follow_links).adapter.shape.n_layers
                        for p in (path_a, path_b))
    return depth_a != depth_b


def _short(name: str) -> str:
    """org/name of a model path, for plot labels."""
    return "/".join(Path(name).parts[-2:])


def render_localize(result: LocalizeResult, plots: list[str]) -> str:
    """The block map with each mapped pair's p-value, the unmapped blocks of B, and the plots written."""
    from scanner.pairs.localize import corrected_log10_p
    from scanner.pairs.results import format_p

    raw, corrected = result.matrix(), corrected_log10_p(result)
    order = "order-preserving" if result.monotone else "any order"
    lines = [
        f"model A : {result.model_a}   ({raw.shape[0]} blocks)",
        f"model B : {result.model_b}   ({raw.shape[1]} blocks)",
        f"{raw.size} block pairs tested; mapped when Bonferroni-corrected log10 p <= {result.threshold_log10} "
        f"({order})",
        "",
        f"{'block B':>8} {'<- block A':>10} {'log10 p':>10} {'corrected':>10} {'p':>12} {'units mapped':>13}",
    ]
    mapped = dict((b, a) for a, b in result.map)
    for layer_b in range(raw.shape[1]):
        if layer_b not in mapped:
            best = int(raw[:, layer_b].argmin())
            lines.append(f"{layer_b:8d} {'-':>10}   (best: block {best}, log10 p {raw[best, layer_b]:.2f})")
            continue
        layer_a = mapped[layer_b]
        units = result.unit_maps[(layer_a, layer_b)]
        lines.append(
            f"{layer_b:8d} {layer_a:10d} {raw[layer_a, layer_b]:10.2f} {corrected[layer_a, layer_b]:10.2f} "
            f"{format_p(raw[layer_a, layer_b]):>12} {int((units >= 0).sum()):>6d}/{units.size:<6d}"
        )
    lines += [f"note: {note}" for note in result.notes]
    lines += [f"plot: {path}" for path in plots]
    return "\n".join(lines)
