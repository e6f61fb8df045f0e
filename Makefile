# One command each for a new machine: `make run` (the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# Tests run on both cores (pytest-xdist, work stealing: a worker left with the long tail hands
# tests to the idle one); each worker is a process of its own, and every
# server a test needs (GCS emulator, tf.data service) binds a free loopback port.
PYTEST_WORKERS ?= 2

.PHONY: run test test-fast lint docs bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The bare package is only the conversion (what Dataflow workers install); `all` adds
# TensorFlow and matplotlib for the runtime and the benchmarks, `test` adds the test tools.
$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[all]"
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test]"
	@# libfuse3 for the slow-storage benchmark scenario; best effort (root with apt only).
	@command -v fusermount3 >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && apt-get install -y -qq fuse3) >/dev/null 2>&1; } || \
	  echo "note: fuse3 not installed; the slow-storage benchmark scenario will report itself unavailable"
	touch $@ $(VENV)/.installed-run

run: $(VENV)/.installed-run
	$(BIN)/python -m benchmarks.main_job --out out/main

# Every test (slow end-to-end ones included) with Hypothesis' full example counts, and the
# docs site built strictly (its examples run in tests/test_docs.py): what CI runs.
test: $(VENV)/.installed-test lint docs
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal --durations=15 $(PYTEST_ARGS)

# The docs site (docs/, mkdocs.yml) into site/; a broken link or reference fails it.
docs: $(VENV)/.installed-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The working loop: tests not marked slow, a tenth of the property-test examples. Slow by
# design (@pytest.mark.slow) or by measurement (tests/slow_tests.txt: over 0.7 s in a quiet
# run, scripts/tier_tests.py). On 2026-12-06 the 197 tests listed took the fast tier from
# 2m52s (quiet) to 1m44s with the other core busy, 684 tests; they still run in `make test`.
test-fast: $(VENV)/.installed-test
	INGEST_HYPOTHESIS=fast $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal -m "not slow" --durations=10 $(PYTEST_ARGS)

bench: $(VENV)/.installed-test
	@# `bench` is `all` (installed by `test`) plus tfx-bsl, which may not install here.
	@$(BIN)/python -m pip install --quiet -e ".[bench]" || \
	  echo "note: tfx-bsl does not install here; the conversion benchmark skips its TFX comparison"
	$(BIN)/python -m benchmarks --out bench-out/suite
	$(BIN)/python -m benchmarks.conversion
	$(BIN)/python -m benchmarks.runtime
	$(BIN)/python -m benchmarks.smooth
	$(BIN)/python -m benchmarks.startup
	$(BIN)/python -m benchmarks.open_cost
	$(BIN)/python -m benchmarks.images
	$(BIN)/python -m benchmarks.checkpoints
	$(BIN)/python -m benchmarks.statistics

clean:
	rm -rf out bench-out site .pytest_cache
