# draftsmith: `make quickstart` (install + main job), `make test` (install + lint + every test tier).
SHELL := /bin/bash
VENV ?= .venv
ACT := . $(VENV)/bin/activate &&

.PHONY: setup quickstart test test-fast lint format
setup:
	@bash scripts/setup.sh

quickstart: setup
	$(ACT) draftsmith quickstart $(ARGS)

test: setup lint
	$(ACT) python -m pytest tests -v

test-fast: setup lint
	$(ACT) python -m pytest tests -m "not slow"

lint: setup
	$(ACT) ruff check . && ruff format --check .

format: setup
	$(ACT) ruff check --fix . && ruff format .
