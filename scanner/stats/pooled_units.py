"""A MoE block's units tested as one MLP, beside its experts paired one to one.

Experts are paired before they are tested (scanner.stats.experts), and each paired expert is tested on its own units.
That needs each expert of a copy to hold most of one expert of the original. A copier can store an expert as many
small pieces and have the router recombine them (a hash router chooses per token id, so each token can get its own
cut of the expert into pieces): every piece is then too small to test, and no pairing lines pieces up with their
expert (bench/redteam/canonical57: "184 experts read as 124", CANNOT TEST). Whatever the cut, the pieces' units
together are the original's units, so the block is also tested on all its MLPs' units pooled (routed and shared
experts alike; copies of one unit in several pieces are one unit's evidence, which the duplicate screen keeps once).

Which units a large block pools is chosen by each unit's own values: its key is the canonical token at which its gate
view peaks (a function of what the unit computes, unchanged by every output-preserving rescale, sign or permutation),
tokens are taken in a fixed pseudo-random order, and the block keeps the units whose key lies among the first k tokens
of that order, k the most that keeps at most ``cap`` units. Two sides keep prefixes of one order, so a copy's kept units
include the original's (or the other way round) whatever their counts, where two independent random samples of a
quarter of the units each would share a sixteenth.

The pooled units are then given labels in a fixed pseudo-random order. Why the p-value stays valid: the selection and
the labels are functions of one side's own units, never of the other side's, and phi_MATCH's Spearman statistic reads
unit labels; units of one expert sit together when pooled in stored order, so two matchings that both fall in one
expert of A (without picking the same unit) would agree for no reason but the experts' layout. Under labels in a
random order only exact agreements (the same unit of A chosen in both views, as for one MLP) move the statistic. The
block's p-value is the smaller of the experts' (combined as their pairing says) and the pooled test's, times the
number of the two that could be tested (Bonferroni, valid whatever their joint law).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scanner.stats.logp import log10_bonferroni

#: The most units a block pools: its matrices are then no larger than one expert's of a mid-sized MoE (Mixtral's experts
#: hold 14,336 units), so testing a block on its pooled units costs a small fraction of its experts' tests.
POOLED_UNITS = 4096
#: The fixed seed of the token order and of the labels (public: a copier knows it and gains nothing, since both sides
#: are read through it alike).
POOL_SEED = 0


def pooled_rows(gates: Sequence[np.ndarray], cap: int = POOLED_UNITS) -> np.ndarray:
    """Indices into the concatenation of ``gates`` (each MLP's gate view, shaped (units, tokens)) of the units a block
    pools, in the order they are labelled (see the module docstring)."""
    sizes = [int(g.shape[0]) for g in gates]
    total = sum(sizes)
    rng = np.random.default_rng(POOL_SEED)
    if total > cap:
        keys = np.concatenate([_peak_tokens(g) for g in gates if g.shape[0]])
        tokens = int(gates[0].shape[1])
        rank = np.empty(tokens, dtype=np.int64)
        rank[rng.permutation(tokens)] = np.arange(tokens)
        within = np.cumsum(np.bincount(rank[keys], minlength=tokens))
        prefix = int(np.searchsorted(within, cap, side="right"))  # tokens whose units fit within the cap
        kept = np.flatnonzero(rank[keys] < prefix)
    else:
        kept = np.arange(total)
    return kept[rng.permutation(kept.size)]


def _peak_tokens(gate: np.ndarray) -> np.ndarray:
    """Each unit's key: the canonical token where its gate view's magnitude peaks (the first such token)."""
    rows = np.asarray(gate)
    return np.abs(rows.astype(np.float32, copy=False)).argmax(axis=1) if rows.shape[1] else np.zeros(rows.shape[0], int)


def pooled_block_log10_p(experts: float | None, pooled: float | None) -> float | None:
    """A MoE block's log10 p from its experts' (None: none could be tested) and its pooled units' (None: too few
    informative units): the smaller times the number of the two that could be tested (Bonferroni; which could be
    tested is set by each side's own units). None when neither could."""
    tested = [p for p in (experts, pooled) if p is not None]
    return log10_bonferroni(tested) if tested else None
