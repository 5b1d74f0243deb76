#!/usr/bin/env bash
# Issue 16, training speed, on the preset's own data: ../bs2048_code found that 2,048-token batches at a peak lr of
# 4e-3 train faster per minute (Muon's Newton-Schulz cost is fixed per optimizer step). This arm is the preset as a
# user runs it (chat answers only, one process on both cores) with those two settings and a 5M-token cap, about
# what the new rate reaches in the 49.1 minutes the preset took to its 4M-token cap in ../../2026-11-27/preset_2threads
# (the baseline; same cached features, prompts.jsonl copied from there). Served batch 8, greedy, k=3, on the same
# prompts; ngram and suffix are re-served as the reproducibility check.
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repo root
O=bench/results/2026-11-28/bs2048_preset
. .venv/bin/activate
L=preset+bs2048+lr4e-3
python bench/acceptance_per_minute.py --out $O --minutes 60 --tokens 5000000 \
  --levers $L --curve $L --curve-every 200 --curve-sim-only --num-prompts 64 --workloads mtbench,code
echo done
