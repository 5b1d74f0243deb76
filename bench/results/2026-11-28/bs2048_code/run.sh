#!/usr/bin/env bash
# Issue 16, training speed: Muon's Newton-Schulz iterations cost a fixed ~0.2 s per optimizer step on two threads,
# ~35 % of a 1,024-token step (torch profiler on bench/train_step.py's step), and the preset's batches hold ~826 real
# tokens. 2,048-token batches halve that cost per token. This arm: ../preset_code_more's data and settings with
# 2,048-token batches and a peak lr of 4e-3 (half the optimizer steps, each ~1.33x larger). Meant as 54.0 minutes
# (what ../preset_code_more's arm took to its 4M-token cap), it ran ONE epoch (21.2 min): the bench then passed no
# optim.epochs under --minutes alone, so the preset's epochs=1 ended it, with its lr cosine. --epochs 1 below makes
# that explicit (the bench now trains until the clock under --minutes alone). Served on the same prompts
# (prompts.jsonl copied from ../preset_code_more), batch 8, greedy, k=3; ngram and suffix re-served as the
# reproducibility check. data/ holds copies of ../preset_code_more/data/{stdlib,site,stdlib_t07}.jsonl.
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repo root
O=bench/results/2026-11-28/bs2048_code
. .venv/bin/activate
L=preset+alsostdlib-site-stdlib_t07+bs2048+lr4e-3
python bench/acceptance_per_minute.py --out $O --minutes 54 --epochs 1 \
  --levers $L --curve $L --curve-every 200 --curve-sim-only --num-prompts 64 --workloads mtbench,code
echo done
