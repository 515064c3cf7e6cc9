"""Benchmark: the batched GPU auction against the host's certified sparse solver, on MATCH-sized problems.

    python bench/bench_auction.py --device cuda                        # 8 and 64 problems of 11008 x 11008
    python bench/bench_auction.py --device cuda --batches 64 --scaling 8 16 64
    python bench/bench_auction.py --size 1000 --batches 4 --check 4     # CPU torch: small, for a sanity run

Each problem is the cosine matrix of two Gaussian activation sets (units x tokens, on the device): independent
(fresh Gaussians) or dependent (a permuted copy plus noise, cosine ~0.7 with the partner). The auction solves a
batch at once (``auction_assignments``); ``--check`` problems of each batch are also solved by the host solver
(``solve_assignment``, certified optimal) in the same run, and the matchings must be identical. Prints wall time,
per-problem time, bidding rounds and phases, certified problems, and the host solver's time for the ratio.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from scanner.inputs import InputSpec
from scanner.stats.assignment import solve_assignment
from scanner.stats.assignment.auction import SCALING, auction_assignments


def problems(batch: int, size: int, tokens: int, dependent: bool, device: str, seed: int) -> torch.Tensor:
    """(batch, size, size) float32 cosine matrices, built on the device."""
    generator = torch.Generator(device=device).manual_seed(seed)
    out = torch.empty(batch, size, size, dtype=torch.float32, device=device)
    for k in range(batch):
        a = torch.randn(size, tokens, generator=generator, device=device)
        if dependent:
            b = a[torch.randperm(size, generator=generator, device=device)]
            b = b + torch.randn(size, tokens, generator=generator, device=device)
        else:
            b = torch.randn(size, tokens, generator=generator, device=device)
        a = a / a.norm(dim=1, keepdim=True)
        b = b / b.norm(dim=1, keepdim=True)
        torch.matmul(a, b.T, out=out[k])
    return out


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", type=int, default=11008)
    parser.add_argument("--tokens", type=int, default=InputSpec().n_sequences * InputSpec().seq_len)
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--scaling", type=float, nargs="+", default=[SCALING])
    parser.add_argument("--check", type=int, default=2, help="problems per batch also solved on the host")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU torch"
    print(f"# {name}, torch {torch.__version__}, {args.size} x {args.size}, {args.tokens} tokens")
    print(f"{'pair':<12} {'batch':>5} {'scaling':>7} {'wall s':>8} {'s/problem':>9} {'rounds':>7} {'phases':>6} "
          f"{'certified':>9} {'host s/problem':>14} {'ratio':>6} identical")
    for dependent in (False, True):
        for batch in args.batches:
            s = problems(batch, args.size, args.tokens, dependent, args.device, args.seed)
            for scaling in args.scaling:
                synchronize(args.device)
                start = time.perf_counter()
                out = auction_assignments(s, scaling=scaling)
                synchronize(args.device)
                wall = time.perf_counter() - start
                host, identical = [], []
                for k in range(min(args.check, batch)):
                    dense = s[k].cpu().numpy()
                    t0 = time.perf_counter()
                    reference = solve_assignment(dense)
                    host.append(time.perf_counter() - t0)
                    identical.append(bool(np.array_equal(reference.col_ind, out.columns[k])))
                host_s = float(np.mean(host)) if host else float("nan")
                print(f"{'dependent' if dependent else 'independent':<12} {batch:>5} {scaling:>7.0f} {wall:>8.3f} "
                      f"{wall / batch:>9.4f} {out.iterations:>7} {out.phases:>6} "
                      f"{int(out.certified.sum()):>4}/{batch:<4} {host_s:>14.3f} {host_s / (wall / batch):>5.0f}x "
                      f"{sum(identical)}/{len(identical)}", flush=True)
            del s
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
