"""Synthetic languages over raw token ids, so zoo models need no tokenizer and no downloaded data.

Each language is a sparse first-order Markov chain (every token has a few successors with
random probabilities) plus an occasional copy of the token ``copy_lag`` positions back. The
copy rule makes attention (and so RoPE and the query/key weights) learn something, not just
the MLPs. A language is fully determined by its seed; the data order is a separate generator,
so two models can share a language yet see different samples (the paper's "twins", 4.2.2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class MarkovLanguage:
    """A seeded stochastic language: sparse Markov transitions plus lagged copying."""

    seed: int
    vocab_size: int = 256
    branching: int = 6
    copy_prob: float = 0.15
    copy_lag: int = 7
    _successors: torch.Tensor = field(init=False, repr=False, compare=False)
    _cumprobs: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        g = torch.Generator().manual_seed(self.seed)
        successors = torch.stack(
            [torch.randperm(self.vocab_size, generator=g)[: self.branching] for _ in range(self.vocab_size)]
        )
        probs = torch.softmax(1.5 * torch.randn(self.vocab_size, self.branching, generator=g), dim=-1)
        cumprobs = probs.cumsum(dim=-1)
        cumprobs[:, -1] = 1.0
        object.__setattr__(self, "_successors", successors)
        object.__setattr__(self, "_cumprobs", cumprobs)

    def sample(self, batch_size: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
        """Draw ``batch_size`` sequences of ``seq_len`` token ids (int64), reproducibly from ``generator``."""
        tokens = torch.empty(batch_size, seq_len, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, self.vocab_size, (batch_size,), generator=generator)
        uniforms = torch.rand(batch_size, seq_len, generator=generator)
        copies = torch.rand(batch_size, seq_len, generator=generator) < self.copy_prob
        for t in range(1, seq_len):
            prev = tokens[:, t - 1]
            choice = torch.searchsorted(self._cumprobs[prev], uniforms[:, t].unsqueeze(1).contiguous()).squeeze(1)
            nxt = self._successors[prev, choice.clamp_max(self.branching - 1)]
            if t >= self.copy_lag:
                nxt = torch.where(copies[:, t], tokens[:, t - self.copy_lag], nxt)
            tokens[:, t] = nxt
        return tokens

