# hpcrun developer entry points. `make test` is what CI runs.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hpcrun-installed
TORCH_PIN := torch==2.13.0
PYTEST_ARGS ?=
BACKEND ?= local

.PHONY: venv lint test test-unit test-full demo bench testbed-up testbed-down clean

# The venv is rebuilt only when the package metadata changes.
$(STAMP): setup.cfg pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# torch first, pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install -q --disable-pip-version-check $(TORCH_PIN)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

lint: venv
	$(VENV)/bin/ruff check hpcrun tests benchmarks examples
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test-unit: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

# Unit tests + fast integration tests on the real Slurm testbed (brought up and down by the suite).
test: lint
	$(PY) -m pytest tests -m "not slow" $(PYTEST_ARGS)

# Everything, including real preemption with grace time, node crashes, time limits, browser checks.
test-full: lint
	$(PY) -m pytest tests $(PYTEST_ARGS)

demo: venv
	$(PY) -m examples.tiny_lm.demo --backend $(BACKEND)

bench: venv
	$(PY) -m benchmarks

testbed-up: venv
	$(VENV)/bin/hpcrun testbed up

testbed-down: venv
	$(VENV)/bin/hpcrun testbed down

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .import_linter_cache
