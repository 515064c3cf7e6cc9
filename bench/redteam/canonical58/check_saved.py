"""Reload saved canonical58 copies and measure their max relative logit change against the original (float32)."""

from __future__ import annotations

import sys

import torch
from transformers import AutoModelForCausalLM

from tests.adversary_support import probe_ids
from tests.fixtures.adversary import max_logit_change


def main(names: list[str]) -> None:
    """Print each saved copy's max relative logit change against /tmp/canonical58/ds4-hash/original."""
    import scanner

    assert scanner.__file__.startswith("/tmp/hubtrace-36acab2/"), scanner.__file__
    torch.set_num_threads(2)
    original = AutoModelForCausalLM.from_pretrained("/tmp/canonical58/ds4-hash/original", dtype=torch.float32).eval()
    ids = probe_ids(original)
    with torch.no_grad():
        for name in names:
            path = f"/tmp/canonical58/ds4-hash/copy-{name}"
            copy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            print(name, "saved copy, max relative logit change:", f"{max_logit_change(original, copy, ids):.3g}")


if __name__ == "__main__":
    main(sys.argv[1:])
