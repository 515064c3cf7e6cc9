#!/usr/bin/env bash
# Every GPU figure BENCHMARKS.md asks for, in one run on a GPU host without Ray (the device machine has torch,
# transformers, safetensors, scipy and fsspec; lap travels as a wheel). Output: one log per bench under $OUT
# (default: bench-out/). Total about 15 minutes on one H100.
#
#     OUT=/tmp/figures bash bench/gpu_figures.sh
set -uo pipefail
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
run() { local name=$1; shift; echo "## $name: $*"; timeout 900 python3 "$@" 2>&1 | tee "$OUT/$name.txt"; }
run auction bench/bench_auction.py --device cuda --batches 8 64 --check 2
run pair_worker bench/bench_pair_worker.py --device cuda --families 2 --derivatives 3
run fingerprint_1b bench/bench_fingerprint_io.py --device cuda --shape 1b --cache /tmp/hubtrace-bench
run fingerprint_7b bench/bench_fingerprint_io.py --device cuda --shape 7b --cache /tmp/hubtrace-bench
run bench_7b_pair bench/bench_7b_pair.py --device cuda --design both
run bench_7b_pair_host bench/bench_7b_pair.py --device cuda --design both --solver host
