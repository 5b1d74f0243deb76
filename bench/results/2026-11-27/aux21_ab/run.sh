#!/usr/bin/env bash
# 60-minute A/B, side by side, one torch thread each: the top aux state taken from layer 21
# (target.aux_layer_ids=[2,15,21]) against the preset's [2, 15, 24], which won ../aux24_ab against 27.
# Same data, split, head and optimizer; only the target features differ. Both feature sets extracted before the
# clock (data preparation, not training minutes). Both evaluated every 400 steps on the same held-out split; then
# with both cores free, served: the 64 held-out chat prompts of ../../2026-11-26/wd_ab (prompts.jsonl copied from
# there), the first 40 MT-Bench and 40 HumanEval prompts; batch 8, greedy, k=3. The exported head records its aux
# ids, so vLLM captures the same layers.
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repo root
out=bench/results/2026-11-27/aux21_ab
.venv/bin/python bench/acceptance_per_minute.py --out $out --minutes 60 --tokens 4000000 \
  --levers preset,preset+aux21 --side-by-side --curve preset,preset+aux21 --curve-every 400 --curve-sim-only \
  --num-prompts 64 --workloads mtbench,code
echo done
