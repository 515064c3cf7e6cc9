"""What a scan did, as numbers (stored in ``scan_runs.summary``) and as the table printed at the end."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rich.console import Group
from rich.table import Table
from rich.text import Text

from scanner.text_safety import terminal


@dataclass
class ScanSummary:
    run_id: str
    db: str
    actors: int = 0
    device: str = "cpu"
    models: int = 0                  # model records discovered
    fingerprinted: int = 0           # new or changed revisions fingerprinted in this run
    skipped: int = 0                 # unchanged revisions already in the store
    not_retried: int = 0             # unchanged revisions that failed before: their error recorded again, not retried
    source_errors: int = 0           # entries discovery could not describe (symlink loops, unreadable folders)
    failures: Counter = field(default_factory=Counter)   # stage -> models (or pairs, stage "compare")
    pairs: dict = field(default_factory=dict)            # PairPlan.to_json_dict()
    pairs_tested: int = 0
    pairs_cannot_test: int = 0       # tested pairs whose statistic could read too few units on a side (no p-value)
    retrieval: dict = field(default_factory=dict)       # scanner.retrieval.scan.Retrieved.to_json_dict()
    pairs_failed: int = 0
    weight_statistics: int = 0       # weight fingerprints recorded beside phi_MATCH (pairs.extra_stats)
    dependent_pairs: int = 0
    families: dict[str, list[str]] = field(default_factory=dict)   # family id -> members (families of 2 or more)
    discrepancies: int = 0
    exports: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)   # what a person must know: work that found nothing, state
    stage_seconds: dict[str, float] = field(default_factory=dict)   # fingerprint, pairs, lineage
    seconds: float = 0.0

    @property
    def failed(self) -> int:
        """Models that failed in this run (discovery errors included, pair failures not)."""
        return sum(n for stage, n in self.failures.items() if stage != "compare")

    def to_json_dict(self) -> dict:
        return {
            "run_id": self.run_id, "db": self.db, "actors": self.actors, "device": self.device,
            "models": self.models, "fingerprinted": self.fingerprinted, "skipped": self.skipped,
            "not_retried": self.not_retried,
            "failed": self.failed, "source_errors": self.source_errors, "failures": dict(self.failures),
            "pairs": self.pairs, "retrieval": self.retrieval, "pairs_tested": self.pairs_tested,
            "pairs_failed": self.pairs_failed, "pairs_cannot_test": self.pairs_cannot_test,
            "weight_statistics": self.weight_statistics,
            "dependent_pairs": self.dependent_pairs, "families": self.families,
            "discrepancies": self.discrepancies, "exports": self.exports, "warnings": self.warnings,
            "stage_seconds": {k: round(v, 2) for k, v in self.stage_seconds.items()}, "seconds": round(self.seconds, 2),
        }


def render_summary(summary: ScanSummary) -> Group:
    """The end-of-scan table: models, pairs, families, and where the results are."""
    table = Table(title=f"hubtrace scan {summary.run_id}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    failures = ", ".join(f"{stage} {n}" for stage, n in sorted(summary.failures.items()))
    pairs = summary.pairs
    incomparable = sum(pairs.get("incomparable", {}).values())
    rows = [
        ("models", f"{summary.models} discovered: {summary.fingerprinted} new or changed, "
                   f"{summary.skipped} unchanged (skipped), {summary.failed} failed"
                   + (f" ({failures})" if failures else "")
                   + (f"; {summary.not_retried} of them failed before and are unchanged, so not tried again "
                      "(rescan_errors: true retries them)" if summary.not_retried else "")),
        ("workers", f"{summary.actors} {summary.device} actor(s)"),
        ("pairs", f"{pairs.get('comparable', 0)} comparable ({pairs.get('declared', 0)} declared by cards), "
                  f"{incomparable} incomparable, {pairs.get('already_tested', 0)} already tested"),
        *((("candidates", f"{pairs.get('possible', 0)} pairs possible, {pairs.get('retrieved', 0)} retrieved "
                           f"(min score {summary.retrieval.get('min_score')}; {summary.retrieval.get('queried', 0)} "
                           f"revisions queried the index), {pairs.get('to_test', 0)} to test, "
                           f"{pairs.get('untested_comparable', 0)} comparable pairs left untested"),)
          if pairs.get("select") == "candidates" else ()),
        ("pairs tested", f"{summary.pairs_tested} now"
                         + (f", {summary.pairs_cannot_test} of them could not be tested (too few units to read; "
                            "no p-value, not evidence of independence)" if summary.pairs_cannot_test else "")
                         + (f", {summary.pairs_failed} failed" if summary.pairs_failed else "")),
        *((("weight statistics", f"{summary.weight_statistics} recorded beside phi_MATCH (pairs.extra_stats)"),)
          if summary.weight_statistics else ()),
        ("lineage", f"{summary.dependent_pairs} dependent pairs, {len(summary.families)} families with relatives, "
                    f"{summary.discrepancies} card discrepancies"),
        ("database", summary.db),
        *((f"export {fmt}", path) for fmt, path in summary.exports.items()),
        ("time", f"{summary.seconds:.1f} s (" + ", ".join(f"{k} {v:.1f} s" for k, v in summary.stage_seconds.items())
                 + ")"),
    ]
    for reason, n in sorted(pairs.get("incomparable", {}).items()):
        rows.insert(3, ("  not tested", f"{n}: {reason}"))
    rows[:0] = [("warning", warning) for warning in summary.warnings]
    for key, value in rows:
        table.add_row(key, Text(terminal(value)))  # Text: rich markup such as [link=...] in hub text stays text
    families = Table(title="families", title_justify="left")
    families.add_column("family")
    families.add_column("members")
    for family_id, members in sorted(summary.families.items()):
        families.add_row(Text(terminal(family_id)), Text(terminal(", ".join(members))))
    return Group(table, families) if summary.families else Group(table)
