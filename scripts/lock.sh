#!/usr/bin/env bash
# Rewrite scripts/constraints.txt from the set-up .venv: the versions `make setup` installs on a fresh clone.
# Run after a change to pyproject.toml or setup.sh has been installed and `make test` passes with it.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DRAFTSMITH_VENV:-.venv}
out=scripts/constraints.txt
{
    sed -n '/^#/p' "$out"  # the header stays
    "$VENV/bin/python" -m pip freeze --exclude-editable --disable-pip-version-check | sed 's/+cpu$//'
} >"$out.tmp"
mv "$out.tmp" "$out"
echo "[lock] $(grep -vc '^#' "$out") pins -> $out"
