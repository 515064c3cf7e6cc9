#!/usr/bin/env bash
# Every GPU figure BENCHMARKS.md asks for, on a GPU host without Ray. Output: one log per bench under $OUT
# (default: bench-out/).
#
#     OUT=/tmp/figures bash bench/gpu_figures.sh          # the pair figures, both matching rules: about 7 minutes
#                                                         # on one H100 (most of it the exact rule's every-block runs)
#     FULL=1 OUT=/tmp/figures bash bench/gpu_figures.sh   # also the 1B and 7B fingerprint figures (+10 minutes)
#
# Peak GPU memory: the 64 cosine matrices of a 7B pair's every-block run (31 GB, built in groups of a third of the free
# memory), so an 80 GB card is enough.
#
# The scanner's import chain needs more than a CUDA image with torch, transformers and safetensors usually holds:
# lap, pydantic (+ pydantic_core, annotated_types, typing_inspection, typing_extensions >= 4.16), gguf, httpx2
# (+ httpcore2, truststore), huggingface_hub 2.x and transformers >= 5.17. Where the host cannot reach an index,
# carry them as wheels (`pip download --no-deps --only-binary=:all: --python-version 3.12 ...`) and install them
# with `pip install --no-index --no-deps --target DIR`, DIR first on PYTHONPATH.
set -uo pipefail
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD:$PWD/bench PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
run() { local name=$1; shift; echo "## $name: $*"; timeout 600 python3 "$@" 2>&1 | tee "$OUT/$name.txt"; }
run bench_7b_pair bench/bench_7b_pair.py --device cuda --design both
run pair_worker bench/bench_pair_worker.py --device cuda --families 2 --derivatives 3
if [ -n "${FULL:-}" ]; then
    run fingerprint_1b bench/bench_fingerprint_io.py --device cuda --shape 1b --cache /tmp/hubtrace-bench
    run fingerprint_7b bench/bench_fingerprint_io.py --device cuda --shape 7b --cache /tmp/hubtrace-bench
fi
