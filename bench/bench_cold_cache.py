"""What each cached test artefact costs a fresh clone: every one built alone into an empty cache folder, one
after another, each in its own process (so its CPU time is its own), with its wall and CPU seconds and disk.

    python bench/bench_cold_cache.py                       # all of them (about 35 minutes of CPU)
    python bench/bench_cold_cache.py chain seed1           # some
    python bench/bench_cold_cache.py --threads 1 smollm2   # torch threads per build (the suite's share on 2 cores)

The SmolLM2 family reads the wheel from .hubtrace-cache/pypi when it is there (the download is not timed).
Artefacts and their builders are those of tests/conftest.py (`_artefacts`), so this measures what the suite builds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMES = ("chain", "seed1", "seed2", "seed3", "independent", "zoo", "smollm2", "null-llama", "null-gpt2",
         "null-gpt_neox", "null-mixtral", "null-stress-distilled-llama", "null-stress-same-order-llama",
         "null-stress-widths-llama")


def build_one(name: str, cache: Path, threads: int | None = None) -> dict[str, float]:
    """Build one artefact under cache (in this process, on `threads` torch threads) and return its wall and CPU
    seconds."""
    sys.path.insert(0, str(ROOT))
    if threads:
        import torch

        torch.set_num_threads(threads)
    from scanner.zoo import ChainSpec, build_chain, build_zoo, train_independent_models
    from tests.lineage_support import seed_zoo
    from tests.null_support import null_stress_zoo, null_zoo

    start, cpu = time.perf_counter(), time.process_time()
    if name == "zoo":
        build_zoo(cache / "zoo")
    elif name == "independent":
        train_independent_models(cache / "independent", n=12)
    elif name.startswith("seed"):
        seed_zoo(cache, int(name[4:]))
    elif name == "chain":
        build_chain(cache / "chain", spec=ChainSpec(length=3))
    elif name.startswith("null-stress-"):
        family, kind = name.removeprefix("null-stress-").rsplit("-", 1)
        null_stress_zoo(cache, family, kind)
    elif name.startswith("null-"):
        null_zoo(cache, name.removeprefix("null-"))
    elif name == "smollm2":
        wheels = ROOT / ".hubtrace-cache" / "pypi"
        if wheels.is_dir():
            os.symlink(wheels.resolve(), cache / "pypi")
        from tests.fixtures.real_model import smollm2_family, smollm2_gguf

        smollm2_family(smollm2_gguf(cache), cache)
    else:
        raise SystemExit(f"unknown artefact {name!r}; choose from {', '.join(NAMES)}")
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall_s": time.perf_counter() - start,
            "cpu_s": time.process_time() - cpu + children.ru_utime + children.ru_stime}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", default=list(NAMES))
    parser.add_argument("--threads", type=int, default=0, help="torch threads per build (default: torch's own)")
    parser.add_argument("--one", nargs=2, metavar=("NAME", "CACHE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(build_one(args.one[0], Path(args.one[1]), args.threads)))
        return
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    print(f"{'artefact':<12} {'wall s':>8} {'CPU s':>8} {'disk MB':>8}")
    total_cpu = 0.0
    for name in args.names:
        cache = Path(tempfile.mkdtemp(prefix=f"cold-{name}-"))
        try:
            done = subprocess.run([sys.executable, __file__, "--one", name, str(cache), "--threads", str(args.threads)],
                                  check=True,
                                  capture_output=True, text=True)
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            disk = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file() and not f.is_symlink()) / 1e6
            total_cpu += figures["cpu_s"]
            print(f"{name:<12} {figures['wall_s']:>8.1f} {figures['cpu_s']:>8.1f} {disk:>8.0f}", flush=True)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    print(f"{'total CPU':<12} {'':>8} {total_cpu:>8.1f}")


if __name__ == "__main__":
    main()
