"""phi_JSD: Jensen-Shannon divergence between next-token distributions (raw value, no valid null)."""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp


def mean_jensen_shannon(log_p: np.ndarray, log_q: np.ndarray) -> float:
    """Mean over positions of JSD(p, q) in nats, from log-probabilities shaped (positions, vocabulary)."""
    if log_p.shape != log_q.shape:
        raise ValueError(
            f"JSD needs distributions over the same positions and ids, got {log_p.shape} and {log_q.shape}"
        )
    log_m = logsumexp(np.stack([log_p, log_q]), axis=0) - np.log(2.0)
    kl_pm = np.sum(np.exp(log_p) * (log_p - log_m), axis=-1)
    kl_qm = np.sum(np.exp(log_q) * (log_q - log_m), axis=-1)
    return float(np.mean(0.5 * (kl_pm + kl_qm)))
