#!/usr/bin/env bash
# 60-minute A/B, side by side, one torch thread each: two draft layers vs twice the MLP width (the preset's
# 4,000-turn run of 2026-11-26, same conditions, is the baseline: runs/preset = ../data4000_ab/runs/preset+conv4000)
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repo root
out=bench/results/2026-11-26/capacity_ab
for lever in preset+layers2 preset+ffn3072; do
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nohup .venv/bin/python bench/acceptance_per_minute.py --out $out --minutes 60 \
    --tokens 4000000 --levers $lever --curve $lever --curve-every 400 --train-only > $out/ab_$lever.log 2>&1 &
done
wait
echo done

# then, with both cores free:
.venv/bin/python bench/acceptance_per_minute.py --out $out --minutes 60 --tokens 4000000 \
  --levers preset,preset+layers2,preset+ffn3072 --curve preset+layers2 --curve-every 400 --curve-min-gap 20 \
  --num-prompts 64 > $out/serve_chat.log 2>&1
echo chat done
.venv/bin/python bench/results/2026-11-26/capacity_ab/serve_bench.py $out/bench_prompts 40 \
  "preset=$out/exported/preset,preset_layers2=$out/exported/preset+layers2,preset_ffn3072=$out/exported/preset+ffn3072" \
  > $out/serve_bench.log 2>&1
echo bench done
