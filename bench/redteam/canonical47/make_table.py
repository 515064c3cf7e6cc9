"""results.jsonl -> table.md (one row per case; threads 1 and 2 compared)."""
import json
from pathlib import Path

here = Path(__file__).parent
rows = [json.loads(line) for line in (here / "results.jsonl").open()]
by: dict = {}
for r in rows:
    by.setdefault(r["case"], {})[r["threads"]] = r
out = ["| case | kind | storage | max logit change (float32 compute) | rounding cost | log10 p A->B / B->A | "
       "canonical units per block [stored, dead, combined] (original -> copy) | threads 1 = 2 | breaks |",
       "|---|---|---|---|---|---|---|---|---|"]
for c, d in by.items():
    r = d.get(2) or d.get(1)
    same = 1 in d and 2 in d and all(d[1][k] == d[2][k] for k in ("units_copy", "forward", "backward"))
    uo = sorted({tuple(u) for u in r["units_original"]})
    uc = sorted({tuple(u) for u in r["units_copy"]})

    def p(x):
        return "CANNOT TEST" if x is None else x

    out.append(f"| {c} | {r['kind']} | {r.get('storage', 'float32').replace('torch.', '')} | {r['max_logit_change']} | "
               f"{r.get('rounding_cost', '-')} | {p(r['forward'])} / {p(r['backward'])} | "
               f"{' '.join(str(list(u)) for u in uo)} -> {' '.join(str(list(u)) for u in uc)} | "
               f"{'yes' if same else 'only ' + str(sorted(d))} | {'**yes**' if r['breaks_claim'] else 'no'} |")
(here / "table.md").write_text("\n".join(out) + "\n")
print("\n".join(out))
