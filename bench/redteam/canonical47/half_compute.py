"""Logit change of a half-precision copy against its half-precision original when both run in that format (as a
user of the checkpoint would), next to what rounding the float32 original to that format costs in the same compute.

Usage: python -m bench.redteam.canonical47.half_compute FLOAT32_ORIGINAL HALF_ORIGINAL HALF_COPY DTYPE
"""
import sys

import torch
from transformers import AutoModelForCausalLM

from tests.adversary_support import probe_ids
from tests.fixtures.adversary import max_logit_change

full, half, cop, dtype = sys.argv[1], sys.argv[2], sys.argv[3], getattr(torch, sys.argv[4])
a32 = AutoModelForCausalLM.from_pretrained(full, dtype=torch.float32).eval()
a = AutoModelForCausalLM.from_pretrained(half, dtype=dtype).eval()
b = AutoModelForCausalLM.from_pretrained(cop, dtype=dtype).eval()
ids = probe_ids(a32)
print(f"copy vs half original, {dtype} compute: {max_logit_change(a, b, ids):.3g}")
print(f"half original vs float32 original ({dtype} compute vs float32): {max_logit_change(a32, a, ids):.3g}")
