#!/usr/bin/env bash
# 60-minute A/B, side by side, one torch thread each: weight decay 0.2 vs decay 0.1 on the hidden matrices only
# (baseline: runs/preset = ../optim_ab/runs/preset+wd0.1, the preset as it is now (weight decay 0.1 on every
# parameter), trained 2026-11-26 under the same conditions)
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repo root
out=bench/results/2026-11-26/wd_ab
for lever in preset+wd0.2 preset+decayhid; do
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nohup .venv/bin/python bench/acceptance_per_minute.py --out $out --minutes 60 \
    --tokens 4000000 --levers $lever --curve $lever --curve-every 400 --train-only > $out/ab_$lever.log 2>&1 &
done
wait
echo done

# then, with both cores free: the three heads, ngram, suffix and none on the 64 held-out chat prompts (one run),
# then on the first 40 MT-Bench and 40 HumanEval prompts (one run per workload); batch 8, greedy, k=3.
# (The training above ran from this script; the serving below, as one command with --workloads, by hand after
# it: the option was added while the runs trained, replacing ../capacity_ab/serve_bench.py.)
.venv/bin/python bench/acceptance_per_minute.py --out $out --minutes 60 --tokens 4000000 \
  --levers preset,preset+wd0.2,preset+decayhid --side-by-side --num-prompts 64 --workloads mtbench,code > $out/serve.log 2>&1
echo served
