"""Peak disk use of Hub downloads during a scan: the demo hub (the 16-model zoo) served by the loopback Hub, scanned
by the real job (local Ray, CPU actors) with its download scratch sampled every few milliseconds.

Downloads are node-local scratch (jobs.scratch): one folder per model being fingerprinted, deleted once its
fingerprint is stored. The bench prints the peak bytes and the peak number of checkpoint folders in the scratch
at any sample, next to ``max_in_flight`` and the largest checkpoint, and what is left at the end (nothing).

    python bench/bench_scratch_disk.py [--max-in-flight 2] [--actors 2]
"""

from __future__ import annotations

import argparse
import os
import stat
import tempfile
import threading
import time
from pathlib import Path

from jobs.config import ScanConfig
from jobs.scan_job import run_scan
from jobs.scratch import PREFIX
from scanner.zoo import build_zoo
from tests.fixtures.fake_hub import FakeHub

ZOO_DIR = Path(".hubtrace-cache/zoo")


def folder_bytes(folder: Path) -> int:
    """Bytes of the regular files under ``folder`` (links not followed); files deleted meanwhile count 0."""
    total = 0
    for parent, _dirs, files in os.walk(folder):  # os.walk skips folders that vanish while it walks
        for name in files:
            try:
                info = os.lstat(os.path.join(parent, name))
            except FileNotFoundError:
                continue
            total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return total


class Sampler(threading.Thread):
    """Samples the scratch folder until stopped: peak bytes and peak number of download folders."""

    def __init__(self, scratch: Path, period: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.scratch, self.period = scratch, period
        self.peak_bytes = self.peak_folders = self.samples = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            folders = list(self.scratch.glob(f"{PREFIX}*")) if self.scratch.is_dir() else []
            self.peak_folders = max(self.peak_folders, len(folders))
            self.peak_bytes = max(self.peak_bytes, sum(folder_bytes(f) for f in folders))
            self.samples += 1
            time.sleep(self.period)

    def stop(self) -> None:
        self._done.set()
        self.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-in-flight", type=int, default=2)
    parser.add_argument("--actors", type=int, default=2)
    args = parser.parse_args()
    zoo = build_zoo(ZOO_DIR)
    largest = max(folder_bytes(zoo[m].path) for m in zoo.ids)
    with tempfile.TemporaryDirectory(prefix="hubtrace-bench-") as tmp, FakeHub(page_size=50) as hub:
        for model_id in zoo.ids:
            hub.add_folder(model_id, zoo[model_id].path)
        scratch = Path(tmp) / "scratch"
        config = ScanConfig.model_validate({
            "sources": [{"kind": "hub", "endpoint": hub.endpoint, "download_dir": str(scratch)}],
            "output_dir": str(Path(tmp) / "out"), "devices": {"mode": "cpu"}, "exports": [],
            "ray": {"actors": args.actors, "max_in_flight": args.max_in_flight}})
        sampler = Sampler(scratch)
        sampler.start()
        summary = run_scan(config)
        sampler.stop()
        left = folder_bytes(scratch) if scratch.exists() else 0
    print(f"demo hub from the loopback Hub: {summary.models} models, {summary.fingerprinted} fingerprinted, "
          f"{summary.failed} failed; {args.actors} actors, max_in_flight {args.max_in_flight}")
    print(f"largest checkpoint {largest / 1e6:.2f} MB; peak scratch {sampler.peak_bytes / 1e6:.2f} MB in at most "
          f"{sampler.peak_folders} checkpoint folder(s) at once ({sampler.samples} samples); left after the scan: "
          f"{left} bytes")


if __name__ == "__main__":
    main()
