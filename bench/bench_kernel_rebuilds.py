"""How a slow test module fares on zoos trained as another machine would train them: each run rebuilds the zoos the
tests need in a fresh cache under other CPU kernels (MKL's code path, MKL_CBWR; ATen's vector width,
ATEN_CPU_CAPABILITY), which changes the trained weights in their last bits and, through training, the zoo itself, then
runs the tests on them. A CI machine trains its own zoos; an assertion that holds on this machine's build alone is a
coin that CI flips.

    PYTHONPATH=. python bench/bench_kernel_rebuilds.py tests/test_merge_zoo.py            # the default 8 settings
    PYTHONPATH=. python bench/bench_kernel_rebuilds.py tests/test_merge_zoo.py --settings COMPATIBLE:avx2 AVX:default

Each setting prints the pytest summary and a digest of one trained checkpoint, so settings that trained identical
zoos are seen as one draw. Minutes per setting (a rebuild of every zoo the module needs).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_SETTINGS = ("AUTO:default", "AUTO:avx2", "COMPATIBLE:avx512", "COMPATIBLE:avx2", "SSE4_2:avx2", "AVX:avx512",
                    "SSE4_2:default", "AVX:default")
"""MKL_CBWR:ATEN_CPU_CAPABILITY pairs (AUTO: MKL's own choice, as on a machine with no setting)."""


def digest(cache: Path) -> str:
    """A short digest of the first safetensors file under the cache: equal digests mean equal training."""
    first = min(cache.rglob("*.safetensors"), default=None)
    return hashlib.sha1(first.read_bytes()).hexdigest()[:10] if first else "-"


def run(tests: list[str], setting: str, root: Path) -> tuple[str, str]:
    """The pytest summary line of ``tests`` on zoos rebuilt under ``setting``, and the trained digest."""
    cbwr, capability = setting.split(":")
    cache = root / setting.replace(":", "-")
    env = {**os.environ, "HUBTRACE_TEST_CACHE": str(cache), "ATEN_CPU_CAPABILITY": capability}
    if cbwr != "AUTO":
        env["MKL_CBWR"] = cbwr
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], env=env,
                          capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return "; ".join([*(lines[-1:] or ["no summary"]), *failed]), digest(cache)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tests", nargs="+", help="test files or node ids")
    parser.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS), help="MKL_CBWR:ATEN_CPU_CAPABILITY")
    parser.add_argument("--root", type=Path, default=None, help="where the rebuilt caches go (default: a temp dir)")
    args = parser.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="hubtrace-rebuilds-"))
    print(f"# caches under {root}\n\n| setting | trained digest | pytest |\n|---|---|---|")
    for setting in args.settings:
        summary, trained = run(args.tests, setting, root)
        print(f"| {setting} | {trained} | {summary} |", flush=True)


if __name__ == "__main__":
    main()
