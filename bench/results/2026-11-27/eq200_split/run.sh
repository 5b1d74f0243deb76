#!/usr/bin/env bash
# Issue 16's equal-data budget (the same 200 ShareGPT conversations, 2 epochs, length 512, TTT 3, draft vocab 8,192;
# the preset as it is now with 512-token batches, as in ../eq200_ids) with data.overflow=split against the default
# truncation: truncated, the 200 conversations give 170 samples and 78k tokens of their 285k (73 % dropped); split,
# every token is in some 512-token window. Both trained one after the other on both cores (equal data: minutes do
# not matter), then served in one `eval acceptance` run with ngram, suffix and no speculation on the same 32
# held-out prompts as ../eq200_ids (prompts.jsonl copied from there); greedy, k=3. Held-out samples are truncated
# in both runs, so their simulated τ compare.
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repo root
L=preset+eq200+bs512
.venv/bin/python bench/acceptance_per_minute.py --out bench/results/2026-11-27/eq200_split --epochs 2 --num-prompts 32 \
  --levers $L,$L+split
echo done
