#!/usr/bin/env bash
# The preset as a user runs it on this 2-core machine: one training process on both cores (two torch threads,
# 1.82x the steps of one thread, ../train_step_threads), 60 minutes with the preset's 4M-token cap, whichever ends
# first (the lr cosine follows it). Features from the draftsmith cache (extracted before the clock: data
# preparation). Evaluated every 400 steps on the held-out split; then served in one run per workload with no
# speculation, ngram and suffix: the 64 held-out chat prompts of ../../2026-11-26/wd_ab (prompts.jsonl copied from
# there, as in ../aux21_ab, whose one-thread heads it compares with), the first 40 MT-Bench and 40 HumanEval prompts;
# batch 8, greedy, k=3.
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repo root
out=bench/results/2026-11-27/preset_2threads
.venv/bin/python bench/acceptance_per_minute.py --out $out --minutes 60 --tokens 4000000 \
  --levers preset --curve preset --curve-every 400 --curve-sim-only \
  --num-prompts 64 --workloads mtbench,code
echo done
