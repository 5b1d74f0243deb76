#!/usr/bin/env bash
# 60-minute A/B, side by side, one torch thread each: Muon with 3 Newton-Schulz iterations vs weight decay 0.1
# (baseline: runs/preset = ../data4000_ab/runs/preset+conv4000, the preset's 4,000-turn run of 2026-11-26 under
# the same conditions)
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repo root
out=bench/results/2026-11-26/optim_ab
for lever in preset+ns3 preset+wd0.1; do
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nohup .venv/bin/python bench/acceptance_per_minute.py --out $out --minutes 60 \
    --tokens 4000000 --levers $lever --curve $lever --curve-every 400 --train-only > $out/ab_$lever.log 2>&1 &
done
wait
echo done

# then, with both cores free: the three heads, ngram, suffix and none on the 64 held-out chat prompts (one run),
# then on the first 40 MT-Bench and 40 HumanEval prompts (one run per workload); batch 8, greedy, k=3
.venv/bin/python bench/acceptance_per_minute.py --out $out --minutes 60 --tokens 4000000 \
  --levers preset,preset+ns3,preset+wd0.1 --num-prompts 64 > $out/serve_chat.log 2>&1
echo chat done
.venv/bin/python bench/results/2026-11-26/capacity_ab/serve_bench.py $out/bench_prompts 40 \
  "preset=$out/exported/preset,preset_ns3=$out/exported/preset+ns3,preset_wd0.1=$out/exported/preset+wd0.1" \
  > $out/serve_bench.log 2>&1
echo bench done
