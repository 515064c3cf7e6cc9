"""Independent check of a bias-sink copy: the logits on random token sequences against the original, and the
residual stream's new coordinates (exactly zero after every block)."""

import sys

import torch
from transformers import AutoModelForCausalLM

original = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
copy = AutoModelForCausalLM.from_pretrained(sys.argv[2]).eval()
d = original.config.hidden_size
vocab = original.config.vocab_size
ids = torch.randint(0, vocab, (8, 64), generator=torch.Generator().manual_seed(11))
with torch.no_grad():
    a = original(input_ids=ids, output_hidden_states=True)
    b = copy(input_ids=ids, output_hidden_states=True)
change = float((a.logits - b.logits).abs().max() / a.logits.abs().max())
print(f"max relative logit change on 8 x 64 random tokens: {change:.3g}")
extra = [float(h[..., d:].abs().max()) for h in b.hidden_states]
print("max |new coordinates| per hidden state:", extra)
