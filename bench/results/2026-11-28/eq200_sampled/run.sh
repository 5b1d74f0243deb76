#!/usr/bin/env bash
# Issue 16's equal-data budget (the same 200 ShareGPT conversations, 2 epochs, length 512, TTT 3, draft vocab 8,192;
# the preset with 512-token batches and data.overflow=split, as in ../../2026-11-27/eq200_mix), trained with the
# target's greedy answers to every user turn of those conversations (data/own.jsonl, made as in eq200_mix), and
# with those plus a second answer set sampled at temperature 0.7 (data/t07.jsonl, seed 1): the same prompts, the
# target's other likely answers. data.also drops the 64 held-out ids' answers, so training sees the target's
# answers to the 200 only. The bench refuses a head whose training data holds a served prompt. Trained one after
# the other on both cores (equal data: minutes do not matter; never beside the regeneration), then served in one
# `eval acceptance` run with ngram, suffix and no speculation on the same 32 held-out prompts as eq200_mix; greedy,
# k=3. The first two levers reproduce eq200_mix (their runs may be copied from there: a run dir with `done` is reused).
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repo root
O=bench/results/2026-11-28/eq200_sampled
. .venv/bin/activate
src=$O/eq200_source.jsonl
[ -f $src ] || python -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; \
import acceptance_per_minute as a; a.equal_data_source(Path('$O'))"
mkdir -p $O/data
[ -f $O/data/own.jsonl ] || draftsmith regenerate --target smollm2 --data $src --out $O/data/own.jsonl --turns 12
draftsmith regenerate --target smollm2 --data $src --out $O/data/t07.jsonl --turns 12 --temperature 0.7 --seed 1
L=preset+eq200+bs512+split
python bench/acceptance_per_minute.py --out $O --epochs 2 --num-prompts 32 --levers $L,$L+alsoown,$L+alsoown-t07
echo done
