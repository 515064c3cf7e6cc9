"""Red-team harness: apply a disguise to each model kind, check its logits, fingerprint it, and test it against its
original (both orders) and an independent control. Results are appended to redteam/results.jsonl."""

from __future__ import annotations

import copy
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from scanner.fingerprints.fingerprint import fingerprint_model
from scanner.pairs.fingerprint_compare import compare_fingerprints
from tests.adversary_support import KINDS, probe_ids, save, trained_model
from tests.fixtures import adversary as adv

CACHE = Path("/work/main/.hubtrace-cache")
GATED_ORIGINAL = CACHE / "zoo/aurora-labs/aurora-base"
GATED_CONTROL = CACHE / "independent/indie-00/solo-00"
RESULTS = Path(__file__).with_name("results.jsonl")
WORK = Path(tempfile.gettempdir()) / "redteam-cases"

_cases: dict = {}


def case(name: str):
    """(original model, original fingerprint, control fingerprint) for 'gated' or a KINDS name, cached in-process."""
    if name in _cases:
        return _cases[name]
    if name == "gated":
        original = AutoModelForCausalLM.from_pretrained(GATED_ORIGINAL).eval()
        out = (original, fingerprint_model(GATED_ORIGINAL), fingerprint_model(GATED_CONTROL))
    else:
        kind = next(k for k in KINDS if k.name == name)
        original, control = trained_model(kind, 1), trained_model(kind, 2)
        folder = WORK / name
        out = (original, fingerprint_model(save(original, folder / "original")),
               fingerprint_model(save(control, folder / "control")))
    _cases[name] = out
    return out


def _p(result) -> float | None:
    return None if result.log10_p is None else round(float(result.log10_p), 2)


def evaluate(label: str, kind: str, disguise: adv.Disguise, seed: int = 7, keep: bool = False) -> dict:
    original, fp_original, fp_control = case(kind)
    row: dict = {"disguise": label, "kind": kind}
    t0 = time.time()
    try:
        disguised = adv.apply(disguise, copy.deepcopy(original), seed)
    except adv.UnsupportedDisguise as exc:
        row["unsupported"] = str(exc)
        _record(row)
        return row
    row["max_logit_change"] = float(f"{adv.max_logit_change(original, disguised, probe_ids(original)):.3g}")
    folder = WORK / kind / f"copy-{label}"
    fp_copy = fingerprint_model(save(disguised, folder))
    forward, backward = compare_fingerprints(fp_original, fp_copy), compare_fingerprints(fp_copy, fp_original)
    control = compare_fingerprints(fp_copy, fp_control)
    row.update(forward=_p(forward), backward=_p(backward), control=_p(control),
               verdict_forward=forward.verdict(), verdict_backward=backward.verdict(),
               verdict_control=control.verdict(),
               canonical_units=[list(x) for x in fp_copy.meta.summaries.get("canonical_units", [])][:2],
               seconds=round(time.time() - t0, 1))
    exact = row["max_logit_change"] <= 1e-4
    dependent = all(r.cannot_test is None and r.log10_p is not None and r.log10_p <= -20 for r in (forward, backward))
    independent = control.cannot_test is None and control.log10_p is not None and control.log10_p >= -3
    row["exact"] = exact
    row["claim_holds"] = dependent and independent
    row["breaks_claim"] = exact and not (dependent and independent)
    _record(row)
    if keep:
        row["_fp"] = fp_copy
    return row


def _record(row: dict) -> None:
    clean = {k: v for k, v in row.items() if not k.startswith("_")}
    print(json.dumps(clean), flush=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(clean) + "\n")


def kinds_from_argv(default: list[str]) -> list[str]:
    return sys.argv[1:] or default


torch.set_num_threads(2)
