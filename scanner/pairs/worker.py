"""A pair worker: tests pairs from stored fingerprints, keeping the fingerprints it needs resident on its device.

Why: a pair test on a GPU is a few hundred milliseconds of work, while reading a 7B fingerprint (360 MB at 256
tokens) from an object store and copying it to the GPU can cost more than that. Pairs arrive sorted by their
first model, so one worker that keeps recently used fingerprints on its device (least recently used dropped
first, within a byte budget) reads and uploads each about once per batch of its pairs.

From an object store, fingerprints are opened lazily (scanner.fingerprints.store.open_fingerprint_at): the header
first, then only the blocks the test compares (with the sequential design, the screening blocks of most pairs),
each through the node's disk cache when one is given (scanner.fingerprints.cache), so the node's later pair tasks
download none of them again.

A related pair whose depths differ also gets its any-order block map here, right after its test and from the same
resident fingerprints (scanner.pairs.block_map), so that the lineage stage reads maps instead of making them.

Ray-free on purpose: the scan's pair tasks (jobs.actors) wrap it, and a machine without Ray (a bench on a GPU
host, a notebook) runs the same code path. Failures are raised; the caller decides what a failed pair becomes.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

from scanner.fingerprints.cache import FingerprintCache
from scanner.fingerprints.fingerprint import Fingerprint
from scanner.fingerprints.store import LazyBlocks, is_url, open_fingerprint_at, read_fingerprint_at
from scanner.pairs.block_map import BlockMap, any_order_map, needs_block_map
from scanner.pairs.fingerprint_compare import compare_fingerprints, fingerprint_statistic
from scanner.pairs.results import PairTestResult
from scanner.reading.activations import MLPActivations
from scanner.stats.matching import MatchingRule
from scanner.stats.sequential import SequentialDesign

HOST_CACHE_BYTES = 2 << 30
"""Fingerprints a host worker keeps in memory: five 7B-shaped ones at 256 tokens."""


class PairWorker:
    """Tests pairs of stored fingerprints on one device (``"cpu"`` or a CUDA device), caching what it reads.

    On a GPU, dense fingerprints are held there as torch tensors in their storage dtype, so a pair's cosine
    matrices are built without a host-to-device copy; MoE fingerprints stay on the host (their experts are paired
    on the host first, scanner.stats.experts).
    """

    def __init__(
        self,
        device: str = "cpu",
        *,
        statistic: str = "match",
        design: SequentialDesign | None = None,
        workers: int = 1,
        rule: MatchingRule = "screened",
        cache_bytes: int | None = None,
        disk_cache: FingerprintCache | None = None,
    ) -> None:
        self.device, self.statistic, self.design, self.workers, self.rule = device, statistic, design, workers, rule
        # a block map and device-resident fingerprints serve the statistics that read gate and up views; a statistic
        # no fingerprint gives is refused here, before any pair is read
        self.reads_gate_and_up = fingerprint_statistic(statistic).reads == "gate and up activations"
        self.cache_bytes = _default_cache_bytes(device) if cache_bytes is None else cache_bytes
        self.disk_cache = disk_cache
        self._cache: OrderedDict[str, Fingerprint] = OrderedDict()
        self.reads = 0  # fingerprints read from the store (a cache miss each)

    def compare(self, address_a: str, address_b: str, block_map: tuple[tuple[int, int], ...] = (), *,
                sha256_a: str | None = None, sha256_b: str | None = None) -> PairTestResult:
        """The pair's test, as ``compare_fingerprints`` gives it, from the fingerprints at the two addresses
        (``sha256_*``: the files' recorded sha256, the disk cache's key besides the address)."""
        result = compare_fingerprints(self.fingerprint(address_a, sha256_a), self.fingerprint(address_b, sha256_b),
                                      self.statistic, device=self.device, design=self.design, workers=self.workers,
                                      block_map=block_map or None, rule=self.rule)
        self._evict()  # lazily opened fingerprints have grown by the blocks the test fetched
        return result

    def block_map(self, address_a: str, address_b: str, result: PairTestResult, *, sha256_a: str | None = None,
                  sha256_b: str | None = None) -> BlockMap | None:
        """The pair's any-order block map when its test ``result`` calls for one (related, one width, depths differ:
        scanner.pairs.block_map.needs_block_map), else None; with this worker's matching rule, on its device."""
        a, b = self.fingerprint(address_a, sha256_a), self.fingerprint(address_b, sha256_b)
        if not self.reads_gate_and_up or not needs_block_map(a.meta, b.meta, result.log10_p):
            return None
        links = any_order_map(a, b, device=self.device, rule=self.rule)
        self._evict()  # a lazily opened fingerprint now holds every block
        return links

    def fingerprint(self, address: str, file_sha256: str | None = None) -> Fingerprint:
        """The fingerprint at ``address``, from the cache or read (and made resident) now; from an object store,
        only its header now and its blocks as a test reads them."""
        if address in self._cache:
            self._cache.move_to_end(address)
            return self._cache[address]
        if is_url(address):
            parts = self.disk_cache.reader(address, file_sha256) if self.disk_cache and file_sha256 else None
            fingerprint = open_fingerprint_at(address, parts=parts, place=self._place)
        else:
            fingerprint = self._resident(read_fingerprint_at(address))
        self.reads += 1
        self._cache[address] = fingerprint
        self._evict()
        return fingerprint

    @property
    def cached_bytes(self) -> int:
        return sum(_nbytes(fingerprint) for fingerprint in self._cache.values())

    def _evict(self) -> None:
        while len(self._cache) > 1 and self.cached_bytes > self.cache_bytes:
            self._cache.popitem(last=False)

    def _place(self, block: list[MLPActivations]) -> list[MLPActivations]:
        """A block fetched from an object store, on this worker's device when dense fingerprints live there."""
        if self.device == "cpu" or not self.reads_gate_and_up or len(block) != 1:
            return block
        return [self._on_device(x) for x in block]

    def _on_device(self, x: MLPActivations) -> MLPActivations:
        import torch

        return dataclasses.replace(x, gate=torch.tensor(x.gate, device=self.device),
                                   up=torch.tensor(x.up, device=self.device))

    def _resident(self, fingerprint: Fingerprint) -> Fingerprint:
        if self.device == "cpu" or not self.reads_gate_and_up or any(len(block) != 1 for block in fingerprint.blocks):
            return fingerprint
        return dataclasses.replace(fingerprint, blocks=[[self._on_device(x) for x in block]
                                                        for block in fingerprint.blocks])


def _nbytes(fingerprint: Fingerprint) -> int:
    def size(x) -> int:
        return int(x.nbytes) if hasattr(x, "nbytes") else int(x.numel() * x.element_size())

    blocks = fingerprint.blocks.fetched() if isinstance(fingerprint.blocks, LazyBlocks) else fingerprint.blocks
    return sum(size(x.gate) + size(x.up) for block in blocks for x in block)


def _default_cache_bytes(device: str) -> int:
    """A quarter of the GPU's memory (the rest holds a batch of cosine matrices), else HOST_CACHE_BYTES."""
    if device == "cpu":
        return HOST_CACHE_BYTES
    import torch

    return torch.cuda.get_device_properties(torch.device(device)).total_memory // 4
