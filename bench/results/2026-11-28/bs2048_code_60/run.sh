#!/usr/bin/env bash
# Issue 16: ../bs2048_code's arm for the full clock. ../preset_code_more's data (the preset's chat answers plus the
# target's answers to stdlib/site code prompts, data/ holds copies) with the preset's 2,048-token batches and lr 4e-3,
# trained 60 minutes (the clock binds, the lr cosine follows it), the lr schedule fixed (80b8312). Served on the same
# prompts (prompts.jsonl copied from ../preset_code_more), batch 8, greedy, k=3; ngram and suffix re-served as the
# reproducibility check. data/ (not committed) holds copies of ../preset_code_more/data/{stdlib,site,stdlib_t07}.jsonl;
# `draftsmith regenerate --target smollm2 --max-tokens 256 --data pycode:stdlib` (site: pycode:site-packages:1200;
# stdlib_t07: pycode:stdlib --temperature 0.7 --seed 1) makes them again (64 of each checked identical).
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repo root
O=bench/results/2026-11-28/bs2048_code_60
. .venv/bin/activate
L=preset+alsostdlib-site-stdlib_t07
python bench/acceptance_per_minute.py --out $O --minutes 60 \
  --levers $L --curve $L --curve-every 300 --curve-sim-only --num-prompts 64 --workloads mtbench,code
echo done
