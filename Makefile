# Phalanx developer entry points. Everything installs itself into .venv on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CORE := src/phalanx/quotas src/phalanx/placement src/phalanx/admission src/phalanx/api
STRICT := $(CORE) src/phalanx/bench src/phalanx/store src/phalanx/dashboard src/phalanx/operator
STAMP := $(VENV)/.installed
BUILD_LOG ?= $(or $(TMPDIR),/tmp)/phalanx-build.log

.PHONY: test faults faults-scale demo lint typecheck contracts unit integration crds venv clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## make test: lint, strict types on the core, layering contracts, then the unit tests, the
## integration tests on the local control plane and the fault suite (on a cluster of its own),
## the 1,000-Job fault-proxy run with 20 SIGKILLs included (about 8-17 minutes of it).
## The Go builds of the local control plane, of every addon and of Kueue's scheduler-performance
## harness (cold: minutes each) start in the background, at low priority, while the unit tests
## run (they come first for that); a test that needs one before it is done waits on its build
## lock (their log: $(BUILD_LOG)). The slowest tests are listed at the end.
test: $(STAMP) lint typecheck contracts
	nice -n 10 $(BIN)/phalanx devcluster build --with all --kueue-perf > $(BUILD_LOG) 2>&1 & \
	$(BIN)/pytest -q --durations=40 tests/unit tests/integration; status=$$?; wait; exit $$status

## make faults: only the fault suite (SIGKILL, leader failover, API-server restart).
faults: $(STAMP)
	$(BIN)/pytest -q -m "faults and not scale"

## make faults-scale: only the 1,000 Jobs through the fault proxy with 20 SIGKILLs.
faults-scale: $(STAMP)
	$(BIN)/pytest -q -m scale

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

typecheck: $(STAMP)
	$(BIN)/mypy --strict $(STRICT)

contracts: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

integration: $(STAMP)
	$(BIN)/pytest -q -m integration

## make crds: regenerate crds/ from the API models.
crds: $(STAMP)
	$(BIN)/phalanx crds --output crds

## make demo: build/start the local control plane and run Phalanx on it.
demo: $(STAMP)
	$(BIN)/phalanx demo

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
