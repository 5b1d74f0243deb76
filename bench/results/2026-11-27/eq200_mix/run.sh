#!/usr/bin/env bash
# Issue 16's equal-data budget (the same 200 ShareGPT conversations, 2 epochs, length 512, TTT 3, draft vocab 8,192;
# the preset with 512-token batches and data.overflow=split, as in ../eq200_split), and the same again with the
# target's own answers to every user turn of those conversations trained on beside their source text (data.also):
#   data/own.jsonl: `draftsmith regenerate --turns 12` over the 264 conversations (200 training + eq200's 64
#                   held-out): greedy answers (<= 256 tokens) to each user turn, asked after the target's own earlier
#                   answers (prompts over 1,024 tokens skipped). data.also drops the 64 held-out ids' answers (their
#                   ids are data.path's held-out ones), so training sees the target's answers to the 200 only.
# The bench refuses a head whose training data holds a served prompt. Trained one after the other on both cores
# (equal data: minutes do not matter), then served in one `eval acceptance` run with ngram, suffix and no
# speculation on the same 32 held-out prompts as ../eq200_ids (prompts.jsonl copied from there); greedy, k=3.
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repo root
O=bench/results/2026-11-27/eq200_mix
. .venv/bin/activate
src=$O/eq200_source.jsonl
[ -f $src ] || python -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; \
import acceptance_per_minute as a; a.equal_data_source(Path('$O'))"
mkdir -p $O/data
draftsmith regenerate --target smollm2 --data $src --out $O/data/own.jsonl --turns 12
L=preset+eq200+bs512+split
python bench/acceptance_per_minute.py --out $O --epochs 2 --num-prompts 32 --levers $L,$L+alsoown
echo done
