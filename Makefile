# draftsmith: `make quickstart` (install + main job), `make test` (install + every test tier).
SHELL := /bin/bash
VENV ?= .venv
ACT := . $(VENV)/bin/activate &&

.PHONY: setup quickstart test test-fast
setup:
	@bash scripts/setup.sh

quickstart: setup
	$(ACT) draftsmith quickstart

test: setup
	$(ACT) python -m pytest tests -v

test-fast: setup
	$(ACT) python -m pytest tests -m "not slow"
