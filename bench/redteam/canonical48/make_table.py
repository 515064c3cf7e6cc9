"""results.jsonl -> table.md (last row per case, storage and threads)."""

import json
from pathlib import Path

here = Path(__file__).parent
rows = {}
for line in (here / "results.jsonl").read_text().splitlines():
    r = json.loads(line)
    rows[(r["case"], r["storage"], r["threads"])] = r
out = [
    "| case | kind | storage | threads | max logit change | rounding cost | log10 p A->B / B->A "
    "| canonical units block 0 (original -> copy) | breaks |",
    "|---|---|---|---|---|---|---|---|---|",
]
for (case, storage, threads), r in rows.items():
    p = lambda v: "CANNOT TEST" if v is None else f"{v}"  # noqa: E731
    units = f"{r['units_original'][0]} -> {r['units_copy'][0]}"
    out.append(
        f"| {case} | {r['kind']} | {storage} | {threads} | {r['max_logit_change']} | {r.get('rounding_cost', '-')} | "
        f"{p(r['forward'])} / {p(r['backward'])} | {units} | {'**yes**' if r['breaks_claim'] else 'no'} |"
    )
(here / "table.md").write_text("\n".join(out) + "\n")
print("\n".join(out))
