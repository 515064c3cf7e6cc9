"""A MoE block's units tested as one MLP, beside its experts paired one to one.

Experts are paired before they are tested (scanner.stats.experts), and each paired expert is tested on its own units.
That needs each expert of a copy to hold most of one expert of the original. A copier can store an expert as many
small pieces and have the router recombine them (a hash router chooses per token id, so each token can get its own
cut of the expert into pieces): every piece is then too small to test, and no pairing lines pieces up with their
expert (bench/redteam/canonical57: "184 experts read as 124", CANNOT TEST). Whatever the cut, the pieces' units
together are the original's units, so the block is also tested on all its MLPs' units pooled (routed and shared
experts alike; copies of one unit in several pieces are one unit's evidence, which the duplicate screen keeps once).

Which units a large block pools is chosen by what each unit adds to the block's output: its hidden row on the
canonical tokens (the gate's activation included) as the block weighs it, times its write size, units of any of the
block's MLPs that put out one function counted for their summed output (scanner.reading.activations
.block_contributions: unchanged by every output-preserving rescale, sign or permutation of units), the ``cap``
largest kept.
A copy's units keep the original's contributions, so a copy pools the original's units, or, where it holds more units
than the original, only units the original pools too. Two earlier choices were broken by independent checks: units
whose gate peaks at the first tokens of a fixed order (bench/redteam/canonical58: 4,224 units writing 1e-5 of their
expert's output, all peaking at the first token, and the copy pooled nothing), and units largest by |up row| |write|
(bench/redteam/canonical59: units large as stored behind gates 2^-20 of a real one's); and two measured unit by
unit, or MLP by MLP: loud units whose outputs cancel, in one expert (bench/redteam/canonical60) or across routed and
shared experts (bench/redteam/canonical61), filled the pool.

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
#: The fixed seed of the labels (public: a copier knows it and gains nothing, since both sides are read through it
#: alike).
POOL_SEED = 0


def pooled_rows(magnitudes: Sequence[np.ndarray], cap: int = POOLED_UNITS) -> np.ndarray:
    """Indices into the concatenation of a block's MLPs' units (``magnitudes``: each MLP's units' magnitudes) of the
    units the block pools, the ``cap`` largest (ties in stored order), in the order they are labelled (see the module
    docstring)."""
    sizes = np.concatenate([np.asarray(m, dtype=np.float64) for m in magnitudes]) if magnitudes else np.zeros(0)
    kept = np.argsort(-sizes, kind="stable")[:cap] if sizes.size > cap else np.arange(sizes.size)
    return kept[np.random.default_rng(POOL_SEED).permutation(kept.size)]


def pooled_block_log10_p(experts: float | None, pooled: float | None) -> float | None:
    """A MoE block's log10 p from its experts' (None: none could be tested) and its pooled units' (None: too few
    informative units): the smaller times the number of the two that could be tested (Bonferroni; which could be
    tested is set by each side's own units). None when neither could."""
    tested = [p for p in (experts, pooled) if p is not None]
    return log10_bonferroni(tested) if tested else None
