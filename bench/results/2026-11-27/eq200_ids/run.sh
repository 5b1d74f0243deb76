#!/usr/bin/env bash
# Issue 16's equal-data budget (200 ShareGPT conversations, 2 epochs, length 512, TTT 3, draft vocab 8,192) on the
# preset as it is now (Muon, weight decay 0.2, 512-token batches as in ../../2026-11-25/eq_levers), with the preset's
# aux ids (2, 15, 21) against the (2, 15, 27) that every earlier equal-data run used. Trained one after the other on
# both cores (equal data: minutes do not matter), then served in one `eval acceptance` run with ngram, suffix and no
# speculation on the same 32 held-out prompts as ../../2026-11-25/eq_levers (prompts.jsonl copied from there);
# greedy, k=3.
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repo root
L=preset+eq200+bs512
.venv/bin/python bench/acceptance_per_minute.py --out bench/results/2026-11-27/eq200_ids --epochs 2 --num-prompts 32 \
  --levers $L,$L+ids2-15-27
echo done
