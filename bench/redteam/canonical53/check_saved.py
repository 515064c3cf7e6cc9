"""Logit change of saved copies against the saved original (reloaded from disk, float32 compute)."""

from __future__ import annotations

import sys

import torch
from transformers import AutoModelForCausalLM

from tests.adversary_support import probe_ids
from tests.fixtures import adversary as adv

if __name__ == "__main__":
    original = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
    for path in sys.argv[2:]:
        copy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        print(path, adv.max_logit_change(original, copy, probe_ids(original)))
