"""Max relative logit change of the saved copies against the saved originals (what `hubtrace test` reads)."""

import sys

import torch
from transformers import AutoModelForCausalLM

from tests.adversary_support import probe_ids
from tests.fixtures import adversary as adv

for original, copy in zip(sys.argv[1::2], sys.argv[2::2], strict=True):
    a = AutoModelForCausalLM.from_pretrained(original, torch_dtype=torch.float32).eval()
    b = AutoModelForCausalLM.from_pretrained(copy, torch_dtype=torch.float32).eval()
    print(copy, adv.max_logit_change(a, b, probe_ids(a)))
