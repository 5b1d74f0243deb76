#!/usr/bin/env bash
# TTT depth 3 against the preset's 2, as a user runs the preset on this 2-core machine (one process, two torch
# threads, 60 minutes and the 4M-token cap, whichever ends first). On two threads the preset's cap ends its
# training at 49 minutes (../preset_2threads), so the slower TTT-3 step (1.22x the cost per token at one thread,
# ../../2026-11-25/eq_levers) fits the same 4M tokens into about the hour: equal data, both within the budget.
# The preset arm is ../preset_2threads's run (runs/preset copied from there before this script ran; the bench
# reuses a run marked done), retrained nowhere; both heads are served in one run per workload with no speculation,
# ngram and suffix on the same prompts as ../preset_2threads (64 held-out chat, 40 MT-Bench, 40 HumanEval);
# batch 8, greedy, k=3.
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repo root
out=bench/results/2026-11-27/ttt3_2threads
[ -f $out/runs/preset/done ] || cp -r bench/results/2026-11-27/preset_2threads/runs/preset $out/runs/
.venv/bin/python bench/acceptance_per_minute.py --out $out --minutes 60 --tokens 4000000 \
  --levers preset,preset+ttt3 --curve preset,preset+ttt3 --curve-every 400 --curve-sim-only \
  --num-prompts 64 --workloads mtbench,code
echo done
