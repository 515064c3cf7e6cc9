"""Research (issue 43): whether the sign-free residual's signs (scanner.reading.activations._spectral_signs) turn with
the units a copier negates, and how settled its fixed number of power iterations leaves them.

A plain MLP's sign-free write view is the read-back less its prediction by a shared map with a sign of each unit's own;
the signs start from the leading eigenvector of K = (B B^T) * (Y Y^T), found by `POWER_ITERATIONS` power iterations.
Negating units' predictors turns K into D K D: the eigenvector turns to D v, but an unsettled iterate turns with the
units only if its start does. This prints, on random predictors and targets (no shared map: the hardest case) of a
given size, for the start the product uses (K's column of the unit with the largest diagonal entry) and for a start
of all ones: the share of signs that differ between 60 and 200 iterations, and the share that differ from D times
the unnegated signs after half the units are negated (0 is bit-for-bit sign invariance).

    PYTHONPATH=. python bench/research/sign_start.py [--units 16384] [--tokens 256]
"""

from __future__ import annotations

import argparse

import torch

from scanner.reading import activations


def _basis(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns spanning the predictors, as `unpredicted_up_to_sign` builds them."""
    energy, directions = torch.linalg.eigh(x.T @ x)
    keep = energy > activations.RANK_TOLERANCE**2 * energy[-1]
    return x @ (directions[:, keep] / energy[keep].sqrt())


def _all_ones_start(basis: torch.Tensor, targets: torch.Tensor, iterations: int) -> torch.Tensor:
    """The signs from a start of all ones (the product's start before fingerprint format 5)."""
    vector = torch.ones(basis.shape[0], dtype=basis.dtype)
    for _ in range(iterations):
        vector = ((basis @ (basis.T @ (vector[:, None] * targets))) * targets).sum(dim=1)
        vector = vector / vector.norm()
    return torch.where(vector < 0, -1.0, 1.0).double()


def _differ(a: torch.Tensor, b: torch.Tensor) -> float:
    """Share of signs that differ, up to one global sign (which the residual does not read)."""
    share = float((a != b).double().mean())
    return min(share, 1.0 - share)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=16384)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.units, args.tokens, generator=generator, dtype=torch.float64)
    y = torch.randn(args.units, args.tokens, generator=generator, dtype=torch.float64)
    d = torch.where(torch.rand(args.units, generator=generator) < 0.5, -1.0, 1.0).double()
    basis, negated = _basis(x), _basis(d[:, None] * x)
    product = activations._spectral_signs
    longer = activations.POWER_ITERATIONS * 10 // 3

    def with_iterations(count: int, b: torch.Tensor) -> torch.Tensor:
        saved, activations.POWER_ITERATIONS = activations.POWER_ITERATIONS, count
        try:
            return product(b, y)
        finally:
            activations.POWER_ITERATIONS = saved

    print(f"{args.units} units x {args.tokens} tokens, random (no shared map)")
    print(f"{'start':<28} {'unsettled (60 vs ' + str(longer) + ')':>22} {'changed by negating half':>26}")
    ours = with_iterations(activations.POWER_ITERATIONS, basis)
    print(f"{'largest unit column (ours)':<28} {_differ(ours, with_iterations(longer, basis)):>22.4f} "
          f"{_differ(d * ours, with_iterations(activations.POWER_ITERATIONS, negated)):>26.4f}")
    ones = _all_ones_start(basis, y, activations.POWER_ITERATIONS)
    print(f"{'all ones (format 4)':<28} {_differ(ones, _all_ones_start(basis, y, longer)):>22.4f} "
          f"{_differ(d * ones, _all_ones_start(negated, y, activations.POWER_ITERATIONS)):>26.4f}")


if __name__ == "__main__":
    main()
