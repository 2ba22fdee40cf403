# prescaler: developer entry points. Every target sets up what it needs, idempotently.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
PACKAGES := operator/prescaler forecasting/prescaler_forecast tests/cluster tests/integration hack/demo/prescaler_demo
# The suite mostly waits (cold starts, timers, condition polls): workers run its tests side by
# side, each with its own local cluster, the longest first (tests/conftest.py). On 2 cores it
# uses under one core on average (measured times: benchmarks/README.md, "Test suite").
PYTEST_WORKERS ?= 5
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist load --maxschedchunk 1

.PHONY: help venv lint typecheck importlint quality unit test test-stress demo crds proto
.PHONY: cluster-bin prometheus-bin nginx-bin cluster-up cluster-down cluster-status

help:
	@echo "make test   - quality gates (ruff, mypy --strict, import-linter, hadolint) then the whole pytest suite ($(PYTEST_WORKERS) workers; slowest 15 printed)"
	@echo "make unit   - the fast unit tier only (seconds; slow-marked cases run in make test)"
	@echo "make test-stress - the cluster tests while a CPU burner occupies every core"
	@echo "make demo   - the main job"
	@echo "make crds   - regenerate crds/ and the chart's copy from the pydantic models"
	@echo "make proto  - regenerate the KEDA external-scaler gRPC modules from the vendored proto"
	@echo "make cluster-bin    - build the local cluster's binaries (cached; cold build is slow)"
	@echo "make prometheus-bin - install Debian's prometheus/promtool if missing"
	@echo "make nginx-bin      - install Debian's nginx if missing (the admission tests' gateway)"
	@echo "make cluster-up     - start a local cluster (kubeconfig: out/cluster/kubeconfig)"
	@echo "make cluster-down   - stop it (by PID)"

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $@

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check benchmarks

typecheck: venv
	$(BIN)/mypy $(PACKAGES)

importlint: venv
	$(BIN)/lint-imports

.PHONY: dockerlint
dockerlint: venv
	$(BIN)/hadolint --config .hadolint.yaml Dockerfile

quality: lint typecheck importlint dockerlint

unit: venv
	$(BIN)/pytest -q tests/unit -m "not slow"

test: quality cluster-bin prometheus-bin nginx-bin
	@echo "make test: quality gates passed, pytest starts at $$(date +%T)"
	$(BIN)/pytest -q $(PYTEST_PARALLEL) --durations=15

# The cluster tests on a machine as busy as a shared CI runner: they must still pass.
test-stress: venv cluster-bin prometheus-bin
	@STRESS_PYTEST="$${STRESS_PYTEST-$(PYTEST_PARALLEL)}" bash hack/test-stress.sh

demo: venv
	@bash hack/demo.sh $(ARGS)

crds: venv
	$(BIN)/python -m prescaler.api.crd --write crds/
	$(BIN)/python -m prescaler.api.crd --write charts/prescaler/crds/

# KEDA's externalscaler.proto, vendored at a pinned KEDA version; the generated code is committed.
proto: venv
	BIN=$(BIN) bash hack/gen-externalscaler.sh

# Local test cluster (tests/cluster, hack/cluster): real control plane + kwok fake GPU nodes.
CLUSTER_PY := PYTHONPATH=tests $(BIN)/python -m cluster

cluster-bin:
	@bash hack/cluster/build.sh

prometheus-bin:
	@bash hack/cluster/install-prometheus.sh

nginx-bin:
	@bash hack/cluster/install-nginx.sh

cluster-up: venv cluster-bin
	@$(CLUSTER_PY) up

cluster-down: venv
	@$(CLUSTER_PY) down

cluster-status: venv
	@$(CLUSTER_PY) status
