#!/usr/bin/env bash
# 60-minute A/B, side by side, one torch thread each: weight decay 0.3 against the preset (0.2), both trained in this
# run (the preset again, so the same run also shows how far a 60-minute preset run repeats: ../wd_ab trained it on
# 2026-11-26 too). Both checkpointed and evaluated every 400 steps (bench.md: simulated τ by step); then with both
# cores free, served: the 64 held-out chat prompts of ../wd_ab (prompts.jsonl copied from there), the first 40
# MT-Bench and 40 HumanEval prompts; batch 8, greedy, k=3.
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repo root
out=bench/results/2026-11-26/wd03_ab
.venv/bin/python bench/acceptance_per_minute.py --out $out --minutes 60 --tokens 4000000 \
  --levers preset,preset+wd0.3 --side-by-side --curve preset,preset+wd0.3 --curve-every 400 --curve-sim-only \
  --num-prompts 64 --workloads mtbench,code
echo done
