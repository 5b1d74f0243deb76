# draftsmith: `make quickstart` (install + main job), `make test` (install + lint + every test tier).
SHELL := /bin/bash
VENV ?= .venv
ACT := . $(VENV)/bin/activate &&

.PHONY: setup lock quickstart test test-fast lint format
setup:
	@bash scripts/setup.sh

# scripts/constraints.txt from the set-up .venv (after a dependency change has passed `make test`)
lock: setup
	@bash scripts/lock.sh

quickstart: setup
	$(ACT) draftsmith quickstart $(ARGS)

# two workers, one core each (tests/conftest.py), each test module on one worker (its fixtures built once)
test: setup lint
	$(ACT) python -m pytest tests -v -n 2 --dist loadfile --no-loadscope-reorder --durations=40

test-fast: setup lint
	$(ACT) python -m pytest tests -m "not slow" -n 2 --dist loadfile --no-loadscope-reorder

lint: setup
	$(ACT) ruff check . && ruff format --check .

format: setup
	$(ACT) ruff check --fix . && ruff format .
