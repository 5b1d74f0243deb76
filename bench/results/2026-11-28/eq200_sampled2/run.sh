#!/usr/bin/env bash
# Issue 16's equal-data budget, as ../eq200_sampled: the preset with 512-token batches and data.overflow=split on the
# same 200 ShareGPT conversations, 2 epochs, trained beside the target's greedy answers to every user turn of them
# (data/own.jsonl) and one answer set sampled at temperature 0.7 (data/t07.jsonl, seed 1), against the same plus a
# third set sampled at 0.7 with seed 2 (data/t07b.jsonl): does a further sample of the same prompts keep paying?
# own.jsonl and t07.jsonl are ../eq200_sampled's files (copied; make them with its run.sh), and so is the first
# lever's run (a run dir with `done` is reused). Trained on both cores, never beside the regeneration; served in one
# `eval acceptance` run with ngram, suffix and no speculation on the same 32 held-out prompts; greedy, k=3.
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repo root
O=bench/results/2026-11-28/eq200_sampled2
. .venv/bin/activate
src=$O/eq200_source.jsonl
[ -f $src ] || python -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; \
import acceptance_per_minute as a; a.equal_data_source(Path('$O'))"
mkdir -p $O/data
for f in own t07; do [ -f $O/data/$f.jsonl ] || cp bench/results/2026-11-28/eq200_sampled/data/$f.jsonl $O/data/; done
draftsmith regenerate --target smollm2 --data $src --out $O/data/t07b.jsonl --turns 12 --temperature 0.7 --seed 2
L=preset+eq200+bs512+split
python bench/acceptance_per_minute.py --out $O --epochs 2 --num-prompts 32 --levers $L+alsoown-t07,$L+alsoown-t07-t07b
echo done
