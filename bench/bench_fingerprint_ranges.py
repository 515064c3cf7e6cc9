"""Bytes and time to read a 7B-shaped fingerprint's metadata, one block, and the whole file from a moto S3 server.

The fingerprint has Llama-2-7B's shape (32 blocks of 11008 units, 256 tokens, float16: ~360 MB) and a header
like a real one: a sha256 for each of the checkpoint's 291 tensors and per-block summaries. The bytes are counted
by a relay between the client and the server (tests/s3_support.py), so they are what crossed the network,
HTTP headers included. A second table times whole reads of a small (zoo-sized) fingerprint, local file against
S3 object, in the same process: the cost a scan's pair task pays per fingerprint it reads.

    python bench/bench_fingerprint_ranges.py [--blocks 32] [--units 11008] [--tokens 256] [--repeats 30]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scanner.fingerprints.fingerprint import QUANTILES, Fingerprint  # noqa: E402
from scanner.fingerprints.inputs import InputSpec  # noqa: E402
from scanner.fingerprints.store import (  # noqa: E402
    FingerprintStore,
    read_fingerprint_at,
    read_fingerprint_block_at,
    read_fingerprint_meta_at,
)
from scanner.reading.activations import MLPActivations  # noqa: E402
from tests.fixtures.synthetic import synthetic_pair  # noqa: E402
from tests.s3_support import counting_relay, environment, make_bucket, s3_server  # noqa: E402
from tests.synthetic_fingerprints import template_fingerprint  # noqa: E402

ROLES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
         "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm")


def seven_b_shaped(template: Fingerprint, blocks: int, units: int, tokens: int) -> Fingerprint:
    """Random float16 activations of that shape, with a header as large as a real 7B fingerprint's."""
    rng = np.random.default_rng(0)
    names = (["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
             + [f"model.layers.{i}.{role}.weight" for i in range(blocks) for role in ROLES])
    hashes = {name: hashlib.sha256(name.encode()).hexdigest() for name in names}
    per_block = lambda: [float(x) for x in rng.standard_normal(blocks)]  # noqa: E731
    quantiles = lambda: [[float(x) for x in rng.random(len(QUANTILES))] for _ in range(blocks)]  # noqa: E731
    summaries = {"mlp_weight_kurtosis": per_block(), "activation_effective_rank": per_block(),
                 "gate_weight_kurtosis": per_block(), "up_weight_kurtosis": per_block(),
                 "down_weight_kurtosis": per_block(), "activation_rms_quantiles": list(QUANTILES),
                 "gate_rms_quantiles": quantiles(), "up_rms_quantiles": quantiles()}
    spec = InputSpec(n_sequences=tokens // 64, seq_len=64)
    meta = dataclasses.replace(template.meta, n_layers=blocks, hidden_size=4096, intermediate_size=units,
                               tensor_hashes=hashes, summaries=summaries, input_spec=dataclasses.asdict(spec),
                               parameter_count=6_738_415_616)
    data = [[MLPActivations(rng.standard_normal((units, tokens), dtype=np.float32).astype(np.float16),
                            rng.standard_normal((units, tokens), dtype=np.float32).astype(np.float16))]
            for _ in range(blocks)]
    return Fingerprint(meta, data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=32)
    parser.add_argument("--units", type=int, default=11008)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hubtrace-bench-") as tmp, s3_server() as variables, \
            environment(variables):
        template = template_fingerprint(Path(tmp) / "llama", 64)
        fingerprint = seven_b_shaped(template, args.blocks, args.units, args.tokens)
        make_bucket("bench-ranges")
        address, _ = FingerprintStore("s3://bench-ranges/fps").write(fingerprint, "org/seven-b", "0" * 40,
                                                                     scratch=Path(tmp))
        del fingerprint
        print(f"# {args.blocks} blocks x {args.units} units x {args.tokens} tokens, float16; moto S3 server; "
              f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
        print("| read | bytes from the server | seconds |")
        print("| --- | ---: | ---: |")
        reads = [("metadata (header)", lambda: read_fingerprint_meta_at(address)),
                 ("one block", lambda: read_fingerprint_block_at(address, args.blocks // 2)),
                 ("whole file (download + every check)", lambda: read_fingerprint_at(address, scratch=Path(tmp)))]
        for name, read in reads:
            with counting_relay() as relay:
                start = time.perf_counter()
                read()
                seconds = time.perf_counter() - start
            print(f"| {name} | {relay.downloaded:,} | {seconds:.3f} |", flush=True)
        small_reads(template, Path(tmp), args.repeats)


def small_reads(template: Fingerprint, tmp: Path, repeats: int) -> None:
    """Whole reads of a zoo-sized fingerprint, local file vs S3 object, alternating, same process."""
    small = synthetic_pair(template, 4, 256, {}, seed=1)[0]
    local = FingerprintStore(tmp / "local").write(small, "org/small", "0" * 40)[0]
    remote = FingerprintStore("s3://bench-ranges/small").write(small, "org/small", "0" * 40, scratch=tmp)[0]
    times: dict[str, list[float]] = {local: [], remote: []}
    for _ in range(repeats):
        for address in times:
            start = time.perf_counter()
            read_fingerprint_at(address, scratch=tmp)
            times[address].append(time.perf_counter() - start)
    size = (tmp / "local").rglob("*.safetensors").__next__().stat().st_size
    print(f"\n# whole reads of a {size / 1e6:.2f} MB fingerprint, {repeats} each, alternating; "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| from | median ms | p90 ms |")
    print("| --- | ---: | ---: |")
    for name, address in (("local file", local), ("moto S3", remote)):
        print(f"| {name} | {1000 * np.median(times[address]):.1f} | {1000 * np.quantile(times[address], 0.9):.1f} |")


if __name__ == "__main__":
    main()
