#!/usr/bin/env bash
# Every GPU figure BENCHMARKS.md asks for, on a GPU host without Ray. Output: one log per bench under $OUT
# (default: bench-out/).
#
#     OUT=/tmp/figures bash bench/gpu_figures.sh          # the pair figures, every matching rule side by side
#     FULL=1 OUT=/tmp/figures bash bench/gpu_figures.sh   # also the 1B and 7B fingerprint figures (+10 minutes:
#                                                         # a lease of its own)
#
# Sized for one command of a 15-minute lease on one H200 (2026-11-29: the machine started in 30 s, the three pair
# benches below took 440 s together): the exact rule is timed on the sequential design only (its every-block figures,
# 21.7 / 67 s on an H100, are in BENCHMARKS.md and dominated the script's time), and the pair worker's GPU profile
# comes last. The time limits stop the script by 9 minutes 40 whatever the card does, keeping what was printed.
#
# Peak GPU memory: the 96 cosine matrices of a 7B pair's every-block run (three views a block, 46 GB, built in groups
# of a third of the free memory), so an 80 GB card is enough.
#
# The scanner's import chain needs more than a CUDA image with torch, transformers and safetensors usually holds:
# lap, pydantic (+ pydantic_core, annotated_types, typing_inspection, typing_extensions >= 4.16), gguf, httpx2
# (+ httpcore2, truststore), huggingface_hub 2.x (+ click >= 8.4.2) and transformers >= 5.17. Where the host cannot reach an index,
# carry them as wheels (`pip download --no-deps --only-binary=:all: --python-version 3.12 ...`) and install them
# with `pip install --no-index --no-deps --target DIR`, DIR first on PYTHONPATH.
set -uo pipefail
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD:$PWD/bench PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
run() { local limit=$1 name=$2; shift 2; echo "## $name: $*"; timeout "$limit" python3 "$@" 2>&1 | tee "$OUT/$name.txt"; }
run 220 bench_7b_pair bench/bench_7b_pair.py --device cuda --design both --rules screened greedy
run 80 bench_7b_exact bench/bench_7b_pair.py --device cuda --design sequential --rules exact
run 280 pair_worker bench/bench_pair_worker.py --device cuda --families 2 --derivatives 3
if [ -n "${FULL:-}" ]; then
    run 600 fingerprint_1b bench/bench_fingerprint_io.py --device cuda --shape 1b --cache /tmp/hubtrace-bench
    run 600 fingerprint_7b bench/bench_fingerprint_io.py --device cuda --shape 7b --cache /tmp/hubtrace-bench
fi
