# prescaler: developer entry points. Every target sets up what it needs, idempotently.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
PACKAGES := operator/prescaler forecasting/prescaler_forecast

.PHONY: help venv lint typecheck importlint quality unit test demo crds

help:
	@echo "make test   - quality gates (ruff, mypy --strict, import-linter) then the whole pytest suite"
	@echo "make unit   - the fast unit tier only (seconds)"
	@echo "make demo   - the main job"
	@echo "make crds   - regenerate crds/ from the pydantic models"

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $@

lint: venv
	$(BIN)/ruff check .

typecheck: venv
	$(BIN)/mypy $(PACKAGES)

importlint: venv
	$(BIN)/lint-imports

quality: lint typecheck importlint

unit: venv
	$(BIN)/pytest -q tests/unit

test: quality
	$(BIN)/pytest -q

demo: venv
	@bash hack/demo.sh

crds: venv
	$(BIN)/python -m prescaler.api.crd --write crds/
