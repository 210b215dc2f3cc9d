# hpcrun developer entry points. `make test` is what CI runs.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hpcrun-installed
TORCH_PIN := torch==2.13.0
PYTEST_ARGS ?=
BACKEND ?= local

.PHONY: venv lint test test-quick test-unit test-full chromium mpi demo bench gpu-check testbed-up testbed-down clean spec-docs

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

# docs/spec.md and docs/site.md are generated from the spec's and the site config's dataclasses;
# a unit test fails when either is stale.
spec-docs: venv
	$(VENV)/bin/hpcrun spec explain --markdown > docs/spec.md.tmp && mv docs/spec.md.tmp docs/spec.md
	$(VENV)/bin/hpcrun spec explain --site --markdown > docs/site.md.tmp && mv docs/site.md.tmp docs/site.md

test-unit: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

# Everything: lint, unit tests, every integration test on the real Slurm testbed (slow ones
# included: real preemption with grace time, node crashes, time limits) and the browser check of
# `hpcrun report`. This is the README's test command and what CI runs (within 60 minutes on a
# 2-core machine). HPCRUN_REQUIRE_BROWSER=1 makes the browser test fail, not skip, without Chromium.
# Two pytest processes side by side (tests/suite.sh): the testbed tests in one, on two Slurm
# clusters side by side (testbed lanes 0 and 1, a test module per lane), the unit and
# local-backend tests in the other (three xdist workers); most testbed time is waiting on Slurm
# (grace times, requeues), so they overlap.
test: lint chromium mpi
	HPCRUN_REQUIRE_BROWSER=1 tests/suite.sh $(PY) $(PYTEST_ARGS)

# The fast set for iterating (about 10 minutes): unit tests and the integration tests that do not
# wait for grace times or node failures.
test-quick: lint
	$(PY) -m pytest tests -m "not slow" $(PYTEST_ARGS)

# Kept as an alias of `make test` for muscle memory: both run everything.
test-full: test

# Debian's Chromium for the report's browser test, installed the way the testbed installs
# Slurm (apt-get as root); fails loudly when it cannot.
CHROMIUM ?= /usr/bin/chromium
CHROMIUM_PACKAGES := chromium chromium-driver
chromium:
	@.ci/apt-ensure $(CHROMIUM) $(CHROMIUM_PACKAGES)

# Open MPI (and, through libpmix-dev, the PMIx library Slurm's --mpi=pmix plugin loads) from
# Debian, then mpi4py in the venv (the `mpi` extra): the MPI bootstrap tests and the
# rank_launcher: pmix runs need them. Installed like Chromium; fails loudly when it cannot.
MPI_PACKAGES := openmpi-bin libopenmpi-dev
mpi: venv
	@.ci/apt-ensure mpiexec $(MPI_PACKAGES)
	@$(PY) -c "import mpi4py" 2>/dev/null || \
	  $(PY) -m pip install -q --disable-pip-version-check -e '.[mpi]'

demo: venv
	$(PY) -m examples.tiny_lm.demo --backend $(BACKEND)

bench: venv
	$(PY) -m benchmarks

# The device check on a GPU machine (about 8 minutes on one GPU); exits 0 with
# "skipped: no CUDA" elsewhere. Figures go to benchmarks/results/gpu/.
gpu-check: venv
	$(PY) -m benchmarks.gpu $(GPU_CHECK_ARGS)

testbed-up: venv
	$(VENV)/bin/hpcrun testbed up

testbed-down: venv
	$(VENV)/bin/hpcrun testbed down

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .import_linter_cache
