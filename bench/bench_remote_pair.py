"""Bytes a scan's pair task reads from an object store for one 7B-shaped pair, with the sequential design.

Two pairs of Llama-2-7B-shaped fingerprints (32 blocks x 11008 units x 256 tokens, float16 on disk: ~361 MB each),
dependent (B derived from A in every block) and independent, as bench_7b_pair.py synthesizes them, are written to a
moto S3 server started here. Each pair is then tested by the real pair task (`jobs.actors.compare_batch`, without
Ray) with the scan's default sequential design, four ways, each in a fresh process state (new pair worker):

* whole files: both fingerprints downloaded whole and checked, as pair tasks did before (`read_fingerprint_at`);
* ranged, no disk cache: the header, then only the blocks the test compares;
* ranged, first task with the node's disk cache (empty), then a second task on the same cache folder.

Bytes are what the server sent, counted by a relay between it and the client (tests/s3_support.py).

    python bench/bench_remote_pair.py [--blocks 32] [--units 11008] [--sequences 4] [--pairs both]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synthetic_checkpoint import tiny_template  # noqa: E402

from jobs.actors import DiskCacheSpec, PairJob, compare_batch  # noqa: E402
from scanner.fingerprints.fingerprint import Fingerprint  # noqa: E402
from scanner.fingerprints.store import FingerprintStore, read_fingerprint_at  # noqa: E402
from scanner.pairs.fingerprint_compare import compare_fingerprints  # noqa: E402
from scanner.reading.activations import MLPActivations  # noqa: E402
from scanner.stats.sequential import SequentialDesign  # noqa: E402
from tests.fixtures.synthetic import synthetic_pair  # noqa: E402
from tests.s3_support import counting_relay, environment, make_bucket, s3_server  # noqa: E402

REVISION = "0" * 40


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=32)
    parser.add_argument("--units", type=int, default=11008)
    parser.add_argument("--sequences", type=int, default=4, help="canonical sequences of 64 tokens")
    parser.add_argument("--pairs", choices=("dependent", "independent", "both"), default="both")
    args = parser.parse_args()
    design = SequentialDesign()
    with tempfile.TemporaryDirectory(prefix="hubtrace-bench-") as tmp, s3_server() as variables, \
            environment(variables):
        template = tiny_template(Path(tmp), 64 * args.sequences)
        make_bucket("bench-pair")
        store = FingerprintStore("s3://bench-pair/fps")
        print(f"# {args.blocks} blocks x {args.units} units x {64 * args.sequences} tokens; design: screen "
              f"{design.screen_blocks} blocks, stop at log10 p <= {design.stop_below_log10_p} or > "
              f"{design.stop_above_log10_p}; moto S3; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
        print("| pair | read | bytes from the server | blocks compared | log10 p | seconds |")
        print("| --- | --- | ---: | ---: | ---: | ---: |")
        for dependent in {"dependent": [True], "independent": [False], "both": [True, False]}[args.pairs]:
            parents = {layer: layer for layer in range(args.blocks)} if dependent else {}
            a, b = (as_float16(fp) for fp in synthetic_pair(template, args.blocks, args.units, parents, 7 + dependent,
                                                             noise=1.0, up_scale=2.5))
            name = "dependent" if dependent else "independent"
            (path_a, sha_a), (path_b, sha_b) = (store.write(fp, f"org/{name}-{x}", REVISION, scratch=Path(tmp))
                                                for x, fp in zip("ab", (a, b), strict=True))
            del a, b
            job = PairJob(f"org/{name}-a", REVISION, path_a, f"org/{name}-b", REVISION, path_b, "set", "comparable",
                          sha256_a=sha_a, sha256_b=sha_b)
            measure(name, job, design, Path(tmp))
        print(f"# load average after: {os.getloadavg()[0]:.1f}")


def as_float16(fingerprint: Fingerprint) -> Fingerprint:
    """Stored as a real fingerprint is (float16 where the values fit, as here): ~365 MB for a 7B shape."""
    return dataclasses.replace(fingerprint, blocks=[[MLPActivations(x.gate.astype(np.float16), x.up.astype(np.float16))
                                                     for x in block] for block in fingerprint.blocks])


def measure(name: str, job: PairJob, design: SequentialDesign, tmp: Path) -> None:
    """One table row per way of reading the pair (module docstring)."""
    cache = DiskCacheSpec(str(tmp / f"cache-{name}"), 10 << 30)
    reads = [
        ("whole files", lambda: compare_fingerprints(read_fingerprint_at(job.path_a, scratch=tmp),
                                                     read_fingerprint_at(job.path_b, scratch=tmp), design=design)),
        ("ranged, no disk cache", lambda: _result(compare_batch([job], "match", design))),
        ("ranged, first task, empty disk cache", lambda: _result(compare_batch([job], "match", design, cache=cache))),
        ("ranged, second task, same disk cache", lambda: _result(compare_batch([job], "match", design, cache=cache))),
    ]
    for label, read in reads:
        with counting_relay() as relay:
            start = time.perf_counter()
            result = read()
            seconds = time.perf_counter() - start
        print(f"| {name} | {label} | {relay.downloaded:,} | {result.n_layers} | {result.log10_p:.1f} | "
              f"{seconds:.1f} |", flush=True)


def _result(outcomes):
    outcome, = outcomes
    if outcome.error is not None:
        raise SystemExit(f"pair failed: {outcome.error}")
    return outcome.result


if __name__ == "__main__":
    main()
